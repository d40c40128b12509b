"""The cost account against public figures, and the planner's layouts, memory and checkpoint economics."""

import json
import math
import re
from dataclasses import replace

import pytest
import torch
from conftest import ROOT, run_script
from torch.utils.flop_counter import FlopCounterMode

from machinery.job.arms import ArmedGPT, ArmsConfig
from machinery.planning import closed_forms, cost, planner
from model import GPT, CausalSelfAttention, GPTConfig, grouped_heads
from parallel.grid import Layout


def account(*argv):
    return cost.account(cost.parse_args(list(argv)))


SHAPES = [
    pytest.param(dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=100), id="small"),
    pytest.param(
        dict(n_layer=3, n_head=4, n_embd=64, block_size=8, vocab_size=256, bias=True, norm="layernorm"),
        id="bias-layernorm",
    ),
    pytest.param(
        dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, norm_position="post"), id="post-ln"
    ),
    pytest.param(dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, norm="none"), id="no-norm"),
    pytest.param(dict(n_layer=1, n_head=3, n_embd=24, block_size=1, vocab_size=50), id="T=1"),
    pytest.param(dict(n_layer=3, n_head=1, n_embd=8, block_size=40, vocab_size=30), id="T>C"),
    # rotary positions: no table to look up; a SwiGLU MLP and GQA's narrower k and v
    pytest.param(
        dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=16, vocab_size=64), id="llama"
    ),
    # an untied head: the token embedding is then only looked up, the head a matmul of its own
    pytest.param(
        dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, tie_embeddings=False), id="untied-head"
    ),
]


@pytest.mark.parametrize("kwargs", SHAPES)
def test_parameters_follow_the_model(kwargs, monkeypatch):
    monkeypatch.setattr(GPT, "_init_weights", lambda self, module: None)  # the count needs no particular values
    gpt_config = ArmsConfig(**kwargs)  # arms.py's Post-LN and no norm among them
    N = ArmedGPT(gpt_config).num_params()
    counted = closed_forms.parameters_on_rank(gpt_config)
    assert counted == N, f"the closed form counts the model's parameters: expected {N}, got {counted}"


def attention_by_matmuls(q, k, v, dropout_p):
    """model.causal_attention as two plain matmuls, which torch's FLOP counter sees (the fused kernel
    it replaces is not counted on a CPU); the (T, T) square is computed whole, the mask applied after."""
    T = q.shape[-2]
    k, v = grouped_heads(k, q.size(1)), grouped_heads(v, q.size(1))  # GQA: (B, H, T, C/H)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v  # (B, H, T, C/H)


@pytest.mark.parametrize("kwargs", SHAPES)
def test_flops_per_token_counts_the_matmuls_of_forward_and_backward(kwargs, monkeypatch):
    """torch counts the FLOPs of every matmul of one forward and backward over full rows of block_size
    tokens: the weights' 6 per parameter and attention's 12 L C T. 6 N also counts the norms' and biases'
    vectors, which do no matmul; N leaves out only what is looked up: learned positions (none under rotary ones),
    and the token embedding when the head is a matrix of its own."""
    monkeypatch.setattr(CausalSelfAttention, "kernel", staticmethod(attention_by_matmuls))
    monkeypatch.setattr(GPT, "_init_weights", lambda self, module: None)  # FLOPs do not depend on the values
    gpt_config = ArmsConfig(**kwargs)  # arms.py's Post-LN and no norm among them
    gpt = ArmedGPT(gpt_config)
    idx = torch.randint(gpt_config.vocab_size, (2, gpt_config.block_size), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        logits, _ = gpt(idx)
        logits.pow(2).mean().backward()
    matmuls = counter.get_total_flops() / idx.numel()
    vectors = sum(p.numel() for p in gpt.parameters() if p.dim() == 1)  # norm weights and biases
    want, got = matmuls + 6 * vectors, closed_forms.flops_per_token(gpt_config)
    L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
    assert got == want, (
        f"FLOPs per token of {kwargs}: the matmuls of forward and backward count {matmuls:.0f} "
        f"(of which attention's 12 L C T = {12 * L * C * T}), plus 6 x {vectors} norm and bias "
        f"parameters: expected {want:.0f}, got {got}"
    )


def test_gpt2_small_costs_nanogpts_855_mflops_per_token():
    """GPT-2 small (124,439,808 parameters, nanoGPT's 123.65M without the 1024 x 768 positions) at T = 1024:
    6 x 123,653,376 + 12 x 12 layers x 768 x 1024 = 855,166,464 FLOPs per token, nanoGPT's estimate_mfu."""
    gpt2 = GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257, bias=True, norm="layernorm")
    want = 6 * 123_653_376 + 12 * 12 * 768 * 1024
    got = closed_forms.flops_per_token(gpt2)
    assert got == want, (
        f"GPT-2 small: 6 N = {6 * 123_653_376} plus attention 12 L C T = {12 * 12 * 768 * 1024}: "
        f"expected {want}, got {got}"
    )


