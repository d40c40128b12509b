"""Check the graders: every wrong body in exercises/mutants/ must be graded "failed".

    python exercises/check_graders.py                  # every exercise's mutants
    python exercises/check_graders.py lr_at init       # some
    python exercises/check_graders.py --mutants DIR    # a teacher's own wrong bodies, laid out as mutants/ is

A grader is only as good as the wrong answers it rejects. exercises/mutants/NAME/ holds wrong bodies
of exercise NAME, one per file: the classic mistakes of that function, each opening with a line
`# wrong: what it gets wrong` (and, for an exercise of several bodies, `# in: WHERE`, the body it
replaces), then the body at indent 0. For each exercise this script grades, in a fresh copy of
the project (every other exercise holding its reference body), first the reference, which must
pass, then each mutant alone, which must fail. --jobs copies grade mutants side by side (default:
one a core), each pytest on one thread, and each copy's pytest runs in a child forked from a process
that has imported torch, numpy and pytest once (Preloaded): the project's own modules, the ones a
mutant changes, are imported afresh in every child. One line per mutant, in the folder's order,
then `N/N mutants caught`; exits 1 if a mutant passed or a reference failed.

A teacher who adds a mutant file sees at once whether the graders catch it; if not, add the
property test that does, and list it in the exercise's tests in catalog.py.
"""

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from catalog import BY_NAME, EXERCISES, MUTANTS, mutants_of, reference_bodies, replace_body  # noqa: E402
from grade import GRADING_ENV, grade  # noqa: E402
from make import ROOT, make  # noqa: E402

from errors import UserError  # noqa: E402

ONE_THREAD = dict(os.environ, OMP_NUM_THREADS="1", **GRADING_ENV)  # the jobs share the cores

# A process that imports what every grading imports, then runs each request {"arguments", "root", "timeout"} as
# pytest in a forked child (it holds no thread to fork with), answering {"output"} (or {"timeout": true}). Imported
# once: torch, numpy, pytest, and torch._dynamo, which AdamW's constructor imports (1.2 s a child otherwise); then
# frozen out of the garbage collector, whose passes over them took a child's pytest most of a second.
PRELOADED = r"""
import gc, json, os, signal, sys, tempfile
import numpy, pytest, torch, torch._dynamo
gc.freeze()
sys.dont_write_bytecode = True  # an edited body must never meet a stale .pyc
for line in sys.stdin:
    request = json.loads(line)
    with tempfile.TemporaryFile("w+") as output:
        child = os.fork()
        if child == 0:
            os.chdir(request["root"])
            sys.path.insert(0, request["root"])
            os.dup2(output.fileno(), 1)
            os.dup2(output.fileno(), 2)
            signal.alarm(request["timeout"])  # the child ends past its time, as a timeout
            code = pytest.main(request["arguments"])
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(child, 0)
        output.seek(0)
        answer = {"output": output.read(), "timeout": os.WIFSIGNALED(status) and os.WTERMSIG(status) == 14}
    print(json.dumps(answer), flush=True)
"""


class Preloaded:
    """pytest for one copy of the project, run by a PRELOADED process: grade.run_tests's `pytest`. Its environment
    is the one the process started with (ONE_THREAD), whatever env a call passes."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-c", PRELOADED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ONE_THREAD
        )

    def __call__(self, arguments, root, env, timeout):
        self.process.stdin.write(json.dumps({"arguments": arguments, "root": root, "timeout": timeout}) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        if answer["timeout"]:
            raise subprocess.TimeoutExpired("pytest", timeout, output=answer["output"])
        return answer["output"]

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def write_bodies(root, exercise, bodies):
    """Put {where: lines at indent 0} into the exercise's file at root."""
    path = os.path.join(root, exercise.file)
    with open(path) as f:
        source = f.read()
    for where, lines in bodies.items():
        source = replace_body(source, exercise, where, list(lines))
    with open(path, "w") as f:
        f.write(source)


def check(exercise, copies, mutants):
    """(mutant, status, detail) for each mutant in order, after grading the reference (which must pass); the
    mutants are graded side by side, one a copy of the project at a time. copies: {folder: its Preloaded}."""
    reference = reference_bodies(ROOT, exercise)
    first = next(iter(copies))
    status, detail = grade(first, exercise, first_failure_only=True, env=ONE_THREAD, pytest=copies[first])
    if status != "passed":
        raise SystemExit(
            f"error: the reference body of {exercise.name} is graded {status}: {detail}. "
            "A grader that fails the right answer proves nothing about wrong ones: fix it first."
        )
    free = queue.SimpleQueue()  # the copies no mutant is in
    for copy in copies:
        free.put(copy)

    def graded(mutant):
        copy = free.get()
        write_bodies(copy, exercise, {mutant.where: mutant.lines})
        try:
            return (mutant, *grade(copy, exercise, first_failure_only=True, env=ONE_THREAD, pytest=copies[copy]))
        finally:
            write_bodies(copy, exercise, reference)
            free.put(copy)

    with ThreadPoolExecutor(len(copies)) as pool:  # threads that wait on pytest processes
        yield from pool.map(graded, mutants_of(exercise, mutants))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "names", nargs="*", help=f"exercises whose mutants to check (default: all): {', '.join(BY_NAME)}"
    )
    parser.add_argument(
        "--mutants",
        default=MUTANTS,
        help="the folder of wrong bodies, one subfolder per exercise (default: exercises/mutants)",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="mutants graded at once (default: the cores)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"error: --jobs {args.jobs}: grade at least one mutant at a time")
    if not os.path.isdir(args.mutants):
        raise SystemExit(f"error: --mutants {args.mutants} is not a folder")
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"error: {', '.join(unknown)}: no such exercise; choose from {', '.join(BY_NAME)}")
    chosen = [e for e in EXERCISES if not args.names or e.name in args.names]
    try:
        missing = [e.name for e in chosen if not mutants_of(e, args.mutants)]
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    if missing:
        print(f"warning: no mutants for {', '.join(missing)}: their graders are unchecked", flush=True)
    start, caught, total = time.perf_counter(), 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        copies = {os.path.join(tmp, f"project-{job}"): Preloaded() for job in range(args.jobs)}
        try:
            for copy in copies:
                make(copy, [], untracked=True, quiet=True)  # every body the reference: the teacher's files included
            for exercise in chosen:
                for mutant, status, detail in check(exercise, copies, args.mutants):
                    total += 1
                    caught += status == "failed"
                    verdict = "caught" if status == "failed" else f"NOT CAUGHT ({status})"
                    where = os.path.relpath(mutant.path)
                    print(f"{verdict:<12} {where}: {mutant.wrong}\n{'':<12} {detail[:300]}", flush=True)
        finally:
            for preloaded in copies.values():
                preloaded.close()
    print(f"{caught}/{total} mutants caught in {time.perf_counter() - start:.0f} s")
    sys.exit(0 if caught == total and total else 1)


if __name__ == "__main__":
    main()
