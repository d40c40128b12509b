"""Grade the exercises: run, for each, the project's own property tests against the code in --root.

    python exercises/grade.py                          # this checkout: every exercise passes
    python exercises/grade.py --root STUDENT_DIR       # a student's copy
    python exercises/grade.py --root STUDENT_DIR lr_at clip_gradients

One line per exercise:
  not attempted   its body is still the stub
  passed          every test that grades it passes
  failed          the first failing property, in words, and the check that failed
  waiting on N    its tests stop in another exercise's stub (N), so they say nothing about this one yet
Exits 1 if any graded exercise failed or is not attempted, else 0.
"""

import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from catalog import BY_NAME, EXERCISES, body, stub_line  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = re.compile(r'NotImplementedError: exercise (\w+):')


def attempted(root, exercise):
    with open(os.path.join(root, exercise.file)) as f:
        _, lines, _ = body(f.read(), exercise.name)
    return not any(stub_line(exercise.name) in line for line in lines)


def in_words(node_id):
    """tests/test_train.py::test_lr_schedule_warmup_then_cosine -> 'lr schedule warmup then cosine'"""
    return node_id.split("::")[-1].removeprefix("test_").replace("_", " ")


def grade(root, exercise, timeout=600):
    """(status, detail) of one exercise in the project at root."""
    if not attempted(root, exercise):
        return "not attempted", exercise.what
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *exercise.tests],
                            cwd=root, capture_output=True, text=True, timeout=timeout,
                            env=dict(os.environ, COLUMNS="240"))  # pytest cuts the failed check to the terminal's width
    if result.returncode == 0:
        return "passed", f"{len(exercise.tests)} test(s)"
    waiting = sorted({n for n in STUB.findall(result.stdout) if n != exercise.name})
    if waiting:
        return "waiting", f"on exercise {', '.join(waiting)}: its tests need that body too"
    failed = re.findall(r"^FAILED (\S+)(?: - (.*))?$", result.stdout, re.MULTILINE)
    if not failed:  # an error before any test ran: a syntax error, an import that fails
        lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
        return "failed", lines[-1] if lines else f"pytest exited with {result.returncode}"
    node, message = failed[0]
    return "failed", f"{in_words(node)}" + (f": {message.strip()[:200]}" if message else "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=ROOT, help="the project to grade (default: this checkout)")
    parser.add_argument("names", nargs="*", help=f"exercises to grade (default: all): {', '.join(BY_NAME)}")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"error: {', '.join(unknown)}: no such exercise; choose from {', '.join(BY_NAME)}")
    if not os.path.isfile(os.path.join(args.root, "train.py")):
        raise SystemExit(f"error: --root {args.root} holds no train.py: point it at a copy made by exercises/make.py")
    chosen = [e for e in EXERCISES if not args.names or e.name in args.names]
    bad = 0
    for number, exercise in enumerate(EXERCISES, 1):
        if exercise not in chosen:
            continue
        status, detail = grade(args.root, exercise)
        bad += status in ("failed", "not attempted")
        print(f"{number:>2}. {exercise.name:<16} {status:<14} {detail}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
