"""Megatron-style tensor parallelism with real gloo processes: every slice does the single-device math."""

import contextlib
import copy
import traceback
from dataclasses import replace
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import train
from machinery.components import checkpoint
from machinery.job.local_ranks import run_ranks
from model import GPT, GPTConfig
from parallel.comm_count import take_comm_bytes
from parallel.grid import Layout, ProcessGrid, destroy_distributed, init_distributed
from parallel.layout import check_layout, model_for_rank
from parallel.optimizer import global_grad_norm
from parallel.tensor_parallel import (
    ColumnParallelLinear,
    CopyToTensorParallel,
    Cut,
    ReduceFromTensorParallel,
    RowParallelLinear,
    VocabParallelEmbedding,
)

# ----------------------------------------------------------------------------
# The pieces, each against its single-device twin: f, g, a column- and a row-parallel Linear, and the MLP
# they make. One run of real ranks per layout computes every piece; each test reads one property from it.

B, T, C, H = 2, 3, 5, 12  # batch, time, width (never cut, odd), hidden width (cut by tp: 12 = 2 x 6 = 4 x 3)
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "reduce")
NOTHING = (0, [])  # (tp bytes counted, collectives called)
ONE_ALL_REDUCE = (B * T * C * 4, [("all_reduce", (B, T, C))])  # of one (B, T, C) float32 tensor


def _pieces_case(dp, tp):
    """The single-device layers, and per DP replica its own inputs and the gradients that reach the outputs;
    parts: a different (B, T, C) tensor on each TP rank, for f's gradient and g's partial result."""
    torch.manual_seed(0)
    fc, proj = nn.Linear(C, H), nn.Linear(H, C)
    generator = torch.Generator().manual_seed(1)
    shapes = dict(x=(B, T, C), hidden=(B, T, H), out_grad=(B, T, C), hidden_grad=(B, T, H), parts=(tp, B, T, C))
    replicas = [{name: torch.randn(*shape, generator=generator) for name, shape in shapes.items()} for _ in range(dp)]
    return dict(fc=fc, proj=proj, replicas=replicas)


