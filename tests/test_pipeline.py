"""Pipeline parallelism: the schedules' logical bubble and memory, and real gloo stages against one device."""

import pytest
import torch

from machinery.job.local_ranks import run_ranks
from model import GPT, GPTConfig
from parallel.grid import Layout, ProcessGrid, destroy_distributed, init_distributed
from parallel.layout import check_layout, model_for_rank
from parallel.optimizer import global_grad_norm
from parallel.pipeline import (
    SCHEDULES,
    bubble_fraction,
    check_schedule,
    logical_timeline,
    peak_activations,
    run_schedule,
    schedule_for,
)


def ops(text):
    """'F0 F1 B0' -> [("F", 0), ("F", 1), ("B", 0)]"""
    return [(op[0], int(op[1:])) for op in text.split()]


def shown(order):
    return " ".join(f"{kind}{i}" for kind, i in order)


# 1F1B by hand: stage s first runs min(p - s - 1, m) warmup forwards, then alternates one forward and one
# backward, then runs the backwards left; forwards and backwards each go in micro-batch order.
ONE_F_ONE_B_BY_HAND = [
    pytest.param(
        4,
        6,
        [
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5",
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5",
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5",
        ],
        id="p=4-m=6",
    ),
    pytest.param(4, 2, ["F0 F1 B0 B1", "F0 F1 B0 B1", "F0 F1 B0 B1", "F0 B0 F1 B1"], id="p=4-m=2"),
    pytest.param(3, 1, ["F0 B0", "F0 B0", "F0 B0"], id="p=3-m=1"),
    pytest.param(1, 3, ["F0 B0 F1 B1 F2 B2"], id="p=1-m=3"),
    pytest.param(2, 5, ["F0 F1 B0 F2 B1 F3 B2 F4 B3 B4", "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4"], id="p=2-m=5"),
]


@pytest.mark.parametrize("p, m, by_hand", ONE_F_ONE_B_BY_HAND)
def test_one_f_one_b_is_warmup_steady_cooldown(p, m, by_hand):
    for stage, text in enumerate(by_hand):
        got = SCHEDULES["1f1b"](p, m, stage)
        assert got == ops(text), (
            f"1F1B, stage {stage} of {p}, {m} micro-batches (warmup min(p - s - 1, m) = "
            f"{min(p - stage - 1, m)}): expected {text}, got {shown(got)}"
        )


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8], ids=lambda p: f"p={p}")
@pytest.mark.parametrize("m", [1, 2, 3, 7, 16], ids=lambda m: f"m={m}")
def test_one_f_one_b_runs_each_micro_batch_once_in_order(p, m):
    """On every stage: each micro-batch's forward and backward exactly once, its backward after its forward,
    forwards and backwards each in micro-batch order (what the next stage receives and sends), and at most
    p - s micro-batches' activations held at once, the first backward as early as that allows."""
    for stage in range(p):
        order = SCHEDULES["1f1b"](p, m, stage)
        every = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
        assert sorted(order) == sorted(every), (
            f"stage {stage} of {p}, {m} micro-batches: expected F and B of micro-batches 0..{m - 1} once each, "
            f"got {shown(order)}"
        )
        late = [i for i in range(m) if order.index(("B", i)) < order.index(("F", i))]
        assert not late, (
            f"stage {stage} of {p}: a backward needs its forward first: micro-batches {late} go "
            f"backward before forward in {shown(order)}"
        )
        for kind in "FB":
            indices = [i for k, i in order if k == kind]
            assert indices == list(range(m)), (
                f"stage {stage} of {p}: the {kind} operations go in micro-batch "
                f"order: expected {list(range(m))}, got {indices}"
            )
        peak = peak_activations(order)
        assert peak == min(p - stage, m), (
            f"stage {stage} of {p}, {m} micro-batches: 1F1B holds the activations "
            f"of min(p - s, m) = {min(p - stage, m)} micro-batches at most, at its "
            f"first backward: expected {min(p - stage, m)}, got {peak} in {shown(order)}"
        )


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [1, 2, 4, 8], ids=lambda p: f"p={p}")
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16], ids=lambda m: f"m={m}")
def test_logical_bubble_is_the_textbook_formula(schedule, p, m):
    """Counting op slots of the schedule itself: idle fraction = (p - 1) / (m + p - 1)."""
    bubble = bubble_fraction(logical_timeline(SCHEDULES[schedule], p, m))
    want = (p - 1) / (m + p - 1)
    assert bubble == pytest.approx(want), (
        f"{schedule}, {p} stages, {m} micro-batches, one slot per operation: expected the idle share "
        f"(p - 1) / (m + p - 1) = {want:.4f}, got {bubble:.4f}"
    )


