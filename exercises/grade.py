"""Grade the exercises: run, for each, the project's own property tests against the code in --root.

    python exercises/grade.py                          # this checkout: every exercise passes
    python exercises/grade.py --root STUDENT_DIR       # a student's copy
    python exercises/grade.py --root STUDENT_DIR lr_at clip_gradients

One line per exercise, each after the exercises it needs:
  not attempted   its body is still the stub
  passed          every test that grades it passes
  failed          a property its body breaks, in words, with the expected and the actual value
                  (tests that wait on another exercise's stub are counted beside it)
  waiting on N    every test that could run passed, and the others stop in exercise N's stub:
                  write N, then grade again
Exits 0 only if every graded exercise passed.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from catalog import BY_NAME, EXERCISES, body, in_needs_order, stub_line  # noqa: E402

from errors import UserError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = re.compile(r"NotImplementedError: exercise (\w+):")
# pytest's environment when it grades: an edited body must never meet a stale .pyc; and only pytest's own plugins,
# as a plugin installed beside it (hypothesis's imports itself at every session's end, 1.5 s) neither grades
# nor may change a grade
GRADING_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def stubbed_bodies(root, exercise):
    """The exercise's bodies that are still the stub, by where they are."""
    with open(os.path.join(root, exercise.file)) as f:
        source = f.read()
    return [
        where
        for where in exercise.where
        if any(stub_line(exercise.name) in line for line in body(source, exercise, where)[1])
    ]


def in_words(name):
    """test_lr_schedule_warmup_then_cosine[lanes=4] -> 'lr schedule warmup then cosine (lanes=4)'"""
    base, _, params = name.partition("[")
    words = base.removeprefix("test_").replace("_", " ")
    return words + (f" ({params.rstrip(']')})" if params else "")


def what_failed(failure, exercise):
    """One line from a failed test's report: the property's own message, or where the body raised what."""
    message, text = failure.get("message", ""), failure.text or ""
    if message.startswith("assert "):  # a check without words: pytest's account of it
        return "the check `" + message.splitlines()[0] + "` failed"
    first = message.split("\nassert ")[0].strip()
    if first.startswith("AssertionError"):
        return " ".join(first.removeprefix("AssertionError").lstrip(": ").split())
    # An exception: say where in the exercise's file it was raised, the student's line.
    raised = re.findall(rf"^{re.escape(exercise.file)}:(\d+): \w+", text, re.MULTILINE)
    at = f" at {exercise.file} line {raised[-1]}" if raised else ""
    return f"raised{at}: " + " ".join(first.split())


def pytest_in_a_new_process(arguments, root, env, timeout):
    """pytest's output, run in a fresh interpreter in root (raises subprocess.TimeoutExpired past timeout)."""
    command = [sys.executable, "-m", "pytest", *arguments]
    env = dict(env or os.environ, **GRADING_ENV)
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=timeout, env=env)
    return result.stdout + result.stderr


def run_tests(root, tests, timeout, first_failure_only=False, env=None, pytest=pytest_in_a_new_process):
    """{(module, test name): (outcome, its report)} with outcome passed | failed | error (the report a JUnit XML
    element, None when passed), and pytest's output. env: pytest's environment (default: this one's); pytest: what
    runs it, given its arguments, root, env and timeout (check_graders.py's runs it in a process that has imported
    torch already)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.xml")
        arguments = ["-q", "-p", "no:cacheprovider", f"--junitxml={report}", *(["-x"] if first_failure_only else [])]
        output = pytest([*arguments, *tests], root, env, timeout)
        cases = ET.parse(report).getroot().iter("testcase") if os.path.exists(report) else []
        outcomes = {}
        for case in cases:
            key, failure, error = (case.get("classname"), case.get("name")), case.find("failure"), case.find("error")
            if failure is not None:
                outcomes[key] = ("failed", failure)
            elif error is not None:
                outcomes[key] = ("error", error)
            elif case.find("skipped") is None:
                outcomes[key] = ("passed", None)
    return outcomes, output


def grade(root, exercise, timeout=900, first_failure_only=False, env=None, pytest=pytest_in_a_new_process):
    """(status, detail) of one exercise in the project at root (pytest: as run_tests takes it)."""
    stubs = stubbed_bodies(root, exercise)
    if len(stubs) == len(exercise.where):
        return "not attempted", f"write {', '.join(exercise.where)}: {exercise.what}"
    if stubs:
        return "failed", f"{', '.join(stubs)} is still the stub: write every body of the exercise"
    try:
        outcomes, output = run_tests(root, exercise.tests, timeout, first_failure_only, env, pytest)
    except subprocess.TimeoutExpired:
        return "failed", f"its tests did not finish within {timeout} s: does the body wait for something forever?"
    failed, waiting = [], {}
    for (_, name), (outcome, report) in outcomes.items():
        if outcome == "passed":
            continue
        stopped_in = set(STUB.findall(report.text or "")) | set(STUB.findall(report.get("message", "")))
        stopped_in -= {exercise.name}
        if stopped_in:
            for other in stopped_in:
                waiting.setdefault(other, []).append(name)
        else:
            failed.append((name, report))
    if not outcomes or (len(outcomes) < len(exercise.tests) and not failed and not first_failure_only):
        lines = [line for line in output.splitlines() if line.strip()]
        return "failed", "its tests did not run: " + (lines[-1] if lines else "pytest printed nothing")
    on = f"on exercise {', '.join(sorted(waiting))}"
    if failed:
        name, report = failed[0]
        more = f" [{len(failed) - 1} more test(s) failed]" if len(failed) > 1 else ""
        wait = f" [{sum(map(len, waiting.values()))} more wait {on}]" if waiting else ""
        return "failed", f"{in_words(name)}: {what_failed(report, exercise)}{more}{wait}"
    if waiting:
        return (
            "waiting",
            f"{on}: {len(outcomes) - sum(map(len, waiting.values()))} test(s) passed, the others run that body too",
        )
    return "passed", f"{len(outcomes)} test(s)"


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
    try:
        chosen = [e for e in in_needs_order(EXERCISES) if not args.names or e.name in args.names]
        for exercise in chosen:  # every marker first: a broken one stops the grading before any test runs
            for where in exercise.where:
                with open(os.path.join(args.root, exercise.file)) as f:
                    body(f.read(), exercise, where)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    number = {e.name: i for i, e in enumerate(EXERCISES, 1)}
    passed = 0
    for exercise in chosen:
        status, detail = grade(args.root, exercise)
        passed += status == "passed"
        needs = f"(needs {', '.join(exercise.needs)}) " if exercise.needs and status != "passed" else ""
        print(f"{number[exercise.name]:>2}. {exercise.name:<16} {status:<14} {needs}{detail}", flush=True)
    sys.exit(0 if passed == len(chosen) else 1)


if __name__ == "__main__":
    main()
