"""Pipeline parallelism: the schedules' logical bubble and memory, and real gloo stages against one device."""

import pytest
import torch

from local_ranks import run_ranks
from model import GPT, GPTConfig
from parallel import ProcessGrid, destroy_distributed, global_grad_norm, init_distributed
from pipeline import (SCHEDULES, PipelineModel, bubble_fraction, check_micro_batches, check_pipeline_layout,
                      logical_timeline, peak_activations, run_schedule)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_logical_bubble_is_the_textbook_formula(schedule, p, m):
    """Counting op slots of the schedule itself: idle fraction = (p - 1) / (m + p - 1)."""
    bubble = bubble_fraction(logical_timeline(SCHEDULES[schedule], p, m))
    assert bubble == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [1, 4, 8])
def test_stored_activations_gpipe_m_1f1b_at_most_p(p, m):
    for stage in range(p):
        assert peak_activations(SCHEDULES["gpipe"](p, m, stage)) == m
        assert peak_activations(SCHEDULES["1f1b"](p, m, stage)) <= min(p, m)
    assert peak_activations(SCHEDULES["1f1b"](p, m, 0)) == min(p, m)


def test_bad_layouts_are_named():
    with pytest.raises(ValueError, match="n_layer 2 < pp 4"):
        check_pipeline_layout(2, 4)
    with pytest.raises(ValueError, match="batch_size 12 is not divisible by micro_batches 5"):
        check_micro_batches(12, 5)
    with pytest.raises(ValueError, match="--micro_batches 0 must be at least 1"):
        check_micro_batches(12, 0)


CFG = dict(block_size=16, vocab_size=64, n_layer=4, n_head=2, n_embd=16)


def _pipeline_against_single_device(schedule, m):
    launch = init_distributed(30)
    p = launch.world_size
    grid = ProcessGrid(1, 1, p, launch.rank, launch.world_size)
    torch.manual_seed(0)
    single = GPT(GPTConfig(**CFG))
    torch.manual_seed(0)
    model = PipelineModel(GPT(GPTConfig(**CFG)), grid, schedule, m)
    stage = model.module
    x = torch.randint(64, (4, 16), generator=torch.Generator().manual_seed(1))
    y = torch.randint(64, (4, 16), generator=torch.Generator().manual_seed(2))
    _, loss = single(x, y)
    loss.backward()
    pipe_loss, records, peak = run_schedule(stage, model.order, x, y, m, grid, CFG["n_embd"])
    model.reduce_gradients()  # sums the tied matrix's two copies
    reference = dict(single.named_parameters())
    for name, param, _ in model.local_parameters():
        torch.testing.assert_close(param.grad, reference[name].grad, msg=name)
    norm = model.grad_norm()
    reference_norm = global_grad_norm([], [p.grad for p in single.parameters()])
    destroy_distributed()
    return {"loss": None if pipe_loss is None else (pipe_loss.item(), loss.item()),
            "norm": (norm.item(), reference_norm.item()), "peak": peak,
            "blocks": len(stage.blocks), "kinds": sorted({r[0] for r in records})}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [1, 4])
def test_pipeline_equals_single_device(schedule, p, m):
    outcome = run_ranks(p, _pipeline_against_single_device, schedule, m, timeout=120)
    for rank, (status, result) in outcome.items():
        assert status == "ok", outcome
        assert result["norm"][0] == pytest.approx(result["norm"][1], rel=1e-5)
        assert result["blocks"] == CFG["n_layer"] // p  # each rank builds only its stage
        assert result["peak"] == (m if schedule == "gpipe" else min(p - rank, m))
    loss, reference = outcome[p - 1][1]["loss"]  # the loss lives on the last stage
    assert loss == pytest.approx(reference, rel=1e-5)
