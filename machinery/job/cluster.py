"""What a run needs to live through a cluster's day: a clean stop when the scheduler asks for one, a rank that
stopped responding named, workers that end with their launcher, and one job per run folder.

    python train.py ...            # SIGTERM or SIGUSR1: checkpoint at the end of this step, exit 75
    python train.py --inject hang@20 --dist_timeout 30 --dp 2 ...   # "rank 1 stopped responding at step 20"

A scheduler ends a job with SIGTERM (Slurm at preemption or the time limit, Kubernetes), and Slurm can warn a
job ahead with another signal (`--signal=USR1@120`). Either, on any rank, stops every rank at the next step
boundary, where rank 0 writes a checkpoint; the run exits with PREEMPTED, and the same command resumes from
that checkpoint, losing nothing. A second signal, a second or more after the first, ends the process at once, as
the signal would by default (one within a second is the same notice, delivered twice: a site may signal both
the launcher, which passes it on, and its workers).

Each rank leaves a heartbeat in out_dir/heartbeat/: its step, host, PID and time. A rank that stops without
dying (stuck in I/O, in a collective, asleep) leaves the others waiting in their next collective until
--dist_timeout; each of them then marks itself as waiting and names the ranks that did not.

torchrun starts each worker in a session of its own, so a kill of torchrun or of its process group leaves the
workers training on as orphans, and a second job started in the same folder writes and deletes checkpoints
beside them. Every worker watches its launcher and ends within a moment of its death; and out_dir/lock.json
names the job that holds the folder (its host and PIDs, renewed while it runs), so a second job refuses to start
there.
"""

import json
import os
import signal
import socket
import threading
import time

import torch
import torch.distributed as dist

from errors import UserError
from machinery.job.files import remove_if_exists, write_json_atomic

PREEMPTED = 75  # the exit code of a run stopped by SIGTERM or SIGUSR1 once its checkpoint is written (EX_TEMPFAIL)
STOP_SIGNALS = ("SIGTERM", "SIGUSR1")  # SIGUSR1 does not exist on Windows
LOCK_FILE, HEARTBEAT_DIR = "lock.json", "heartbeat"
RENEW_SECONDS = 10  # the lock's holder rewrites it this often...
STALE_SECONDS = 60  # ...and a lock of another host not renewed for this long is a dead job's


# ----------------------------------------------------------------------------
# Stop signals: a checkpoint at the next step boundary


class StopSignals:
    """Catches SIGTERM and SIGUSR1 while a run trains. The handler only records the signal: the loop asks
    `any_rank_received` at each step boundary, where every rank can stop together. Signal handlers can be set
    from the main thread only; elsewhere (a run inside a thread) the signals keep their usual effect."""

    def __init__(self, abandoned=lambda: False):
        self.received, self.received_at = None, 0.0  # the name of the first stop signal, once one came, and when
        self.abandoned = abandoned  # whether the other ranks have given up on this one: no boundary to reach
        self.previous = {}

    def catch(self):
        """From now until restore(): the loop is about to run."""
        if threading.current_thread() is threading.main_thread():
            for name in STOP_SIGNALS:
                if hasattr(signal, name):
                    number = getattr(signal, name)
                    self.previous[number] = signal.signal(number, self.receive)

    def receive(self, number, frame):
        if self.received is not None and time.monotonic() - self.received_at < 1:
            return  # the same notice, delivered twice
        if self.received is not None:  # the second: end now, as the signal does by default
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
            return
        if self.abandoned():  # a hung rank, signalled by its launcher once the others gave up: end now
            os.write(2, b"the other ranks stopped waiting for this one; ending it without a checkpoint\n")
            os._exit(1)
        self.received, self.received_at = signal.Signals(number).name, time.monotonic()

    def any_rank_received(self, device):
        """Whether a stop signal reached any rank: every rank asks at the same step boundary (one integer,
        maxed over the world), so every rank stops after the same step."""
        received = torch.tensor([self.received is not None], dtype=torch.int32, device=device)
        if dist.is_initialized():
            dist.all_reduce(received, op=dist.ReduceOp.MAX)
        return bool(received.item())

    def restore(self):
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        self.previous = {}


# ----------------------------------------------------------------------------
# Heartbeats: which rank stopped responding, and at which step


