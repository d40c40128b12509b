"""A simulated failing fleet: a run trained through kills, hangs and corrupted checkpoints, measured as the chapter
states it (goodput at several checkpoint intervals, the share of steps recomputed, the time to detect a failure, the
best interval against Young/Daly's, and what a restart costs). notebooks/11_failing_fleet.ipynb runs it.

    python bench/fleet.py [--mtbf 1] [--intervals 2,auto,x8] [--seeds 1 2 3] [--max_iters 300] [--ranks 1]

A supervisor of our own (`fleet`) starts `python train.py ...` (or torchrun with --ranks 2) and starts the same
command again whenever the job ends before --max_iters: each restart is a fresh job, new processes on a new port
with nothing but the run folder's checkpoints (the spare that replaces a failed node). Meanwhile a failure process
strikes at exponential intervals of mean --mtbf seconds of training (the clock runs while a job trains, not while
one starts: a restart of seconds stays short against the MTBF, as a restart of minutes is against a fleet's hours),
one of:

    kill     SIGKILL to the job (with --ranks 2: to one worker), a node that dies;
    hang     SIGSTOP to the job's last rank: it stops responding without dying. With --ranks 2 the other rank ends
             after --dist_timeout and names it; the supervisor's watchdog ends any job silent (no line on stdout,
             one per step) for 3 x longer than a clean job ever is (under torchrun, longer than --dist_timeout and
             its grace), and SIGKILLs every process the lock names;
    corrupt  the job killed and 64 bytes of its newest checkpoint's state.pt overwritten, a node that dies with
             its last write damaged: the next job skips it (sha256) and falls back to the one before.

Every draw (the times between strikes, their kinds, the bytes overwritten) comes from one seeded generator.
First a clean run of the same command, checkpointing every 2 steps, measures the step time and a checkpoint's cost
C (the median gap between two step lines, without and with a checkpoint in it), a fresh job's start-up and the
longest gap a healthy job leaves; planner.checkpoint_economics then gives Young/Daly's interval for that C and the
MTBF. --intervals: steps, "auto" for Young/Daly's in steps, "xK" for K times it. The table prints, per interval:
goodput (useful steps per second of wall time, max_iters / wall, and per second of training, the start-ups and
detections left out: FleetRun.training_goodput), the share of the steps trained that
were trained again (each life's last logged step against the step the next one resumed from), the failures and the
time to detect them, what a restart took, and whether every run logged the clean run's losses bit for bit. It
measures; it asserts nothing.
"""

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from machinery.components import checkpoint  # noqa: E402
from machinery.components.run_folder import read_jsonl  # noqa: E402
from machinery.job import cluster  # noqa: E402
from machinery.planning import planner  # noqa: E402

# the run: a tiny GPT on the standard library's bytes, a line per step (the supervisor reads each as a sign of life)
# fmt: off
FLAGS = [
    "--source", "stdlib", "--tokenizer", "byte", "--dtype", "float32", "--seed", "1",
    "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--batch_size", "4",
    "--warmup_iters", "20", "--learning_rate", "3e-3", "--log_interval", "1", "--eval_interval", "100000",
    "--eval_iters", "2", "--num_samples", "0", "--plot", "false", "--keep_last", "3",
]
# fmt: on
KINDS = ("kill", "hang", "corrupt")
DIST_TIMEOUT = 2  # seconds a rank waits for a stopped one (--dist_timeout), under torchrun
STEP_LINE = re.compile(r"^step\s+(\d+) \| loss")
RESUMED = re.compile(r"resuming from the checkpoint of step (\d+)")
SKIPPED = "warning: skipping checkpoint"
NAMED = "stopped responding at step"  # cluster.Heartbeat's words for a rank that stopped, printed by a survivor


def command(out_dir, ckpt_interval, max_iters, ranks=1, dist_timeout=None, flags=FLAGS):
    """The job's command line: the same for every life of a run."""
    # torchrun --standalone: a rendezvous of its own on a free port, new with every job
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    launch = [sys.executable] + (torchrun if ranks > 1 else [])
    run = ["--out_dir", out_dir, "--max_iters", max_iters, "--ckpt_interval", ckpt_interval, "--dp", ranks]
    return [*launch, "train.py", *flags, *map(str, run), "--dist_timeout", str(dist_timeout or DIST_TIMEOUT)]


class Job:
    """One life of the run: the command started in a session of its own, each line of its output time-stamped
    (time.monotonic) by a reader thread."""

    def __init__(self, argv):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.launched = time.monotonic()
        self.process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines = []  # (time, line)
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def last_sign_of_life(self):
        return self.lines[-1][0] if self.lines else self.launched

    def steps(self):
        """(time, step) of every step line so far."""
        return [(t, int(m[1])) for t, line in list(self.lines) if (m := STEP_LINE.match(line))]

    def finish(self):
        self.process.wait()
        self.reader.join(timeout=5)


