"""torch's engines (torch_engines.py: --dp_mode ddp, DistributedDataParallel; --dp_mode fsdp, FSDP2) take the
single process's steps, as our hand-written DP does; an FSDP2 checkpoint is in single-device form."""

import json
import shutil

import pytest
import torch
from conftest import write_word_corpus

import train
from machinery.components import checkpoint
from machinery.job.config import parse_args
from machinery.job.local_ranks import results_of, run_ranks
from machinery.planning import closed_forms

# fp32: the engines agree with one process to rounding (bf16 would round differently split matmuls differently)
# fmt: off
MODEL = [
    "--dtype", "float32", "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32",
    "--max_iters", "12", "--warmup_iters", "4", "--learning_rate", "3e-3", "--log_interval", "1",
    "--eval_interval", "6", "--eval_iters", "2", "--ckpt_interval", "5", "--max_new_tokens", "5",
    "--num_samples", "1", "--plot", "false", "--dist_timeout", "30",
]
# fmt: on


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    write_word_corpus(root / "corpus.txt", 3000)
    return root


def args(corpus, out, *extra):
    # fmt: off
    return [
        "--source", str(corpus / "corpus.txt"), "--data_dir", str(corpus / "data"), "--out_dir", str(out),
        *MODEL, *map(str, extra),
    ]
    # fmt: on


@pytest.fixture(scope="module")
def single(corpus):
    """The reference: one process, 8 sequences per step (it prepares the data, before any ranks start)."""
    out = corpus / "single"
    train.main(args(corpus, out, "--batch_size", 8))
    return out


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train_ranks(world_size, argv):
    outcome = run_ranks(world_size, train.main, argv, timeout=120)
    assert all(status == "ok" for status, _ in outcome.values()), f"every rank trains to the end: {outcome}"


def assert_takes_the_same_steps(out, reference, what):
    """Every logged loss within a relative 2e-4 of the reference's, grad norms and val losses alike, and
    the same final weights (fp32 tolerance)."""
    got, want = metrics(out), metrics(reference)
    steps = [r["step"] for r in want]
    assert [r["step"] for r in got] == steps, f"{what}: logs steps {steps}, got {[r['step'] for r in got]}"
    for key in ("loss", "grad_norm", "val_loss"):
        for a, b in zip(got, want):
            if key in b:
                assert abs(a[key] - b[key]) <= 2e-4 * abs(b[key]), (
                    f"{what}: step {b['step']}'s {key} is the single process's {b[key]:.6f} within 2e-4 "
                    f"(relative), got {a[key]:.6f}"
                )
    (_, mine), (_, theirs) = checkpoint.load_latest(out / "ckpt"), checkpoint.load_latest(reference / "ckpt")
    assert mine["step"] == theirs["step"] == 12, f"{what}: both end at step 12: {mine['step']}, {theirs['step']}"
    for name, weight in theirs["model"].items():
        torch.testing.assert_close(mine["model"][name], weight, rtol=1e-4, atol=1e-5, msg=f"{what}: {name}")


@pytest.mark.parametrize("dp_mode", ["ddp", "fsdp"])
@pytest.mark.parametrize("extra", [["--batch_size", 4], ["--batch_size", 2, "--gradient_accumulation_steps", 2]])
def test_torch_engine_takes_the_single_process_steps(corpus, single, dp_mode, extra):
    """dp 2 under DDP or FSDP2, with and without gradient accumulation (only the last micro-batch syncs), takes
    the single process's steps. Every run also times a step of unsynced backwards first (reporting.print_cost_account),
    whose gradients clear_gradients must drop. The DP bytes counted per step are cost.py's closed form: DDP's
    buckets and FSDP2's reduce-scatter both hand over the gradient of every parameter once."""
    out = corpus / f"{dp_mode}-{'-'.join(map(str, extra))}"
    argv = args(corpus, out, "--dp", 2, "--dp_mode", dp_mode, *extra)
    train_ranks(2, argv)
    assert_takes_the_same_steps(out, single, f"--dp 2 --dp_mode {dp_mode} {' '.join(map(str, extra))}")
    _, _, configs = parse_args(argv)
    closed_form, _ = closed_forms.busiest_stage_comm_bytes(
        configs.model,
        configs.parallel,
        batch_size=configs.train.batch_size,
        accumulation=configs.train.gradient_accumulation_steps,
        compute_bytes=4,
    )["dp"]
    counted = [r["comm_bytes_dp"] for r in metrics(out)[:-1]]  # the last record holds the final check only
    assert counted == [closed_form] * len(counted), f"{dp_mode}: {closed_form:,} B per step, got {counted}"
    # the state a rank holds at the first update: DDP all 16 B per parameter, FSDP2 (ZeRO-3) 16/dp
    (state,) = [r["state_bytes"] for r in metrics(out) if "state_bytes" in r]
    assert state == closed_forms.fullest_rank_state_bytes(configs.model, configs.parallel), f"{dp_mode}: {state:,} B"


