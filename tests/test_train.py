import ast
import json
import math
import os

import numpy as np
import pytest
import torch
from conftest import ROOT, run_script

import train
from data import TokenStream
from machinery.components import checkpoint, run_setup
from machinery.components.run_folder import read_jsonl
from machinery.job.config import TrainConfig, parse_args
from model import GPT, GPTConfig
from parallel.grid import Layout, ProcessGrid
from parallel.layout import model_for_rank
from train import clip_gradients, lr_at, optimizer_step

# a run small enough for a unit test: 2 layers of width 32 on the small corpus
# fmt: off
QUICK = [
    "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "16", "--batch_size", "4",
    "--eval_iters", "2", "--log_interval", "1", "--max_new_tokens", "20",
]
# fmt: on


def cosine_schedule(step, peak, low, warmup, end):
    """The schedule as lr_at's docstring states it, written out: (step + 1) / warmup of the peak, then a half
    cosine from the peak at step warmup to low at step end, then low."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if step >= end:
        return low
    return low + (peak - low) * (1 + math.cos(math.pi * (step - warmup) / (end - warmup))) / 2


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(dict(warmup_iters=100, max_iters=1000), id="warmup=100, decay to max_iters=1000"),
        pytest.param(dict(warmup_iters=100, max_iters=1000, lr_decay_iters=2000), id="lr_decay_iters=2000"),
        pytest.param(dict(warmup_iters=0, max_iters=400, min_lr=0.0), id="no warmup, min_lr=0"),
        pytest.param(dict(warmup_iters=1, max_iters=9, lr_decay_iters=5), id="warmup=1, lr_decay_iters=5"),
    ],
)
def test_lr_schedule_warmup_then_cosine(overrides):
    cfg = TrainConfig(**{**dict(learning_rate=1e-3, min_lr=1e-4), **overrides})
    peak, low, warmup = cfg.learning_rate, cfg.min_lr, cfg.warmup_iters
    end = cfg.lr_decay_iters or cfg.max_iters  # lr_decay_iters 0 means max_iters
    quarter = (end - warmup) // 4  # every case decays over a multiple of 4 steps
    points = [  # (step, the LR there, the rule in words)
        *(
            [
                (0, peak / warmup, "step 0 takes learning_rate / warmup_iters"),
                (warmup - 1, peak, "the last warmup step, warmup_iters - 1, reaches learning_rate"),
            ]
            if warmup
            else []
        ),
        (warmup, peak, "the decay starts from learning_rate at step warmup_iters"),
        (
            warmup + quarter,
            low + (peak - low) * (1 + math.cos(math.pi / 4)) / 2,
            "a quarter of the way from warmup_iters to the end, the cosine gives min_lr + (learning_rate - min_lr) "
            "(1 + cos(pi/4)) / 2",
        ),
        (warmup + 2 * quarter, (peak + low) / 2, "halfway down the cosine, halfway from learning_rate to min_lr"),
        (end, low, "the decay ends at min_lr at step lr_decay_iters (0: max_iters)"),
        (end + 2 * quarter, low, "past the end it stays at min_lr: the cosine does not turn up again"),
    ]
    for step, want, words in points:
        got = lr_at(step, cfg)
        assert got == pytest.approx(want), f"{words}: at step {step} expected {want:.6g}, got {got:.6g}"
    for step in range(2 * end + 1):
        got, want = lr_at(step, cfg), cosine_schedule(step, peak, low, warmup, end)
        assert got == pytest.approx(want), (
            f"linear warmup over warmup_iters, cosine to min_lr at step {end}: at step {step} expected {want:.6g}, "
            f"got {got:.6g}"
        )


def parameters_with_gradients(scale, seed=0):
    """Three parameters whose gradients are views into one flat buffer, as bucketed DP holds them, and a fourth
    without a gradient (unused this step): (parameters, buffer)."""
    shapes = [(10, 10), (7,), (3, 5)]
    buffer = scale * torch.randn(sum(math.prod(s) for s in shapes), generator=torch.Generator().manual_seed(seed))
    params, offset = [], 0
    for shape in shapes:
        p = torch.nn.Parameter(torch.zeros(shape))
        p.grad = buffer[offset : offset + math.prod(shape)].view(shape)
        offset += math.prod(shape)
        params.append(p)
    return params + [torch.nn.Parameter(torch.zeros(4))], buffer


def test_clipping_bounds_the_global_norm():
    params, buffer = parameters_with_gradients(scale=5.0)
    before = buffer.clone()
    norm = before.norm()  # the global norm, as the model's grad_norm() hands it over: a 0-dim fp32 tensor
    clip_gradients((p for p in params), norm, max_norm=1.0)  # a generator, as train.py passes parameters()
    assert params[-1].grad is None, "a parameter without a gradient is skipped and keeps none"
    twins, want = parameters_with_gradients(scale=5.0)  # the same gradients, clipped by PyTorch
    torch.nn.utils.clip_grad_norm_(twins, max_norm=1.0)
    got = torch.cat([p.grad.flatten() for p in params[:-1]])
    factors = got / before
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-7), (
        f"every gradient is scaled by one factor, max_norm / grad_norm = {1.0 / norm.item():.6f} (as "
        f"torch.nn.utils.clip_grad_norm_ does): got factors from {factors.min().item():.6f} to "
        f"{factors.max().item():.6f}"
    )
    assert got.norm().item() == pytest.approx(1.0, rel=1e-5), (
        f"after clipping the global norm is max_norm = 1.0: got {got.norm().item():.6f}"
    )
    assert torch.allclose(buffer, want, rtol=1e-5, atol=1e-7), (
        "the gradients are scaled in place: bucketed DP holds them as views into its buckets, which must hold the "
        f"clipped values; the buckets still hold a norm of {buffer.norm().item():.4f}"
    )


@pytest.mark.parametrize(
    "scale, max_norm",
    [
        pytest.param(0.01, 1.0, id="norm below max_norm"),
        pytest.param(5.0, 0.0, id="max_norm=0 means no clipping"),
        pytest.param(0.0, 1.0, id="all gradients zero"),
    ],
)
def test_clipping_leaves_gradients_within_bounds_alone(scale, max_norm):
    params, buffer = parameters_with_gradients(scale)
    before = buffer.clone()
    norm = before.norm()
    clip_gradients(params, norm, max_norm)
    assert params[-1].grad is None, "a parameter without a gradient is skipped and keeps none"
    got = torch.cat([p.grad.flatten() for p in params[:-1]])
    why = (
        "max_norm 0 means no clipping (--grad_clip 0)"
        if max_norm == 0
        else f"a global norm of {norm.item():.3g}, not above max_norm = {max_norm}, is not clipped (nor scaled up)"
    )
    assert torch.equal(got, before), (
        f"{why}: the gradients are left as they are; got a norm of {got.norm().item():.4g} for {norm.item():.4g}"
    )


def test_clipping_uses_the_global_norm_it_is_given():
    """Under DP, TP and PP a rank holds a share of the gradient: the factor comes from grad_norm, the norm over every
    rank's share, so that every rank scales by the same factor."""
    params, buffer = parameters_with_gradients(scale=5.0)
    before = buffer.clone()
    local = before.norm()
    everyone = 2 * local  # the whole model's gradient: this rank's share is a part of it
    clip_gradients(params, everyone, max_norm=1.5 * local.item())
    got = torch.cat([p.grad.flatten() for p in params[:-1]])
    factor = (got.norm() / local).item()
    assert factor == pytest.approx(0.75, rel=1e-5), (
        f"the factor is max_norm / grad_norm = 1.5 |this rank's share| / (2 |this rank's share|) = 0.75, from the "
        f"grad_norm it is given and not from the gradients this rank holds: got {factor:.6f}"
    )


