"""The chapter's three tiers as commands: --init_from (a run, or GPT-2 in Hugging Face's layout), --export_hf,
--mix with a weight schedule, and the guards on a run's data (gpt2-small without a corpus; a plan of many epochs).
transfer.py's and mixture.py's own pieces are tested in test_transfer.py and test_mixture.py."""

import json
import os
import re

import pytest
import torch
from conftest import ROOT, TIKTOKEN_CACHE, needs_gpt2, run_script, write_word_corpus

from machinery.components import checkpoint
from machinery.components.run_folder import recorded_gpt_config
from machinery.components.sample import generate
from machinery.interchange import hf_layouts, safetensors_format
from model import GPT, GPTConfig

os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))  # for this process and the scripts it starts

TINY = ["--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--batch_size", "4"]
QUIET = ["--num_samples", "0", "--plot", "false", "--log_interval", "1", "--eval_iters", "2", "--dtype", "float32"]
GPT2_ARCHITECTURE = ["--norm", "layernorm", "--bias", "--activation", "gelu_tanh"]


def train(tmp_path, *flags):
    return run_script([ROOT / "train.py", *QUIET, *flags], cwd=tmp_path)  # in tmp_path: data/ and out/ land there


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def transformers_gpt2(folder, seed=0):
    """A random GPT-2 (2 layers, 4 heads, width 64, GPT-2's vocabulary) saved by transformers' save_pretrained."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install transformers)"
    )
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=50257)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # away from the init's small, symmetric weights, so greedy choices are clear-cut
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model


@needs_gpt2
@pytest.mark.integration
def test_init_from_a_transformers_gpt2_samples_what_transformers_generates(tmp_path):
    hf_model = transformers_gpt2(tmp_path / "hf")
    corpus = write_word_corpus(tmp_path / "words.txt", 3000)
    shape = ["--n_layer", "2", "--n_head", "4", "--n_embd", "64", "--block_size", "128", *GPT2_ARCHITECTURE]
    # fmt: off
    result = train(
        tmp_path, "--init_from", tmp_path / "hf", "--tokenizer", "gpt2", "--source", corpus, *shape,
        "--max_iters", "0", "--out_dir", tmp_path / "run",
    )
    # fmt: on
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert f"starting from the weights of {tmp_path / 'hf'}" in result.stdout
    prompt = "alpha beta gamma"
    # fmt: off
    sampled = run_script(
        [ROOT / "train.py", "--sample", "--top_k", "1", "--prompt", prompt, "--num_samples", "1",
         "--max_new_tokens", "16", "--out_dir", tmp_path / "run"],
        cwd=tmp_path,
    )
    # fmt: on
    assert sampled.returncode == 0, sampled.stderr
    import tiktoken

    encoding = tiktoken.get_encoding("gpt2")
    ids = torch.tensor([encoding.encode_ordinary(prompt)])
    greedy = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    expected = prompt + encoding.decode(greedy[0, ids.size(1) :].tolist())
    assert sampled.stdout.split("\n==========")[0].strip() == expected.strip()


@pytest.fixture(scope="module")
def gpt2_started_on_one_process(tmp_path_factory):
    """(its folder, the flags): a run of 3 steps from a transformers GPT-2 on one process, for the layouts below."""
    folder = tmp_path_factory.mktemp("gpt2_one_process")
    transformers_gpt2(folder / "hf")
    corpus = write_word_corpus(folder / "words.txt", 3000)
    # fmt: off
    flags = [
        *QUIET, "--init_from", folder / "hf", "--tokenizer", "gpt2", "--source", corpus, "--data_dir", folder / "d",
        "--n_layer", "2", "--n_head", "4", "--n_embd", "64", "--block_size", "64", "--batch_size", "4",
        *GPT2_ARCHITECTURE, "--max_iters", "3", "--eval_interval", "3",
    ]
    # fmt: on
    one = train(folder, *flags, "--out_dir", folder / "one")
    assert one.returncode == 0, one.stderr
    return folder, flags


@needs_gpt2
@pytest.mark.parametrize(
    "layout",
    [["--tp", "2"], ["--pp", "2", "--micro_batches", "2"], ["--dp", "2", "--dp_mode", "fsdp", "--batch_size", "2"]],
    ids=["tp2", "pp2", "fsdp-dp2"],
)
@pytest.mark.integration
def test_init_from_gpt2_on_two_ranks_takes_the_steps_one_process_takes(tmp_path, layout, gpt2_started_on_one_process):
    """Two ranks load --init_from's weights into their parts (GPT-2's 50257 rows are odd: a tp=2 cut pads them; a
    pipeline holds the tied embedding on both stages; FSDP2 shards every matrix) and take one process's steps."""
    folder, flags = gpt2_started_on_one_process
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    two = run_script([*launcher, ROOT / "train.py", *flags, *layout, "--out_dir", tmp_path / "two"], cwd=folder)
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-3000:]
    for a, b in zip(metrics(folder / "one"), metrics(tmp_path / "two"), strict=True):
        assert a["step"] == b["step"] and a.keys() & {"loss", "val_loss"} == b.keys() & {"loss", "val_loss"}
        for key in a.keys() & {"loss", "val_loss"}:  # a fresh init would be a nat or more away
            assert b[key] == pytest.approx(a[key], rel=1e-4), (a["step"], key)


