"""Shared fixtures. Multi-rank tests start their ranks with local_ranks.run_ranks (forked processes with
torchrun's environment).

A few tests read data the project would otherwise download: Tiny Shakespeare and GPT-2's BPE files (tiktoken's
cache). They look in the first of these folders that exists, and are skipped, naming what they need, where none
holds it: $MINIPRETRAIN_TEST_DATA; data/test-data in the repository (where `python tests/fetch_test_data.py`
puts them, once, with network); ../shared/data beside the repository (a team's copy for offline machines)."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project's modules, however the tests were started

TEST_DATA_FOLDERS = [
    *([Path(os.environ["MINIPRETRAIN_TEST_DATA"])] if os.environ.get("MINIPRETRAIN_TEST_DATA") else []),
    ROOT / "data" / "test-data",
    ROOT.parent / "shared" / "data",
]
TEST_DATA = next((folder for folder in TEST_DATA_FOLDERS if folder.is_dir()), TEST_DATA_FOLDERS[0])
SHAKESPEARE = TEST_DATA / "tinyshakespeare.txt"
TIKTOKEN_CACHE = TEST_DATA / "tiktoken_cache"
HELLASWAG_FIXTURE = ROOT / "tests" / "data" / "hellaswag_mini.jsonl"  # 8 examples in HellaSwag's format, 4 endings each

if os.environ.get("PYTEST_XDIST_WORKER"):  # python -m pytest -n 2: two tests at a time, a core each, and so the
    os.environ["OMP_NUM_THREADS"] = "1"  # scripts and ranks they start (torch reads it when first imported)

if TIKTOKEN_CACHE.is_dir():  # tiktoken reads this at load time: gpt2 works offline
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))

FETCH = "python tests/fetch_test_data.py, once, with network (see docs/benchmarks.md#tests)"
needs_shakespeare = pytest.mark.skipif(
    not SHAKESPEARE.exists(), reason=f"needs Tiny Shakespeare (tinyshakespeare.txt) in a test-data folder: {FETCH}"
)
needs_gpt2 = pytest.mark.skipif(
    not TIKTOKEN_CACHE.is_dir(), reason=f"needs GPT-2's BPE files (tiktoken_cache/) in a test-data folder: {FETCH}"
)


LONGEST_FIRST = ("slow", "graders")  # markers whose tests take minutes: started first, so none ends the run alone


def pytest_collection_modifyitems(items):
    """The tests under LONGEST_FIRST's markers first, in that order (a stable sort: each module's order kept)."""

    def rank(item):
        return next((i for i, name in enumerate(LONGEST_FIRST) if item.get_closest_marker(name)), len(LONGEST_FIRST))

    items.sort(key=rank)


def run_script(args, cwd, timeout=600):
    """Run one of the project's scripts in a fresh interpreter; return the CompletedProcess."""
    return subprocess.run(
        [sys.executable, *(str(a) for a in args)], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def write_word_corpus(path, lines):
    """Random sentences over ten words: a corpus a small model learns within tens of steps."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    rng = random.Random(0)
    path.write_text("".join(" ".join(rng.choices(words, k=8)) + ".\n" for _ in range(lines)))
    return path


@pytest.fixture
def small_corpus(tmp_path):
    """A folder of three short text documents, ~60 KB in all."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    line = "the quick brown fox jumps over the lazy dog {}\n"
    for i in range(3):
        (folder / f"doc{i}.txt").write_text("".join(line.format(i * 1000 + j) for j in range(400)))
    return folder


def save_bpe_tokenizer(folder, texts, vocab_size=400):
    """A byte-level BPE trained on texts, with <|endoftext|> as its special token, saved into folder as a base model
    ships it: tokenizer.json, and the tokenizer_config.json AutoTokenizer reads its class from."""
    import json

    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet
    )
    tokenizer.train_from_iterator(texts, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder
