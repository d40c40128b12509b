"""Causal self-attention written out (arms.manual_causal_attention): against PyTorch's fused kernel, and
against what a reader can compute by hand: who sees whom, weights that average, the 1/sqrt(head size) scale,
fp32 scores under bf16 inputs, dropout of the weights. Then the model with --attention manual, on every layout."""

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

import train
from machinery.components import checkpoint
from machinery.job.arms import ArmedGPT, ArmsConfig, ManualAttention, manual_causal_attention
from machinery.job.config import parse_args
from machinery.job.local_ranks import run_ranks
from model import GPT, GPTConfig
from parallel.grid import Layout, ProcessGrid, destroy_distributed, init_distributed
from parallel.layout import model_for_rank
from parallel.pipeline import run_schedule


def random_qkv(B, H, T, head_size, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, head_size, generator=generator) for _ in range(3)]


@contextlib.contextmanager
def seeded_global_generator(seed):
    """F.dropout and a module's init draw from torch's global generator only: seed it for the block, then put
    its state back, so no test's draws depend on what ran before it (or change what runs after)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def assert_close(got, want, what, atol=1e-5, rtol=1e-4):
    """got == want within atol + rtol |want| everywhere; else the worst entry, expected against got."""
    assert got.shape == want.shape, f"{what}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}"
    got, want = got.double(), want.double()
    excess = (got - want).abs() - (atol + rtol * want.abs())
    excess = torch.where(torch.isnan(excess), math.inf, excess)  # a NaN is never close
    if excess.max() > 0:
        index = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
        off = int((excess > 0).sum())
        raise AssertionError(
            f"{what}: at index {index} expected {want[index]:.6g}, got {got[index]:.6g} "
            f"({off} of {excess.numel()} entries off by more than {atol:g} + {rtol:g} |expected|)"
        )


def weights_by_hand(q, k):
    """(B, H, T, T) attention weights computed here: query t's softmax over keys 0..t, zeros after t."""
    T, head_size = q.size(-2), q.size(-1)
    weights = torch.zeros(*q.shape[:-1], T, dtype=torch.float64)
    for t in range(T):
        scores = q[..., t : t + 1, :].double() @ k[..., : t + 1, :].double().transpose(-2, -1)  # (B, H, 1, t + 1)
        weights[..., t, : t + 1] = torch.softmax(scores[..., 0, :] / math.sqrt(head_size), dim=-1)
    return weights


def identity_values(B, H, T):
    """v = the identity, one value row per position (head size T): the output then IS the weights, y[t, s] = w[t, s]."""
    return torch.eye(T).expand(B, H, T, T).contiguous()


SHAPES = [
    pytest.param(1, 1, 1, 4, id="T=1"),
    pytest.param(1, 2, 7, 8, id="T=7,heads=2"),
    pytest.param(3, 4, 16, 16, id="batch=3,heads=4,T=16"),
    pytest.param(2, 3, 5, 32, id="head_size=32,T=5"),
]


@pytest.mark.parametrize("B, H, T, head_size", SHAPES)
def test_equals_pytorch_attention_in_output_and_gradients(B, H, T, head_size):
    """The same output as F.scaled_dot_product_attention(is_causal=True), and the same gradients of q, k and v."""
    q, k, v = (t.requires_grad_() for t in random_qkv(B, H, T, head_size))
    q_ref, k_ref, v_ref = (t.detach().clone().requires_grad_() for t in (q, k, v))
    y = manual_causal_attention(q, k, v, 0.0)
    want = F.scaled_dot_product_attention(q_ref, k_ref, v_ref, is_causal=True)
    assert_close(y, want, "the output equals F.scaled_dot_product_attention(q, k, v, is_causal=True)")
    upstream = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))  # dLoss/dy
    (y * upstream).sum().backward()
    (want * upstream).sum().backward()
    for name, got, expected in (("q", q, q_ref), ("k", k, k_ref), ("v", v, v_ref)):
        assert got.grad is not None, f"no gradient reaches {name}: the output must be computed from it with torch ops"
        assert_close(got.grad, expected.grad, f"the gradient of {name} equals PyTorch attention's")


