import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, SHAKESPEARE, needs_gpt2, needs_shakespeare, run_script, save_bpe_tokenizer

import data
from data import TokenStream
from errors import UserError
from machinery.corpora import corpus
from machinery.corpora.corpus import DOWNLOADS, DataConfig, get_tokenizer, prepare
from machinery.job.files import download, file_sha256

TEXT = "Hello, world!\n\tunicode: naïve café 日本語 🙂 <|endoftext|> done"


def test_byte_tokenizer_round_trip():
    tok = get_tokenizer("byte")
    ids = tok.encode(TEXT)
    assert tok.vocab_size == 256 and max(ids) < 256
    assert tok.decode(ids) == TEXT


@needs_gpt2
def test_gpt2_tokenizer_round_trip():
    tok = get_tokenizer("gpt2")
    assert tok.encode("hello world") == [31373, 995]
    assert tok.vocab_size == 50257 and tok.eot == 50256
    assert tok.decode(tok.encode(TEXT)) == TEXT  # "<|endoftext|>" in text is ordinary text, not the EOT id
    assert tok.eot not in tok.encode(TEXT)


def test_unknown_tokenizer_lists_choices():
    with pytest.raises(ValueError, match="unknown tokenizer 'bpe-9'.*byte.*gpt2"):
        get_tokenizer("bpe-9")


def test_tokenizer_not_available_offline_says_what_to_do(monkeypatch):
    import tiktoken

    def offline(name):
        raise ConnectionError("network unreachable")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(ValueError, match="not available offline.*TIKTOKEN_CACHE_DIR.*--tokenizer byte"):
        get_tokenizer("gpt2")


def test_prepare_writes_bins_and_meta(small_corpus, tmp_path):
    out = tmp_path / "prepared"
    meta = prepare(DataConfig(source=str(small_corpus)), str(out))
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "val.bin", dtype=np.uint16)
    docs = [(small_corpus / f"doc{i}.txt").read_bytes() for i in range(3)]
    expected = b"\0".join(docs) + b"\0"  # byte tokenizer: EOT (0) after each document
    assert bytes(np.concatenate([train, val]).astype(np.uint8)) == expected
    assert meta["train_tokens"] == len(train) and meta["val_tokens"] == len(val)
    assert len(val) == int(len(expected) * 0.1)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 256 and meta["documents"] == 3
    assert json.loads((out / "meta.json").read_text()) == meta
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_prepare_streams_in_chunks(small_corpus, tmp_path):
    """Chunked reading cuts at line ends and changes nothing in the output."""
    a, b = tmp_path / "a", tmp_path / "b"
    prepare(DataConfig(source=str(small_corpus)), str(a))
    prepare(DataConfig(source=str(small_corpus)), str(b), chunk_chars=100)
    for name in ("train.bin", "val.bin"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_prepare_again_is_a_no_op(small_corpus, tmp_path, capsys):
    out = tmp_path / "prepared"
    prepare(DataConfig(source=str(small_corpus)), str(out))
    stamps = {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)}
    prepare(DataConfig(source=str(small_corpus)), str(out))
    assert {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)} == stamps
    assert "already holds" in capsys.readouterr().out


def test_prepare_refuses_other_inputs_unless_overwrite(small_corpus, tmp_path):
    out = tmp_path / "prepared"
    prepare(DataConfig(source=str(small_corpus)), str(out))
    before = (out / "train.bin").read_bytes()
    (small_corpus / "doc0.txt").write_text("changed text\n" * 100)
    with pytest.raises(ValueError, match="already holds data prepared differently.*source_sha256.*--overwrite"):
        prepare(DataConfig(source=str(small_corpus)), str(out))
    assert (out / "train.bin").read_bytes() == before
    prepare(DataConfig(source=str(small_corpus)), str(out), overwrite=True)
    assert (out / "train.bin").read_bytes() != before


def test_failed_prepare_leaves_previous_data_intact(small_corpus, tmp_path):
    out = tmp_path / "prepared"
    prepare(DataConfig(source=str(small_corpus)), str(out))
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    (small_corpus / "doc2.txt").write_bytes(b"\xff\xfe not utf-8")  # fails mid-way, after doc0 and doc1
    with pytest.raises(ValueError, match="doc2.txt is not UTF-8"):
        prepare(DataConfig(source=str(small_corpus)), str(out), overwrite=True)
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before  # no temp files, nothing changed


