"""Context parallelism (parallel/context_parallel.py): the online-softmax merge against one softmax over every key,
forward and backward; the zigzag cut's balance; ring attention on 2 and 4 gloo ranks against causal attention.
Whole training runs on cp layouts against one process: tests/test_data_parallel.py."""

import pytest
import torch

from machinery.job.local_ranks import results_of, run_ranks
from model import causal_attention
from parallel import context_parallel
from parallel.context_parallel import (
    Ring,
    block_attention,
    causal_pairs,
    merge_block,
    ring_attention,
    zigzag_positions,
)


def attention_inputs(seed=0, B=2, H=3, Tq=5, Tk=12, D=8):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=generator) for T in (Tq, Tk, Tk))
    q_positions = torch.tensor([3, 4, 7, 10, 11])  # queries among the keys' positions 0..11: the mask cuts blocks
    return q, k, v, q_positions, torch.arange(Tk)


def merged_over(q, k, v, q_positions, k_positions, blocks):
    """Attention over the keys cut into blocks (lists of key indices), the first block's softmax merged with each
    next one's."""
    out, lse = block_attention(q, k[:, :, blocks[0]], v[:, :, blocks[0]], q_positions, k_positions[blocks[0]])
    for keys in blocks[1:]:
        out, lse = merge_block(
            out, lse, *block_attention(q, k[:, :, keys], v[:, :, keys], q_positions, k_positions[keys])
        )
    return out, lse


@pytest.mark.parametrize(
    "blocks",
    [
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]],
        [[3, 4], [0, 1, 2, 8, 9], [5, 6, 7, 10, 11]],
        [[11, 0], list(range(1, 11))],
    ],
    ids=["in order", "shuffled", "late block first"],
)
def test_merging_blocks_gives_the_softmax_over_all_keys(blocks):
    q, k, v, q_positions, k_positions = attention_inputs()
    whole_out, whole_lse = block_attention(q, k, v, q_positions, k_positions)
    out, lse = merged_over(q, k, v, q_positions, k_positions, blocks)
    torch.testing.assert_close(out, whole_out, rtol=0, atol=1e-5)
    torch.testing.assert_close(lse, whole_lse, rtol=0, atol=1e-5)


def far_from_unit_scale(scale):
    """attention_inputs with scores far from 0: "large", q times 40, so the largest rows' log-sum-exp pass 100
    (exp of which overflows fp32 past 88.7); "very negative", every q component >= 1 and k's <= -40, so every score lies
    below -110 (exp of which underflows fp32 to 0 below -103.3)."""
    q, k, v, q_positions, k_positions = attention_inputs(seed=2)
    if scale == "large":
        return 40 * q, k, v, q_positions, k_positions
    return q.abs() + 1, -40 * (k.abs() + 1), v, q_positions, k_positions


@pytest.mark.parametrize("scale", ["large", "very negative"])
def test_merging_blocks_far_from_unit_scale_neither_overflows_nor_underflows(scale):
    """The merge's sums in exp overflow or underflow fp32 at these scores, though the softmax over all keys (one
    block_attention, which subtracts each row's largest score) is well defined: the merge must match it."""
    q, k, v, q_positions, k_positions = far_from_unit_scale(scale)
    whole_out, whole_lse = block_attention(q, k, v, q_positions, k_positions)
    edge = whole_lse.max() if scale == "large" else whole_lse.min()
    assert (edge > 100) if scale == "large" else (edge < -110), f"the inputs' log-sum-exp reaches {edge:.1f}"
    out, lse = merged_over(q, k, v, q_positions, k_positions, [[3, 4], [0, 1, 2, 8, 9], [5, 6, 7, 10, 11]])
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), (
        f"with the log-sum-exp of the scores reaching {edge:.0f}, the merged output or log-sum-exp is not finite: "
        "a sum of exponentials of these overflows or underflows fp32; carry its log instead"
    )
    torch.testing.assert_close(out, whole_out, rtol=0, atol=1e-4)
    torch.testing.assert_close(lse, whole_lse, rtol=1e-6, atol=1e-4)


