"""examples/slurm/train.sbatch, run by bash with stand-ins for srun, scontrol and torchrun on the PATH: the
torchrun command each node runs, the global batch kept on any number of nodes (or the user's own), the GPU count
and rendezvous port, the environment srun hands on, and the checkpoint and requeue on a signal."""

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

# what the script reads, kept out of the tests' environment, so that a run inside a Slurm job tests the same
READ_BY_THE_SCRIPT = (
    "MASTER_PORT GPUS_PER_NODE DATA_DIR OUT_DIR BENCHMARK_DIR TIKTOKEN_CACHE_DIR TORCH_ELASTIC_SHUTDOWN_TIMEOUT".split()
)


@pytest.fixture
def slurm(tmp_path):
    """A PATH whose srun records the environment it hands on and runs its command once (as on one node), whose
    scontrol names two nodes, tells the job's state (JOB_STATE, else RUNNING) and records a requeue, and whose
    torchrun records its PID (torchrun.pid) and arguments, then sleeps for SLEEP seconds (0: returns at once). On
    USR1 or TERM, torchrun records the signal, takes CKPT_SECONDS to "write the checkpoint", and exits with 75, as
    train.py's ranks do."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    stubs = {
        "srun": (
            'echo "srun SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK-unset} TIKTOKEN_CACHE_DIR=${TIKTOKEN_CACHE_DIR-unset}"'
            f' >> {calls}\nwhile [[ "$1" == --* ]]; do shift; done; exec "$@"'
        ),
        "scontrol": f"""case "$1 $2" in
    "show hostnames") printf "node1\\nnode2\\n" ;;
    "show job") echo "JobId=$3 JobName=minipretrain JobState=${{JOB_STATE:-RUNNING}} Reason=None" ;;
    *) echo "scontrol $*" >> {calls} ;;