def test_prepare_leaves_token_files_not_of_ours_untouched(small_corpus, tmp_path):
    out = tmp_path / "nanogpt"  # nanoGPT's prepare.py writes train.bin and val.bin, and meta.pkl, not meta.json
    out.mkdir()
    theirs = {name: name.encode() for name in ("train.bin", "val.bin", "meta.pkl")}
    for name, content in theirs.items():
        (out / name).write_bytes(content)
    with pytest.raises(ValueError, match=r"holds train\.bin and val\.bin but no meta\.json.*nothing there was touched"):
        prepare(DataConfig(source=str(small_corpus)), str(out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == theirs
    prepare(DataConfig(source=str(small_corpus)), str(out), overwrite=True)  # asked for: replaced
    assert (out / "meta.json").exists() and (out / "train.bin").read_bytes() != theirs["train.bin"]


def test_glob_and_single_file_sources(small_corpus, tmp_path):
    one = prepare(DataConfig(source=str(small_corpus / "doc1.txt")), str(tmp_path / "one"))
    two = prepare(DataConfig(source=str(small_corpus / "doc[01].txt")), str(tmp_path / "two"))
    assert one["documents"] == 1 and two["documents"] == 2


def test_missing_source_is_named(tmp_path):
    with pytest.raises(ValueError, match="--source '.*nowhere.txt': no such file.*stdlib, shakespeare"):
        prepare(DataConfig(source=str(tmp_path / "nowhere.txt")), str(tmp_path / "out"))


def test_empty_corpus_is_an_error(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="produced no tokens"):
        prepare(DataConfig(source=str(tmp_path / "empty.txt")), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "meta.json").exists()


def test_stdlib_source_is_deterministic_and_skips_tests():
    files = corpus.stdlib_files()
    rel = [os.path.relpath(f, os.path.dirname(corpus.__file__)) for f in files]
    assert files == corpus.stdlib_files() and len(files) > 300
    assert any(f.endswith(os.path.join("pydoc_data", "topics.py")) for f in files)
    assert not any(part in ("test", "tests", "site-packages") for f in files for part in f.split(os.sep)[-3:-1])
    assert rel  # ordered, non-empty


@needs_shakespeare
def test_shakespeare_download_is_checked(tmp_path):
    url = SHAKESPEARE.as_uri()
    meta = prepare(DataConfig(source="shakespeare", url=url), str(tmp_path / "sh"))
    assert meta["train_tokens"] + meta["val_tokens"] == SHAKESPEARE.stat().st_size + 1  # ASCII + one EOT
    wrong = tmp_path / "wrong.txt"
    wrong.write_text("not shakespeare\n")
    with pytest.raises(ValueError, match="sha256"):
        download("shakespeare", str(tmp_path / "other"), DOWNLOADS["shakespeare"], url=wrong.as_uri())
    assert os.listdir(tmp_path / "other") == []  # the bad download is not kept


def test_unreachable_download_says_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="could not download shakespeare.*--source"):
        download("shakespeare", str(tmp_path), DOWNLOADS["shakespeare"], url=(tmp_path / "missing.txt").as_uri())


def test_a_long_download_reports_its_progress(tmp_path, capsys):
    served = tmp_path / "big.bin"
    served.write_bytes(os.urandom(5 << 20))  # 5 MB: a line per MB, the most often it reports
    spec = dict(sha256=file_sha256(served), filename="big.bin", offline_flags=("--source", "--url"))
    path = download("big", str(tmp_path / "dest"), spec, url=served.as_uri())
    assert open(path, "rb").read() == served.read_bytes()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  big: ")]
    assert lines == [f"  big: {mb} of 5 MB" for mb in range(1, 6)]  # 5 MiB is 5.24 MB


def test_default_data_dir_is_short_and_one_per_source():
    assert corpus.default_data_dir(DataConfig(source="texts/*.txt")) == os.path.join("data", "texts_txt-byte")
    deep = [f"/home/someone/corpora/2026/{kind}/collected/by/hand/**/*.txt" for kind in ("prose", "poems")]
    names = [os.path.basename(corpus.default_data_dir(DataConfig(source=source, tokenizer="gpt2"))) for source in deep]
    assert names[0] != names[1] and all(len(name) <= 54 for name in names)
    assert names[0].startswith("corpora_2026_prose_collected_by_hand_txt_") and names[0].endswith("-gpt2")


def write_tokens(path, n):
    """A token file whose token i is the number i, so every window names its own position."""
    np.arange(n, dtype=np.uint16).tofile(path)
    return np.arange(n)


def check_shapes(x, y, B, T):
    assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor), (
        f"next_batch returns two torch tensors (x, y): got {type(x).__name__} and {type(y).__name__}"
    )
    assert tuple(x.shape) == tuple(y.shape) == (B, T), (
        f"next_batch returns x and y of shape (B, T) = {(B, T)}: got {tuple(x.shape)} and {tuple(y.shape)}"
    )
    assert x.dtype == y.dtype == torch.int64, (
        f"x and y are int64 (embedding indices and cross-entropy targets): got {x.dtype} and {y.dtype}"
    )