@pytest.mark.parametrize("p", [2, 4], ids=lambda p: f"p={p}")
@pytest.mark.parametrize("m", [1, 4, 8], ids=lambda m: f"m={m}")
def test_stored_activations_gpipe_m_1f1b_at_most_p(p, m):
    for stage in range(p):
        gpipe, one_f_one_b = (peak_activations(SCHEDULES[name](p, m, stage)) for name in ("gpipe", "1f1b"))
        assert gpipe == m, f"GPipe holds all {m} micro-batches' activations on stage {stage}: expected {m}, got {gpipe}"
        assert one_f_one_b <= min(p, m), (
            f"1F1B holds at most min(p, m) = {min(p, m)} micro-batches' activations "
            f"on stage {stage} of {p}: got {one_f_one_b}"
        )
    first = peak_activations(SCHEDULES["1f1b"](p, m, 0))
    assert first == min(p, m), f"1F1B's first stage holds min(p, m) = {min(p, m)}: got {first}"


@pytest.mark.parametrize("p, v", [(2, 2), (2, 3), (3, 2), (4, 2), (4, 4)], ids=lambda x: str(x))
def test_interleaved_schedule_runs_every_chunk_once_and_shrinks_the_bubble_v_fold(p, v):
    """Generated, then checked: each rank runs F and B of every micro-batch through each of its v chunks once, with
    no wait that never ends; counted in slots, the bubble is (p - 1) / (v m + p - 1)."""
    schedule = schedule_for("1f1b", v)
    for m in (p, 2 * p, 4 * p):
        check_schedule(schedule, p, m, v)
        bubble = bubble_fraction(logical_timeline(schedule, p, m))
        assert bubble == pytest.approx((p - 1) / (v * m + p - 1)), (p, v, m, bubble)
        # its first rank keeps p + (p - 1) / v stages' worth of activations, 1F1B's p and a little more (with m = p
        # all of them: every forward comes first)
        want = m if m == p else p + (p - 1) / v
        assert peak_activations(schedule(p, m, 0)) / v == pytest.approx(want)


def test_a_schedule_that_skips_or_stalls_is_refused():
    def skips(stages, micro_batches, stage):
        return SCHEDULES["1f1b"](stages, micro_batches, stage)[:-1]  # the last backward never runs

    def backward_first(stages, micro_batches, stage):  # every backward before any forward: nothing to go back
        order = SCHEDULES["gpipe"](stages, micro_batches, stage)
        return order[micro_batches:] + order[:micro_batches]

    with pytest.raises(ValueError, match="rank 0 of 2 does not run F and B of each of 4 micro-batches"):
        check_schedule(skips, 2, 4)
    with pytest.raises(RuntimeError, match="backward_first deadlocks with 2 stages and 4 micro-batches"):
        check_schedule(backward_first, 2, 4)

    def last_stage_reversed(stages, micro_batches, stage):  # runs, but takes micro-batch 1's activation first
        order = SCHEDULES["gpipe"](stages, micro_batches, stage)
        return order if stage < stages - 1 else [(kind, micro_batches - 1 - i) for kind, i in order]

    with pytest.raises(ValueError, match="rank 0 receives its B messages from rank 1 in another order"):
        check_schedule(last_stage_reversed, 2, 2)


