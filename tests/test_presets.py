"""The textbook's numbers, reproduced by whole preset runs (minutes each: python -m pytest -m slow)."""

import json
import math

import pytest

from conftest import ROOT, SHAKESPEARE, needs_shakespeare, run_script

pytestmark = pytest.mark.slow


def final_records(out):
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r], records[-1]["val_loss"]


def test_default_run_learns_from_uniform_guessing(tmp_path):
    """`python train.py`: loss starts at ~ln 256 = 5.55 and ends clearly below 2.5, in under 10 minutes."""
    result = run_script([ROOT / "train.py"], cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    logged, val_loss = final_records(tmp_path / "out" / "tiny")
    assert abs(logged[0]["loss"] - math.log(256)) < 0.1
    assert logged[-1]["loss"] < 2.2 and val_loss < 2.2


@needs_shakespeare
def test_shakespeare_baby_gpt_matches_nanogpt(tmp_path):
    """nanoGPT's CPU baby GPT reaches val loss ~1.88 at 2000 iterations; so must ours."""
    args = ["--preset", "shakespeare", "--url", SHAKESPEARE.as_uri(), "--data_dir", tmp_path / "d", "--out_dir", tmp_path / "o"]
    result = run_script([ROOT / "train.py", *args], cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    _, val_loss = final_records(tmp_path / "o")
    assert val_loss <= 1.89