def lock_pids(out_dir):
    """The PIDs the run folder's lock names (the job's ranks and, under torchrun, their launcher)."""
    try:
        with open(os.path.join(out_dir, cluster.LOCK_FILE)) as f:
            return [pid for _, pid in json.load(f)["processes"]]
    except (OSError, ValueError, KeyError):
        return []


def end_job(job, out_dir):
    """SIGKILL the job's process group, every process its lock names and every process whose command line names
    its out_dir (a stopped worker, in a session of its own under torchrun, does not end with its launcher, and may
    be stopped before it wrote the lock), then wait until they are gone."""
    pids = lock_pids(out_dir) + processes_naming(out_dir)
    for kill in [
        lambda: os.killpg(job.process.pid, signal.SIGKILL),
        *[lambda p=p: os.kill(p, signal.SIGKILL) for p in pids],
    ]:
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
    job.finish()
    deadline = time.monotonic() + 15
    while any(cluster.is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def processes_naming(out_dir):
    """PIDs of the processes whose command line holds out_dir (Linux's /proc; elsewhere none)."""
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if out_dir.encode() in f.read().split(b"\0") and int(entry) != os.getpid():
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


def struck_rank_pid(job, out_dir):
    """The process a one-rank strike hits: the job itself on one rank, the last worker the lock names under torchrun."""
    workers = [pid for pid in lock_pids(out_dir) if pid != job.process.pid]
    return workers[-1] if workers and len(workers) > 1 else job.process.pid


def corrupt_newest(ckpt_dir, rng):
    """Overwrite 64 bytes of the newest checkpoint's state.pt at a drawn offset; the step, or None if none."""
    for step in checkpoint.list_steps(ckpt_dir):
        path = os.path.join(checkpoint.step_path(ckpt_dir, step), checkpoint.STATE_FILE)
        try:
            with open(path, "r+b") as f:
                f.seek(rng.randrange(max(1, os.path.getsize(path) - 64)))
                f.write(bytes(rng.getrandbits(8) for _ in range(64)))
            return step
        except OSError:
            continue
    return None


@dataclass
class Strike:
    at: float  # seconds since the run's first launch
    kind: str
    step: int  # the last step logged when it struck (-1: none yet in this life)
    detected: float = math.nan  # when the supervisor saw the job end (kill, corrupt) or its watchdog fired (hang)
    corrupted_step: int | None = None


@dataclass
class Life:
    launched: float  # seconds since the run's first launch
    resumed_from: int  # the step its checkpoint held (0: a fresh start)
    first_step_at: float  # when it logged its first step (nan: never)
    last_step: int  # the last step it logged (resumed_from - 1: none)
    ended: float
    returncode: int
    skipped_corrupt: bool  # it found a damaged checkpoint and fell back
    longest_silence: float  # the longest time without a line, from its launch to its end
    step_lines: list  # (time, step) of each step it logged
    strike: Strike | None = None
    watchdog: bool = False  # ended by the supervisor's watchdog

    @property
    def longest_gap(self):
        """The longest time between two of its step lines (0 with fewer than two)."""
        times = [t for t, _ in self.step_lines]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)

    @property
    def trained(self):
        return self.last_step + 1 - self.resumed_from


@dataclass
class FleetRun:
    interval: int
    seed: int
    max_iters: int
    lives: list = field(default_factory=list)
    wall: float = math.nan
    finished: bool = False

    @property
    def strikes(self):
        return [life.strike for life in self.lives if life.strike is not None]

    @property
    def goodput(self):
        """Useful steps per second of wall time."""
        return self.max_iters / self.wall if self.finished else math.nan

    @property
    def trained_seconds(self):
        """The wall time its lives spent training: from each life's first step line to its last. Left out: the
        start-ups and the time to detect a failure, which the checkpoint interval does not change."""
        return sum(life.step_lines[-1][0] - life.step_lines[0][0] for life in self.lives if life.step_lines)

    @property
    def training_goodput(self):
        """Useful steps per second of training: what the checkpoint interval trades, checkpoints written against
        steps trained again. On a real fleet a restart of minutes is short against an MTBF of days, and goodput
        per second of wall follows this one; here a restart (Python, torch, the data) takes seconds against an
        MTBF of one, so the wall's goodput is mostly restarts, and this is the part the interval moves."""
        return self.max_iters / self.trained_seconds if self.finished else math.nan

    def lost_per_life(self):
        """Steps each life trained that a later life trained again: its last logged step + 1 minus the step the
        next life resumed from."""
        return [a.last_step + 1 - b.resumed_from for a, b in zip(self.lives, self.lives[1:])]

    @property
    def recomputed(self):
        """The share of all steps trained that were later lost and trained again."""
        trained = sum(life.trained for life in self.lives)
        return sum(self.lost_per_life()) / trained if trained else math.nan

    def detections(self, kind=None):
        return [s.detected - s.at for s in self.strikes if kind is None or s.kind == kind]

    def restarts(self):
        """Seconds from a failure's detection to the next life's first step: what the spare costs."""
        return [b.first_step_at - a.ended for a, b in zip(self.lives, self.lives[1:]) if a.strike is not None]

    def false_alarms(self):
        """Lives the watchdog ended that no strike had hung."""
        return sum(life.watchdog and (life.strike is None or life.strike.kind != "hang") for life in self.lives)


