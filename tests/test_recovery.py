"""Checkpoints, exact resume and automatic incident recovery, with real processes killed for real."""

import dataclasses
import json
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_script, write_word_corpus

from machinery.components import checkpoint
from machinery.components.run_folder import read_jsonl
from machinery.health.incidents import Recovery
from machinery.job import cluster
from machinery.job.config import RecoveryConfig, TrainConfig
from train import lr_at

# fmt: off
BASE = [
    "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--batch_size", "4",
    "--max_iters", "60", "--ckpt_interval", "10", "--log_interval", "1", "--eval_interval", "20",
    "--eval_iters", "4", "--warmup_iters", "10", "--learning_rate", "3e-3", "--monitor_window", "20",
    "--max_new_tokens", "20", "--num_samples", "1", "--plot", "false",
]
# fmt: on


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with a repetitive little corpus, prepared once, that a small model learns fast."""
    root = tmp_path_factory.mktemp("recovery")
    write_word_corpus(root / "corpus.txt", 4000)
    return root


def train_args(workdir, out, *extra):
    # fmt: off
    return [
        ROOT / "train.py",
        "--source", workdir / "corpus.txt", "--data_dir", workdir / "data", "--out_dir", out,
        *BASE,
        *extra,
    ]
    # fmt: on


def run_train(workdir, out, *extra):
    return run_script(train_args(workdir, out, *extra), cwd=workdir, timeout=300)


def losses(out):
    """The run's per-step numbers that must match exactly (speed excluded)."""
    keys = ("step", "loss", "val_loss", "lr", "grad_norm")
    return [tuple(r.get(k) for k in keys) for r in read_jsonl(out / "metrics.jsonl")]