def _hidden_features(tp_rank, tp):
    """This rank's slice of the H hidden features: the column layer's outputs, the row layer's inputs."""
    return slice(tp_rank * H // tp, (tp_rank + 1) * H // tp)


def _calls(spies):
    """[(collective, shape of its tensor)] the spies saw since the last look; they start again."""
    calls = []
    for name, spy in spies.items():
        for call in spy.call_args_list:
            tensor = next(a for a in (*call.args, *call.kwargs.values()) if torch.is_tensor(a))
            calls.append((name, tuple(tensor.shape)))
        spy.reset_mock()
    return sorted(calls)


def _measured(what, forward, x, out_grad, module=None):
    """forward(x) on this rank and its backward from out_grad: the output, the gradients of x and of the
    module's parameters (None where none arrived), and per direction (tp bytes counted, collectives called)."""
    x = x.clone().requires_grad_()
    try:
        with contextlib.ExitStack() as stack:
            spies = {
                name: stack.enter_context(mock.patch.object(dist, name, wraps=getattr(dist, name)))
                for name in COLLECTIVES
            }
            take_comm_bytes()  # count from here
            y = forward(x)
            sent = {"forward": (take_comm_bytes()["tp"], _calls(spies))}
            assert y.shape == out_grad.shape, (
                f"{what}: expected an output of shape {tuple(out_grad.shape)}, got {tuple(y.shape)}"
            )
            y.backward(out_grad.clone())  # a copy: f's backward may all-reduce the gradient it is handed in place
            sent["backward"] = (take_comm_bytes()["tp"], _calls(spies))
    except AssertionError:
        raise
    except Exception as e:  # a rank reports one line: name the piece and the line of tensor_parallel.py that raised
        frames = traceback.extract_tb(e.__traceback__)
        lines = [frame.lineno for frame in frames if frame.filename.endswith("tensor_parallel.py")]
        where = f" at tensor_parallel.py line {lines[-1]}" if lines else ""
        raise RuntimeError(f"{what} raised{where}: {type(e).__name__}: {e}") from e
    parameters = {} if module is None else dict(module.named_parameters())
    as_numpy = {name: None if p.grad is None else p.grad.numpy() for name, p in parameters.items()}
    return dict(out=y.detach().numpy(), x_grad=None if x.grad is None else x.grad.numpy(), grads=as_numpy, sent=sent)


def _pieces_on_rank(case, dp, tp):
    """On each rank, with its slices of the single-device weights: f, g, the column- and the row-parallel
    Linear alone, and the MLP column -> GELU -> row with and without biases."""
    launch = init_distributed(20)
    grid = ProcessGrid(Layout(dp=dp, tp=tp), launch.rank, launch.world_size)
    group, replica, mine = grid.tp_group, case["replicas"][grid.dp_rank], _hidden_features(grid.tp_rank, tp)
    fc, proj = case["fc"], case["proj"]

    def parameter(tensor):
        return nn.Parameter(tensor.detach().clone())

    def column(bias):  # W cut by rows (output features), the bias like them
        return ColumnParallelLinear(
            parameter(fc.weight[mine]), parameter(fc.bias[mine]) if bias else None, group, Cut(dim=0)
        )

    def row(bias):  # W cut by columns (input features), the bias whole
        return RowParallelLinear(parameter(proj.weight[:, mine]), parameter(proj.bias) if bias else None, group)

    part = replica["parts"][grid.tp_rank]
    got = {
        "f": _measured("f", lambda x: CopyToTensorParallel.apply(x, group), replica["x"], part),
        # g's input is a partial result (here a copy of this rank's part), as F.linear's output is in the layer
        "g": _measured("g", lambda x: ReduceFromTensorParallel.apply(x.clone(), group), part, replica["out_grad"]),
    }
    layer = column(bias=True)
    got["column"] = _measured(
        "the column-parallel Linear", layer, replica["x"], replica["hidden_grad"][..., mine], layer
    )
    layer = row(bias=True)
    got["row"] = _measured("the row-parallel Linear", layer, replica["hidden"][..., mine], replica["out_grad"], layer)
    for bias in (True, False):
        mlp = nn.Sequential(column(bias), nn.GELU(), row(bias))  # parameters 0.weight, 0.bias, 2.weight, 2.bias
        got[f"mlp bias={bias}"] = _measured(
            f"column -> GELU -> row with bias={bias}", mlp, replica["x"], replica["out_grad"], mlp
        )
    destroy_distributed()
    return got


@pytest.fixture(scope="module", params=[(1, 2), (1, 4), (2, 2)], ids=["tp=2", "tp=4", "dp=2,tp=2"])
def pieces(request):
    """(tp, the case, run_ranks' outcome) of one run of dp x tp ranks: two TP groups side by side under dp=2."""
    dp, tp = request.param
    case = _pieces_case(dp, tp)
    return tp, case, run_ranks(dp * tp, _pieces_on_rank, case, dp, tp, timeout=90)


def _ranks(pieces):
    """("rank r", its replica's data, its hidden features, its values) for every rank, once every rank finished."""
    tp, case, outcome = pieces
    stopped = []
    for rank, (status, value) in sorted(outcome.items()):
        if status != "ok":
            first_line = str(value).partition("\n")[0]  # the error in its own words, without pytest's account
            stopped.append(f"rank {rank} ({status}): {first_line}")
    assert not stopped, "every rank runs the pieces to the end, but " + "; ".join(stopped)
    return [
        (f"rank {rank}", case["replicas"][rank // tp], _hidden_features(rank % tp, tp), value)
        for rank, (_, value) in sorted(outcome.items())
    ]


def _single_device(module, x, out_grad):
    """The single-device twin: module(x) and its backward from out_grad, on a copy; (output, x's gradient, module)."""
    module, x = copy.deepcopy(module), x.clone().requires_grad_()
    y = module(x)
    y.backward(out_grad)
    return y.detach(), x.grad, module


def _first_values(tensor):
    """The first four values, for a message: enough to see a factor of tp or a sign."""
    values = ", ".join(f"{v:.4g}" for v in tensor.flatten()[:4].tolist())
    return f"[{values}{', ...' if tensor.numel() > 4 else ''}]"


def _assert_close(got, want, what):
    """A rank's tensor (numpy, None for a gradient that never arrived) equals the single-device value."""
    assert got is not None, f"{what}: expected a tensor of shape {tuple(want.shape)}, got None (no gradient)"
    got = torch.from_numpy(got)
    assert got.shape == want.shape, f"{what}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}"
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (
        f"{what}: expected {_first_values(want)}, got {_first_values(got)} "
        f"(largest difference {(got - want).abs().max().item():.3g})"
    )


def _assert_sent(sent, direction, want, what):
    """The collectives one direction called, and the tp bytes comm_count.counted saw, are want's."""
    bytes_counted, calls = sent[direction]
    assert calls == want[1], f"{what}: expected the collectives {want[1] or 'none'}, got {calls or 'none'}"
    assert bytes_counted == want[0], (
        f"{what}: expected {want[0]} tp bytes counted (hand the tensor through counted('tp', ...)), got {bytes_counted}"
    )


def test_f_is_the_identity_forward_and_sums_the_gradients_backward(pieces):
    for rank, replica, _, got in _ranks(pieces):
        f = got["f"]
        _assert_close(f["out"], replica["x"], f"{rank}: f's forward returns its input unchanged")
        _assert_close(
            f["x_grad"],
            replica["parts"].sum(0),
            f"{rank}: f's backward is the sum of every TP rank's gradient (and only its TP group's)",
        )
        _assert_sent(f["sent"], "forward", NOTHING, f"{rank}: f communicates nothing in forward")
        _assert_sent(f["sent"], "backward", ONE_ALL_REDUCE, f"{rank}: f all-reduces the (B, T, C) gradient once")


def test_g_sums_the_partial_results_forward_and_passes_the_gradient_back(pieces):
    for rank, replica, _, got in _ranks(pieces):
        g = got["g"]
        _assert_close(
            g["out"],
            replica["parts"].sum(0),
            f"{rank}: g's forward is the sum of every TP rank's partial result (and only its TP group's)",
        )
        _assert_close(g["x_grad"], replica["out_grad"], f"{rank}: g's backward passes the gradient on unchanged")
        _assert_sent(g["sent"], "forward", ONE_ALL_REDUCE, f"{rank}: g all-reduces the (B, T, C) output once")
        _assert_sent(g["sent"], "backward", NOTHING, f"{rank}: g communicates nothing in backward")


def test_column_parallel_linear_computes_this_ranks_output_features(pieces):
    _, case, _ = pieces
    for rank, replica, mine, got in _ranks(pieces):
        y, x_grad, fc = _single_device(case["fc"], replica["x"], replica["hidden_grad"])
        column = got["column"]
        _assert_close(
            column["out"],
            y[..., mine],
            f"{rank}: the column-parallel output is this rank's slice of the output features, X W_i^T + b_i",
        )
        _assert_close(column["x_grad"], x_grad, f"{rank}: the input's gradient arrives whole (f sums the ranks' parts)")
        _assert_close(column["grads"]["weight"], fc.weight.grad[mine], f"{rank}: the gradient of this rank's rows of W")
        _assert_close(column["grads"]["bias"], fc.bias.grad[mine], f"{rank}: the gradient of this rank's slice of b")
        _assert_sent(
            column["sent"], "forward", NOTHING, f"{rank}: the column-parallel Linear communicates nothing in forward"
        )
        _assert_sent(
            column["sent"],
            "backward",
            ONE_ALL_REDUCE,
            f"{rank}: the column-parallel Linear all-reduces the input's gradient once in backward (f)",
        )


def test_row_parallel_linear_sums_partial_products_and_adds_its_bias_once(pieces):
    _, case, _ = pieces
    for rank, replica, mine, got in _ranks(pieces):
        y, x_grad, proj = _single_device(case["proj"], replica["hidden"], replica["out_grad"])
        row = got["row"]
        _assert_close(
            row["out"], y, f"{rank}: the row-parallel output is the whole sum_i X_i W_i^T + b, the bias added once"
        )
        _assert_close(row["x_grad"], x_grad[..., mine], f"{rank}: the gradient of this rank's input features")
        _assert_close(
            row["grads"]["weight"], proj.weight.grad[:, mine], f"{rank}: the gradient of this rank's columns of W"
        )
        _assert_close(row["grads"]["bias"], proj.bias.grad, f"{rank}: the gradient of the whole bias, on every rank")
        _assert_sent(
            row["sent"],
            "forward",
            ONE_ALL_REDUCE,
            f"{rank}: the row-parallel Linear all-reduces its partial output once in forward (g)",
        )
        _assert_sent(
            row["sent"], "backward", NOTHING, f"{rank}: the row-parallel Linear communicates nothing in backward"
        )


@pytest.mark.parametrize("bias", [True, False], ids=["biases", "no biases"])
def test_column_then_row_equals_the_single_device_mlp(pieces, bias):
    _, case, _ = pieces
    fc, proj = copy.deepcopy(case["fc"]), copy.deepcopy(case["proj"])
    if not bias:
        fc.bias = proj.bias = None
    for rank, replica, mine, got in _ranks(pieces):
        y, x_grad, single = _single_device(nn.Sequential(fc, nn.GELU(), proj), replica["x"], replica["out_grad"])
        mlp = got[f"mlp bias={bias}"]
        _assert_close(mlp["out"], y, f"{rank}: the MLP's output, whole on every rank")
        _assert_close(mlp["x_grad"], x_grad, f"{rank}: the MLP input's gradient, whole on every rank")
        want = {"0.weight": single[0].weight.grad[mine], "2.weight": single[2].weight.grad[:, mine]}
        if bias:
            want.update({"0.bias": single[0].bias.grad[mine], "2.bias": single[2].bias.grad})
        for name, grad in want.items():
            _assert_close(mlp["grads"].get(name), grad, f"{rank}: the gradient of this rank's part of {name}")


def test_column_then_row_communicates_one_all_reduce_each_way(pieces):
    for rank, _, _, got in _ranks(pieces):
        for bias in (True, False):
            sent, where = got[f"mlp bias={bias}"]["sent"], f"{rank}, bias={bias}"
            _assert_sent(sent, "forward", ONE_ALL_REDUCE, f"{where}: the MLP's forward is one all-reduce (g)")
            _assert_sent(sent, "backward", ONE_ALL_REDUCE, f"{where}: the MLP's backward is one all-reduce (f)")


# ----------------------------------------------------------------------------
# The whole model


def _compare_with_single_device(cfg_kwargs, tp):
    """On each rank: the TP model's logits, loss, grads (gathered) and clipped norm vs the single-device model."""
    launch = init_distributed(30)
    grid = ProcessGrid(Layout(tp=tp), launch.rank, launch.world_size)
    gpt_config = GPTConfig(**cfg_kwargs)
    torch.manual_seed(0)
    single = GPT(gpt_config)
    torch.manual_seed(0)
    model = model_for_rank(GPT(gpt_config), grid, Layout(tp=tp), 3)
    sliced = model.module
    x = torch.randint(gpt_config.vocab_size, (3, gpt_config.block_size), generator=torch.Generator().manual_seed(1))
    y = torch.randint(gpt_config.vocab_size, (3, gpt_config.block_size), generator=torch.Generator().manual_seed(2))
    logits, loss = single(x, y)
    loss.backward()
    local_logits, tp_loss = sliced(x, y)
    tp_loss.backward()
    result = {"loss": (tp_loss.item(), loss.item())}
    # the logits: this rank's vocabulary slice
    V_local = local_logits.shape[-1]
    start = grid.tp_rank * V_local
    width = min(V_local, gpt_config.vocab_size - start)
    torch.testing.assert_close(local_logits[..., :width], logits[..., start : start + width])
    grads = dict(single.named_parameters())
    for name, p, cut in model.local_parameters():
        torch.testing.assert_close(checkpoint.gather_whole(p.grad, cut, grid), grads[name].grad, msg=name)
    full = checkpoint.full_state_dict(model)
    assert list(full) == list(single.state_dict())
    for name, value in single.state_dict().items():
        torch.testing.assert_close(full[name], value, msg=name)
    norm = model.grad_norm()
    reference = global_grad_norm([], [p.grad for p in single.parameters()])
    train.clip_gradients(sliced.parameters(), norm, 0.5)
    train.clip_gradients(single.parameters(), reference, 0.5)
    for name, p, cut in model.local_parameters():  # clipped by the same factor as the single-device gradient
        torch.testing.assert_close(checkpoint.gather_whole(p.grad, cut, grid), grads[name].grad, msg=name)
    result["norm"] = (norm.item(), reference.item())
    # the sliced layers hold exactly 1/tp of the parameters
    counts = []
    for module_name, module in sliced.named_modules():
        if (
            isinstance(module, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding))
            and module_name != "lm_head"
        ):
            counts.append((module.weight.numel(), dict(single.named_parameters())[f"{module_name}.weight"].numel()))
    result["counts"] = counts
    destroy_distributed()
    return result


@pytest.mark.parametrize(
    "tp, cfg",
    [
        (2, dict(block_size=16, vocab_size=256, n_layer=2, n_head=4, n_embd=32)),
        (4, dict(block_size=16, vocab_size=256, n_layer=2, n_head=4, n_embd=32)),
        (3, dict(block_size=16, vocab_size=256, n_layer=1, n_head=3, n_embd=24)),  # V padded to 258, masked
    ],
    ids=["tp2", "tp4", "tp3-padded-vocab"],
)
def test_tensor_parallel_equals_single_device(tp, cfg):
    outcome = run_ranks(tp, _compare_with_single_device, cfg, tp, timeout=120)
    for rank, (status, result) in outcome.items():
        assert status == "ok", outcome
        assert result["loss"][0] == pytest.approx(result["loss"][1], rel=1e-5)
        assert result["norm"][0] == pytest.approx(result["norm"][1], rel=1e-5)
        padding = (-cfg["vocab_size"]) % tp * cfg["n_embd"]  # the embedding's padding rows, if V % tp
        assert len(result["counts"]) == 4 * cfg["n_layer"] + 1
        for local, whole in result["counts"]:
            assert local * tp - whole in (0, padding)  # exactly 1/tp of each sliced matrix


def test_bad_layouts_are_named_before_any_process_group(tmp_path, capsys):
    with pytest.raises(ValueError, match="n_head 6 is not divisible by tp 4"):
        check_layout(Layout(tp=4), GPTConfig(n_head=6, n_embd=96), 12, 4, torch.float32)
    with pytest.raises(SystemExit) as exit_info:  # no launcher, no process group: it must not wait for peers
        train.main(["--tp", "8", "--out_dir", str(tmp_path / "o"), "--data_dir", str(tmp_path / "d")])
    assert "n_head 4 is not divisible by tp 8" in str(exit_info.value.code)
    with pytest.raises(ValueError, match="--sequence_parallel cuts along the sequence .* and --tp is 1: pass --tp 2"):
        check_layout(Layout(sequence_parallel=True), GPTConfig(), 12, 1, torch.float32)
    with pytest.raises(ValueError, match="block_size 30 is not divisible by 4: choose --block_size a multiple of 4"):
        check_layout(Layout(tp=4, sequence_parallel=True), GPTConfig(block_size=30), 12, 4, torch.float32)


@pytest.mark.parametrize(
    "cut",
    [Cut(dim=0), Cut(dim=1), Cut(dim=0, sections=(6, 3, 3)), Cut(dim=0, rows=10)],
    ids=["rows", "columns", "qkv-blocks-gqa", "padded-vocab"],
)
@pytest.mark.parametrize("tp", [2, 3, 4])
def test_cut_shard_then_unshard_is_the_identity(cut, tp):
    cut = replace(cut, sections=tuple(size * tp for size in cut.sections))  # each block's rows divisible by tp
    full = torch.randn(10 if cut.rows else 12 * tp, 6 * tp)
    shards = [cut.shard(full, SimpleNamespace(tp=tp, tp_rank=rank)) for rank in range(tp)]
    assert len({s.shape for s in shards}) == 1  # equal slices: what all_gather needs
    assert torch.equal(cut.join(shards), full)


def _activations_per_block(sequence_parallel, arch):
    """On a rank of tp 2: the bytes autograd keeps for one more block (3 blocks against 2)."""
    from machinery.health.monitor import SavedActivations

    launch = init_distributed(60)
    grid = ProcessGrid(Layout(tp=2), launch.rank, launch.world_size)
    kept = []
    for n_layer in (2, 3):
        torch.manual_seed(0)
        gpt_config = GPTConfig(n_layer=n_layer, n_head=4, n_embd=128, block_size=64, vocab_size=256, arch=arch)
        model, tokens = (
            model_for_rank(GPT(gpt_config), grid, Layout(tp=2, sequence_parallel=sequence_parallel), 8),
            torch.randint(256, (8, 64)),
        )
        with SavedActivations(model.module) as saved:
            model.forward_backward(tokens, tokens, 1.0)
        kept.append(saved.peak)
    destroy_distributed()
    return kept[1] - kept[0]


@pytest.mark.integration
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_sequence_parallelism_cuts_the_norm_regions_as_the_closed_form_says(arch):
    """Per block on tp 2: the planner's activation bytes (fp32, as measured) with and without --sequence_parallel,
    each within 25% of what autograd keeps; the difference is the norms' tensors, halved."""
    from machinery.planning import closed_forms

    B, T, C = 8, 64, 128
    measured, planned = {}, {}
    for sp in (False, True):
        measured[sp] = run_ranks(2, _activations_per_block, sp, arch, timeout=120)[0][1]
        blocks = [GPTConfig(n_layer=n, n_head=4, n_embd=C, block_size=T, vocab_size=256, arch=arch) for n in (2, 3)]
        two, three = (
            closed_forms.memory_per_gpu(g, Layout(tp=2, sequence_parallel=sp), B, 1, activation_bytes=4) for g in blocks
        )
        planned[sp] = three.activations - two.activations
        assert measured[sp] / planned[sp] == pytest.approx(1, abs=0.25)
    # each norm keeps its input and output (B, T, C) and the inverse root (B, T, 1), fp32; two norms a block, each
    # of them T/2 positions under SP
    assert measured[False] - measured[True] == 2 * B * (T // 2) * (2 * C + 1) * 4
