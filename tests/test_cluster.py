"""cluster.py: the stop signals, the heartbeats that name a hung rank, workers that end with their launcher, and one
job per run folder; with real processes, signals and gloo where the property needs them."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import ROOT, write_word_corpus

from machinery.job import cluster
from machinery.job.local_ranks import run_ranks
from train import main

# fmt: off
SMALL = [
    "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--batch_size", "4",
    "--log_interval", "1", "--eval_interval", "1000", "--eval_iters", "2", "--num_samples", "0", "--plot", "false",
]
# fmt: on


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    write_word_corpus(root / "corpus.txt", 2000)
    return root


def args(corpus, out, *extra):
    return ["--source", str(corpus / "corpus.txt"), "--data_dir", str(corpus / "data"), "--out_dir", str(out)] + [
        *SMALL,
        *map(str, extra),
    ]


def dead_pid():
    """The PID of a process that has ended."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# ----------------------------------------------------------------------------
# Stop signals


def test_a_second_stop_signal_ends_the_process_at_once():
    """The first signal is only recorded (the loop stops at its next step boundary); the second ends the process as
    the signal does by default, without waiting for a boundary that may be far away."""
    code = (
        "import os, signal, time\n"
        "from machinery.job import cluster\n"
        "signals = cluster.StopSignals()\n"
        "signals.catch()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print(signals.received, flush=True)\n"
        "time.sleep(1.5)\n"  # a repeat within a second is the same notice, sent twice
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('still here', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout == "SIGTERM\n" and done.returncode == -signal.SIGTERM, done.stderr


@pytest.mark.integration  # the default run has the single-process SIGTERM (test_recovery.py)
def test_a_stop_signal_to_one_rank_stops_every_rank_with_a_checkpoint(corpus, tmp_path, monkeypatch):
    """SIGUSR1 to rank 1 alone, at step 6: both ranks finish the step, rank 0 writes the checkpoint of step 7, and
    both exit with cluster.PREEMPTED."""
    import train

    optimizer_step = train.optimizer_step
    calls = []

    def signal_at_step_6(model, *rest):
        calls.append(None)
        if len(calls) == 7 and model.grid.rank == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        return optimizer_step(model, *rest)

    monkeypatch.setattr(train, "optimizer_step", signal_at_step_6)
    out = tmp_path / "run"
    outcome = run_ranks(2, main, args(corpus, out, "--dp", "2", "--max_iters", "40", "--ckpt_interval", "100"))
    assert outcome == {0: ("exit", str(cluster.PREEMPTED)), 1: ("exit", str(cluster.PREEMPTED))}
    assert sorted(os.listdir(out / "ckpt")) == ["step_0000000", "step_0000007"]
    assert not (out / "lock.json").exists()  # released on the way out


# ----------------------------------------------------------------------------
# Heartbeats


def test_the_rank_that_did_not_mark_itself_waiting_is_named(tmp_path):
    job = [[socket.gethostname(), os.getpid()]]  # three ranks in one process, for the test
    beats = [cluster.Heartbeat(tmp_path, rank, world_size=3, job=job, interval=0) for rank in range(3)]
    for beat in beats:
        beat.beat(19)
    beats[0].step = beats[1].step = 20
    beats[1].beat(20, waiting=True)  # another survivor, which timed out first
    assert beats[0].unresponsive(grace=0) == (
        f"rank 2 stopped responding at step 20 (host {socket.gethostname()}, pid {os.getpid()}: its last heartbeat "
        "0 s ago, at step 19)"
    )
    assert beats[2].others_waiting()  # what the hung rank reads when its launcher signals it


def test_an_earlier_jobs_beats_are_not_this_jobs(tmp_path):
    earlier = [[socket.gethostname(), dead_pid()]]
    cluster.Heartbeat(tmp_path, 1, world_size=2, job=earlier).beat(30, waiting=True)
    (tmp_path / "heartbeat" / "rank_1.json").write_text(
        json.dumps({**json.loads((tmp_path / "heartbeat" / "rank_1.json").read_text()), "pid": earlier[0][1]})
    )  # as that job's rank 1 wrote it
    fresh = cluster.Heartbeat(tmp_path, 0, world_size=2, job=[[socket.gethostname(), os.getpid()]])
    assert not fresh.others_waiting()
    assert fresh.unresponsive(grace=0) == "rank 1 stopped responding at step None (it left no heartbeat)"


@pytest.mark.integration
def test_a_hung_rank_is_named_by_the_survivor(corpus, tmp_path):
    """--inject hang@12 on rank 1 of 2: it sleeps, alive; rank 0 waits in its next collective until --dist_timeout,
    then names it. A restart resumes (the fault fired once)."""
    out = tmp_path / "run"
    started = time.monotonic()
    extra = ("--dp", "2", "--max_iters", "20", "--ckpt_interval", "5", "--inject", "hang@12", "--dist_timeout", "5")
    outcome = run_ranks(2, main, args(corpus, out, *extra), timeout=30)  # the hung rank is killed at 30 s
    status, message = outcome[0]
    assert status == "exit" and "rank 1 stopped responding at step 12" in message, outcome
    assert "rank 1: injecting fault" not in message  # the detector's words, not the injector's
    assert outcome[1][0] == "missing" and time.monotonic() - started < 60
    assert run_ranks(2, main, args(corpus, out, *extra)) == {0: ("ok", None), 1: ("ok", None)}


# ----------------------------------------------------------------------------
# One job per run folder


def holder(pid, renewed_ago=0.0, host=None):
    now = time.time()
    return {"processes": [[host or socket.gethostname(), pid]], "started": now - 100, "renewed": now - renewed_ago}


def write_lock(folder, held):
    folder.mkdir(exist_ok=True)
    (folder / cluster.LOCK_FILE).write_text(json.dumps(held))


def test_a_live_jobs_lock_is_refused_naming_its_pid(tmp_path):
    live = os.getppid()  # the process that started the tests: alive (this process's own lock would be its own)
    write_lock(tmp_path, holder(live))
    with pytest.raises(ValueError, match=rf"in use by the job started .* pid {live}\).*kill {live}"):
        cluster.RunLock(tmp_path, cluster.this_process())


@pytest.mark.parametrize(
    "gone",
    [
        pytest.param(lambda: holder(dead_pid()), id="its-processes-ended"),
        pytest.param(lambda: holder(1, host="another-host", renewed_ago=2 * cluster.STALE_SECONDS), id="not-renewed"),
        pytest.param(lambda: holder(os.getppid(), renewed_ago=2 * cluster.STALE_SECONDS), id="pid-reused"),
    ],
)
def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path, gone, capsys):
    write_lock(tmp_path, gone())
    lock = cluster.RunLock(tmp_path, cluster.this_process())
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and said[0].startswith("warning: taking over") and "which is gone" in said[0]
    assert json.loads((tmp_path / cluster.LOCK_FILE).read_text())["processes"] == [[socket.gethostname(), os.getpid()]]
    lock.release()
    assert not (tmp_path / cluster.LOCK_FILE).exists()


def test_a_lock_taken_over_by_another_job_is_not_released_by_the_first(tmp_path):
    lock = cluster.RunLock(tmp_path, cluster.this_process())
    write_lock(tmp_path, holder(12345, host="another-host"))  # it was judged gone, and another job took over
    lock.release()
    assert json.loads((tmp_path / cluster.LOCK_FILE).read_text())["processes"] == [["another-host", 12345]]


@pytest.mark.integration
def test_a_second_job_on_a_live_run_folder_is_refused_before_step_0(corpus, tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "train.py", *args(corpus, out, "--max_iters", "100000", "--max_epochs", "0")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in first.stdout:  # until it trains
            if line.startswith("step"):
                break
        second = subprocess.run(
            [sys.executable, "train.py", *args(corpus, out, "--max_iters", "100000", "--max_epochs", "0")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        first.kill()
        first.wait()
    assert second.returncode != 0 and f"pid {first.pid}" in second.stderr and "one job per run folder" in second.stderr
    assert "step " not in second.stdout


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("torchrun") is None or sys.platform == "win32", reason="needs torchrun and POSIX")
def test_a_kill_of_torchruns_process_group_ends_every_worker(corpus, tmp_path):
    """torchrun starts each worker in a session of its own: a kill -9 of torchrun's process group would leave them
    training as orphans. Each watches its launcher and ends within a moment of its death."""
    out = tmp_path / "run"
    endless = args(corpus, out, "--dp", "2", "--max_iters", "100000", "--max_epochs", "0")
    launcher = subprocess.Popen(
        ["torchrun", "--nproc_per_node", "2", "train.py", *endless],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        for line in launcher.stdout:
            if line.startswith("step"):
                break
        workers = [pid for _, pid in json.loads((out / cluster.LOCK_FILE).read_text())["processes"]]
        assert launcher.pid in workers and len(workers) == 3  # the two ranks and their launcher
        os.killpg(launcher.pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while any(cluster.is_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(cluster.is_alive(pid) for pid in workers)
    finally:
        launcher.wait()
        for pid in re.findall(r"\d+", subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout):
            os.kill(int(pid), signal.SIGKILL)