def dominant_future_keys(q, k, cut, margin):
    """k with every key after position `cut` replaced by one key L u, u a unit vector that each of the queries
    0..cut points along (q . u > 0), L chosen so that for each of those queries the future score beats every
    visible score by at least `margin`: after a softmax over all keys the visible weights underflow to 0."""
    head_size = q.size(-1)
    u = torch.ones(head_size) / math.sqrt(head_size)
    along = q[..., : cut + 1, :] @ u  # (B, H, cut + 1): each query's component along u
    assert along.min() > 0, f"the queries 0..{cut} must point along u: the smallest q . u is {along.min():.3g}"
    visible = torch.ones(cut + 1, cut + 1, dtype=torch.bool).tril()  # key s <= query t
    scores = (q[..., : cut + 1, :] @ k[..., : cut + 1, :].transpose(-2, -1)).masked_fill(~visible, -math.inf)
    best_visible = scores.amax(-1) / math.sqrt(head_size)  # (B, H, cut + 1)
    L = ((best_visible + margin) * math.sqrt(head_size) / along).max().item()  # L (q . u) / sqrt(d) >= best + margin
    new_k = k.clone()
    new_k[..., cut + 1 :, :] = L * u
    return new_k


@pytest.mark.parametrize("loud", ["random", "dominant"])
@pytest.mark.parametrize("cut", [0, 3, 7])
def test_earlier_positions_never_see_the_future(cut, loud):
    """New keys and values after position `cut` leave the outputs at positions 0..cut exactly as they were.
    "random": loud random keys (10 randn). "dominant": keys whose score beats every visible one by >= 200, so a
    softmax taken before the mask gives the visible keys weight 0 (exp(-200) underflows fp32): masking after the
    softmax, renormalised or not, cannot get them back."""
    generator = torch.Generator().manual_seed(cut)
    q, k, v = random_qkv(2, 2, 9, 8)
    if loud == "dominant":
        q = q.abs()  # every query along u = ones / sqrt(8): one future key can outscore every visible key
    before = manual_causal_attention(q, k, v, 0.0)
    new_v = v.clone()
    new_v[..., cut + 1 :, :] = 10 * torch.randn(new_v[..., cut + 1 :, :].shape, generator=generator)
    if loud == "random":
        new_k = k.clone()
        new_k[..., cut + 1 :, :] = 10 * torch.randn(new_k[..., cut + 1 :, :].shape, generator=generator)
    else:
        new_k = dominant_future_keys(q, k, cut, margin=200.0)
        scores = (q @ new_k.transpose(-2, -1) / math.sqrt(q.size(-1)))[..., : cut + 1, :]  # (B, H, cut + 1, 9)
        visible = torch.ones(cut + 1, 9, dtype=torch.bool).tril()  # key s <= query t
        lead = scores[..., cut + 1 :].amin(-1) - scores.masked_fill(~visible, -math.inf).amax(-1)
        assert lead.min() >= 100, f"queries 0..{cut} score the new keys >= 100 above the visible: {lead.min():.4g}"
    after = manual_causal_attention(q, new_k, new_v, 0.0)
    assert_close(
        after[..., : cut + 1, :],
        before[..., : cut + 1, :],
        f"changing keys and values after position {cut} ({loud} keys"
        + (", scoring >= 100 above every visible key" if loud == "dominant" else "")
        + f") leaves the outputs at positions 0..{cut} unchanged",
        atol=1e-6,
        rtol=0,
    )


