"""Sampling: the KV cache draws the tokens the whole-context forward draws, top-p keeps exactly the nucleus
(after top-k), and the text streamed to the terminal is the text decoded at the end, also where a UTF-8
character spans tokens. Speed is bench/sample_speed.py's job, not asserted here."""

import io
import random
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, needs_gpt2

import train
from machinery.components.sample import KVCache, TextPrinter, filter_top_p, generate, sample_text, sample_texts
from machinery.corpora.corpus import ByteTokenizer, DataConfig, get_tokenizer, prepare
from machinery.job.arms import ArmedGPT, ArmsConfig
from machinery.job.config import SampleConfig
from model import GPT, GPTConfig

SMALL = dict(block_size=16, n_layer=2, n_head=2, n_embd=32)


def spread_model(**overrides):
    """A random GPT whose logits are far apart (std ~3, not init's near-uniform 0.25): a greedy choice then
    never hangs on a difference in the last bits between two ways of computing the same logits."""
    torch.manual_seed(0)
    return ArmedGPT(ArmsConfig(**{**SMALL, "naive_init_std": 0.5, **overrides})).eval()


KERNELS = [
    pytest.param(dict(attention="sdpa"), id="sdpa"),
    pytest.param(dict(attention="manual"), id="manual"),
    pytest.param(dict(attention="sdpa", norm_position="post"), id="sdpa-post-ln"),
]


@pytest.mark.parametrize("overrides", KERNELS)
def test_one_token_at_a_time_through_the_cache_gives_the_full_forwards_logits(overrides):
    model = spread_model(**overrides)
    idx = torch.randint(256, (2, SMALL["block_size"]), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)  # (2, T, V)
        cache = [KVCache() for _ in model.blocks]
        first, _ = model(idx[:, :5], cache=cache)  # a prompt of 5 fills the cache at once
        steps = [model(idx[:, [t]], cache=cache)[0] for t in range(5, idx.size(1))]  # then one position each
    cached = torch.cat([first, *steps], dim=1)
    assert len(cache[0]) == idx.size(1), "each layer's cache holds every position fed"
    # position t's logits depend on its position embedding and tokens 0..t: a wrong position or mask shows here
    torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-4)  # logits of std ~3


@pytest.mark.parametrize("overrides", KERNELS)
def test_greedy_tokens_are_the_same_with_and_without_the_cache_past_block_size(overrides):
    model = spread_model(**overrides)
    prompt = torch.randint(256, (2, 3), generator=torch.Generator().manual_seed(2))
    new = 3 * SMALL["block_size"]  # the context outgrows block_size after 13 tokens: the cache is recomputed
    cached = generate(model, prompt, new, top_k=1, kv_cache=True)
    uncached = generate(model, prompt, new, top_k=1, kv_cache=False)
    assert cached.shape == (2, 3 + new)
    assert cached.tolist() == uncached.tolist()
    assert len(set(cached[0, 20:].tolist())) > 1, "a constant tail would prove little"


def test_a_cache_that_holds_positions_takes_one_new_token_at_a_time():
    model = spread_model()
    cache = [KVCache() for _ in model.blocks]
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="1 new token at a time, not 2"):
            model(torch.zeros(1, 2, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="sequence length 17 exceeds block_size 16"):
            model(torch.zeros(1, 13, dtype=torch.long), cache=cache)


# ----------------------------------------------------------------------------
# top-p


def kept(logits):
    return [sorted(torch.nonzero(row > -float("inf")).flatten().tolist()) for row in logits]


def test_top_p_keeps_exactly_the_nucleus():
    # probabilities 0.1, 0.4, 0.2, 0.3: by rank token 1 (0.4), 3 (0.3 -> 0.7), 2 (0.2 -> 0.9), 0 (0.1 -> 1.0)
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.3, 0.2, 0.4, 0.1]])  # the second row in another order
    logits = probs.log()
    nucleus = {  # top_p -> the fewest most likely tokens whose probability reaches it, per row
        0.05: [[1], [2]],
        0.35: [[1], [2]],
        0.45: [[1, 3], [0, 2]],
        0.65: [[1, 3], [0, 2]],
        0.75: [[1, 2, 3], [0, 1, 2]],
        0.95: [[0, 1, 2, 3], [0, 1, 2, 3]],
    }
    for top_p, want in nucleus.items():
        filtered = filter_top_p(logits, top_p)
        assert kept(filtered) == want, f"top_p {top_p}: expected the nucleus {want}, kept {kept(filtered)}"
        inside = filtered > -float("inf")
        assert torch.equal(filtered[inside], logits[inside]), "the nucleus keeps its logits"