class Heartbeat:
    """This rank's sign of life, out_dir/heartbeat/rank_R.json: {step, time, host, pid, waiting}, written at most
    once a second (a file per step would be a cost on a shared file system); the step in memory is always current.
    job: [[host, pid], ...] of this job's ranks, which tells its beats from an earlier job's."""

    def __init__(self, out_dir, rank, world_size, job, interval=1.0):
        self.folder = os.path.join(out_dir, HEARTBEAT_DIR)
        self.rank, self.world_size, self.job, self.interval = rank, world_size, job, interval
        self.step, self.written = None, 0.0

    def path(self, rank):
        return os.path.join(self.folder, f"rank_{rank}.json")

    def beat(self, step, waiting=False):
        self.step = step
        now = time.time()
        if waiting or now - self.written >= self.interval:
            os.makedirs(self.folder, exist_ok=True)
            beat = {"step": step, "time": now, "host": socket.gethostname(), "pid": os.getpid(), "waiting": waiting}
            write_json_atomic(self.path(self.rank), beat)
            self.written = now

    def read(self, rank):
        """Rank `rank`'s last beat in this job, or None."""
        try:
            with open(self.path(rank)) as f:
                beat = json.load(f)
        except (OSError, ValueError):
            return None
        return beat if [beat["host"], beat["pid"]] in self.job else None

    def others_waiting(self):
        """Whether another rank has marked itself as waiting: its collective timed out, and it gave up on this job."""
        beats = [self.read(rank) for rank in range(self.world_size) if rank != self.rank]
        return any(beat is not None and beat["waiting"] for beat in beats)

    def unresponsive(self, grace=3.0):
        """After this rank's collective timed out: mark it as waiting at its step, give the other survivors
        `grace` seconds to do the same, then name the ranks that did not, as text ("rank 1 stopped responding
        at step 20 (...)"), or None if every rank says it was waiting (then the network between them failed)."""
        self.beat(self.step, waiting=True)
        time.sleep(grace)
        now, lines = time.time(), []
        for rank in range(self.world_size):
            beat = self.read(rank)
            if beat is not None and beat["waiting"]:
                continue
            if beat is None:
                lines.append(f"rank {rank} stopped responding at step {self.step} (it left no heartbeat)")
                continue
            gone = beat["host"] == socket.gethostname() and not is_alive(beat["pid"])
            lines.append(
                f"rank {rank} stopped responding at step {self.step} (host {beat['host']}, pid {beat['pid']}: its "
                f"last heartbeat {now - beat['time']:.0f} s ago, at step {beat['step']}"
                + ("; its process is gone)" if gone else ")")
            )
        return "; ".join(lines) or None