@pytest.fixture(scope="module")
def clean(workdir):
    out = workdir / "clean"
    result = run_train(workdir, out)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_sigkill_between_checkpoints_resumes_bitwise(workdir, clean):
    out = workdir / "killed"
    process = subprocess.Popen(
        [sys.executable, *map(str, train_args(workdir, out))],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # kill it once it is past step 25, between two checkpoints
            if len(losses(out)) > 25:
                break
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    done = len(losses(out))
    assert done < len(losses(clean))  # it really died mid-run
    resumed = run_train(workdir, out, "--resume")  # a bare boolean flag: insist on resuming
    assert resumed.returncode == 0, resumed.stderr
    restart = int(re.search(r"resuming from the checkpoint of step (\d+)", resumed.stdout).group(1))
    assert restart % 10 == 0 and 20 <= restart <= done
    assert losses(out) == losses(clean)  # exact equality, not a tolerance


@pytest.mark.integration
def test_chaos_five_crashes_resume_to_the_same_losses(workdir, clean):
    out = workdir / "chaos"
    steps = sorted(random.Random(1).sample(range(1, 60), 5))
    inject = ",".join(f"crash@{s}" for s in steps)
    codes = [run_train(workdir, out, "--inject", inject).returncode for _ in range(6)]
    assert codes == [-signal.SIGKILL] * 5 + [0]
    assert json.loads((out / "injected.json").read_text()) == [f"crash@{s}" for s in steps]
    assert losses(out) == losses(clean)


def test_seed_seeds_every_generator_a_checkpoint_saves(workdir, clean):
    """Python's and numpy's generators too, not only torch's: two runs of one command save the same states."""
    again = workdir / "clean-again"
    assert run_train(workdir, again, "--max_iters", "2").returncode == 0
    first, second = (checkpoint.load(checkpoint.step_path(out / "ckpt", 0)) for out in (clean, again))
    assert first["rng"]["python"] == second["rng"]["python"]
    assert torch.equal(first["rng"]["numpy"]["state"]["key"], second["rng"]["numpy"]["state"]["key"])


@pytest.mark.integration
def test_sigterm_at_a_random_step_checkpoints_there_and_resumes_bitwise(workdir, clean):
    """A scheduler's SIGTERM (preemption, a time limit) at a random step: the run finishes that step, writes a
    checkpoint, and exits with cluster.PREEMPTED; the same command resumes there and logs the uninterrupted losses."""
    out, at = workdir / "preempted", random.Random(36).randint(12, 45)
    process = subprocess.Popen(
        [sys.executable, *map(str, train_args(workdir, out))], cwd=workdir, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 120
        while len(losses(out)) <= at and time.time() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        stdout, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == cluster.PREEMPTED, stdout
    stopped_at = int(re.search(r"SIGTERM: stopped after step \d+ and wrote the checkpoint of step (\d+)", stdout)[1])
    assert at < stopped_at < 60 and checkpoint.list_steps(out / "ckpt")[0] == stopped_at
    assert [r[0] for r in losses(out)] == list(range(stopped_at))  # nothing logged past the checkpoint
    resumed = run_train(workdir, out)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from the checkpoint of step {stopped_at}" in resumed.stdout
    assert losses(out) == losses(clean)  # exact equality, not a tolerance
    assert_same_tensors(out, clean, 60)


def assert_same_tensors(out, reference, step):
    """Every tensor of two runs' checkpoints of `step` equal bit for bit (the RNG states among them)."""
    mine, theirs = (checkpoint.load(checkpoint.step_path(o / "ckpt", step)) for o in (out, reference))
    flat_mine, flat_theirs = dict(flat_tensors(mine)), dict(flat_tensors(theirs))
    assert flat_mine.keys() == flat_theirs.keys()
    assert all(torch.equal(flat_mine[k], flat_theirs[k]) for k in flat_mine), [
        k for k in flat_mine if not torch.equal(flat_mine[k], flat_theirs[k])
    ]


def flat_tensors(value, prefix=""):
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from flat_tensors(v, f"{prefix}/{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from flat_tensors(v, f"{prefix}/{i}")


def test_a_corrupt_newest_checkpoint_falls_back_to_its_mirrored_copy_first(tmp_path, capsys):
    """checkpoint.find_latest over a run's ckpt/ and its --ckpt_mirror's: a step's copy in the mirror before an
    older step; the whole run resumed from it is tested below (integration)."""
    primary, mirror = tmp_path / "run" / "ckpt", tmp_path / "mirror" / "ckpt"
    for step in (10, 20):
        checkpoint.save(primary, step, {"step": step, "w": torch.full((3,), float(step))}, healthy=True)
        checkpoint.mirror(primary, mirror, step)
    (Path(checkpoint.step_path(primary, 20)) / "state.pt").write_bytes(b"not a checkpoint")
    step, path, state = checkpoint.find_latest([primary, mirror])
    warnings = capsys.readouterr().out.splitlines()
    assert (step, path, state["w"].tolist()) == (20, checkpoint.step_path(mirror, 20), [20.0] * 3)
    assert len(warnings) == 1 and f"falling back to its copy in {mirror}" in warnings[0]


@pytest.mark.integration
@pytest.mark.parametrize("fault", ["corrupt", "delete"])
def test_the_mirror_resumes_when_the_primarys_newest_checkpoint_is_lost(workdir, clean, fault):
    """--ckpt_mirror: a second run folder holds a verified copy of every checkpoint. With the primary's newest
    corrupted or deleted, the run resumes from the mirror's copy of that same step, bitwise."""
    out, mirror = workdir / f"mirrored-{fault}", workdir / f"mirror-{fault}"
    first = run_train(workdir, out, "--ckpt_mirror", mirror, "--inject", "crash@45")
    assert first.returncode == -signal.SIGKILL
    assert checkpoint.list_steps(mirror / "ckpt")[0] == 40 and (mirror / "run.json").exists()
    newest = Path(checkpoint.step_path(out / "ckpt", 40))
    if fault == "corrupt":
        (newest / "state.pt").write_bytes(b"not a checkpoint")
    else:
        shutil.rmtree(newest)
    resumed = run_train(workdir, out, "--ckpt_mirror", mirror, "--inject", "crash@45")
    assert resumed.returncode == 0, resumed.stderr
    assert f"taking the checkpoint of step 40 from the mirror: {checkpoint.step_path(mirror / 'ckpt', 40)}" in (
        resumed.stdout
    )
    assert losses(out) == losses(clean)
    assert_same_tensors(out, clean, 60)


def test_a_mirror_folder_of_another_run_is_refused(workdir, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    refused = run_train(workdir, workdir / "mirror-refused", "--ckpt_mirror", tmp_path, "--max_iters", "2")
    assert refused.returncode != 0 and f"--ckpt_mirror {tmp_path} is not empty and holds no run.json" in refused.stderr
    assert os.listdir(tmp_path) == ["notes.txt"]


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_crash_storm_ends_with_the_uninterrupted_runs_losses_and_tensors(workdir, ranks):
    """25 SIGKILLs at random moments, with a checkpoint every 2 steps, so that many land while one is written; the
    same command is started again after each. Under torchrun (2 ranks) the kill goes to torchrun's process group, as
    a cancelled job's would, and the workers, in sessions of their own, end as their launcher dies."""
    launch = [sys.executable] + (["-m", "torch.distributed.run", "--nproc_per_node", "2"] if ranks == 2 else [])
    steps = {1: 800, 2: 1200}[ranks]  # enough for 25 short lives (a dying launcher's workers train on a moment)
    extra = ("--ckpt_interval", "2", "--max_iters", steps, "--eval_interval", "200", "--dp", ranks)

    def command(out):
        return [*launch, *map(str, train_args(workdir, out, *extra))]

    reference = workdir / f"storm-{ranks}-reference"
    done = subprocess.run(command(reference), cwd=workdir, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out, rng, kills, mid_write = workdir / f"storm-{ranks}", random.Random(25 + ranks), 0, 0
    while kills < 25:
        job = subprocess.Popen(
            command(out), cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        # a life is a few steps past where the last one was cut, counted in steps so that a faster machine's lives
        # cover no more of the run, then a random moment, often while a checkpoint (every 2 steps) is written
        logged, steps_on = len(losses(out)), rng.randint(1, 16)
        deadline = time.time() + 120
        while len(losses(out)) < logged + steps_on and job.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.05))
        if job.poll() is not None:
            break  # it finished first
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        kills += 1
        mid_write += (out / "ckpt").is_dir() and any(name.endswith(".tmp") for name in os.listdir(out / "ckpt"))
        wait_for_the_jobs_processes_to_end(out)
    assert kills == 25, f"the run finished after {kills} kills: give it more steps"
    cut_at = len(losses(out))  # how far the 25 lives took it, printed against the whole run's records
    last = subprocess.run(command(out), cwd=workdir, capture_output=True, text=True, timeout=600)
    assert last.returncode == 0, last.stderr
    print(
        f"{kills} kills, {mid_write} of them while a checkpoint was being written; cut at {cut_at} records of "
        f"{len(losses(reference))}"
    )
    assert losses(out) == losses(reference)
    assert_same_tensors(out, reference, steps)


def wait_for_the_jobs_processes_to_end(out, timeout=15):
    """Until every process the run folder's lock names has ended (a worker notices its launcher's death within
    a second), so the next start finds a lock whose holder is gone rather than a live one."""
    lock = out / cluster.LOCK_FILE
    pids = [pid for _, pid in json.loads(lock.read_text())["processes"]] if lock.exists() else []
    deadline = time.time() + timeout
    while any(cluster.is_alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.1)


@pytest.mark.integration
def test_truncated_newest_checkpoint_falls_back(workdir, clean):
    out = workdir / "truncated"
    first = run_train(workdir, out, "--max_iters", "60", "--inject", "crash@45")
    assert first.returncode == -signal.SIGKILL
    newest = Path(checkpoint.step_path(out / "ckpt", 40))
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    resumed = run_train(workdir, out, "--inject", "crash@45")
    assert resumed.returncode == 0, resumed.stderr
    assert "skipping checkpoint" in resumed.stdout and "step_0000040" in resumed.stdout
    assert "resuming from the checkpoint of step 30" in resumed.stdout
    assert losses(out) == losses(clean)


@pytest.mark.parametrize("fault", ["nan", pytest.param("spike", marks=pytest.mark.integration)])
def test_injected_fault_is_recovered_automatically(workdir, clean, fault):
    out = workdir / fault
    result = run_train(workdir, out, "--inject", f"{fault}@52")
    assert result.returncode == 0, result.stdout + result.stderr
    incidents = [json.loads(line) for line in (out / "incidents.jsonl").read_text().splitlines()]
    assert len(incidents) == 1
    incident = incidents[0]
    assert incident["step"] == 52 and incident["detector"] == {"nan": "nonfinite", "spike": "spike"}[fault]
    assert (incident["rung"], incident["response"]) == (1, "skip")  # a first incident: skip the data, keep the LR
    action = incident["action"]
    assert action["restored_step"] == 50 and action["lr_scale"] == 1.0
    assert action["skipped_rows"] == [50 * 4, 53 * 4]  # from the checkpoint's data position past the bad batch
    final, clean_final = losses(out)[-1][2], losses(clean)[-1][2]
    assert abs(final - clean_final) / clean_final < 0.02, (final, clean_final)
    steps = [r[0] for r in losses(out)]
    assert steps == sorted(set(steps))  # metrics.jsonl holds one timeline, without the abandoned steps


def test_too_many_incidents_stop_the_run_with_good_checkpoints(workdir):
    out = workdir / "doomed"
    result = run_train(workdir, out, "--inject", "nan@33,nan@37", "--max_incidents", "1")
    assert result.returncode != 0
    assert (
        "stopping after 2 incidents (--max_incidents 1)" in result.stderr
        and "suspect something deeper" in result.stderr
    )
    assert [(i["rung"], i["response"]) for i in read_jsonl(out / "incidents.jsonl")] == [(1, "skip"), (3, "stop")]
    kept = checkpoint.list_steps(out / "ckpt")
    assert kept and all(checkpoint.verify(checkpoint.step_path(out / "ckpt", s)) is None for s in kept)


@pytest.mark.integration
def test_checkpoint_without_optimizer_state_is_refused(workdir):
    out = workdir / "no_optimizer"
    assert run_train(workdir, out, "--max_iters", "10").returncode == 0
    step, state = checkpoint.load_latest(out / "ckpt")
    del state["optimizer"]
    checkpoint.save(out / "ckpt", step, state, healthy=True)
    refused = run_train(workdir, out, "--max_iters", "20")
    assert refused.returncode != 0 and "has no optimizer state" in refused.stderr
    assert "--reset_optimizer" in refused.stderr
    accepted = run_train(workdir, out, "--max_iters", "20", "--reset_optimizer")
    assert accepted.returncode == 0 and "AdamW restarts from zero moments" in accepted.stdout


@pytest.mark.integration
def test_resume_without_the_three_pieces_forgets_each(workdir, clean):
    """--resume_without optimizer,data_position,schedule: the run continues from the weights alone."""
    out = workdir / "forgetful"
    shutil.copytree(clean, out)
    checkpoint.discard_after(out / "ckpt", 40)  # as if the machine died after step 40's checkpoint
    result = run_train(workdir, out, "--resume_without", "optimizer,data_position,schedule")
    assert result.returncode == 0, result.stderr
    assert "resuming without the checkpoint's optimizer, data_position, schedule" in result.stdout
    resumed = {r[0]: r for r in losses(out)}
    assert resumed[39] == losses(clean)[39]  # the timeline up to the checkpoint is kept
    assert resumed[40][3] == pytest.approx(lr_at(0, TrainConfig(learning_rate=3e-3, warmup_iters=10)))
    _, state = checkpoint.load_latest(out / "ckpt")
    assert state["step"] == 60 and state["recovery"]["schedule_from"] == 40
    assert state["data"]["position"] == 20 * 4  # rows read since the resume, from the start of train.bin
    assert {s["step"].item() for s in state["optimizer"]["state"].values()} == {20}  # AdamW's own count restarted


@pytest.mark.integration
def test_fp16_overflow_is_a_skipped_step_not_an_incident(workdir):
    """The loss scaler skips an overflowing fp16 step and lowers its scale; rolling back would undo that."""
    out = workdir / "fp16"
    result = run_train(workdir, out, "--max_iters", "30", "--dtype", "float16", "--naive_init_std", "1.0")
    assert result.returncode == 0, result.stderr
    skipped = [r for r in read_jsonl(out / "metrics.jsonl") if "skipped" in r]
    assert skipped and all("fp16 overflow" in r["skipped"] for r in skipped)
    assert "loss scale now 32768" in result.stdout  # halved from 65536 at the first overflow
    assert not read_jsonl(out / "incidents.jsonl")


def test_resume_with_another_model_shape_names_the_fields(workdir, clean):
    result = run_train(workdir, clean, "--n_embd", "64")
    assert result.returncode != 0
    assert "checkpoints cannot continue" in result.stderr and "n_embd: 32 -> 64" in result.stderr


@pytest.mark.integration
def test_torchrun_restarts_a_crashed_worker_which_resumes(workdir, clean):
    out = workdir / "torchrun"
    args = train_args(workdir, out, "--inject", "crash@33")
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "--max-restarts=2"]
    result = run_script([*launcher, *args[0:1], *args[1:]], cwd=workdir, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert losses(out) == losses(clean)


# --- checkpoint.py on its own ------------------------------------------------------------


def small_state(step):
    return {"step": step, "weights": torch.full((4,), float(step))}


def test_retention_keeps_exactly_what_the_policy_says(tmp_path):
    for step in range(0, 210, 10):
        checkpoint.save(tmp_path, step, small_state(step), healthy=step <= 170)
        kept = checkpoint.retain(tmp_path, keep_last=3, keep_every=50)
    # the newest 3, every 50th, and the newest healthy one (170): recovery may need it
    assert kept == [0, 50, 100, 150, 170, 180, 190, 200]
    assert sorted(checkpoint.list_steps(tmp_path)) == kept
    assert sorted(os.listdir(tmp_path)) == [f"step_{s:07d}" for s in kept]


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ.get('PAYLOAD_MARK', '/nonexistent/mark')}",))


def test_a_truncated_newest_checkpoint_is_skipped_for_the_one_before(tmp_path, capsys):
    """The in-process twin of test_truncated_newest_checkpoint_falls_back (-m integration, a whole run)."""
    for step in (10, 20):
        checkpoint.save(tmp_path, step, small_state(step), healthy=True)
    state = Path(checkpoint.step_path(tmp_path, 20)) / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a write cut off half way
    step, loaded = checkpoint.load_latest(tmp_path)
    warnings = capsys.readouterr().out.splitlines()
    assert step == 10 and torch.equal(loaded["weights"], small_state(10)["weights"])
    assert "step_0000020" in warnings[0] and "does not match its sha256" in warnings[0]


def test_crafted_pickle_is_refused_not_run(tmp_path, monkeypatch, capsys):
    mark = tmp_path / "pwned"
    monkeypatch.setenv("PAYLOAD_MARK", str(mark))
    checkpoint.save(tmp_path / "ckpt", 10, small_state(10), healthy=True)
    # an attacker replaces the newest checkpoint with a pickle that runs a command, and fixes its manifest
    evil = Path(checkpoint.step_path(tmp_path / "ckpt", 20))
    evil.mkdir()
    (evil / "state.pt").write_bytes(pickle.dumps({"model": Payload()}, protocol=2))
    manifest = {"step": 20, "healthy": True, "files": {"state.pt": checkpoint.file_sha256(evil / "state.pt")}}
    (evil / "manifest.json").write_text(json.dumps(manifest))
    step, state = checkpoint.load_latest(tmp_path / "ckpt")
    warnings = capsys.readouterr().out.splitlines()
    assert step == 10 and torch.equal(state["weights"], torch.full((4,), 10.0))
    assert "refused to load" in warnings[0] and "step_0000020" in warnings[0]
    assert not mark.exists()  # the payload never ran


def test_full_disk_keeps_previous_checkpoints(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, 10, small_state(10), healthy=True)
    before = (tmp_path / "step_0000010" / "state.pt").read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(ValueError, match="No space left.*earlier checkpoints there are untouched"):
        checkpoint.save(tmp_path, 20, small_state(20), healthy=True)
    assert os.listdir(tmp_path) == ["step_0000010"]  # no half-written step_0000020(.tmp)
    assert (tmp_path / "step_0000010" / "state.pt").read_bytes() == before


def test_resume_flag_without_a_checkpoint_is_an_error(workdir):
    result = run_train(workdir, workdir / "fresh", "--resume")
    assert result.returncode != 0 and "--resume, but" in result.stderr and "holds no checkpoint" in result.stderr


# --- the runbook's ladder ------------------------------------------------------------------


@pytest.mark.parametrize("response", [pytest.param("lower_lr", marks=pytest.mark.integration), "rewarm"])
def test_a_repeat_within_the_window_climbs_to_rung_2(workdir, response):
    out = workdir / f"repeat-{response}"
    result = run_train(workdir, out, "--inject", "nan@33,nan@37", "--repeat_response", response, "--rewarm_iters", "8")
    assert result.returncode == 0, result.stdout + result.stderr
    first, second = read_jsonl(out / "incidents.jsonl")
    assert (first["rung"], first["response"], first["action"]["lr_scale"]) == (1, "skip", 1.0)
    assert (second["rung"], second["response"]) == (2, response)
    assert first["action"]["restored_step"] == second["action"]["restored_step"] == 30
    records = {r["step"]: r for r in read_jsonl(out / "metrics.jsonl")}
    cfg = TrainConfig(max_iters=60, warmup_iters=10, learning_rate=3e-3, min_lr=2e-4)  # BASE's schedule
    if response == "lower_lr":  # half the scheduled LR for the rest of the run
        assert second["action"]["lr_scale"] == 0.5
        assert all(records[s]["lr"] == pytest.approx(0.5 * lr_at(s, cfg)) for s in (30, 45, 59))
    else:  # from 1/8 of the schedule back up to it in 8 steps, then the schedule as planned
        assert second["action"]["lr_scale"] == 1.0 and second["action"]["rewarm_from"] == 30
        assert records[30]["lr"] == pytest.approx(lr_at(30, cfg) / 8)
        assert records[34]["lr"] == pytest.approx(lr_at(34, cfg) * 5 / 8)
        assert all(records[s]["lr"] == pytest.approx(lr_at(s, cfg)) for s in (38, 45, 59))


def test_the_runbooks_response_climbs_one_rung_per_repeat():
    rcfg = RecoveryConfig(incident_window=100, max_incidents=3)
    assert Recovery().response(500, rcfg) == "skip"  # the first incident
    after_one = Recovery(incidents=1, last_incident_step=500)
    assert after_one.response(520, rcfg) == "lower_lr"  # again within the window
    assert after_one.response(480, rcfg) == "lower_lr"  # again while replaying after the rollback
    assert after_one.response(600, rcfg) == "skip"  # a window later: a first incident again
    assert after_one.response(520, dataclasses.replace(rcfg, repeat_response="rewarm")) == "rewarm"
    assert Recovery(incidents=3, last_incident_step=0).response(5000, rcfg) == "stop"
    with pytest.raises(ValueError, match="--repeat_response 'panic': choose lower_lr or rewarm"):
        RecoveryConfig(repeat_response="panic")


def test_the_lr_factor_is_the_cuts_times_a_rewarms_climb_and_the_schedule_restarts():
    assert [Recovery(lr_scale=0.25).lr_factor(s) for s in (0, 10**6)] == [0.25, 0.25]
    rewarming = Recovery(lr_scale=0.5, rewarm_from=30, rewarm_iters=4)  # climbs over steps 30..33
    assert [rewarming.lr_factor(s) for s in (29, 30, 31, 33, 34)] == [0.5, 0.125, 0.25, 0.5, 0.5]
    assert Recovery(schedule_from=40).schedule_step(45) == 5
    # a checkpoint keeps the incidents' state, not the run's setting of how long a re-warm climbs
    saved = rewarming.state_dict()
    assert "rewarm_iters" not in saved and saved["rewarm_from"] == 30
    resumed = Recovery(rewarm_iters=8)
    resumed.load_state_dict(saved)
    assert (resumed.rewarm_from, resumed.lr_scale, resumed.rewarm_iters) == (30, 0.5, 8)


def test_saving_works_where_a_folder_cannot_be_opened_as_a_file(tmp_path, monkeypatch):
    """Windows: os.open on a folder fails, so the folder's fsync after the rename is skipped there."""
    real_open = os.open

    def windows_open(path, flags, *args, **kwargs):
        if os.path.isdir(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", windows_open)
    checkpoint.save(tmp_path, 10, small_state(10), healthy=True)
    step, state = checkpoint.load_latest(tmp_path)
    assert step == 10 and torch.equal(state["weights"], small_state(10)["weights"])