class FixedLogits(GPT):
    """A GPT whose every position scores the same logits: generate's filters seen alone."""

    def __init__(self, probs):
        super().__init__(GPTConfig(**{**SMALL, "vocab_size": len(probs)}))
        self.logits = torch.tensor(probs).log()

    def forward(self, idx, targets=None, cache=None):
        return self.logits.expand(*idx.shape, -1), None


def drawn(model, n=4000, **settings):
    torch.manual_seed(0)
    return sorted(set(generate(model, torch.zeros(n, 1, dtype=torch.long), 1, **settings)[:, 1].tolist()))


def test_top_k_then_top_p_in_generate():
    model = FixedLogits([0.4, 0.3, 0.2, 0.1])
    assert drawn(model) == [0, 1, 2, 3]
    assert drawn(model, top_p=0.65) == [0, 1]  # 0.4 + 0.3 reach 0.65
    assert drawn(model, top_k=3) == [0, 1, 2]
    # top-k first: among tokens 0 and 1, token 0 holds 0.4 / 0.7 = 0.57 >= 0.5, the nucleus alone. (top-p
    # first would keep 0 and 1: 0.4 < 0.5 of the whole.)
    assert drawn(model, top_k=2, top_p=0.5) == [0]
    assert drawn(model, top_p=1e-6) == [0], "a tiny top_p is greedy"


def test_top_p_one_changes_nothing():
    model = spread_model()
    prompt = torch.zeros(3, 1, dtype=torch.long)
    torch.manual_seed(5)
    default = generate(model, prompt, 30, temperature=3.0)
    torch.manual_seed(5)
    with_top_p = generate(model, prompt, 30, temperature=3.0, top_p=1.0)
    assert default.tolist() == with_top_p.tolist()
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match=f"top_p {bad} must lie in"):
            generate(model, prompt, 1, top_p=bad)