def is_alive(pid):
    """Whether process pid runs (on this host); a zombie, ended but not yet reaped by its parent, does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:  # Linux: the state follows the command's closing parenthesis
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:  # no /proc (macOS, Windows): alive, as far as can be told
        return True


# ----------------------------------------------------------------------------
# Workers that end with their launcher


def end_with_launcher(rank, interval=0.25):
    """Under torchrun a worker's parent is its launcher. A daemon thread checks every `interval` seconds that it
    still is, and ends this process when the launcher is gone (killed, its machine's job cancelled): an orphan
    would train on, and write and delete checkpoints beside the next job in its folder."""
    launcher = os.getppid()

    def watch():
        while os.getppid() == launcher:
            time.sleep(interval)
        os.write(2, f"rank {rank}: its launcher (pid {launcher}) is gone; ending this worker\n".encode())
        os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


# ----------------------------------------------------------------------------
# One job per run folder


def describe(holder):
    processes = ", ".join(f"{host} pid {pid}" for host, pid in holder["processes"])
    return f"the job started {time.ctime(holder['started'])} ({processes})"


def is_live(holder):
    """A job lives while it renews its lock and, on this host, while one of its processes does (a PID may be
    reused by another process, but not one that renews the lock)."""
    here = [pid for host, pid in holder["processes"] if host == socket.gethostname()]
    renewed = time.time() - holder["renewed"] < STALE_SECONDS
    return renewed and (not here or any(is_alive(pid) for pid in here))


class RunLock:
    """out_dir/lock.json, held by rank 0 for the whole job: {processes: [[host, pid], ...], started, renewed}.
    Taken before anything is written in out_dir; renewed every RENEW_SECONDS by a daemon thread; removed when
    the job ends, if it still names this job. processes: every rank's, and under torchrun each launcher's."""

    def __init__(self, out_dir, processes):
        self.path = os.path.join(out_dir, LOCK_FILE)
        now = time.time()
        self.holder = {"processes": processes, "started": now, "renewed": now}
        held = self.read()
        if held is not None and {tuple(p) for p in held["processes"]} & {tuple(p) for p in processes}:
            held = None  # this very job: set up again (a test), or its workers restarted by torchrun --max-restarts
        if held is not None and is_live(held):
            raise UserError(
                f"{out_dir} is in use by {describe(held)}: one job per run folder. Wait for it to end or end it "
                f"(kill {held['processes'][0][1]} on {held['processes'][0][0]}), then run again; or choose another "
                "--out_dir"
            )
        if held is not None:
            say(f"warning: taking over {self.path} from {describe(held)}, which is gone")
        os.makedirs(out_dir, exist_ok=True)
        write_json_atomic(self.path, self.holder)
        self.done = threading.Event()
        threading.Thread(target=self.renew, name="lock-renewal", daemon=True).start()

    def read(self):
        try:
            with open(self.path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except ValueError:  # cut short by a crash: a holder that left no readable name is gone
            return None

    def is_ours(self):
        held = self.read()
        return held is not None and (held["started"], held["processes"]) == (
            self.holder["started"],
            self.holder["processes"],
        )

    def renew(self):
        while not self.done.wait(RENEW_SECONDS):
            if self.is_ours():
                self.holder["renewed"] = time.time()
                write_json_atomic(self.path, self.holder)

    def release(self):
        self.done.set()
        if self.is_ours():
            remove_if_exists(self.path)


def this_process():
    """[[host, pid]] of this process, and of its launcher under torchrun (the process a kill would aim at)."""
    host = socket.gethostname()
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ  # not local_ranks.py's children: their parent is the caller
    return [[host, os.getpid()]] + ([[host, os.getppid()]] if under_torchrun else [])


def every_process():
    """this_process of every rank, gathered (a collective: every rank calls it)."""
    mine = this_process()
    if not dist.is_initialized():
        return mine
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    unique = []
    for process in (p for rank in everyone for p in rank):
        if process not in unique:
            unique.append(process)
    return unique


# ----------------------------------------------------------------------------
# All of it, for the length of a job


class Watch:
    """The stop signals, this rank's heartbeat and, on rank 0, the run folder's lock, from set-up to the end of
    a job. As a context manager around the loop: released on the way out, and a RuntimeError from a collective
    that waited past --dist_timeout becomes a UserError naming the rank that stopped responding."""

    def __init__(self, out_dir, grid):
        processes, self.lock = every_process(), None

        def take_lock():
            self.lock = RunLock(out_dir, processes)

        grid.on_rank0(take_lock)  # a refusal stops every rank
        self.heartbeat = Heartbeat(out_dir, grid.rank, grid.world_size, processes)
        self.signals = StopSignals(abandoned=self.heartbeat.others_waiting)

    def beat(self, step):
        self.heartbeat.beat(step)

    def stop_requested(self, device):
        return self.signals.any_rank_received(device)

    def close(self):
        self.signals.restore()
        if self.lock is not None:
            self.lock.release()

    def __enter__(self):
        self.signals.catch()  # around the loop only: a set-up alone (a test) leaves the signals as they were
        return self

    def __exit__(self, kind, error, traceback):
        self.close()
        if isinstance(error, RuntimeError) and dist.is_initialized() and self.heartbeat.step is not None:
            named = self.heartbeat.unresponsive()
            if named:
                raise UserError(f"{named}. Run the same command again to resume from the last checkpoint") from None
        return False


# ----------------------------------------------------------------------------
# Coordination: every rank goes on, or every rank stops


def say(*args, **kwargs):
    """print, on rank 0 only: one voice for the whole group, whose other ranks would repeat it word for word."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs)


def raise_on_every_rank(problem):
    """Gather every rank's problem (a message, or None); if any rank has one, every rank raises it as a UserError,
    so no rank waits in a collective for one that gave up. A barrier too."""
    problems = [problem]
    if dist.is_initialized():
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    failed = [p for p in problems if p]
    if failed:
        raise UserError(failed[0] + (f" (and {len(failed) - 1} more rank(s) alike)" if len(failed) > 1 else ""))


def check_visible_everywhere(paths):
    """Stop every rank if some rank cannot see a file that rank 0 just wrote.

    Rank 0 alone prepares the data and writes run.json and the checkpoints; every rank
    reads them. On several machines that works only if the folders are on a file
    system that every machine mounts: a rank that saw no checkpoint would silently
    start from step 0 while the others resume."""
    missing = [path for path in paths if not os.path.exists(path)]
    rank = dist.get_rank() if dist.is_initialized() else 0
    raise_on_every_rank(
        None
        if not missing
        else (
            f"rank {rank} cannot see {missing[0]}, which rank 0 wrote. Every rank reads the data and the "
            "checkpoints that rank 0 writes: on several machines put --data_dir and --out_dir on a file system "
            "that every machine mounts (NFS, Lustre, ...)."
        )
    )
