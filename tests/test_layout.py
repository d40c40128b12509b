"""The layout's seams: the model as a rank holds it (layout.RankModel), answered by all four implementations."""

import inspect

import pytest
import torch

from machinery.components.checkpoint import ParameterCut
from machinery.job.torch_engines import DDPModel, DTensorCut, FSDPModel
from model import GPT, GPTConfig
from parallel.grid import Layout, ProcessGrid
from parallel.layout import RankModel, model_for_rank
from parallel.pipeline import PipelineModel, PipelineRank
from parallel.tensor_parallel import Cut

IMPLEMENTATIONS = {
    "ShardedModel": lambda gpt, grid: model_for_rank(gpt, grid, Layout(), 2),
    "PipelineModel": lambda gpt, grid: PipelineModel(
        PipelineRank(gpt, 0, 1), grid, {}, None, None, Layout(micro_batches=2), gpt.config.n_embd
    ),
    "DDPModel": lambda gpt, grid: DDPModel(gpt, grid),
    "FSDPModel": lambda gpt, grid: FSDPModel(gpt, grid),
}


def protocol_members(protocol):
    """(its data members, {name: signature} of its methods), as the Protocol declares them."""
    methods = {
        name: inspect.signature(value)
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }
    return set(protocol.__annotations__), methods


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_every_rank_model_answers_the_whole_interface(name):
    """Every member any caller uses is in RankModel; each implementation has each one, methods with the
    Protocol's parameters (names, order, defaults), so the loop can call any of them alike."""
    gpt = GPT(GPTConfig(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=8))
    model = IMPLEMENTATIONS[name](gpt, ProcessGrid())  # one process: nothing to cut or average
    assert isinstance(model, RankModel)  # runtime_checkable: every member present
    attributes, methods = protocol_members(RankModel)
    missing = sorted(a for a in attributes if not hasattr(model, a))
    assert not missing, f"{name} lacks {missing}"
    for method, signature in methods.items():
        ours = inspect.signature(getattr(type(model), method))
        assert list(ours.parameters.values()) == [
            p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()
        ], f"{name}.{method}{ours} differs from RankModel.{method}{signature}"
    assert isinstance(model.zero_stage, int) and model.micro_batches >= 1 and model.in_flight >= 1
    assert all(isinstance(p, torch.nn.Parameter) for _, p, _ in model.local_parameters())


@pytest.mark.parametrize("cut", [Cut, DTensorCut], ids=lambda cut: cut.__name__)
def test_every_cut_answers_checkpoints_two_calls(cut):
    """checkpoint.py gathers and cuts every parameter through ParameterCut's two calls, whoever cut it."""
    _, methods = protocol_members(ParameterCut)
    for method, signature in methods.items():
        assert inspect.signature(getattr(cut, method)) == signature, f"{cut.__name__}.{method}"