def test_temperature_0_is_greedy():
    assert drawn(FixedLogits([0.3, 0.4, 0.2, 0.1]), temperature=0) == [1]
    model = spread_model()
    prompt = torch.randint(256, (2, 3), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    greedy = generate(model, prompt, 20, temperature=0, top_k=5, top_p=0.5)  # both keep the most likely token
    assert torch.rand(1).item() == torch.rand(1, generator=torch.Generator().manual_seed(0)).item(), "no draw"
    assert greedy.tolist() == generate(model, prompt, 20, top_k=1).tolist()
    with pytest.raises(ValueError, match="temperature -1 must be 0"):
        generate(model, prompt, 1, temperature=-1)


# ----------------------------------------------------------------------------
# streaming


class Writes(io.StringIO):
    """A text file that keeps each write apart."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, text):
        self.writes.append(text)
        return super().write(text)


def streamed(tokenizer, prompt, tokens):
    out = Writes()
    printer = TextPrinter(tokenizer, prompt, out)
    for token in tokens:
        printer.add(token)
    printer.flush()
    return out


def test_streamed_bytes_print_only_whole_characters():
    tokenizer = ByteTokenizer()
    text = "é€😀 a"
    tokens = tokenizer.encode(text) + [tokenizer.eot] + tokenizer.encode("b")
    out = Writes()
    printer = TextPrinter(tokenizer, "> ", out)
    printed = []
    for token in tokens:
        printer.add(token)
        printed.append(out.getvalue())
    printer.flush()
    # after each byte: the characters complete so far, never a replacement character
    assert printed[:12] == [
        "> ",
        "> é",
        "> é",
        "> é",
        "> é€",
        "> é€",
        "> é€",
        "> é€",
        "> é€😀",
        "> é€😀 ",
        "> é€😀 a",
        "> é€😀 a",
    ]
    assert "\ufffd" not in "".join(out.writes)
    assert out.getvalue() == sample_text(tokenizer, "> ", tokens) == "> é€😀 a\n<|endoftext|>\nb"


def test_streamed_text_is_the_final_decode_for_any_bytes():
    """Random bytes: characters split, unfinished at a cut or the end, invalid sequences, runs of cuts."""
    tokenizer, rng = ByteTokenizer(), random.Random(0)
    pieces = list("héllo €😀中".encode()) + [0, 0, 0x80, 0xFF, 0xC3, 0xF0]
    for trial in range(400):
        pool = range(256) if trial % 2 else pieces
        tokens = [rng.choice(pool) for _ in range(rng.randint(0, 24))]
        assert streamed(tokenizer, "p", tokens).getvalue() == sample_text(tokenizer, "p", tokens), tokens


@needs_gpt2
def test_streamed_gpt2_tokens_that_split_characters():
    tokenizer = get_tokenizer("gpt2")
    tokens = tokenizer.encode("naïve 😀 🤖 €100 中文字")
    assert any("\ufffd" in tokenizer.decode([t]) for t in tokens), "some token ends inside a character"
    # a cut between characters (after "naïve 😀"), and a padded-vocab id (50300) then end-of-text
    whole = tokens[:4] + [tokenizer.eot, 50300] + tokens[4:] + [tokenizer.eot]
    out = streamed(tokenizer, "", whole)
    assert out.getvalue() == sample_text(tokenizer, "", whole) == "naïve 😀\n<|endoftext|>\n 🤖 €100 中文字"
    assert not any("\ufffd" in text for text in out.writes), "only whole characters are printed"
    # a cut inside 🤖: both sides decode the unfinished bytes to U+FFFD, the stream as the final decode
    split = tokens[:5] + [tokenizer.eot] + tokens[5:]
    assert streamed(tokenizer, "", split).getvalue() == sample_text(tokenizer, "", split)


def test_sample_texts_streams_what_it_returns():
    model = spread_model()
    settings = SampleConfig(prompt="é", num_samples=2, max_new_tokens=40, temperature=2.0, top_k=0)
    out = io.StringIO()
    torch.manual_seed(0)
    texts = sample_texts(model, ByteTokenizer(), settings, "cpu", stream=out)
    assert len(texts) == 2 and all(text.startswith("é") for text in texts)
    assert out.getvalue() == "".join(f"{text} \n==========\n" for text in texts)  # as print(text, "\n==========")


# ----------------------------------------------------------------------------
# the command line


def test_sample_from_the_command_line_with_and_without_the_cache(small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    # fmt: off
    run = [
        "--source", small_corpus, "--data_dir", tmp_path / "data", "--out_dir", out, "--n_layer", "2",
        "--n_head", "2", "--n_embd", "32", "--block_size", "16",
    ]
    train.main([str(a) for a in [*run, "--batch_size", "4", "--eval_iters", "1", "--max_iters", "2",
                                 "--num_samples", "2", "--max_new_tokens", "24"]])
    # fmt: on
    samples = (out / "samples.txt").read_text()
    assert samples.endswith("\n") and len(samples.split("\n\n==========\n\n")) == 2  # the format train.py writes
    sample = ["--sample", "--num_samples", "2", "--max_new_tokens", "40", "--prompt", "the ", "--top_p", "0.9"]
    capsys.readouterr()
    train.main([str(a) for a in [*run, *sample]])  # the cache on (the default), in this process
    cached = capsys.readouterr().out
    command = [sys.executable, ROOT / "train.py", *run, *sample, "--kv_cache", "false"]
    uncached = subprocess.run(command, cwd=tmp_path, capture_output=True, timeout=120)  # bytes: a sampled \r stays
    assert uncached.returncode == 0, uncached.stderr.decode()
    # the same seed draws the same tokens, 40 past a block of 16, whether the cache is kept or not
    assert uncached.stdout.decode() == cached
    assert cached.count(" \n==========\n") == 2 and cached.startswith("the ")


@pytest.mark.parametrize(
    "flag, value", [("--top_k", "-1"), ("--temperature", "-1"), ("--max_new_tokens", "0"), ("--num_samples", "-1")]
)
def test_a_sampling_flag_out_of_range_stops_the_command_before_it_starts(flag, value, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=rf"^error: {flag} {value}(\.0)?: .*or more"):
        train.main(["--out_dir", str(out), flag, value])
    assert not out.exists()


def test_sample_with_no_samples_and_a_training_run_with_ckpt_step_are_refused(tmp_path, capsys):
    out = tmp_path / "run"
    for flags, refusal in [
        (["--sample", "--num_samples", "0"], "--sample with --num_samples 0 would print nothing"),
        (["--ckpt_step", "4"], "--ckpt_step 4 chooses the checkpoint --sample, --eval_only or --export_hf reads"),
    ]:
        with pytest.raises(SystemExit):
            train.main(["--out_dir", str(out), *flags])
        assert refusal in capsys.readouterr().err
    assert not out.exists()


def test_sample_reads_the_checkpoint_ckpt_step_names(small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    # fmt: off
    run = [
        "--source", small_corpus, "--data_dir", tmp_path / "data", "--out_dir", out, "--n_layer", "1",
        "--n_head", "2", "--n_embd", "32", "--block_size", "16",
    ]
    train.main([str(a) for a in [*run, "--batch_size", "4", "--eval_iters", "1", "--max_iters", "4",
                                 "--ckpt_interval", "2", "--num_samples", "0"]])
    # fmt: on
    greedy = [str(a) for a in [*run, "--sample", "--num_samples", "1", "--max_new_tokens", "30", "--temperature", "0"]]
    capsys.readouterr()
    train.main([*greedy, "--ckpt_step", "2"])
    of_step_2 = capsys.readouterr()
    assert f"sampling from {out / 'ckpt' / 'step_0000002'}" in of_step_2.err
    with pytest.raises(
        SystemExit,
        match=r"the checkpoint of step 3 in .*ckpt cannot be read: there is no such checkpoint\. The checkpoints "
        r"there that verify: step 4, step 2, step 0; name one with --ckpt_step N",
    ):
        train.main([*greedy, "--ckpt_step", "3"])
    shutil.rmtree(out / "ckpt" / "step_0000004")
    capsys.readouterr()
    train.main(greedy)  # the newest now: step 2's
    assert capsys.readouterr().out == of_step_2.out


@needs_gpt2
def test_a_run_without_its_tokenizer_stops_before_step_0(small_corpus, tmp_path, monkeypatch):
    import tiktoken.load
    import tiktoken.registry

    data_dir = tmp_path / "data"
    prepare(DataConfig(source=str(small_corpus), tokenizer="gpt2", workers=1), str(data_dir))  # with the tokenizer
    # then offline: an empty tiktoken cache, no network, and no encoding this process loaded before
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})

    def offline(url):
        raise ConnectionError(f"no network to fetch {url}")

    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    out = tmp_path / "run"
    # fmt: off
    run = [
        "--data_dir", data_dir, "--tokenizer", "gpt2", "--out_dir", out, "--n_layer", "1", "--n_head", "2",
        "--n_embd", "32", "--block_size", "16", "--batch_size", "2", "--max_iters", "2",
    ]
    # fmt: on
    with pytest.raises(
        SystemExit,
        match=r"at its end this run writes 3 samples \(--num_samples 0: none\) with its data's tokenizer: tokenizer "
        r"'gpt2' is not available offline \(ConnectionError: no network .*\)\. .*run once with network.*point "
        r"TIKTOKEN_CACHE_DIR at the copy",
    ):
        train.main([str(a) for a in run])
    assert not (out / "ckpt").exists()