def test_gpt3_175b_on_300b_tokens_is_3_14e23_flops():
    flops = account("--model", "175B", "--tokens", "300B", "--gpu", "A100", "--gpus", "1024").train_flops
    assert flops == pytest.approx(3.14e23, rel=0.05), (
        f"GPT-3 175B on 300B tokens, the paper's 3.14e23 FLOPs within 5%: expected 3.14e23, got {flops:.3g}"
    )


@pytest.mark.parametrize("model, published", [("70B", 1_720_320), ("7B", 184_320)])
def test_llama2_gpu_hours_on_a100s(model, published):
    """Llama 2's paper reports A100-80GB GPU-hours for 2T tokens; at 40% MFU the account lands within 30%."""
    r = account("--model", model, "--tokens", "2T", "--gpu", "A100", "--gpus", "2048", "--mfu", "0.4")
    assert r.gpu_hours == pytest.approx(published, rel=0.3)
    assert r.cost_usd == pytest.approx(2.0 * r.gpu_hours)


def test_100b_parameters_hold_1_6_tb_of_state():
    gpt_config = GPTConfig(n_layer=80, n_head=80, n_embd=10240, block_size=2048, vocab_size=50257)
    assert closed_forms.parameters_on_rank(gpt_config) == pytest.approx(100e9, rel=0.02)
    assert 16 * closed_forms.parameters_on_rank(gpt_config) == pytest.approx(1.6e12, rel=0.02)


def test_state_is_cut_by_tp_times_pp():
    gpt_config = cost.MODELS["7B"].gpt_config
    whole = closed_forms.memory_per_gpu(gpt_config, Layout(), 1, 1).state
    for tp, pp in [(2, 1), (1, 2), (4, 2), (8, 4)]:
        # the first stage also holds the embedding and the positions: a little more than its share
        assert (
            whole / (tp * pp)
            <= closed_forms.memory_per_gpu(gpt_config, Layout(tp=tp, pp=pp), 1, 1).state
            <= 1.2 * whole / (tp * pp)
        )
    # full recomputation keeps only each layer's input
    assert (
        closed_forms.memory_per_gpu(gpt_config, Layout(tp=8, recompute=True), 1, 1).activations
        < closed_forms.memory_per_gpu(gpt_config, Layout(tp=8), 1, 1).activations / 5
    )