def fleet(
    out_dir,
    interval,
    max_iters,
    mtbf,
    seed,
    watchdog,
    kinds=KINDS,
    ranks=1,
    dist_timeout=None,
    flags=FLAGS,
    max_wall=300,
    say=lambda text: None,
    draws=None,
):
    """Train the run in out_dir (started over) to max_iters through failures, restarting the job whenever it ends
    early; returns the FleetRun. The failures strike every Exponential(mean `mtbf`) seconds of training: the failure
    clock runs while a job trains (from its first step to its last), not while one starts, so that a restart of a
    few seconds stays short against the MTBF, as a restart of minutes is against a real fleet's hours.
    watchdog: a Watchdog, the seconds without a line after which a job is taken as hung (before its first step, and
    after it). mtbf=math.inf: a clean run. draws: where the failures come from (their times by expovariate, their
    kinds by choice), random.Random(seed) unless a schedule fixed in advance is given."""
    shutil.rmtree(out_dir, ignore_errors=True)
    rng = draws or random.Random(seed)
    argv = command(out_dir, interval, max_iters, ranks, dist_timeout, flags)
    result = FleetRun(interval, seed, max_iters)
    start, trained_before = time.monotonic(), 0.0  # seconds of training in the earlier lives
    next_strike = rng.expovariate(1 / mtbf) if math.isfinite(mtbf) else math.inf
    while True:
        job = Job(argv)
        strike, watchdog_fired = None, False
        while job.process.poll() is None:
            now, steps = time.monotonic(), job.steps()
            training = steps and steps[-1][1] < max_iters - 1 and strike is None
            if training and trained_before + now - steps[0][0] >= next_strike:
                strike = Strike(now - start, rng.choice(kinds), steps[-1][1])
                if strike.kind == "hang":
                    os.kill(struck_rank_pid(job, out_dir), signal.SIGSTOP)
                elif strike.kind == "kill":
                    os.kill(struck_rank_pid(job, out_dir), signal.SIGKILL)
                else:  # corrupt: the job dies, and its newest checkpoint with it
                    os.killpg(job.process.pid, signal.SIGKILL)
                    job.process.wait()
                    strike.corrupted_step = corrupt_newest(os.path.join(out_dir, "ckpt"), rng)
                next_strike += rng.expovariate(1 / mtbf)
                say(f"  {strike.at:6.2f} s: {strike.kind} at step {strike.step}")
            # before the first step and after the last (the final check), a job is as quiet as one starting up
            allowed = watchdog.training if steps and steps[-1][1] < max_iters - 1 else watchdog.startup
            # under torchrun the surviving rank names a stopped one, but torchrun waits on it: that line ends the job
            named = any(NAMED in line for _, line in job.lines[-3:])
            if named or now - job.last_sign_of_life() > allowed or now - start > max_wall:
                watchdog_fired = now - job.last_sign_of_life() > allowed
                break
            time.sleep(0.005)
        ended = time.monotonic()
        if strike is not None:
            strike.detected = ended - start
        end_job(job, out_dir)
        steps, text = job.steps(), "\n".join(line for _, line in job.lines)
        if steps:
            trained_before += (strike.at + start if strike else ended) - steps[0][0]
        resumed = RESUMED.search(text)
        resumed_from = int(resumed[1]) if resumed else 0
        times = [job.launched] + [t for t, _ in job.lines] + [ended]
        life = Life(
            launched=job.launched - start,
            resumed_from=resumed_from,
            first_step_at=steps[0][0] - start if steps else math.nan,
            last_step=steps[-1][1] if steps else resumed_from - 1,
            ended=ended - start,
            returncode=job.process.returncode,
            skipped_corrupt=SKIPPED in text,
            longest_silence=max(b - a for a, b in zip(times, times[1:])),
            step_lines=[(t - start, step) for t, step in steps],
            strike=strike,
            watchdog=watchdog_fired,
        )
        result.lives.append(life)
        say(
            f"  life {len(result.lives)}: steps {resumed_from}..{life.last_step}, exit {life.returncode}"
            + (", watchdog" if watchdog_fired else "")
        )
        if (life.returncode == 0 and life.last_step == max_iters - 1) or "holds a finished run" in text:
            result.wall, result.finished = ended - start, True
            return result
        if ended - start > max_wall:
            result.wall = ended - start
            return result


