"""The benchmark: HellaSwag-format multiple choice, scored by the model's loss; its download; --eval_only."""

import contextlib
import json
import math

import pytest
import torch
import torch.nn as nn
from conftest import HELLASWAG_FIXTURE as FIXTURE
from conftest import ROOT, run_script

from machinery.components import evaluation
from machinery.components.run_folder import is_finished
from machinery.corpora.corpus import ByteTokenizer
from machinery.job.config import BenchmarkConfig
from machinery.job.files import file_sha256
from model import GPTConfig


class UnigramModel(nn.Module):
    """Predicts the same distribution at every position: byte 'a' with probability 1/2, each of the
    other 255 bytes with 1/510. So the loss of an 'a' is ln 2 and of any other byte ln 510."""

    def __init__(self):
        super().__init__()
        self.config = GPTConfig(block_size=64)
        self.logits = torch.zeros(256)
        self.logits[ord("a")] = math.log(255)

    def forward(self, idx):  # (B, T) -> (B, T, 256)
        return self.logits.expand(*idx.shape, 256), None


def write_examples(path, examples):
    path.write_text("".join(json.dumps({"ctx": c, "endings": e, "label": label}) + "\n" for c, e, label in examples))
    return path


def test_accuracy_is_computed_as_by_hand(tmp_path):
    a, other = math.log(2), math.log(510)  # the unigram model's loss per token
    # Each ending is scored with the space before it. Example 1's endings cost:
    #   " aaaaaaaaaa": 1 other + 10 a = 13.166 in all, 1.197 per token
    #   " b": 2 other = 12.469, 6.234 per token; " bb": 18.703; " bbb": 24.938
    # acc (lowest sum) picks " b", which is wrong; acc_norm (lowest mean) picks the a's, right.
    # Example 2: " aa" costs 7.621 (2.540 per token), below " b" both ways: both right.
    path = write_examples(
        tmp_path / "hand.jsonl",
        [
            ("x", ["aaaaaaaaaa", "b", "bb", "bbb"], 0),
            ("x", ["b", "aa", "bbbb", "bbbbbbbbbbbb"], 1),
        ],
    )
    examples = evaluation.read_examples(path)
    rows, starts = evaluation.render(*examples[0][:2], ByteTokenizer(), block_size=64)
    summed, mean = evaluation.ending_losses(UnigramModel(), rows, starts, torch.device("cpu"))
    fp32 = dict(rtol=1e-5, atol=1e-4)  # a loss is a log-sum-exp over 256 fp32 logits
    torch.testing.assert_close(summed, torch.tensor([other + 10 * a, 2 * other, 3 * other, 4 * other]), **fp32)
    torch.testing.assert_close(mean, torch.tensor([(other + 10 * a) / 11, other, other, other]), **fp32)
    scores = evaluation.benchmark_scores(
        UnigramModel(), ByteTokenizer(), examples, torch.device("cpu"), contextlib.nullcontext()
    )
    assert scores == {"acc": 0.5, "acc_norm": 1.0, "chance": 0.25, "examples": 2}


def test_a_long_row_keeps_its_ending_and_cuts_the_context():
    rows, starts = evaluation.render("0123456789", ["ab"], ByteTokenizer(), block_size=4)
    assert bytes(rows[0]) == b"89 ab" and starts == [2]  # block_size + 1 tokens: " ab" is scored whole


def test_bad_examples_are_named(tmp_path):
    bad = write_examples(tmp_path / "b.jsonl", [("x", ["y"], 0)])
    with bad.open("a") as f:
        f.write('{"ctx": "x"}\n')
    with pytest.raises(ValueError, match="b.jsonl line 2: not a HellaSwag example"):
        evaluation.read_examples(bad)
    with pytest.raises(ValueError, match="label 4 is not an index"):
        evaluation.read_examples(write_examples(tmp_path / "c.jsonl", [("x", ["y", "z"], 4)]))
    with pytest.raises(ValueError, match="--benchmark 'nowhere.jsonl': no such file"):
        evaluation.read_benchmark(BenchmarkConfig(benchmark="nowhere.jsonl"))
    assert evaluation.read_benchmark(BenchmarkConfig()) == []  # none by default: the default run needs no network