def test_an_fsdp_checkpoint_resumes_on_one_process_and_back(corpus, single):
    """A single-device checkpoint, both ways: an FSDP2 dp 2 run killed at step 8 goes on from its step-5
    checkpoint on one process; one process's step-5 checkpoint goes on under FSDP2. Both take the losses of
    the uninterrupted run: weights and AdamW's moments crossed over whole."""
    killed = corpus / "fsdp-killed"
    outcome = run_ranks(
        2, train.main, args(corpus, killed, "--dp", 2, "--dp_mode", "fsdp", "--batch_size", 4, "--inject", "crash@8")
    )
    assert outcome[1] == ("missing", -9), f"the last rank is SIGKILLed at step 8: {outcome}"
    train.main(args(corpus, killed, "--batch_size", 8))
    assert_takes_the_same_steps(killed, single, "fsdp dp 2 -> 1 process")

    to_fsdp = corpus / "single-to-fsdp"
    shutil.copytree(single, to_fsdp)
    for step in checkpoint.list_steps(to_fsdp / "ckpt"):
        if step > 5:
            shutil.rmtree(checkpoint.step_path(to_fsdp / "ckpt", step))
    train_ranks(2, args(corpus, to_fsdp, "--dp", 2, "--dp_mode", "fsdp", "--batch_size", 4))
    assert_takes_the_same_steps(to_fsdp, single, "1 process -> fsdp dp 2")


@pytest.mark.parametrize("dp_mode, flags", [("fsdp", ["--tp", 2]), ("ddp", ["--pp", 2])])
def test_torch_engines_refuse_tensor_and_pipeline_parallelism(corpus, dp_mode, flags):
    with pytest.raises(SystemExit) as refused:
        train.main(args(corpus, corpus / "refused", "--dp", 1, "--dp_mode", dp_mode, *flags, "--batch_size", 8))
    message = str(refused.value.code)
    for named in (f"--dp_mode {dp_mode}", "--tp 1 --pp 1", " ".join(map(str, flags))):
        assert named in message, f"the refusal names {named!r}: {message}"


def _replicas_after_wrapping(dp_mode):
    """Each rank builds its GPT from its own seed, then wraps it: the weights every rank then holds, whole."""
    from machinery.job.torch_engines import DDPModel, FSDPModel
    from model import GPT, GPTConfig
    from parallel.grid import Layout, ProcessGrid, destroy_distributed, init_distributed

    launch = init_distributed(30)
    grid = ProcessGrid(Layout(dp=2), launch.rank, launch.world_size)
    torch.manual_seed(launch.rank)
    gpt = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16))
    rank0_weights = {name: p.detach().clone() for name, p in gpt.named_parameters()} if launch.rank == 0 else None
    model = DDPModel(gpt, grid) if dp_mode == "ddp" else FSDPModel(gpt, grid)
    held = {name: w.tolist() for name, w in checkpoint.full_state_dict(model).items()}
    destroy_distributed()
    return held, rank0_weights and {name: w.tolist() for name, w in rank0_weights.items()}


@pytest.mark.parametrize("dp_mode", ["ddp", "fsdp"])
def test_replicas_start_from_dp_rank_0s_weights(dp_mode):
    (held0, rank0_weights), (held1, _) = results_of(run_ranks(2, _replicas_after_wrapping, dp_mode, timeout=60))
    for name, weight in rank0_weights.items():
        assert held0[name] == weight == held1[name], f"{dp_mode}: {name} on both ranks is DP rank 0's initial weight"