@pytest.mark.parametrize("T", [1, 6])
def test_the_first_position_reads_its_own_value(T):
    """Position 0 sees only itself: its one weight is 1, so its output is v[0] exactly."""
    q, k, v = random_qkv(2, 3, T, 8)
    y = manual_causal_attention(q, k, v, 0.0)
    assert y.shape == v.shape, (
        f"the output has the shape of v (B, H, T, head size): expected {tuple(v.shape)}, got {tuple(y.shape)}"
    )
    assert_close(y[..., 0, :], v[..., 0, :], "position 0 sees only itself: its output is v[0]", atol=1e-6, rtol=0)


@pytest.mark.parametrize("S", [1, 7])
def test_one_new_query_sees_every_key_so_far(S):
    """Sampling with the KV cache asks for one query, the newest token, against the S keys so far: its output is
    the last row of the same attention over all S positions (the mask comes from the queries' positions)."""
    q, k, v = random_qkv(2, 3, S, 8)
    y = manual_causal_attention(q[..., -1:, :], k, v, 0.0)
    assert y.shape == (2, 3, 1, 8), f"one query in, one row out (B, H, 1, head size): got {tuple(y.shape)}"
    assert_close(y, manual_causal_attention(q, k, v, 0.0)[..., -1:, :], "the newest query over all S keys")


@pytest.mark.parametrize("T", [1, 6, 11])
def test_each_output_averages_the_values_it_sees(T):
    """With v the identity the output reads out the weights: non-negative, zero on the future, each row summing
    to 1, and equal to the softmax of q . k / sqrt(head size) over the visible keys, computed here position by
    position."""
    B, H = 2, 2
    q, k, _ = random_qkv(B, H, T, T, seed=T)
    weights = manual_causal_attention(q, k, identity_values(B, H, T), 0.0)  # (B, H, T, T): row t = query t
    assert weights.shape == (B, H, T, T), (
        f"the output has the shape of v: expected {(B, H, T, T)}, got {tuple(weights.shape)}"
    )
    lowest = weights.min().item()
    assert lowest >= 0, f"attention weights are non-negative (a softmax): the smallest is {lowest:.6g}"
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)  # key s after query t
    on_future = weights[..., future].abs().max().item() if T > 1 else 0.0
    assert on_future == 0, f"no weight on a later position (key s > query t): expected 0, found {on_future:.6g}"
    assert_close(weights.sum(-1), torch.ones(B, H, T), "each position's weights sum to 1 (a softmax over the keys)")
    assert_close(weights, weights_by_hand(q, k), "the weights are softmax(q . k / sqrt(head size)) over keys 0..t")


@pytest.mark.parametrize("score", [None, -1e5], ids=["random_queries", "every_score_-1e5"])
def test_equal_keys_give_the_running_mean_of_the_values(score):
    """With every key the same, each visible key gets the same weight: the output at t is mean(v[0..t]). However
    low those equal scores (-1e5), the future still gets none: its mask is -inf, not a finite number like -1e4
    that such scores fall below."""
    B, H, T, head_size = 2, 2, 7, 8
    q, k, v = random_qkv(B, H, T, head_size)
    same_keys = k[..., :1, :].expand(B, H, T, head_size).contiguous()
    if score is not None:  # q = score sqrt(head size) k0 / |k0|^2: every q . k0 / sqrt(head size) is `score`
        k0 = k[..., :1, :]  # (B, H, 1, head size)
        q = (score * math.sqrt(head_size) * k0 / k0.pow(2).sum(-1, keepdim=True)).expand(B, H, T, head_size)
    y = manual_causal_attention(q, same_keys, v, 0.0)
    running_mean = v.cumsum(dim=-2) / torch.arange(1, T + 1).view(T, 1)  # (B, H, T, head size)
    scores = "random scores" if score is None else f"every score near {score:g}"
    assert_close(y, running_mean, f"with equal keys ({scores}) the output at position t is the mean of v[0..t]")