@pytest.mark.parametrize(
    "B, T, lanes, n_windows, order_seed",
    [
        pytest.param(3, 8, 1, 24, 0, id="B=3, T=8, lanes=1"),
        pytest.param(3, 8, 4, 26, 0, id="B=3, T=8, lanes=4, 2 windows sit out"),
        pytest.param(2, 5, 3, 12, 0, id="B=2, T=5, lanes=3"),
        pytest.param(2, 5, 3, 12, 5, id="B=2, T=5, lanes=3, order_seed=5"),
        pytest.param(1, 1, 1, 5, 0, id="B=1, T=1"),
        # 10 rows an epoch: the 4th batch reads its last row, then the next epoch's first two
        pytest.param(3, 4, 2, 10, 0, id="B=3, T=4, lanes=2, a batch across the epoch's end"),
    ],
)
def test_token_stream_walks_without_gaps_or_overlap(tmp_path, B, T, lanes, n_windows, order_seed):
    """Row r of the walk is window stream.window(r) (lanes, then the seeded order), tokens [w*T, w*T + T]:
    x its first T, y its last T; a batch that crosses the end of an epoch reads on into the next one."""
    tokens = write_tokens(tmp_path / "t.bin", n_windows * T + 1)
    stream = TokenStream(str(tmp_path / "t.bin"), "uint16", B, T, lanes=lanes, order_seed=order_seed)
    rows = stream.windows_per_epoch  # one epoch
    batches = -(-rows // B)  # the epoch's batches; where B does not divide rows, the last one crosses its end
    xs, ys = [], []
    for batch in range(batches):  # each batch checked as it comes: a wrong one is named before the next is read
        x, y = stream.next_batch()
        check_shapes(x, y, B, T)
        for b in range(B):
            r = batch * B + b
            w = stream.window(r)
            where = f"row {r} of the walk (batch {batch}, row {b}) is window self.window({r}) = {w}"
            want_x, want_y = tokens[w * T : w * T + T].tolist(), tokens[w * T + 1 : w * T + T + 1].tolist()
            assert x[b].tolist() == want_x, (
                f"{where}: x holds tokens {w * T}..{w * T + T - 1}: expected {want_x}, got {x[b].tolist()}"
            )
            assert y[b].tolist() == want_y, (
                f"{where}: y is x shifted by one, the next tokens: expected {want_y}, got {y[b].tolist()}"
            )
        xs.append(x)
        ys.append(y)
    x, y = torch.cat(xs), torch.cat(ys)  # (batches * B, T): the epoch's rows, then any of the next epoch's
    predicted = sorted(y[:rows].flatten().tolist())
    assert predicted == tokens[1 : rows * T + 1].tolist(), (
        f"one epoch predicts each of tokens 1..{rows * T} exactly once: got {predicted[:12]}..."
    )
    assert stream.position == batches * B, (
        f"position counts the rows read: after {batches} batches of {B}, expected {batches * B}, got {stream.position}"
    )
    again, _ = stream.next_batch()
    want = x[[(batches * B + b) % rows for b in range(B)]]  # row r reads what row r mod rows did
    assert torch.equal(again, want), (
        f"after one epoch of {rows} rows the walk starts over: expected {want[:, 0].tolist()} as the rows' first "
        f"tokens, got {again[:, 0].tolist()}"
    )


@pytest.mark.parametrize("world_size", [2, 3], ids=["world=2", "world=3"])
def test_token_stream_shards_by_rank_and_resumes(tmp_path, world_size):
    """Rank r of a world reads rows r*B .. r*B + B - 1 of the global batch one process of world*B reads."""
    T, B, steps = 4, 2, 5
    write_tokens(tmp_path / "t.bin", T * 64 + 1)
    path = str(tmp_path / "t.bin")
    single = TokenStream(path, "uint16", world_size * B, T, lanes=8)
    ranks = [TokenStream(path, "uint16", B, T, rank=r, world_size=world_size, lanes=8) for r in range(world_size)]
    for step in range(steps):
        x, y = single.next_batch()
        for r, stream in enumerate(ranks):
            xr, yr = stream.next_batch()
            check_shapes(xr, yr, B, T)
            want = x[r * B : r * B + B]
            assert torch.equal(xr, want) and torch.equal(yr, y[r * B : r * B + B]), (
                f"at step {step}, rank {r} of {world_size} reads rows {r * B}..{r * B + B - 1} of the global batch "
                f"of {world_size * B}: expected rows starting at tokens {want[:, 0].tolist()}, "
                f"got {xr[:, 0].tolist()}"
            )
    for r, stream in enumerate(ranks):
        assert stream.position == steps * world_size * B, (
            f"position counts the rows the whole group has read: after {steps} steps of {world_size} ranks x {B} "
            f"rows, expected {steps * world_size * B} on rank {r}, got {stream.position}"
        )
    resumed = [TokenStream(path, "uint16", B, T, rank=r, world_size=world_size, lanes=8) for r in range(world_size)]
    for stream in resumed:
        stream.load_state_dict(single.state_dict())
    want, got = single.next_batch()[0], torch.cat([stream.next_batch()[0] for stream in resumed])
    assert torch.equal(got, want), (
        f"ranks resumed from one process's position read its next global batch: expected rows starting at "
        f"tokens {want[:, 0].tolist()}, got {got[:, 0].tolist()}"
    )


def test_a_seeded_order_reads_the_same_windows_in_another_sequence(tmp_path):
    T, B, n_windows = 4, 2, 32
    write_tokens(tmp_path / "t.bin", T * n_windows + 1)
    path = str(tmp_path / "t.bin")

    def epoch(order_seed, **kwargs):
        stream = TokenStream(path, "uint16", B, T, lanes=4, order_seed=order_seed, **kwargs)
        return [row[0].item() for _ in range(n_windows // B) for row in stream.next_batch()[0]]

    plain, shuffled = epoch(0), epoch(7)
    every_window = list(range(0, T * n_windows, T))
    assert sorted(shuffled) == sorted(plain) == every_window, (
        f"with or without order_seed an epoch reads each window once: expected the starts {every_window}, got "
        f"{sorted(plain)} and, with order_seed=7, {sorted(shuffled)}"
    )
    assert shuffled != plain, f"order_seed=7 reads the windows in another order than the lanes: got {shuffled}"
    assert epoch(7) == shuffled and epoch(8) != shuffled, (
        "the order is fixed by the seed (order_seed=7 twice gives one order) and changes with it (order_seed=8)"
    )
    ranks = [TokenStream(path, "uint16", B // 2, T, rank=r, world_size=2, lanes=4, order_seed=7) for r in range(2)]
    sharded = [row[0].item() for _ in range(n_windows // B) for s in ranks for row in s.next_batch()[0]]
    assert sharded == shuffled, f"two ranks still split the same global batches: expected {shuffled}, got {sharded}"


def test_token_stream_too_small_for_a_block(tmp_path):
    write_tokens(tmp_path / "t.bin", 5)
    with pytest.raises(ValueError, match="fewer than one block.*--block_size"):
        TokenStream(str(tmp_path / "t.bin"), "uint16", 1, 8)


def test_data_cli(small_corpus, tmp_path):
    result = run_script(["-m", "machinery.corpus", "--source", small_corpus, "--out_dir", tmp_path / "d"], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "prepared" in result.stdout and (tmp_path / "d" / "meta.json").exists()
    bad = run_script(["-m", "machinery.corpus", "--source", tmp_path / "nope", "--out_dir", tmp_path / "e"], cwd=ROOT)
    assert bad.returncode != 0 and "nope" in bad.stderr and "Traceback" not in bad.stderr


JSONL_DOCS = ["First document.\nIt has two lines.", "  second: naïve café 日本語 🙂 <|endoftext|> as text", "third"]


@needs_gpt2
@pytest.mark.parametrize("name", ["corpus.jsonl", "corpus.jsonl.gz"])
def test_json_lines_corpus_gives_back_its_documents_in_order(tmp_path, name):
    """python -m machinery.corpus --source corpus.jsonl --text_field body --tokenizer gpt2: one document per line;
    decoding train.bin + val.bin gives the documents back, in order, each followed by end-of-text."""
    import gzip

    lines = "".join(json.dumps({"id": i, "body": text}) + "\n" for i, text in enumerate(JSONL_DOCS)) + "\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(lines.encode()) if name.endswith(".gz") else lines.encode())
    out = tmp_path / "prepared"
    result = run_script(
        [
            "-m",
            "machinery.corpus",
            "--source",
            path,
            "--text_field",
            "body",
            "--tokenizer",
            "gpt2",
            "--out_dir",
            out,
        ],
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "meta.json").read_text())
    tokens = np.concatenate([np.fromfile(out / f"{split}.bin", dtype=meta["dtype"]) for split in ("train", "val")])
    tok = get_tokenizer("gpt2")
    assert tokens[-1] == tok.eot and meta["documents"] == 3 and meta["text_field"] == "body"
    pieces = np.split(tokens, np.flatnonzero(tokens == tok.eot) + 1)[:-1]
    assert [tok.decode(piece[:-1].tolist()) for piece in pieces] == JSONL_DOCS


def test_json_lines_without_the_text_field_is_named(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text field"}) + "\n")
    with pytest.raises(
        ValueError, match=r"corpus.jsonl, line 2: no text under --text_field 'text' \(its fields: body\)"
    ):
        prepare(DataConfig(source=str(path)), str(tmp_path / "out"))
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match="corpus.jsonl, line 1: not JSON"):
        prepare(DataConfig(source=str(path)), str(tmp_path / "out"))


def test_sharded_parallel_prepare_writes_the_same_bytes(tmp_path):
    """Shards tokenized by 2 worker processes, or in one, or one big shard: the same token files."""
    from conftest import write_word_corpus

    write_word_corpus(tmp_path / "corpus.txt", 20000)
    outputs = {}
    for name, workers, shard_chars in (
        ("one shard", 1, 1 << 24),
        ("shards, 1 worker", 1, 1 << 16),
        ("shards, 2 workers", 2, 1 << 16),
    ):
        out = tmp_path / name
        prepare(
            DataConfig(source=str(tmp_path / "corpus.txt"), workers=workers),
            str(out),
            chunk_chars=1 << 14,
            shard_chars=shard_chars,
        )
        outputs[name] = [(out / f).read_bytes() for f in ("train.bin", "val.bin")]
        assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]  # no shards left behind
    assert outputs["one shard"] == outputs["shards, 1 worker"] == outputs["shards, 2 workers"]


KILL_AT_SHARD = r"""
import os, signal, sys
from machinery.corpora import corpus
calls = 0
tokenize = corpus.tokenize_shard
def tokenize_then_die(job):
    global calls
    calls += 1
    if calls == 4:
        os.kill(os.getpid(), signal.SIGKILL)  # killed mid-way, after 3 finished shards
    return tokenize(job)
corpus.tokenize_shard = tokenize_then_die
corpus.prepare(corpus.DataConfig(source=sys.argv[1], workers=1), sys.argv[2], chunk_chars=1 << 14, shard_chars=1 << 16)
"""


def test_a_killed_prepare_resumes_without_redoing_finished_shards(tmp_path, capsys):
    from conftest import write_word_corpus

    write_word_corpus(tmp_path / "corpus.txt", 20000)
    corpus, killed, whole = str(tmp_path / "corpus.txt"), tmp_path / "killed", tmp_path / "whole"
    result = subprocess.run([sys.executable, "-c", KILL_AT_SHARD, corpus, str(killed)], cwd=ROOT, timeout=120)
    assert result.returncode == -signal.SIGKILL
    assert not (killed / "meta.json").exists() and len(list((killed / "shards.partial").glob("*.bin"))) == 3
    prepare(DataConfig(source=corpus, workers=1), str(killed), chunk_chars=1 << 14, shard_chars=1 << 16)
    assert "resumed: 3 of" in capsys.readouterr().out
    prepare(DataConfig(source=corpus, workers=2), str(whole), chunk_chars=1 << 14, shard_chars=1 << 16)
    for name in ("train.bin", "val.bin"):
        assert (killed / name).read_bytes() == (whole / name).read_bytes()
    assert sorted(os.listdir(killed)) == ["meta.json", "train.bin", "val.bin"]


# ----------------------------------------------------------------------------
# A Hugging Face tokenizer.json (--tokenizer PATH), against transformers' own reading of it

MULTILINGUAL = "Hello, world! Grüße aus Köln. 你好，世界。 Привет, мир! naïve café <|endoftext|> the end\n"


@pytest.fixture(scope="module")
def hf_tokenizer_folder(tmp_path_factory):
    texts = [MULTILINGUAL * 3, "the quick brown fox jumps over the lazy dog"] * 5
    return save_bpe_tokenizer(tmp_path_factory.mktemp("hf-tokenizer"), texts)


def test_a_tokenizer_json_gives_transformers_ids(hf_tokenizer_folder):
    transformers = pytest.importorskip("transformers")
    ours = get_tokenizer(str(hf_tokenizer_folder))
    theirs = transformers.AutoTokenizer.from_pretrained(hf_tokenizer_folder)
    ids = ours.encode(MULTILINGUAL)
    assert ids == theirs.encode(MULTILINGUAL, add_special_tokens=False)
    assert ours.eot == theirs.convert_tokens_to_ids("<|endoftext|>") and ours.eot in ids  # the literal is special
    assert ours.decode(ids) == MULTILINGUAL
    assert get_tokenizer(str(hf_tokenizer_folder / "tokenizer.json")).encode(MULTILINGUAL) == ids


def test_the_corpus_command_prepares_a_corpus_with_a_tokenizer_json(hf_tokenizer_folder, tmp_path):
    transformers = pytest.importorskip("transformers")
    (tmp_path / "doc.txt").write_text(MULTILINGUAL * 20)
    out = tmp_path / "prepared"
    command = [
        "-m",
        "machinery.corpus",
        "--source",
        tmp_path / "doc.txt",
        "--tokenizer",
        hf_tokenizer_folder,
        "--out_dir",
        out,
    ]
    done = run_script(command, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "meta.json").read_text())
    tokens = np.concatenate([np.fromfile(out / f"{split}.bin", dtype=meta["dtype"]) for split in ("train", "val")])
    theirs = transformers.AutoTokenizer.from_pretrained(hf_tokenizer_folder)
    expected = theirs.encode(MULTILINGUAL * 20, add_special_tokens=False) + [meta["eot_token"]]
    assert tokens.tolist() == expected


def test_a_missing_tokenizer_json_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"--tokenizer {tmp_path}: no tokenizer.json there"):
        get_tokenizer(str(tmp_path))


@pytest.mark.parametrize("argv", [["--source", "c.txt", "--tokenizer", "byte", "--out_dir", "D"], []])
def test_data_py_as_a_script_points_to_corpus_preparation(argv, tmp_path):
    """`python data.py --source ...`, as older handouts say, prepares nothing: it exits non-zero naming the command
    that does, and writes nothing (a silent exit 0 would let the next command train on another corpus)."""
    result = run_script([os.path.join(ROOT, "data.py"), *argv], cwd=tmp_path, timeout=60)
    assert result.returncode != 0, f"python data.py {' '.join(argv)} exits non-zero: got 0, {result.stdout}"
    assert "python -m machinery.corpus" in result.stderr, f"it names the command that prepares: {result.stderr}"
    assert os.listdir(tmp_path) == [], f"it writes nothing: found {os.listdir(tmp_path)}"


def test_token_files_that_do_not_parse_are_refused_by_name(tmp_path):
    """A meta.json that holds no JSON, a token file with no whole id or none at all: each refused as the user's
    file, named (a UserError: one line), not a traceback from json or numpy."""
    (tmp_path / "meta.json").write_bytes(b'{"vocab_size": 256, \xff')
    with pytest.raises(UserError, match=f"{tmp_path / 'meta.json'} is not a JSON file"):
        data.load_meta(str(tmp_path))
    for name, content in [("empty.bin", b""), ("odd.bin", b"\x01\x02\x03")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UserError, match=f"{tmp_path / name} holds no uint16 token ids"):
            TokenStream(str(tmp_path / name), "uint16", 1, 1)