def test_download_is_checked_by_sha256(tmp_path, monkeypatch):
    url = FIXTURE.as_uri()
    bcfg = BenchmarkConfig(benchmark="hellaswag", benchmark_url=url, benchmark_dir=str(tmp_path / "hs"))
    with pytest.raises(ValueError, match="sha256 .*expected 0aa3b888"):
        evaluation.read_benchmark(bcfg)  # the fixture is not the real validation file
    assert list((tmp_path / "hs").iterdir()) == []  # and is not kept
    with pytest.raises(ValueError, match="could not download hellaswag .*--benchmark_url file:///"):
        evaluation.read_benchmark(
            BenchmarkConfig(
                benchmark="hellaswag", benchmark_url=(tmp_path / "no").as_uri(), benchmark_dir=str(tmp_path / "hs")
            )
        )
    # a file with the expected hash is kept, and read from disk from then on
    monkeypatch.setitem(evaluation.HELLASWAG, "sha256", file_sha256(FIXTURE))
    assert len(evaluation.read_benchmark(bcfg)) == 8
    offline = BenchmarkConfig(
        benchmark="hellaswag",
        benchmark_url=(tmp_path / "gone").as_uri(),
        benchmark_dir=str(tmp_path / "hs"),
        benchmark_examples=3,
    )
    assert len(evaluation.read_benchmark(offline)) == 3


@pytest.mark.integration
def test_a_model_trained_on_the_right_endings_picks_them_and_eval_only_agrees(tmp_path):
    """A tiny model trained on the fixture's contexts with their right endings scores far above
    guessing on it at the run's final check, which logs it; --eval_only of the last checkpoint
    (the same weights) logs the same val loss and accuracies again, and trains nothing."""
    examples = evaluation.read_examples(FIXTURE)
    corpus = tmp_path / "right.txt"
    corpus.write_text("".join(f"{context} {endings[label]}\n" for context, endings, label in examples) * 40)
    # fmt: off
    flags = [
        "--source", corpus, "--max_iters", "250", "--eval_interval", "125", "--ckpt_interval", "125",
        "--num_samples", "0", "--benchmark", FIXTURE, "--out_dir", tmp_path / "run",
        "--data_dir", tmp_path / "data", "--max_epochs", "0",  # memorizing the endings is the point
    ]
    # fmt: on
    trained = run_script(["train.py", *flags], cwd=ROOT)
    assert trained.returncode == 0, trained.stderr
    assert "on 8 HellaSwag-format examples (guessing scores 0.2500)" in trained.stdout
    again = run_script(["train.py", "--eval_only", *flags], cwd=ROOT)
    assert again.returncode == 0, again.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    final, evaluated = records[-2], records[-1]
    assert final["hellaswag_acc_norm"] >= 0.75  # 6 of 8 or better; guessing: 2 of 8
    assert final["step"] == evaluated["step"] == 250 and "loss" not in evaluated
    assert evaluated["eval_only"] is True and "eval_only" not in final
    for key in ("val_loss", "hellaswag_acc_norm", "hellaswag_acc"):
        assert final[key] == evaluated[key]
    assert "step 250, final check: val loss" in again.stdout and "step    " not in again.stdout  # no training step ran


def test_an_eval_only_record_does_not_finish_a_run(tmp_path):
    """A run that died after its last checkpoint but before its final check is not finished, and
    --eval_only's record at that step must not make it look finished (its plot and samples would never come)."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        json.dumps({"step": 9, "loss": 2.0})
        + "\n"
        + json.dumps({"step": 10, "val_loss": 2.0, "eval_only": True})
        + "\n"
    )
    assert not is_finished(str(metrics), 10, 10)
    with metrics.open("a") as f:
        f.write(json.dumps({"step": 10, "val_loss": 2.0}) + "\n")  # the run's own final check
    assert is_finished(str(metrics), 10, 10)


def test_eval_only_without_a_run_says_so(tmp_path):
    result = run_script(["train.py", "--eval_only", "--out_dir", tmp_path / "empty"], cwd=ROOT)
    assert result.returncode != 0 and "holds no checkpoints; train there first" in result.stderr
    assert not (tmp_path / "empty").exists()  # nothing created