def test_zero_shares_the_state_out_over_dp_and_the_planner_uses_it():
    gpt_config = cost.MODELS["7B"].gpt_config
    held = closed_forms.fullest_rank_parameters(gpt_config, Layout(tp=2, pp=2))
    for dp in (1, 2, 8):
        # plain DP: every rank holds it all
        assert closed_forms.memory_per_gpu(gpt_config, Layout(dp=dp, tp=2, pp=2), 1, 1).state == 16 * held
        assert (
            closed_forms.memory_per_gpu(gpt_config, Layout(dp=dp, tp=2, pp=2, zero=1), 1, 1).state
            == (4 + 4 + 8 / dp) * held
        )
        assert (
            closed_forms.memory_per_gpu(gpt_config, Layout(dp=dp, tp=2, pp=2, zero=2), 1, 1).state
            == (4 + 12 / dp) * held
        )
    assert closed_forms.state_bytes_formula(4, 2) == "4 + 12/4 = 7 B"
    # the planner: less memory on every layout with data parallelism; a pipeline's layouts get ZeRO-1 when ZeRO-2 is
    # asked (train.py refuses the two together), a layout without one ZeRO-2
    plain, zero2 = (account("--model", "70B", "--gpu", "H100", "--gpus", "64", "--zero", z) for z in ("0", "2"))
    plain_memory = {replace(p.layout, zero=0): p.memory_gb_per_gpu for p in plain.layouts}
    assert all(p.memory_gb_per_gpu < plain_memory[replace(p.layout, zero=0)] for p in zero2.layouts if p.layout.dp > 1)
    hw = planner.GPUS["H100"]

    def memory(dp, tp, pp, zero):
        return planner.plan_layout(gpt_config, hw, Layout(dp=dp, tp=tp, pp=pp, zero=zero), 64, 1, 0.4).memory_gb_per_gpu

    assert memory(4, 2, 2, 2) == memory(4, 2, 2, 1) < memory(4, 2, 2, 0)
    assert memory(4, 2, 1, 2) < memory(4, 2, 1, 1) < memory(4, 2, 1, 0)


def test_the_planner_ranks_layouts_that_fit_first_and_keeps_tp_in_a_node():
    r = account("--model", "70B", "--tokens", "2T", "--gpu", "H100", "--gpus", "1024")
    layouts = r.layouts
    assert len(layouts) > 10 and all(p.layout.world_size == 1024 for p in layouts)
    fits = [p.fits for p in layouts]
    assert fits == sorted(fits, reverse=True)  # every layout that fits before any that does not
    fitting = [p for p in layouts if p.fits]
    assert [p.step_seconds for p in fitting] == sorted(p.step_seconds for p in fitting)
    assert fitting[0].layout.tp <= 8  # a TP group across nodes pays the slow network at every layer
    best = fitting[0]  # ZeRO-1 shards the 8 B of AdamW moments over dp: 16 B -> 8 + 8/dp
    assert r.zero1_state_gb_best_layout == pytest.approx(r.state_gb_best_layout * (8 + 8 / best.layout.dp) / 16)
    assert all(p.memory_gb_per_gpu <= 80 for p in fitting)
    for p in layouts:
        assert p.tokens_per_s == pytest.approx(r.batch_tokens / p.step_seconds)


