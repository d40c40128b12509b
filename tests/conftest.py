"""Shared fixtures. The staged data (Tiny Shakespeare, GPT-2 BPE files) sits in ../shared/data beside the repo."""

import multiprocessing
import os
import queue
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
SHAKESPEARE = SHARED_DATA / "tinyshakespeare.txt"
TIKTOKEN_CACHE = SHARED_DATA / "tiktoken_cache"

if TIKTOKEN_CACHE.is_dir():  # tiktoken reads this at load time: gpt2 works offline
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))

needs_shakespeare = pytest.mark.skipif(not SHAKESPEARE.exists(), reason=f"{SHAKESPEARE} not staged")
needs_gpt2 = pytest.mark.skipif(not TIKTOKEN_CACHE.is_dir(), reason=f"{TIKTOKEN_CACHE} not staged")


def run_script(args, cwd, timeout=600):
    """Run one of the project's scripts in a fresh interpreter; return the CompletedProcess."""
    return subprocess.run(
        [sys.executable, *(str(a) for a in args)], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def write_word_corpus(path, lines):
    """Random sentences over ten words: a corpus a small model learns within tens of steps."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    rng = random.Random(0)
    path.write_text("".join(" ".join(rng.choices(words, k=8)) + ".\n" for _ in range(lines)))
    return path


@pytest.fixture
def small_corpus(tmp_path):
    """A folder of three short text documents, ~60 KB in all."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    line = "the quick brown fox jumps over the lazy dog {}\n"
    for i in range(3):
        (folder / f"doc{i}.txt").write_text("".join(line.format(i * 1000 + j) for j in range(400)))
    return folder


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, port, fn, args, results):
    # A forked child of a multi-threaded parent hangs in OpenMP unless it drops to one thread first;
    # one thread per rank is also what 2 cores can give several ranks.
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      GLOO_SOCKET_IFNAME="lo")
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


# fork starts 8 ranks in ~0.15 s from a process that has already imported torch, where spawn
# pays a fresh interpreter and `import torch` per rank. fork does not exist on Windows and is
# unsafe on macOS (its system libraries are not fork-safe), so there the ranks are spawned.
DEFAULT_START = "fork" if sys.platform.startswith("linux") else "spawn"


def run_ranks(world_size, fn, *args, timeout=120, start_method=DEFAULT_START):
    """Start world_size processes, as torchrun would start them (RANK, WORLD_SIZE, ... on
    127.0.0.1 and a free port), each calling fn(*args); return {rank: (status, value)}.
    Under spawn, fn must be importable (a module-level function) and args picklable.

    Workers still running at the timeout are killed, so a test never hangs or leaves
    processes behind; a rank that never reported shows as ("missing", exit code).
    """
    context = multiprocessing.get_context(start_method)
    results = context.Queue()
    port = free_port()
    workers = [context.Process(target=_rank_main, args=(r, world_size, port, fn, args, results)) for r in range(world_size)]
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
