"""Communication and memory per rank: what each rank counts in a training step equals the closed
form, byte for byte; the activation meter sees what autograd keeps, and lets it go."""

import gc

import pytest
import torch

from bench.layouts import measure_layout, pipelined
from machinery.health.monitor import SavedActivations
from machinery.job.arms import ArmedGPT, ArmsConfig
from machinery.planning.closed_forms import parameters_on_rank
from model import GPT, GPTConfig
from parallel.grid import Layout

SMALL = GPTConfig(block_size=8, vocab_size=101, n_layer=4, n_head=4, n_embd=32)  # V = 101: padded to a multiple of tp


@pytest.mark.parametrize(
    "layout, gpt_config, dtype",
    [
        (pipelined(2, 2, 2), SMALL, torch.float32),
        (
            pipelined(1, 2, 4, schedule="gpipe"),
            GPTConfig(**{**vars(SMALL), "bias": True, "norm": "layernorm"}),
            torch.bfloat16,
        ),
        (pipelined(2, 4, 1), SMALL, torch.float32),
    ],
    ids=["dp2xtp2xpp2-fp32", "tp2xpp4-bias-bf16", "dp2xtp4"],
)  # pp4: inner stages talk both ways
def test_counted_bytes_equal_the_closed_form_on_every_rank(layout, gpt_config, dtype):
    """One step of 2 accumulation micro-steps on 8 ranks: every rank's count, in each dimension,
    is the closed form for its stage; so is the number of parameters it holds."""
    row = measure_layout(layout, steps=1, gpt_config=gpt_config, accumulation=2, dtype=dtype)
    for rank in row["ranks"]:
        assert rank["bytes"] == rank["formula"], rank
        assert rank["parameters"] == parameters_on_rank(gpt_config, layout, rank["grid"][1]), rank
    # the shape of the story: TP talks at every layer, PP only at the stage borders, DP once per step
    counted = [rank["bytes"] for rank in row["ranks"]]
    assert all(c["tp"] > 0 for c in counted) and all((c["pp"] > 0) == (layout.pp > 1) for c in counted)
    assert all((c["dp"] > 0) == (layout.dp > 1) for c in counted)


def test_parameters_on_rank_add_up_to_the_model():
    """The stages of one TP rank hold the model once, plus the last stage's copy of the tied embedding."""
    for kwargs in ({}, {"bias": True, "norm": "layernorm"}, {"norm_position": "post"}):
        gpt_config = ArmsConfig(**{**vars(SMALL), **kwargs})  # Post-LN: an arm (arms.py)
        whole = ArmedGPT(gpt_config).num_params()
        assert parameters_on_rank(gpt_config) == whole
        assert (
            sum(parameters_on_rank(gpt_config, Layout(pp=4), s) for s in range(4))
            == whole + gpt_config.vocab_size * gpt_config.n_embd
        )


def test_saved_activations_grow_with_the_batch_and_are_let_go():
    model = GPT(SMALL)
    x = torch.randint(SMALL.vocab_size, (8, SMALL.block_size))
    peaks = []
    for rows in (4, 8):
        with SavedActivations(model) as saved:
            model(x[:rows], x[:rows])[1].backward()
        assert saved.now == 0  # backward freed what it used
        peaks.append(saved.peak)
    assert peaks[1] == pytest.approx(2 * peaks[0], rel=0.05)  # activations are per row
    with SavedActivations(model) as saved:
        loss = model(x, x)[1]
        assert saved.now == saved.peak > 0
        del loss  # a forward that is never backpropagated (an error mid-step): its graph goes, and so does the count
        gc.collect()
    assert saved.now == 0