def one_step(tmp_path, batch_size, accumulation, dtype=torch.float32):
    """One optimizer_step of a fresh seeded model on a fixed token file; returns (model, loss, grad norm)."""
    tokens = tmp_path / "tokens.bin"
    if not tokens.exists():
        np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint16).tofile(tokens)
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(block_size=16, vocab_size=256, n_layer=2, n_head=2, n_embd=32))
    autocast = run_setup.autocast_context(torch.device("cpu"), dtype)
    model = model_for_rank(gpt, ProcessGrid(), Layout(), batch_size, dtype, autocast)
    cfg = TrainConfig(batch_size=batch_size, gradient_accumulation_steps=accumulation, lanes=4)
    stream = TokenStream(str(tokens), "uint16", batch_size, 16, lanes=cfg.lanes)
    optimizer = run_setup.make_optimizer(gpt, cfg, torch.device("cpu"))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    loss, norm = optimizer_step(model, optimizer, scaler, stream.next_batch, 1e-3, cfg)
    return gpt, loss, norm


def test_accumulation_equals_one_big_batch(tmp_path):
    """k micro-batches of B/k with accumulation take the same step as one batch of B."""
    big, big_loss, big_norm = one_step(tmp_path, batch_size=8, accumulation=1)
    for k in (2, 4):
        acc, loss, norm = one_step(tmp_path, batch_size=8 // k, accumulation=k)
        torch.testing.assert_close(loss, big_loss)
        torch.testing.assert_close(norm, big_norm)
        for p, q in zip(acc.parameters(), big.parameters()):
            torch.testing.assert_close(p, q)


def test_bf16_autocast_step_on_cpu_is_finite(tmp_path):
    model, loss, norm = one_step(tmp_path, batch_size=4, accumulation=2, dtype=torch.bfloat16)
    assert torch.isfinite(loss) and torch.isfinite(norm)
    assert abs(loss.item() - math.log(256)) < 0.2
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())  # fp32 master weights