@dataclass
class Watchdog:
    startup: float  # seconds without a line before a job's first step, and after its last (the final check)
    training: float  # ... and between them


# ----------------------------------------------------------------------------
# A clean run: step time, a checkpoint's cost, a fresh job's start-up, and how long a healthy job is silent


@dataclass
class Calibration:
    step_seconds: float  # one training step without a checkpoint (the median gap between two step lines)
    checkpoint_seconds: float  # C: what writing a checkpoint adds to its step (median gap with one, minus without)
    startup_seconds: float  # launch to the first step
    longest_gap: float  # the longest the clean job went between two step lines
    clean: FleetRun
    losses: list  # its (step, loss) series: what every failing run must log, bit for bit
    out_dir: str

    def watchdog(self, factor=3, floor=1.0):
        """A silence `factor` times the clean job's longest (its start-up; its longest gap between two steps, at
        least `floor` seconds, a margin for a busy machine) is taken as a hang."""
        return Watchdog(startup=factor * self.startup_seconds, training=max(floor, factor * self.longest_gap))


def calibrate(out_dir, max_iters, dense=2, ranks=1, flags=FLAGS):
    """A clean run of the command writing a checkpoint every `dense` steps. The gap before step line s holds the
    checkpoint of step s when s is a multiple of `dense` (the loop saves it after logging step s - 1): the step time
    and C from the medians of the gaps without and with one."""
    clean = fleet(out_dir, dense, max_iters, math.inf, 0, Watchdog(60, 60), ranks=ranks, flags=flags)
    life = clean.lives[0]
    gaps = [(s, t1 - t0) for (t0, _), (t1, s) in zip(life.step_lines[1:], life.step_lines[2:])]
    step = statistics.median(g for s, g in gaps if s % dense)
    return Calibration(
        step_seconds=step,
        checkpoint_seconds=statistics.median(g for s, g in gaps if s % dense == 0) - step,
        startup_seconds=life.first_step_at - life.launched,
        longest_gap=max(g for _, g in gaps),
        clean=clean,
        losses=losses_of(os.path.join(out_dir, "metrics.jsonl")),
        out_dir=out_dir,
    )


def young_daly_seconds(checkpoint_seconds, mtbf_seconds, params=1_000_000):
    """cost.py's Young/Daly interval for a checkpoint that takes checkpoint_seconds and a fleet that fails every
    mtbf_seconds: checkpoint_economics on one device, at the write bandwidth that makes its checkpoint take C."""
    plan = planner.checkpoint_economics(
        params,
        gpus=1,
        write_bandwidth=12 * params / checkpoint_seconds,
        gpu_mtbf_hours=mtbf_seconds / 3600,
        restart_seconds=0,
    )
    return plan.interval_minutes * 60


def intervals_in_steps(spec, young_daly_steps):
    """--intervals: "2,auto,x8" -> [2, Young/Daly's in steps, 8 x it]."""
    steps = []
    for part in spec.split(","):
        if part == "auto":
            steps.append(max(1, round(young_daly_steps)))
        elif part.startswith("x"):
            steps.append(max(1, round(float(part[1:]) * young_daly_steps)))
        else:
            steps.append(int(part))
    return steps


def losses_of(metrics_path):
    """(step, loss) of every logged step, and (max_iters, the final val loss) from the final check."""
    return [(r["step"], r.get("loss", r.get("val_loss"))) for r in read_jsonl(metrics_path)]


def same_losses(run_folder, reference):
    """Whether a run logged the reference's (step, loss) series bit for bit."""
    return losses_of(os.path.join(run_folder, "metrics.jsonl")) == reference


def run_dir(out_root, interval, seed, arm=""):
    return os.path.join(out_root, f"every_{interval}_seed_{seed}{arm}")


def clean_dir(out_root, interval, repeat=0):
    """A clean run's folder; the first at each interval is where calibrate's run of the densest interval lies."""
    return os.path.join(out_root, f"clean_{interval}" + (f"_{repeat}" if repeat else ""))


