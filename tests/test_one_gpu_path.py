"""The path of someone with one GPU and a few days: the gpt2-small preset and the GPU speed script,
both run on the CPU at a tiny scale, so neither can rot where no GPU is at hand."""

import re

import pytest
from conftest import HELLASWAG_FIXTURE as FIXTURE
from conftest import ROOT, needs_gpt2, run_script, write_word_corpus


@needs_gpt2
@pytest.mark.integration
def test_gpt2_small_preset_runs_two_steps_on_cpu(tmp_path):
    """The whole preset (124M parameters, block 1024, GPT-2 BPE, the benchmark at the end) for two
    steps of one sequence: it starts near ln 50257, and the peak memory it prints stays under 6 GiB."""
    corpus = write_word_corpus(tmp_path / "words.txt", 4000)  # ~40k gpt2 tokens: 3 val rows of 1025
    # fmt: off
    result = run_script(
        [
            "train.py",
            "--preset", "gpt2-small", "--device", "cpu", "--max_iters", "2", "--batch_size", "1",
            "--gradient_accumulation_steps", "1", "--compile", "false", "--num_samples", "1",
            "--max_new_tokens", "8", "--eval_iters", "1", "--benchmark", FIXTURE, "--source", corpus,
            "--data_dir", tmp_path / "data", "--out_dir", tmp_path / "run",
        ],
        cwd=ROOT,
    )
    # fmt: on
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert "cost: parameters: 124.48M" in result.stdout and "ln 50257 = 10.8249" in result.stdout
    first_loss = float(re.search(r"step     0 \| loss (\S+)", result.stdout).group(1))
    assert abs(first_loss - 10.8249) < 0.3
    assert "on 8 HellaSwag-format examples" in result.stdout and "samples:" in result.stdout
    peak = float(re.search(r"peak memory (\S+) GiB", result.stdout).group(1))
    print(f"gpt2-small, 2 steps of 1 x 1024 tokens on CPU: peak memory {peak:.2f} GiB")
    assert peak < 6


@pytest.mark.integration
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_gpu_speed_script_runs_on_cpu(arch):
    """bench/gpu_speed.py's CPU mode: a tiny shape with GPT-2's vocabulary, one rank and 2 gloo ranks."""
    # fmt: off
    result = run_script(
        ["bench/gpu_speed.py", "--device", "cpu", "--compile", "false", "--steps", "2", "--warmup", "1", "--dp", "2",
         "--arch", arch],
        cwd=ROOT,
        timeout=300,
    )
    # fmt: on
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if re.match(r"\s+[12]\s+4\s", line)]
    assert [row[0] for row in rows] == ["1", "2"] and all(float(row[2].replace(",", "")) > 0 for row in rows)