@needs_gpt2
@pytest.mark.integration
def test_export_hf_loads_in_transformers_with_the_same_logits_and_greedy_text(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from machinery.components import checkpoint
    from machinery.components.sample import single_device_model

    corpus = write_word_corpus(tmp_path / "words.txt", 3000)
    # fmt: off
    result = train(
        tmp_path, "--tokenizer", "gpt2", "--source", corpus, *TINY, *GPT2_ARCHITECTURE, "--max_iters", "4",
        "--out_dir", tmp_path / "run",
    )
    # fmt: on
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    exported = run_script(
        [ROOT / "train.py", "--export_hf", tmp_path / "hf", "--out_dir", tmp_path / "run"], cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    assert "lm_eval --model hf" in exported.stdout

    _, state = checkpoint.load_latest(str(tmp_path / "run" / "ckpt"))
    ours = single_device_model(recorded_gpt_config(state["config"]), state["model"], "cpu").eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(50257, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        our_logits = ours(ids)[0][..., :50257]  # our rows past GPT-2's 50257 are padding, not exported
        their_logits = theirs(ids).logits
    assert (our_logits - their_logits).abs().max() < 1e-4
    prompt = ids[:1, :8]
    with torch.no_grad():
        our_text = generate(ours, prompt, 12, top_k=1)
    their_text = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    assert our_text.tolist() == their_text.tolist()


@pytest.mark.integration
def test_export_hf_refuses_another_architecture(tmp_path, small_corpus):
    result = train(tmp_path, "--source", small_corpus, *TINY, "--max_iters", "1", "--out_dir", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    exported = run_script(
        [ROOT / "train.py", "--export_hf", tmp_path / "hf", "--out_dir", tmp_path / "run"], cwd=tmp_path
    )
    assert exported.returncode != 0
    assert "norm: 'rmsnorm' (GPT-2: 'layernorm')" in exported.stderr and "--preset gpt2-small" in exported.stderr
    assert not (tmp_path / "hf").exists()


@pytest.mark.integration
def test_init_from_a_finished_run_starts_at_its_final_val_loss(tmp_path, small_corpus):
    common = ["--source", small_corpus, "--data_dir", tmp_path / "data", *TINY, "--eval_interval", "5"]
    base = train(tmp_path, *common, "--max_iters", "10", "--out_dir", tmp_path / "base")
    assert base.returncode == 0, base.stderr
    follow = train(
        tmp_path, *common, "--max_iters", "5", "--init_from", tmp_path / "base", "--out_dir", tmp_path / "next"
    )
    assert follow.returncode == 0, follow.stderr
    assert "its checkpoint of step 10" in follow.stdout and "the data, against" not in follow.stdout  # the same
    base_final = metrics(tmp_path / "base")[-1]["val_loss"]
    assert metrics(tmp_path / "next")[0]["val_loss"] == base_final

    # Resuming reads the run's own checkpoints, not its source again: it goes on with the source gone.
    (tmp_path / "base").rename(tmp_path / "base-moved")
    further = ["--init_from", tmp_path / "base", "--out_dir", tmp_path / "next"]
    resumed = train(tmp_path, *common, "--max_iters", "8", *further)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from the checkpoint of step 5" in resumed.stdout
    assert "starting from the weights" not in resumed.stdout

    # With no checkpoint of its own that verifies, it starts over from the source, read then.
    for step in (tmp_path / "next" / "ckpt").iterdir():
        (step / checkpoint.STATE_FILE).write_bytes(b"damaged")
    (tmp_path / "base-moved").rename(tmp_path / "base")
    restarted = train(tmp_path, *common, "--max_iters", "8", *further)
    assert restarted.returncode == 0, restarted.stderr
    assert "starting from the weights of" in restarted.stdout and "its checkpoint of step 10" in restarted.stdout
    assert metrics(tmp_path / "next")[0]["val_loss"] == base_final


@pytest.mark.integration
def test_a_source_that_changed_under_a_run_is_refused_when_read_again(tmp_path, small_corpus):
    """A run whose checkpoints all fail to verify reads its --init_from again; if the file there has changed shape
    since the run recorded its model, it says so rather than loading it into the model it built."""

    def gpt2_shaped_file(rows):
        torch.manual_seed(0)
        # fmt: off
        gpt_config = GPTConfig(
            n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=rows, norm="layernorm", bias=True,
            activation="gelu_tanh",
        )
        # fmt: on
        safetensors_format.write_safetensors(
            str(tmp_path / "w.safetensors"), hf_layouts.state_dict_to_hf(GPT(gpt_config).state_dict(), rows)
        )

    flags = [
        *["--source", small_corpus, "--data_dir", tmp_path / "data", *TINY, *GPT2_ARCHITECTURE, "--max_iters", "2"],
        *["--init_from", tmp_path / "w.safetensors", "--out_dir", tmp_path / "run"],
    ]
    gpt2_shaped_file(256)
    assert train(tmp_path, *flags).returncode == 0
    for step in (tmp_path / "run" / "ckpt").iterdir():
        (step / checkpoint.STATE_FILE).write_bytes(b"damaged")
    gpt2_shaped_file(250)  # pads to 256 as well, so the run's identity still matches
    again = train(tmp_path, *flags)
    assert again.returncode != 0
    assert "no longer fits the model this run recorded (vocab_size: 256 -> 250)" in again.stderr


@pytest.mark.integration
def test_init_from_refuses_another_shape_naming_both(tmp_path, small_corpus):
    common = ["--source", small_corpus, "--data_dir", tmp_path / "data", *TINY]
    assert train(tmp_path, *common, "--max_iters", "1", "--out_dir", tmp_path / "base").returncode == 0
    other = train(
        tmp_path, *common, "--n_layer", "3", "--max_iters", "1", "--init_from", tmp_path / "base", "--out_dir", "x"
    )
    assert other.returncode != 0
    assert "holds n_layer 2; this run has n_layer 3: pass --n_layer 2" in other.stderr


def two_source_mix(tmp_path, schedule):
    """Two corpora told apart by their words; the mix file naming them."""
    prose, code = tmp_path / "prose.txt", tmp_path / "code.txt"
    write_word_corpus(prose, 2000)
    code.write_text("".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(3000)))
    mix = {"sources": {"prose": str(prose), "code": str(code)}, "weights": {"prose": 1, "code": 3}}
    (tmp_path / "mix.json").write_text(json.dumps({**mix, "schedule": schedule}))
    return tmp_path / "mix.json"


def mix_args(tmp_path, out):
    # fmt: off
    return [
        "--mix", tmp_path / "mix.json", "--data_dir", tmp_path / "data", *TINY, "--max_iters", "24",
        "--eval_interval", "4", "--ckpt_interval", "5", "--out_dir", out,
    ]
    # fmt: on


@pytest.mark.integration
def test_mix_reads_its_weights_follows_its_schedule_and_resumes_exactly_after_sigkill(tmp_path):
    from machinery.corpora.mixture import read_mix, weights_at

    two_source_mix(tmp_path, [{"step": 8, "weights": {"prose": 3, "code": 1}, "ramp": 8}])
    clean = train(tmp_path, *mix_args(tmp_path, tmp_path / "clean"))
    assert clean.returncode == 0, clean.stdout[-2000:] + clean.stderr
    mix, rows_per_step = read_mix(tmp_path / "mix.json"), 4
    for record in (r for r in metrics(tmp_path / "clean") if "mix_tokens" in r):
        step, read = record["step"], record["mix_tokens"]
        planned = {name: sum(weights_at(mix, s)[name] for s in range(step)) * rows_per_step * 32 for name in read}
        for name in read:  # each source's share of the tokens read so far, against the schedule's
            assert abs(read[name] - planned[name]) <= 0.01 * sum(read.values()) + 32, (step, read, planned)
        assert set(record["val_loss_by_source"]) == {"prose", "code"}
    read_by_step = {r["step"]: r["mix_tokens"] for r in metrics(tmp_path / "clean") if "mix_tokens" in r}
    late_rows = {name: (read_by_step[24][name] - read_by_step[16][name]) / 32 for name in ("prose", "code")}
    assert abs(late_rows["prose"] - 24) <= 1 and abs(late_rows["code"] - 8) <= 1  # 1:3 turned to 3:1 by step 16

    crashed = train(tmp_path, *mix_args(tmp_path, tmp_path / "crashed"), "--inject", "crash@13")
    assert crashed.returncode != 0  # SIGKILL between the checkpoints of steps 10 and 15
    resumed = train(tmp_path, *mix_args(tmp_path, tmp_path / "crashed"), "--inject", "crash@13")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from the checkpoint of step 10" in resumed.stdout
    keys = ("step", "loss", "val_loss", "val_loss_by_source", "mix_tokens", "grad_norm")
    strip = [[{k: r.get(k) for k in keys} for r in metrics(tmp_path / out)] for out in ("clean", "crashed")]
    assert strip[0] == strip[1]  # exact equality: the reader's state came back with the checkpoint


@pytest.mark.integration
def test_continuing_a_mix_run_with_a_changed_mix_says_what_changed(tmp_path):
    two_source_mix(tmp_path, [])
    first = train(tmp_path, *mix_args(tmp_path, tmp_path / "run"))
    assert first.returncode == 0, first.stderr
    two_source_mix(tmp_path, [{"step": 24, "weights": {"prose": 1, "code": 0}}])
    more = train(tmp_path, *mix_args(tmp_path, tmp_path / "run"), "--max_iters", "30")
    assert more.returncode == 0, more.stderr
    assert "continuing the run in" in more.stdout and "schedule: none -> step 24: prose 1, code 0" in more.stdout
    # a new run from this one's weights, on another mix, says how its data differs from what they learned from
    two_source_mix(tmp_path, [])
    mix = json.loads((tmp_path / "mix.json").read_text())
    (tmp_path / "mix.json").write_text(json.dumps({**mix, "weights": {"prose": 3, "code": 1}}))
    new = train(tmp_path, *mix_args(tmp_path, tmp_path / "new"), "--init_from", tmp_path / "run", "--max_iters", "2")
    assert new.returncode == 0, new.stderr
    said = f"the data, against what {tmp_path / 'run'}, its checkpoint of step 30 read: "
    assert (
        said + "weights: prose 0.25 -> 0.75, code 0.75 -> 0.25; schedule: step 24: prose 1, code 0 -> none"
        in new.stdout
    )


def test_gpt2_small_without_a_corpus_is_refused_with_the_data_command(tmp_path):
    result = run_script([ROOT / "train.py", "--preset", "gpt2-small"], cwd=tmp_path)
    assert result.returncode != 0
    assert "--preset gpt2-small names no corpus" in result.stderr
    assert "python -m machinery.corpus --source" in result.stderr and "--data_dir" in result.stderr
    assert not (tmp_path / "data").exists()  # nothing was prepared in its place


def test_a_run_planned_for_a_hundred_epochs_of_its_data_stops_before_training(tmp_path, small_corpus):
    # ~52k tokens of train data: 100 epochs of it at 4 x 32 = 128 tokens per step
    args = ["--source", small_corpus, *TINY, "--out_dir", tmp_path / "run", "--max_iters", "41000"]
    result = train(tmp_path, *args)
    assert result.returncode != 0
    epochs = float(re.search(r"it would read them (\S+) times", result.stderr).group(1))
    assert 95 < epochs < 105 and "--max_epochs 0" in result.stderr
    assert "step     0" not in result.stdout  # stopped before the first step