@pytest.mark.parametrize("native_bf16, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_dtype_on_cpu_is_bf16_only_where_native(monkeypatch, native_bf16, expected):
    monkeypatch.setattr(run_setup, "cpu_has_native_bf16", lambda: native_bf16)
    assert run_setup.pick_dtype("auto", torch.device("cpu")) == expected
    assert run_setup.pick_dtype("float32", torch.device("cpu")) == torch.float32  # an explicit dtype is kept


@pytest.mark.integration
def test_tiny_preset_end_to_end(tmp_path):
    """The README's main command, shortened: prepares the stdlib corpus, trains, evaluates, samples."""
    out = tmp_path / "run"
    result = run_script([ROOT / "train.py", "--preset", "tiny", "--max_iters", "50", "--out_dir", out], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "data" / "stdlib-byte" / "meta.json").exists()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "loss" in r]
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s"} <= set(logged[0]) and "val_loss" in records[0]
    assert abs(logged[0]["loss"] - math.log(256)) < 0.1  # step 0: uniform guessing
    assert logged[-1]["loss"] < logged[0]["loss"] - 1.0  # and it learns
    assert records[-1]["step"] == 50 and "val_loss" in records[-1]
    assert "ln 256 = 5.5452" in result.stdout and "cost: training compute" in result.stdout
    assert "final check: val loss" in result.stdout and "perplexity" in result.stdout
    assert (out / "metrics.png").stat().st_size > 10_000
    assert (out / "samples.txt").read_text().strip()
    # fmt: off
    sampled = run_script(
        [
            ROOT / "train.py",
            "--sample", "--out_dir", out, "--num_samples", "1", "--max_new_tokens", "30", "--prompt", "def ",
        ],
        cwd=tmp_path,
    )
    # fmt: on
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("def ")