def test_70b_does_not_fit_on_one_node_and_says_what_it_needs():
    result = run_script(["-m", "machinery.cost", "--model", "70B", "--gpu", "H100", "--gpus", "8"], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "does not fit on 8 x H100" in result.stdout and "tp x pp >= 16" in result.stdout


def test_json_has_the_fields_machines_read():
    # fmt: off
    result = run_script(
        [
            "-m", "machinery.cost",
            "--model", "70B", "--tokens", "2T", "--gpu", "A100", "--gpus", "2048", "--mfu", "0.4", "--json", ],
        cwd=ROOT,
    )
    # fmt: on
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    for key in ("params", "train_flops", "gpu_hours", "wall_days", "cost_usd", "layouts"):
        assert key in r
    for key in ("dp", "tp", "pp", "micro_batches", "fits", "memory_gb_per_gpu", "step_seconds", "tokens_per_s"):
        assert key in r["layouts"][0]


def test_this_cpu_is_measured_as_hardware():
    r = account("--model", "tiny", "--gpu", "cpu", "--gpus", "2", "--tokens", "1M")
    assert r.gpu == "cpu" and r.layouts and all(p.step_seconds > 0 for p in r.layouts)


def test_chinchilla_is_the_default_budget():
    r = account("--model", "124M", "--gpus", "1")
    assert r.tokens_per_param == pytest.approx(20)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "8B"], "--model '8B': choose one of"),
        (["--model", "7B", "--gpu", "B200"], "--gpu 'B200': choose one of"),
        (["--model", "tiny", "--gpus", "7"], "--gpus 7: no layout dp x tp x pp = 7"),  # 4 heads, 4 layers, 16 rows
        (["--model", "7B", "--tokens=-2T"], "--tokens -2T: must be positive"),
        (["--model", "7B", "--tokens", "lots"], "--tokens 'lots': give a number"),
        (["--model", "7B", "--mfu", "1.5"], "--mfu 1.5: a share of the peak"),
        (["--n_layer", "4"], "--n_head, --n_embd missing"),
    ],
)
def test_bad_input_is_named(argv, message, capsys):
    with pytest.raises(SystemExit) as refused:
        cost.main(argv)
    said = f"{capsys.readouterr().err}{refused.value.code}"  # argparse prints its refusals; ours are the exit text
    assert refused.value.code != 0 and message in said, said


def test_young_daly_interval_minimizes_the_time_lost():
    c = planner.checkpoint_economics(7e9, 1024, 10e9, 72000, 600)

    def lost(interval):
        return planner.share_of_time_lost(interval, c.save_seconds, c.cluster_mtbf_hours * 3600, 600)

    best = c.interval_minutes * 60
    assert lost(best) < lost(best * 0.7) and lost(best) < lost(best * 1.4)
    assert lost(best) == pytest.approx(c.goodput_lost)
    assert c.cluster_mtbf_hours == pytest.approx(72000 / 1024)
    assert c.interval_minutes == pytest.approx(math.sqrt(2 * 12 * 7e9 / 10e9 * 72000 * 3600 / 1024) / 60)


def test_account_lines_count_6nd():
    gpt_config = GPTConfig(block_size=64, vocab_size=256, n_layer=2, n_head=2, n_embd=32)
    lines = cost.account_lines(
        gpt_config, Layout(), 4, 1, max_iters=100, tokens_per_step=256, activation_bytes=4, step_seconds=0.01
    )
    flops = closed_forms.flops_per_token(gpt_config) * 100 * 256
    assert f"{flops:.3g} FLOPs" in lines[1] and f"6 N D = {6 * GPT(gpt_config).num_params() * 25600:.3g}" in lines[1]
    assert "~0.0 min for 100 steps" in lines[3]


def test_without_communication_the_bubble_is_the_formula():
    free = planner.Hardware("free links", 1e15, 1e12, float("inf"), float("inf"), 0.0, 8)
    gpt_config = cost.MODELS["1.3B"].gpt_config
    for pp, rows in [(2, 16), (4, 16), (4, 64)]:
        plan = planner.plan_layout(gpt_config, free, Layout(pp=pp), rows, 1, 0.5)
        assert plan.parts["bubble"] / plan.step_seconds == pytest.approx((pp - 1) / (rows + pp - 1))


def test_a_ring_all_reduce_costs_2_n_minus_1_over_n_of_the_message():
    hw = planner.Hardware("slow links", 1e30, 1e12, 1e9, 1e9, 0.0, 8)  # compute free: the step is communication
    gpt_config = cost.MODELS["1.3B"].gpt_config
    gradients = 4 * closed_forms.parameters_on_rank(gpt_config)
    for dp in (2, 4, 8):
        plan = planner.plan_layout(gpt_config, hw, Layout(dp=dp), 8 * dp, 8, 0.5)  # one micro-step: nothing to overlap
        assert plan.parts["dp"] == pytest.approx(2 * (dp - 1) / dp * gradients / 1e9)