def test_a_block_with_nothing_to_see_changes_nothing():
    """Keys later than every query: the merge keeps the running output and sum as they were."""
    q, k, v, q_positions, k_positions = attention_inputs()
    seen = torch.arange(0, 4)
    out, lse = block_attention(q, k[:, :, seen], v[:, :, seen], q_positions, k_positions[seen])
    future = torch.tensor([0, 1])
    merged = merge_block(
        out, lse, *block_attention(q, k[:, :, future], v[:, :, future], q_positions, torch.tensor([20, 21]))
    )
    torch.testing.assert_close(merged[0], out, rtol=0, atol=1e-6)
    torch.testing.assert_close(merged[1], lse, rtol=0, atol=1e-6)


def test_gradients_through_the_merges_are_those_of_the_whole_softmax():
    q, k, v, q_positions, k_positions = attention_inputs(seed=1)
    grads = []
    for blocks in ([list(range(12))], [[5, 6, 7, 8], [0, 1, 2, 3, 4], [9, 10, 11]]):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = merged_over(*leaves, q_positions, k_positions, blocks)
        (out.square().sum() + lse.sum()).backward()
        grads.append([t.grad for t in leaves])
    for merged, whole in zip(*grads):
        torch.testing.assert_close(merged, whole, rtol=0, atol=1e-5)


def test_zigzag_gives_every_rank_the_same_share_of_the_causal_work():
    T = 64
    for cp in (2, 4):
        held = torch.cat([zigzag_positions(T, cp, r) for r in range(cp)])
        assert sorted(held.tolist()) == list(range(T))  # every position on exactly one rank
        assert len({causal_pairs(T, cp, r) for r in range(cp)}) == 1  # the same work on each
    # cut into cp contiguous pieces instead, the last rank would see 3 times the first's keys (cp 2: 3/8 vs 1/8)
    contiguous = [int((torch.arange(r * 32, (r + 1) * 32)[:, None] >= torch.arange(T)).sum()) for r in range(2)]
    assert contiguous[1] > 2.9 * contiguous[0]


def _ring_against_causal(B, H, kv_heads, T, D):
    """On each rank of the world as one cp group: ring attention over its zigzag positions, forward and backward,
    against causal attention over the whole sequence computed on every rank."""
    import torch.distributed as dist

    from parallel.grid import destroy_distributed, init_distributed

    launch = init_distributed(60)
    try:
        cp, rank = launch.world_size, launch.rank
        generator = torch.Generator().manual_seed(0)
        q = torch.randn(B, H, T, D, generator=generator, requires_grad=True)
        k, v = (torch.randn(B, kv_heads, T, D, generator=generator, requires_grad=True) for _ in range(2))
        wide = [t.repeat_interleave(H // kv_heads, dim=1) for t in (k, v)]
        expected = causal_attention(q, *wide, 0.0)
        (expected * torch.arange(D)).sum().backward()  # a gradient that differs per position and channel
        mine = zigzag_positions(T, cp, rank)
        local = [t.detach()[:, :, mine].clone().requires_grad_() for t in (q, k, v)]
        ring = Ring(list(range(cp)), rank, dist.group.WORLD)
        scores = []  # the (queries, keys) of every block this rank computes
        counting = context_parallel.block_attention
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                context_parallel,
                "block_attention",
                lambda q, k, *rest: scores.append(q.size(2) * k.size(2)) or counting(q, k, *rest),
            )
            out = ring_attention(*local, ring, T)
        (out * torch.arange(D)).sum().backward()
        errors = [
            (out - expected[:, :, mine]).abs().max().item(),
            *((t.grad - whole.grad[:, :, mine]).abs().max().item() for t, whole in zip(local, (q, k, v))),
        ]
        return errors, sum(scores)
    finally:
        destroy_distributed()


@pytest.mark.parametrize("cp, kv_heads", [(2, 4), (4, 2)], ids=["cp2", "cp4-gqa"])
def test_ring_attention_equals_causal_attention_forward_and_backward(cp, kv_heads):
    T = 32
    outcome = results_of(run_ranks(cp, _ring_against_causal, 2, 4, kv_heads, T, 8, timeout=120))
    for errors, _ in outcome:
        assert max(errors) < 1e-4, errors  # output, then q's, k's and v's gradients (values up to ~10)
    # each rank computes its own block, then half a block a step: the same work on every rank, no score wasted
    # on a block the mask hides whole
    balanced = (T // cp) ** 2 * (1 + (cp - 1) / 2)
    assert [scores for _, scores in outcome] == [balanced] * cp