esac""",
        # the traps first: once the arguments are recorded, a signal finds them set
        "torchrun": f"""checkpoint() {{
    echo "torchrun got $1" >> {calls}; sleep "${{CKPT_SECONDS:-0}}"; echo "checkpoint written" >> {calls}; exit 75
}}
trap 'checkpoint USR1' USR1
trap 'checkpoint TERM' TERM
echo $$ > {tmp_path}/torchrun.pid
echo "torchrun $*" >> {calls}
sleep "${{SLEEP:-0}}" &
wait $!""",
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SLURM_", "SRUN_")) and name not in READ_BY_THE_SCRIPT
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        SHARED=str(tmp_path / "shared"),
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_JOB_ID="1234",
        SLURM_CPUS_PER_TASK="32",  # as sbatch sets them from the #SBATCH lines
        SLURM_GPUS_PER_NODE="h100:8",
    )
    return env, calls


def run(env, *args, **more_env):
    return subprocess.run(["bash", SCRIPT, *args], env={**env, **more_env}, capture_output=True, text=True, timeout=30)


def recorded(calls, program):
    return [line for line in calls.read_text().splitlines() if line.startswith(program + " ")]


def test_each_node_runs_torchrun_with_the_presets_global_batch(slurm):
    env, calls = slurm
    done = run(env, "--max_iters", "5")
    assert done.returncode == 0, done.stderr
    (line,) = recorded(calls, "torchrun")
    shared = env["SHARED"]
    assert line == (
        "torchrun --nnodes=2 --nproc_per_node=8 --rdzv_id=1234 --rdzv_backend=c10d --rdzv_endpoint=node1:21234 "
        "--signals_to_handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 --shutdown_timeout=100 "
        f"train.py --preset gpt2-small --dp 16 --gradient_accumulation_steps 2 --data_dir {shared}/data/corpus-gpt2 "
        f"--out_dir {shared}/runs/gpt2-small --benchmark_dir {shared}/data/hellaswag --max_iters 5"
    )  # 16 GPUs x 16 sequences x 2 micro-steps: gpt2-small's 512 sequences per step; port 20000 + the job id


def test_srun_gets_the_jobs_cpus_and_the_shared_tokenizer_cache(slurm):
    env, calls = slurm
    done = run(env)
    assert done.returncode == 0, done.stderr
    # Slurm >= 22.05: srun takes --cpus-per-task from SRUN_CPUS_PER_TASK only; compute nodes may be offline
    assert recorded(calls, "srun") == [f"srun SRUN_CPUS_PER_TASK=32 TIKTOKEN_CACHE_DIR={env['SHARED']}/cache/tiktoken"]


def test_a_node_count_that_breaks_the_global_batch_is_refused(slurm):
    env, calls = slurm
    done = run(env, SLURM_NNODES="3")
    assert done.returncode == 1 and "24 GPUs do not divide gpt2-small's 32 micro-steps" in done.stderr
    assert not calls.exists()  # nothing started


@pytest.mark.parametrize(
    "flags",
    [
        ["--gradient_accumulation_steps", "1", "--batch_size", "21"],
        ["--batch_size=21", "--gradient_accumulation_steps=1"],
    ],
)
def test_the_users_own_accumulation_steps_replace_the_guard_and_the_scripts(slurm, flags):
    env, calls = slurm
    done = run(env, *flags, SLURM_NNODES="3")  # what the refusal above advises: 24 x 21 x 1 = 504 sequences
    assert done.returncode == 0, done.stderr
    (line,) = recorded(calls, "torchrun")
    assert line.count("--gradient_accumulation_steps") == 1 and line.endswith(" ".join(flags))
    assert "--dp 24 " in line


@pytest.mark.parametrize(
    "gpus, nproc",
    [
        ({}, 8),  # SLURM_GPUS_PER_NODE=h100:8, the type stripped
        ({"SLURM_GPUS_ON_NODE": "4"}, 4),  # what the node was given comes first
        ({"SLURM_GPUS_ON_NODE": "4", "GPUS_PER_NODE": "2"}, 2),  # the user's override
    ],
)
def test_the_gpu_count_is_the_one_slurm_gave(slurm, gpus, nproc):
    env, calls = slurm
    done = run(env, **gpus)
    assert done.returncode == 0, done.stderr
    (line,) = recorded(calls, "torchrun")
    world = 2 * nproc
    assert f"--nproc_per_node={nproc} " in line
    assert f"--dp {world} --gradient_accumulation_steps {32 // world} " in line


def test_no_gpu_count_is_refused_with_how_to_give_one(slurm):
    env, calls = slurm
    done = run({name: value for name, value in env.items() if name != "SLURM_GPUS_PER_NODE"})
    assert done.returncode == 1 and "sbatch --gpus-per-node N, or set GPUS_PER_NODE=N" in done.stderr
    assert not calls.exists()


def test_master_port_sets_the_rendezvous_port(slurm):
    env, calls = slurm
    done = run(env, MASTER_PORT="31337")
    assert done.returncode == 0, done.stderr
    (line,) = recorded(calls, "torchrun")
    assert "--rdzv_endpoint=node1:31337 " in line


def signal_the_job(tmp_path, env, calls, sent, torchrun_too=False, **more_env):
    """Start the script with a torchrun that runs until signalled; once torchrun has started, send the script
    `sent`, and torchrun SIGTERM too where `torchrun_too` (as Slurm does at a job's end). Returns the script's
    exit code, the recorded calls and its output."""
    log = tmp_path / "job.log"
    with open(log, "w") as out:
        job = subprocess.Popen(
            ["bash", SCRIPT],
            env={**env, "SLEEP": "60", "CKPT_SECONDS": "2", **more_env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60  # until torchrun has started (and the traps are set): slow on a busy machine
        while not (calls.exists() and recorded(calls, "torchrun")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert recorded(calls, "torchrun"), "the script started torchrun"
        job.send_signal(sent)
        if torchrun_too:
            os.kill(int((tmp_path / "torchrun.pid").read_text()), signal.SIGTERM)
        returncode = job.wait(timeout=30)
        return returncode, calls.read_text().splitlines(), log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):  # the stand-ins and their sleeps, if still there
            os.killpg(job.pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "sent",
    [signal.SIGUSR1, signal.SIGTERM],  # --signal=B:USR1@120 before the time limit; a SIGTERM for the script alone
    ids=["USR1", "TERM"],
)
def test_a_signal_for_the_script_asks_every_rank_for_a_checkpoint_then_requeues(slurm, tmp_path, sent):
    env, calls = slurm
    returncode, lines, output = signal_the_job(tmp_path, env, calls, sent)  # the job still RUNNING
    # forwarded as USR1 (srun would answer a TERM by killing the step); the requeue only once the step has
    # ended with its checkpoint written, since a requeue ends the running job at once
    assert lines[-3:] == ["torchrun got USR1", "checkpoint written", "scontrol requeue 1234"], output
    assert returncode == 75, output  # the step's
    assert f"got {sent.name}: asking every rank for a checkpoint" in output


@pytest.mark.parametrize("state, requeued", [("TIMEOUT", True), ("PREEMPTED", True), ("CANCELLED", False)])
def test_at_a_jobs_end_torchrun_alone_is_signalled_and_the_script_waits(slurm, tmp_path, state, requeued):
    """The end of a job signals the script and each node's torchrun: the script adds no signal of its own, which
    would make torchrun drop its graceful shutdown, and requeues once the checkpoint is written, unless the user
    cancelled the job."""
    env, calls = slurm
    returncode, lines, output = signal_the_job(tmp_path, env, calls, signal.SIGTERM, torchrun_too=True, JOB_STATE=state)
    ran = lines[lines.index("torchrun got TERM") :]
    assert ran == ["torchrun got TERM", "checkpoint written"] + ["scontrol requeue 1234"] * requeued, output
    assert "torchrun got USR1" not in lines and returncode == 75, output
    assert ("job 1234 was cancelled (scancel): not requeued" in output) != requeued