# ----------------------------------------------------------------------------
# The table


def table(runs, calibration, mtbf, young_daly_steps, out_root):
    """One line per interval: goodput, recomputed share, failures and detection, restarts, bitwise losses."""
    lines = [
        f"step {1000 * calibration.step_seconds:.2f} ms, checkpoint C {1000 * calibration.checkpoint_seconds:.1f} ms, "
        f"MTBF {mtbf:g} s of training -> Young/Daly (planner.checkpoint_economics) every "
        f"{young_daly_seconds(calibration.checkpoint_seconds, mtbf):.3f} s = {young_daly_steps:.0f} steps; "
        f"a fresh job's start-up {calibration.startup_seconds:.2f} s",
        f"{'interval':>9} {'goodput steps/s':>16} {'of training':>12} {'recomputed':>13} {'failures':>9} "
        f"{'kill/corrupt detect':>20} {'hang detect':>12} {'restart':>12} {'same losses':>12}",
    ]
    for interval in sorted({r.interval for r in runs}):
        mine = [r for r in runs if r.interval == interval]
        fast = [d for r in mine for d in r.detections("kill") + r.detections("corrupt")]
        hangs = [d for r in mine for d in r.detections("hang")]
        restarts = [t for r in mine for t in r.restarts()]
        same = sum(same_losses(run_dir(out_root, r.interval, r.seed), calibration.losses) for r in mine)
        recomputed = mean_std([100 * r.recomputed for r in mine], "{:.1f}") + "%"
        lines.append(
            f"{interval:>9} {mean_std([r.goodput for r in mine], '{:.1f}'):>16} "
            f"{mean_std([r.training_goodput for r in mine], '{:.0f}'):>12} {recomputed:>13} "
            f"{sum(len(r.strikes) for r in mine):>9} {mean_max(fast):>20} {mean_max(hangs):>12} "
            f"{mean_max(restarts):>12} {f'{same} of {len(mine)}':>12}"
        )
    lines.append(
        "(goodput: useful steps per second of wall, and per second of training (start-ups and detection left out); "
        "detect and restart: mean/max seconds; goodput and recomputed: mean ± std over seeds)"
    )
    return "\n".join(lines)


def mean_std(values, fmt):
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    spread = f" ± {fmt.format(statistics.stdev(values))}" if len(values) > 1 else ""
    return fmt.format(statistics.fmean(values)) + spread


def mean_max(seconds):
    return f"{statistics.fmean(seconds):.2f}/{max(seconds):.2f}" if seconds else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mtbf", type=float, default=1.0, help="mean seconds of training between failures")
    parser.add_argument("--intervals", default="2,auto,x8", help='steps; "auto": Young/Daly\'s; "xK": K times it')
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max_iters", type=int, default=300)
    parser.add_argument("--ranks", type=int, default=1, help="2: torchrun with --dp 2 (hang: one worker stops)")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "fleet"))
    parser.add_argument("--verbose", action="store_true", help="print every strike and life")
    args = parser.parse_args()
    say = print if args.verbose else (lambda text: None)
    calibration = calibrate(os.path.join(args.out, "clean"), args.max_iters, ranks=args.ranks)
    yd_steps = young_daly_seconds(calibration.checkpoint_seconds, args.mtbf) / calibration.step_seconds
    watchdog = calibration.watchdog()
    if args.ranks > 1:  # the surviving rank names the stopped one after --dist_timeout and 3 s of grace: let it first
        watchdog = Watchdog(watchdog.startup, max(watchdog.training, DIST_TIMEOUT + 4))
    print(
        f"clean run: {calibration.clean.wall:.2f} s; watchdog: a job silent for {watchdog.training:.2f} s while it "
        f"trains or {watchdog.startup:.2f} s while it starts or ends (3 x the clean job's) is taken as hung"
    )
    runs = []
    for interval in intervals_in_steps(args.intervals, yd_steps):
        for seed in args.seeds:
            kinds = args.kinds.split(",")
            run = fleet(
                run_dir(args.out, interval, seed), interval, args.max_iters, args.mtbf, seed, watchdog, kinds,
                args.ranks, say=say,
            )  # fmt: skip
            runs.append(run)
            print(
                f"every {interval} steps, seed {seed}: {run.wall:.1f} s, {len(run.lives)} lives, "
                f"{', '.join(s.kind for s in run.strikes) or 'no failure'}"
            )
    print(table(runs, calibration, args.mtbf, yd_steps, args.out))


if __name__ == "__main__":
    main()
