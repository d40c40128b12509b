"""Many ranks on one machine without torchrun: the simulation that tests, benchmarks and notebooks run.

    from machinery.job.local_ranks import run_ranks
    outcome = run_ranks(8, train.main, ["--dp", "2", "--tp", "2", "--pp", "2", "--micro_batches", "2"])

Each rank is a child process with the environment torchrun would give it
(RANK, WORLD_SIZE, LOCAL_RANK, ... on 127.0.0.1 and a free port), so the code
under test starts exactly as under torchrun (parallel.grid.init_distributed) and talks
over gloo. On Linux the children are forked, so they start at once from a
process that has already imported torch, where torchrun pays a fresh interpreter
and `import torch` per rank (DESIGN.md has the times). fork does not exist on Windows and is
unsafe on macOS (its system libraries are not fork-safe), so there they are spawned.
"""

import multiprocessing
import os
import queue
import socket
import sys
import time

import torch

DEFAULT_START = "fork" if sys.platform.startswith("linux") else "spawn"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, port, fn, args, results):
    # A forked child of a multi-threaded parent hangs in OpenMP unless it drops to one thread first
    # (parallel.grid.init_distributed then gives it cores / local ranks).
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
    )
    try:
        results.put((rank, "ok", fn(*args)))
    except SystemExit as e:
        results.put((rank, "exit", str(e.code)))
    except BaseException as e:  # report, never hang the parent
        results.put((rank, "error", f"{type(e).__name__}: {e}"))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)


def run_ranks(world_size, fn, *args, timeout=120, start_method=DEFAULT_START):
    """Start world_size processes, each calling fn(*args) as one rank; return {rank: (status, value)},
    status "ok" (value: what fn returned), "exit" (fn called sys.exit: its message), "error" (the
    exception, as text) or "missing" (the process died without a word: its exit code).
    Under spawn, fn must be importable (a module-level function) and args picklable. Return plain
    values (numbers, lists, numpy arrays), not tensors, from fn.

    Workers still running at the timeout are killed, so a caller never hangs or leaves processes behind.
    """
    context = multiprocessing.get_context(start_method)
    results = context.Queue()
    port = free_port()
    workers = [
        context.Process(target=_rank_main, args=(r, world_size, port, fn, args, results)) for r in range(world_size)
    ]
    for w in workers:
        w.start()
    outcome, deadline = {}, time.time() + timeout
    try:
        while len(outcome) < world_size and time.time() < deadline:
            try:
                rank, status, value = results.get(timeout=0.2)
                outcome[rank] = (status, value)
            except queue.Empty:
                if all(not w.is_alive() for w in workers) and results.empty():
                    break
    finally:
        for w in workers:
            w.join(timeout=max(0.1, deadline - time.time()))
            if w.is_alive():
                w.kill()
                w.join()
    for rank, w in enumerate(workers):
        outcome.setdefault(rank, ("missing", w.exitcode))
    return outcome


def results_of(outcome):
    """[each rank's value], or a RuntimeError naming the first rank that did not finish."""
    for rank, (status, value) in sorted(outcome.items()):
        if status != "ok":
            raise RuntimeError(f"rank {rank} {status}: {value}")
    return [value for _, (_, value) in sorted(outcome.items())]