@pytest.mark.parametrize(
    "H, head_size",
    [(1, 4), (3, 16), (2, 64)],
    ids=["heads=1,head_size=4", "heads=3,head_size=16", "heads=2,head_size=64"],
)
def test_scores_are_scaled_by_one_over_root_head_size(H, head_size):
    """Two positions: query 1 weighs key 1 by sigmoid((q1 . k1 - q1 . k0) / sqrt(head size)), closed form.
    Read out with v[0] = 0, v[1] = 1: the output at position 1 is that weight. The scale is the head's size,
    C/H, not the width C = H * head size, and its square root."""
    B, T = 4, 2
    q, k, _ = random_qkv(B, H, T, head_size)
    v = torch.zeros(B, H, T, head_size)
    v[..., 1, :] = 1
    y = manual_causal_attention(q, k, v, 0.0)
    q1 = q[..., 1, :]
    want = torch.sigmoid(((q1 * k[..., 1, :]).sum(-1) - (q1 * k[..., 0, :]).sum(-1)) / math.sqrt(head_size))
    assert_close(
        y[..., 1, :],
        want.unsqueeze(-1).expand(B, H, head_size),
        f"query 1's weight on key 1 is sigmoid((q1 . k1 - q1 . k0) / sqrt({head_size})) with {H} heads "
        f"of size {head_size} (C = {H * head_size})",
    )


def sharp_qkv(common, dtype):
    """q, k, v (2, 3, 24, 16) whose scores share a common part near 4 common (as the logits of a sharpened
    attention do) and differ by O(1) from key to key."""
    B, H, T, head_size = 2, 3, 24, 16
    generator = torch.Generator().manual_seed(0)
    direction = torch.ones(head_size)  # every q . k / sqrt(head size) holds common * 16 / 4 = 4 common
    q = direction + 0.3 * torch.randn(B, H, T, head_size, generator=generator)
    k = common * direction + torch.randn(B, H, T, head_size, generator=generator)
    v = torch.randn(B, H, T, head_size, generator=generator)
    return [t.to(dtype) for t in (q, k, v)]


def test_large_scores_neither_overflow_nor_lose_their_weights():
    """Scores near 128: exp(128) overflows fp32, but the softmax only depends on the scores' differences."""
    q, k, v = sharp_qkv(32, torch.float32)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(
        manual_causal_attention(q, k, v, 0.0),
        want,
        "with scores near 128 the output equals F.scaled_dot_product_attention(q, k, v, is_causal=True)",
        atol=1e-4,
    )


@pytest.mark.parametrize("common", [0, 32], ids=["scores_near_0", "scores_near_128"])
def test_bf16_inputs_give_bf16_outputs_from_fp32_scores(common):
    """bf16 q, k, v give a bf16 output that matches attention computed in fp32 on the same values. bf16 holds
    scores near 128 in steps of 0.5 to 1: off by up to 0.5, which moves a weight by up to 65%, so the scores and
    their softmax must be fp32."""
    q, k, v = sharp_qkv(common, torch.bfloat16)
    y = manual_causal_attention(q, k, v, 0.0)
    assert y.dtype == torch.bfloat16, f"bf16 inputs give a bf16 output: expected torch.bfloat16, got {y.dtype}"
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert_close(
        y.float(),
        want,
        "with bf16 inputs the output is fp32 attention of the same values, rounded (scores and softmax in fp32)",
        atol=0.05,
        rtol=0,
    )


def dropped_weights(p, draws, B=4, H=4, T=8):
    """(weights without dropout (B, H, T, T), `draws` dropped weight matrices (draws, B, H, T, T)) read out by
    v = the identity, for one q and k: the draws are copies of the batch, in one call."""
    q, k, _ = random_qkv(B, H, T, T)
    copies = [t.repeat(draws, 1, 1, 1) for t in (q, k, identity_values(B, H, T))]  # (draws B, H, T, T)
    with seeded_global_generator(0):
        dropped = manual_causal_attention(*copies, p)
    assert dropped.shape == copies[2].shape, (
        f"the output has the shape of v (B, H, T, head size): expected "
        f"{tuple(copies[2].shape)}, got {tuple(dropped.shape)}"
    )
    return weights_by_hand(q, k), dropped.view(draws, B, H, T, T)