def test_odd_shapes_are_answered_not_crashed(capsys):
    """A shape whose only cuts put TP across nodes, and one that no cut of up to 4096 devices fits."""
    cost.main(["--n_layer", "2", "--n_head", "64", "--n_embd", "57344", "--gpus", "32"])
    cost.main(["--n_layer", "1", "--n_head", "1", "--n_embd", "200000", "--gpus", "8"])
    assert "no cut of up to 4,096 devices fits it" in capsys.readouterr().out


@pytest.mark.parametrize("model, gqa", [("70B", True), ("7B", False)])
def test_context_parallelism_keeps_less_than_sequence_parallelism_by_the_kv_saving(model, gqa):
    """Cutting a sequence n ways: cp holds every activation at T/n positions plus the ring's K and V blocks, tp+sp
    leaves 4h of the norms' inputs whole; per position and layer cp keeps 4 (h - kv)(n - 1)/n bytes less (16-bit
    units), nothing less without GQA; TP without SP keeps the most; the state cp keeps is TP's times n."""
    gpt_config, n = cost.MODELS[model].gpt_config, 8
    h = gpt_config.n_embd
    kv = gpt_config.kv_width
    assert (kv < h) == gqa
    for row in planner.long_context_rows(gpt_config, n, [4096, 131072]):
        act = row["activations"]
        saving = 4 * (h - kv) * (n - 1) / n * row["T"] * gpt_config.n_layer  # bytes at 16 bits
        assert act["tp+sp"] - act["cp"] == pytest.approx(saving)  # the logits: T V / n positions-by-vocab on both
        assert act["tp"] > act["tp+sp"]
        assert row["state"]["cp"] > 7 * row["state"]["tp"]


def test_long_context_table_from_the_command_line(capsys):
    cost.main(["--model", "70B", "--long_context", "8"])
    out = capsys.readouterr().out
    assert "524,288" in out and "cp keeps 4 (h - kv)(n - 1)/n = 25,088 B" in out


@pytest.mark.parametrize(
    "layout",
    [
        Layout(dp=2, tp=2, pp=2, zero=1, micro_batches=4),
        Layout(tp=4, pp=2, sequence_parallel=True, recompute=True, micro_batches=2, virtual_stages=2),
        Layout(dp=2, cp=2, zero=2),
        Layout(dp=4, dp_mode="fsdp"),
    ],
    ids=["dp2-tp2-pp2-zero1", "tp4-sp-pp2-v2-recompute", "dp2-cp2-zero2", "fsdp4"],
)
def test_each_printed_formula_computes_the_bytes_it_stands_beside(layout):
    """A run prints each dimension's closed form as bytes = formula; the formula is the arithmetic that computed
    them, so evaluating the printed text with the values it names gives the bytes again, on every stage."""
    gpt_config = GPTConfig(block_size=64, vocab_size=101, n_layer=8, n_head=4, n_embd=32)
    for stage in range(layout.pp):
        sent = closed_forms.comm_bytes_per_step(
            gpt_config, layout, stage=stage, batch_size=8, accumulation=2, compute_bytes=2
        )
        for dimension, (bytes_, formula) in sent.items():
            if bytes_ == 0:
                assert formula == "none: a group of 1", (dimension, formula)
                continue
            terms, named = formula.rsplit(", ", 1)
            values = {name: int(value.replace(",", "")) for name, value in (kv.split("=") for kv in named.split())}
            arithmetic = re.sub(r" \([^()]*\)(?= \+ |$)", "", terms)  # each term's words dropped
            assert closed_forms.computed(arithmetic, **values) == bytes_, (dimension, formula)


def test_a_closed_forms_arithmetic_is_arithmetic_only():
    assert closed_forms.computed("A * (B + 2) // 3", A=4, B=1) == 4
    for text in ("__import__('os')", "A ** 2", "A.real", "[A]"):
        with pytest.raises(ValueError, match="is not arithmetic"):
            closed_forms.computed(text, A=2)