def test_bad_layouts_are_named():
    def check(gpt_config, pp, micro_batches):
        check_layout(Layout(pp=pp, micro_batches=micro_batches), gpt_config, 12, pp, torch.float32)

    with pytest.raises(ValueError, match="n_layer 2 < pp 4"):
        check(GPTConfig(n_layer=2), 4, 1)
    with pytest.raises(ValueError, match="batch_size 12 is not divisible by micro_batches 5"):
        check(GPTConfig(n_layer=2), 2, 5)
    with pytest.raises(ValueError, match="--micro_batches 0 must be at least 1"):
        check(GPTConfig(n_layer=2), 2, 0)

    def interleaved(n_layer, pp, micro_batches, v, schedule="1f1b"):
        layout = Layout(pp=pp, micro_batches=micro_batches, virtual_stages=v, schedule=schedule)
        check_layout(layout, GPTConfig(n_layer=n_layer), 12, pp, torch.float32)

    with pytest.raises(ValueError, match=r"--virtual_stages 2 cuts n_layer 6 into pp x v = 4 equal chunks"):
        interleaved(6, 2, 2, 2)
    with pytest.raises(ValueError, match="--virtual_stages 2 runs micro-batches .* groups of pp = 2.* is 3"):
        interleaved(4, 2, 3, 2)
    with pytest.raises(ValueError, match="--schedule gpipe: pass --pp 2 or more with --schedule 1f1b"):
        interleaved(4, 2, 2, 2, "gpipe")
    with pytest.raises(ValueError, match="here --pp is 1"):
        interleaved(4, 1, 2, 2)


CFG = dict(block_size=16, vocab_size=64, n_layer=4, n_head=2, n_embd=16)


def _pipeline_against_single_device(schedule, m):
    launch = init_distributed(30)
    p = launch.world_size
    grid = ProcessGrid(Layout(pp=p), launch.rank, launch.world_size)
    torch.manual_seed(0)
    single = GPT(GPTConfig(**CFG))
    torch.manual_seed(0)
    model = model_for_rank(GPT(GPTConfig(**CFG)), grid, Layout(pp=p, schedule=schedule, micro_batches=m), 4)
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
    return {
        "loss": None if pipe_loss is None else (pipe_loss.item(), loss.item()),
        "norm": (norm.item(), reference_norm.item()),
        "peak": peak,
        "blocks": sum(len(chunk.blocks) for chunk in stage.chunks),
        "kinds": sorted({slot.kind for slot in records}),
    }


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 4], ids=lambda p: f"p={p}")
@pytest.mark.parametrize("m", [1, 4], ids=lambda m: f"m={m}")
def test_pipeline_equals_single_device(schedule, p, m):
    """Real stages over gloo take the single device's loss and gradients, each keeping its schedule's activations."""
    outcome = run_ranks(p, _pipeline_against_single_device, schedule, m, timeout=120)
    for rank in range(p):
        status, result = outcome.get(rank, ("missing", None))
        assert status == "ok", (
            f"every stage runs the {schedule} schedule to the end with the single device's "
            f"gradients: rank {rank} ended {status}: {result}"
        )
        norm, reference_norm = result["norm"]
        assert norm == pytest.approx(reference_norm, rel=1e-5), (
            f"stage {rank}: the grad norm over all stages is the single device's: expected {reference_norm}, got {norm}"
        )
        assert result["blocks"] == CFG["n_layer"] // p, (
            f"rank {rank} builds only its stage: expected {CFG['n_layer'] // p} blocks, got {result['blocks']}"
        )
        peak = m if schedule == "gpipe" else min(p - rank, m)
        assert result["peak"] == peak, (
            f"stage {rank} of {p} under {schedule} with {m} micro-batches holds "
            f"{peak} micro-batches' activations at most: got {result['peak']}"
        )
    loss, reference = outcome[p - 1][1]["loss"]  # the loss lives on the last stage
    assert loss == pytest.approx(reference, rel=1e-5), (
        f"the last stage's loss is the single device's: expected {reference}, got {loss}"
    )