def test_dropout_drops_weights_and_scales_the_kept_ones():
    """Each attention weight w is, independently, dropped (0) with probability p or kept as w / (1 - p), so
    the weights stay unbiased: averaged over many draws, each row still sums to 1."""
    p, draws = 0.25, 200
    weights, dropped = dropped_weights(p, draws)
    kept = dropped.double() != 0
    assert_close(
        torch.where(kept, dropped.double(), weights / (1 - p)),
        weights.expand_as(dropped) / (1 - p),
        f"a kept weight w becomes w / (1 - p) = w / {1 - p}",
        atol=1e-6,
        rtol=1e-4,
    )
    visible = torch.ones(weights.shape[-1], weights.shape[-1], dtype=torch.bool).tril()
    share_dropped = 1 - kept[..., visible].double().mean().item()
    assert abs(share_dropped - p) < 0.02, (
        f"each weight is dropped with probability p = {p}: expected a share near {p} dropped, got {share_dropped:.3f}"
    )
    row_sum = dropped.double().sum(-1).mean().item()
    assert row_sum == pytest.approx(1, abs=0.01), (
        f"dropout keeps the weights unbiased: averaged over {draws} draws a row of weights sums to 1, got {row_sum:.4f}"
    )


def test_dropout_draws_each_weight_independently():
    """One coin per weight: the same weight in two batch rows (or two heads) is kept in both or dropped in both
    with probability p^2 + (1 - p)^2, as chance has it, not always (one mask shared by the batch or the heads)."""
    p = 0.25
    _, dropped = dropped_weights(p, draws=50)  # (draws, B, H, T, T): the draws are copies of one batch
    kept = dropped != 0
    visible = torch.ones(kept.shape[-1], kept.shape[-1], dtype=torch.bool).tril()
    chance = p**2 + (1 - p) ** 2
    for axis, name in ((0, "batch rows"), (2, "heads")):
        first, second = kept.narrow(axis, 0, kept.shape[axis] - 1), kept.narrow(axis, 1, kept.shape[axis] - 1)
        agree = (first == second)[..., visible].double().mean().item()
        assert abs(agree - chance) < 0.03, (
            f"the same weight in two {name} is dropped or kept alike with "
            f"probability p^2 + (1 - p)^2 = {chance}: got {agree:.3f}"
        )


def test_dropout_acts_on_the_weights_not_on_the_output():
    """With every value row the same vector u, any weights (dropped or not) give each output row a multiple of
    u: dropping entries of the output instead would zero some channels of a row and not others."""
    B, H, T, head_size = 2, 2, 6, 8
    q, k, _ = random_qkv(B, H, T, head_size)
    u = torch.arange(1.0, head_size + 1)  # (head size,)
    with seeded_global_generator(0):
        y = manual_causal_attention(q, k, u.expand(B, H, T, head_size).contiguous(), 0.5)
    multiple = y[..., :1] / u[0]  # (B, H, T, 1): each row's multiple of u
    assert_close(
        y,
        multiple * u,
        "with every value row equal to u, each output row is a multiple of u: the weights are dropped, not the output",
        atol=1e-5,
        rtol=1e-5,
    )
    assert (multiple != 1).any(), (
        "with dropout_p = 0.5 some weights are dropped: the rows' multiples of u "
        "(their weights' sums) were all 1, nothing was dropped"
    )


# ----------------------------------------------------------------------------
# The model with --attention manual: the same numbers as with sdpa, on one process and on tp and pp ranks

SMALL = dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32)


def test_attention_flag_is_parsed_and_validated():
    assert parse_args(["--attention", "manual"])[2].model.attention == "manual"
    assert parse_args([])[2].model.attention == "sdpa"
    with pytest.raises(ValueError, match="attention 'flash' must be sdpa or manual"):
        ArmsConfig(attention="flash")