def run_main(argv, capsys):
    """train.main in this process; returns (exit message or code, stdout + stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        train.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out + captured.err


def test_short_run_in_process_and_out_dir_protection(small_corpus, tmp_path, capsys):
    out, data_dir = tmp_path / "run", tmp_path / "data"
    args = ["--source", small_corpus, "--data_dir", data_dir, "--out_dir", out, "--max_iters", "3", *QUICK]
    train.main([str(a) for a in args])
    assert (out / "ckpt" / "step_0000003" / "state.pt").exists()
    metrics = (out / "metrics.jsonl").read_text()
    code, text = run_main([*args, "--n_layer", "3"], capsys)
    assert "holds a different run" in str(code) and "n_layer: 2 -> 3" in str(code) and "--overwrite" in str(code)
    assert (out / "metrics.jsonl").read_text() == metrics  # nothing overwritten
    train.main([str(a) for a in [*args, "--n_layer", "3", "--overwrite", "--num_samples", "0"]])
    assert json.loads((out / "run.json").read_text())["GPTConfig"]["n_layer"] == 3
    assert (out / "samples.txt").read_text() == "\n"  # --num_samples 0: no samples, and no error


def test_plot_false_draws_no_figure_and_says_only_what_it_wrote(small_corpus, tmp_path, capsys):
    """--plot false: no metrics.png, and the closing line names the files written; the run is the same run, so
    continued with a bare --plot it draws the figure."""
    out = tmp_path / "run"
    args = ["--source", small_corpus, "--data_dir", tmp_path / "data", "--out_dir", out, *QUICK, "--num_samples", "0"]
    train.main([str(a) for a in [*args, "--max_iters", "2", "--plot", "false"]])
    assert not (out / "metrics.png").exists()
    assert f"wrote {out}: metrics.jsonl, samples.txt, ckpt/" in capsys.readouterr().out
    train.main([str(a) for a in [*args, "--max_iters", "3", "--plot"]])
    assert "resuming from the checkpoint of step 2" in capsys.readouterr().out
    assert (out / "metrics.png").stat().st_size > 10_000


def test_a_run_recorded_before_newer_fields_existed_continues(small_corpus, tmp_path, capsys):
    """run.json and the checkpoints of a run from before --activation and --init_from lack those fields: they read
    as their defaults, which is what that run did, so it continues; a command that sets one is another run."""
    out = tmp_path / "run"
    args = ["--source", small_corpus, "--data_dir", tmp_path / "data", "--out_dir", out, *QUICK, "--num_samples", "0"]
    train.main([str(a) for a in [*args, "--max_iters", "3"]])

    def without_new_fields(identity):
        del identity["GPTConfig"]["activation"], identity["TrainConfig"]["init_from"]
        return identity

    run_json = out / "run.json"
    run_json.write_text(json.dumps(without_new_fields(json.loads(run_json.read_text()))))
    state = checkpoint.load(checkpoint.step_path(out / "ckpt", 3))
    checkpoint.save(str(out / "ckpt"), 3, {**state, "config": without_new_fields(state["config"])}, healthy=True)

    train.main([str(a) for a in [*args, "--max_iters", "5"]])
    assert "resuming from the checkpoint of step 3" in capsys.readouterr().out
    code, _ = run_main([*args, "--max_iters", "7", "--activation", "gelu_tanh"], capsys)
    assert "holds a different run" in str(code) and "activation: 'gelu' -> 'gelu_tanh'" in str(code)


def snapshot(folder):
    """{relative path: bytes} of every file under folder."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_finished_run_says_so_and_exits_nonzero(small_corpus, tmp_path, capsys):
    """The same command twice: the second finds the run finished, says what to do, and changes nothing."""
    out = tmp_path / "run"
    args = ["--source", small_corpus, "--data_dir", tmp_path / "data", "--out_dir", out, "--max_iters", "3", *QUICK]
    train.main([str(a) for a in args])
    before, _ = snapshot(out), capsys.readouterr()
    code, text = run_main(args, capsys)
    message = str(code)
    assert code != 0 and "holds a finished run" in message and str(out) in message
    assert "step 3" in message and "--max_iters is 3" in message
    assert all(hint in message for hint in ("a larger --max_iters", "--overwrite", "another --out_dir"))
    assert "cost:" not in text and snapshot(out) == before  # refused before any work, nothing rewritten
    code, _ = run_main([*args, "--max_iters", "2"], capsys)  # a smaller max_iters: finished all the more
    assert "holds a finished run" in str(code) and snapshot(out) == before
    # what the message offers works: a larger --max_iters trains on from step 3
    train.main([str(a) for a in [*args, "--max_iters", "5"]])
    assert "continuing the run in" in capsys.readouterr().out
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4, 5] and json.loads((out / "run.json").read_text())["TrainConfig"]["max_iters"] == 5


