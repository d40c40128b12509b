"""examples/slurm/train.sbatch, run by bash with stand-ins for srun, scontrol and torchrun on the PATH: the
torchrun command each node runs, the global batch kept on any number of nodes, and the requeue on a signal."""

import contextlib
import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import ROOT

SCRIPT = ROOT / "examples" / "slurm" / "train.sbatch"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash, as Slurm does")


@pytest.fixture
def slurm(tmp_path):
    """A PATH whose srun runs its command once (as on one node), whose scontrol names two nodes and records a
    requeue, and whose torchrun records its arguments, then sleeps for SLEEP seconds (0: returns at once)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    stubs = {
        "srun": 'while [[ "$1" == --* ]]; do shift; done; exec "$@"',
        "scontrol": f'if [[ "$1" == show ]]; then printf "node1\\nnode2\\n"; else echo "scontrol $*" >> {calls}; fi',
        "torchrun": f'echo "torchrun $*" >> {calls}; sleep "${{SLEEP:-0}}"',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SHARED": str(tmp_path / "shared"),
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_ID": "1234",
    }
    return env, calls


def test_each_node_runs_torchrun_with_the_presets_global_batch(slurm):
    env, calls = slurm
    done = subprocess.run(["bash", SCRIPT, "--max_iters", "5"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    (line,) = calls.read_text().splitlines()
    shared = env["SHARED"]
    assert line == (
        "torchrun --nnodes=2 --nproc_per_node=8 --rdzv_id=1234 --rdzv_backend=c10d --rdzv_endpoint=node1:29500 "
        f"train.py --preset gpt2-small --dp 16 --gradient_accumulation_steps 2 --data_dir {shared}/data/corpus-gpt2 "
        f"--out_dir {shared}/runs/gpt2-small --max_iters 5"
    )  # 16 GPUs x 16 sequences x 2 micro-steps: gpt2-small's 512 sequences per step


def test_a_node_count_that_breaks_the_global_batch_is_refused(slurm):
    env, calls = slurm
    done = subprocess.run(["bash", SCRIPT], env={**env, "SLURM_NNODES": "3"}, capture_output=True, text=True)
    assert done.returncode == 1 and "24 GPUs do not divide gpt2-small's 32 micro-steps" in done.stderr
    assert not calls.exists()  # nothing started


def test_the_signal_before_the_time_limit_requeues_the_job(slurm):
    env, calls = slurm
    job = subprocess.Popen(["bash", SCRIPT], env={**env, "SLEEP": "30"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 60  # until torchrun has started (and the trap is set): slow on a busy machine
        while not calls.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert calls.exists(), "the script started torchrun"
        job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 sends the batch script
        job.wait(timeout=20)
        assert "scontrol requeue 1234" in calls.read_text().splitlines()
    finally:
        with contextlib.suppress(ProcessLookupError):  # the sleeping stand-in for torchrun, if still there
            os.killpg(job.pid, signal.SIGKILL)