def loss_and_grads(attention, autocast=False):
    with seeded_global_generator(0):
        model = ArmedGPT(ArmsConfig(**SMALL, attention=attention))
    x, y = (torch.randint(64, (3, 16), generator=torch.Generator().manual_seed(seed)) for seed in (1, 2))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        _, loss = model(x, y)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


def test_manual_attention_model_equals_sdpa_model():
    loss, grads = loss_and_grads("manual")
    reference_loss, reference_grads = loss_and_grads("sdpa")
    assert loss == pytest.approx(reference_loss, rel=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], msg=name)
    bf16_loss, _ = loss_and_grads("manual", autocast=True)  # train.py's CPU bf16 path
    assert bf16_loss == pytest.approx(reference_loss, rel=1e-2)


def _manual_attention_on_ranks(tp, pp):
    """This rank's loss (or None off the last stage) and gradients against the single-device sdpa model."""
    launch = init_distributed(30)
    grid = ProcessGrid(Layout(tp=tp, pp=pp), launch.rank, launch.world_size)
    with seeded_global_generator(0):
        single = GPT(GPTConfig(**SMALL))
    with seeded_global_generator(0):
        manual = ArmedGPT(ArmsConfig(**SMALL, attention="manual"))
    x, y = (torch.randint(64, (4, 16), generator=torch.Generator().manual_seed(seed)) for seed in (1, 2))
    _, loss = single(x, y)
    loss.backward()
    if pp == 1:
        model = model_for_rank(manual, grid, Layout(tp=tp), 4)
        _, rank_loss = model.module(x, y)
        rank_loss.backward()
    else:
        model = model_for_rank(manual, grid, Layout(tp=tp, pp=pp, micro_batches=2), 4)
        rank_loss, _, _ = run_schedule(model.module, model.order, x, y, 2, grid, SMALL["n_embd"])
        model.reduce_gradients()
    blocks = model.module.blocks if pp == 1 else [b for chunk in model.module.chunks for b in chunk.blocks]
    assert all(isinstance(block.attn, ManualAttention) for block in blocks)
    reference = dict(single.named_parameters())
    for name, param, cut in model.local_parameters():  # TP slices gathered whole
        torch.testing.assert_close(checkpoint.gather_whole(param.grad, cut, grid), reference[name].grad, msg=name)
    destroy_distributed()
    return None if rank_loss is None else (rank_loss.item(), loss.item())


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_manual_attention_on_tensor_and_pipeline_ranks(tp, pp):
    """Each TP rank attends over its own heads, each stage over its own blocks: the loss and gradients of the
    single-device model with the fused kernel."""
    outcome = run_ranks(tp * pp, _manual_attention_on_ranks, tp, pp, timeout=120)
    assert all(status == "ok" for status, _ in outcome.values()), outcome
    losses = [result for _, result in outcome.values() if result is not None]  # the last stage's, on each TP rank
    assert losses, outcome
    for loss, reference in losses:
        assert loss == pytest.approx(reference, rel=1e-5)


def test_train_py_runs_with_manual_attention_and_resumes_with_either_kernel(small_corpus, tmp_path):
    """--attention manual trains; the kernel is not part of the run's identity (both compute the same
    function of the same weights), so the run continues under sdpa."""
    out = tmp_path / "run"
    # fmt: off
    args = [
        str(a)
        for a in [
            "--source", small_corpus, "--data_dir", tmp_path / "data", "--out_dir", out, "--n_layer", "2",
            "--n_head", "2", "--n_embd", "32", "--block_size", "16", "--batch_size", "4", "--eval_iters", "1",
            "--num_samples", "0",
        ]
    ]
    # fmt: on
    train.main([*args, "--max_iters", "2", "--attention", "manual"])
    assert (out / "ckpt" / "step_0000002" / "state.pt").exists()
    train.main([*args, "--max_iters", "4", "--attention", "sdpa"])
    assert (out / "ckpt" / "step_0000004" / "state.pt").exists()