def test_a_run_that_died_before_its_final_check_finishes_on_the_next_command(small_corpus, tmp_path, capsys):
    """The last checkpoint is written before the final eval, plot and samples: dying between them is not finishing."""
    out = tmp_path / "run"
    args = ["--source", small_corpus, "--data_dir", tmp_path / "data", "--out_dir", out, "--max_iters", "3", *QUICK]
    train.main([str(a) for a in args])
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # as if killed after the checkpoint of step 3
    (out / "samples.txt").unlink()
    train.main([str(a) for a in args])
    assert "resuming from the checkpoint of step 3" in capsys.readouterr().out
    assert (out / "metrics.jsonl").read_text().splitlines() == lines and (out / "samples.txt").exists()


def test_data_may_live_inside_the_run_folder_and_a_file_is_no_folder(small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    # fmt: off
    train.main(
        [
            str(a)
            for a in [
                "--source", small_corpus, "--data_dir", out / "data", "--out_dir", out, "--max_iters", "2",
                *QUICK,
            ]
        ]
    )
    # fmt: on
    assert (out / "data" / "meta.json").exists() and (out / "run.json").exists()
    (tmp_path / "notes.txt").write_text("mine")
    code, _ = run_main(
        ["--source", small_corpus, "--data_dir", out / "data", "--out_dir", tmp_path / "notes.txt", *QUICK], capsys
    )
    assert "is a file, not a folder" in str(code) and (tmp_path / "notes.txt").read_text() == "mine"


def test_a_folder_that_is_not_a_run_is_refused_and_left_untouched(small_corpus, tmp_path, capsys):
    foreign = tmp_path / "results"
    (foreign / "plots").mkdir(parents=True)
    (foreign / "metrics.jsonl").write_text('{"epoch": 1, "accuracy": 0.93}\n')
    (foreign / "plots" / "a.png").write_bytes(b"\x89PNG not ours")
    before = snapshot(foreign)
    for extra in ([], ["--overwrite"]):  # not even --overwrite takes over a folder that is not a run of ours
        # fmt: off
        code, _ = run_main(
            [
                "--source", small_corpus, "--data_dir", tmp_path / "data", "--out_dir", foreign,
                "--max_iters", "2",
                *QUICK,
                *extra,
            ],
            capsys,
        )
        # fmt: on
        assert code != 0 and "not a run of ours" in str(code) and str(foreign) in str(code)
        assert snapshot(foreign) == before and sorted(p.name for p in foreign.iterdir()) == ["metrics.jsonl", "plots"]


@pytest.mark.parametrize(
    "flag, field",
    [
        ("--resume", "resume"),
        ("--overwrite", "overwrite"),
        ("--compile", "compile"),
        ("--reset_optimizer", "reset_optimizer"),
    ],
)
def test_boolean_flags_work_bare_or_with_a_value(flag, field):
    def value(argv):
        configs = parse_args(argv)[2]
        return next(getattr(c, field) for c in vars(configs).values() if hasattr(c, field))

    assert value([flag]) is True and value([flag, "--n_layer", "3"]) is True  # bare, also before another flag
    assert value([flag, "true"]) is True and value([flag, "false"]) is False and value([]) is False
    assert parse_args(["--sample"])[1] == "sample" and parse_args(["--sample", "false"])[1] == "train"
    assert parse_args(["--eval_only"])[1] == "eval_only" and parse_args([])[1] == "train"
    with pytest.raises(SystemExit):  # argparse's error: "--sample and --eval_only exclude each other"
        parse_args(["--sample", "--eval_only"])
    with pytest.raises(SystemExit):  # they read the run that --overwrite would delete
        parse_args(["--eval_only", "--overwrite"])


def test_train_py_reads_on_one_screen():
    """The loop fits one screen and no function of train.py outgrows a page (counted with ast)."""
    tree = ast.parse((ROOT / "train.py").read_text())
    lengths = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert lengths["train"] <= 60, lengths["train"]
    assert max(lengths.values()) <= 80, {name: n for name, n in lengths.items() if n > 80}


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--n_layers", "3"], ["unknown flag --n_layers", "did you mean --n_layer", "--learning_rate"]),
        (["--preset", "huge"], ["unknown preset 'huge'", "tiny, shakespeare, gpt2-small"]),
        (["--max_iters", "ten"], ["--max_iters", "invalid int value"]),
        (["--compile", "maybe"], ["--compile", "true or false"]),
        (["--n_embd", "130"], ["n_embd 130 is not divisible by n_head 4"]),
        (["--dtype", "float8"], ["--dtype 'float8'"]),
        (["--tokenizer", "bpe-9"], ["unknown tokenizer 'bpe-9'"]),
        (["--source", "no/such/corpus.txt"], ["--source 'no/such/corpus.txt': no such file"]),
        (["--resume_without", "optimizer,weights"], ["--resume_without weights", "data_position"]),
        (["--monitor_window", "1"], ["--monitor_window 1", "2 healthy steps or more"]),
    ],
)
def test_bad_input_is_named(argv, expected, tmp_path, small_corpus, capsys):
    code, text = run_main(
        ["--out_dir", tmp_path / "o", "--source", small_corpus, "--data_dir", tmp_path / "d", *argv], capsys
    )
    message = str(code) + text
    assert code != 0 and all(e in message for e in expected), message
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    "argv, tokenizer",
    [([], "byte"), (["--tokenizer", "gpt2"], "gpt2"), (["--preset", "gpt2-small"], "gpt2")],
    ids=["the embedded default", "another tokenizer", "a preset without a corpus"],
)
def test_a_named_data_dir_without_token_files_or_a_source_is_refused(argv, tokenizer, tmp_path, capsys):
    """--data_dir EMPTY without --source: the embedded default would fill it and the run train on a corpus the user
    never named. Refused before the run writes anything, naming the folder and the command that prepares it (with
    the run's tokenizer, so that the data it makes is the data the run reads)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _ = run_main(["--data_dir", empty, "--out_dir", tmp_path / "o", *argv, *QUICK], capsys)
    assert f"--data_dir {empty} holds no token files" in str(code), code
    prepare = f"python -m machinery.corpus --source 'texts/**/*.txt' --tokenizer {tokenizer} --out_dir {empty}"
    assert prepare in str(code), code
    assert os.listdir(empty) == [] and not (tmp_path / "o").exists(), "nothing is written"


def test_empty_corpus_and_too_small_val_split(tmp_path, small_corpus, capsys):
    (tmp_path / "empty.txt").write_text("")
    code, _ = run_main(
        ["--source", tmp_path / "empty.txt", "--data_dir", tmp_path / "d1", "--out_dir", tmp_path / "o"], capsys
    )
    assert "produced no tokens" in str(code)
    code, _ = run_main(
        ["--source", small_corpus, "--data_dir", tmp_path / "d2", "--out_dir", tmp_path / "o", "--block_size", "20000"],
        capsys,
    )
    assert "val.bin holds" in str(code) and "block_size + 1 = 20001" in str(code)


def test_sample_without_checkpoint_says_so(tmp_path, capsys):
    code, _ = run_main(["--sample", "--out_dir", tmp_path / "none"], capsys)
    assert "no checkpoint in" in str(code) and "train first" in str(code)
