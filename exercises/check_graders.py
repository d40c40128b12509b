"""Check the graders: every wrong body in exercises/mutants/ must be graded "failed".

    python exercises/check_graders.py                  # every exercise's mutants
    python exercises/check_graders.py lr_at init       # some
    python exercises/check_graders.py --mutants DIR    # a teacher's own wrong bodies, laid out as mutants/ is

A grader is only as good as the wrong answers it rejects. exercises/mutants/NAME/ holds wrong bodies
of exercise NAME, one per file: the classic mistakes of that function, each opening with a line
`# wrong: what it gets wrong` (and, for an exercise of several bodies, `# in: WHERE`, the body it
replaces), then the body at indent 0. For each exercise this script grades, in a fresh copy of
the project (every other exercise holding its reference body), first the reference, which must
pass, then each mutant alone, which must fail. Most of a grading is pytest starting and importing,
one core's work, so --jobs copies grade mutants side by side (default: one a core), each pytest on
one thread. One line per mutant, in the folder's order, then `N/N mutants caught`; exits 1 if a
mutant passed or a reference failed.

A teacher who adds a mutant file sees at once whether the graders catch it; if not, add the
property test that does, and list it in the exercise's tests in catalog.py.
"""

import argparse
import os
import queue
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from catalog import BY_NAME, EXERCISES, MUTANTS, mutants_of, reference_bodies, replace_body  # noqa: E402
from grade import grade  # noqa: E402
from make import ROOT, make  # noqa: E402

ONE_THREAD = dict(os.environ, OMP_NUM_THREADS="1")  # torch's threads: the jobs share the cores


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
    mutants are graded side by side, one a copy of the project at a time."""
    reference = reference_bodies(ROOT, exercise)
    status, detail = grade(copies[0], exercise, first_failure_only=True, env=ONE_THREAD)
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
            return (mutant, *grade(copy, exercise, first_failure_only=True, env=ONE_THREAD))
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
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if missing:
        print(f"warning: no mutants for {', '.join(missing)}: their graders are unchecked", flush=True)
    start, caught, total = time.perf_counter(), 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        copies = [os.path.join(tmp, f"project-{job}") for job in range(args.jobs)]
        for copy in copies:
            make(copy, [], untracked=True, quiet=True)  # every body the reference: the teacher's files included
        for exercise in chosen:
            for mutant, status, detail in check(exercise, copies, args.mutants):
                total += 1
                caught += status == "failed"
                verdict = "caught" if status == "failed" else f"NOT CAUGHT ({status})"
                where = os.path.relpath(mutant.path)
                print(f"{verdict:<12} {where}: {mutant.wrong}\n{'':<12} {detail[:300]}", flush=True)
    print(f"{caught}/{total} mutants caught in {time.perf_counter() - start:.0f} s")
    sys.exit(0 if caught == total and total else 1)


if __name__ == "__main__":
    main()
