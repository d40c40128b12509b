"""The exercises: a student copy starts with nothing attempted; the grader reports failed, waiting and
passed honestly and names a broken marker; the graders reject every wrong body in exercises/mutants/
(`-m graders`, minutes), and the needs the catalog declares are enough to grade each exercise."""

import re
import sys

import pytest
from conftest import ROOT, run_script

sys.path.insert(0, str(ROOT / "exercises"))
from catalog import BY_NAME, EXERCISES, all_needs, in_needs_order, mutants_of, reference_bodies  # noqa: E402
from check_graders import main as check_the_graders  # noqa: E402
from check_graders import write_bodies

GPIPE_ORDER = ['return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]\n']


def grade(root, *names):
    return run_script([ROOT / "exercises" / "grade.py", "--root", root, *names], cwd=root, timeout=900)


def student_copy(tmp_path, *names):
    out = tmp_path / "student"
    made = run_script([ROOT / "exercises" / "make.py", out, "--only", ",".join(names)], cwd=ROOT)
    assert made.returncode == 0, made.stderr
    return out


def status_of(result, name):
    return next(line.split()[2] for line in result.stdout.splitlines() if line.split()[1:2] == [name])


def test_a_student_copy_starts_with_nothing_attempted(tmp_path):
    out = student_copy(tmp_path, *BY_NAME)
    result = grade(out)
    assert result.returncode == 1
    assert result.stdout.count("not attempted") == len(BY_NAME), result.stdout
    for exercise in EXERCISES:  # the stub keeps the signature and docstring, and names the exercise
        stubs = (out / exercise.file).read_text().count(f'NotImplementedError("exercise {exercise.name}:')
        assert stubs == len(exercise.where), exercise.name


def test_the_report_follows_the_needs(tmp_path):
    out = student_copy(tmp_path, *BY_NAME)
    reported = [line.split()[1] for line in grade(out).stdout.splitlines()]
    assert reported == [e.name for e in in_needs_order(EXERCISES)]
    for name in reported:
        assert all(reported.index(n) < reported.index(name) for n in BY_NAME[name].needs), name


def test_one_reference_body_makes_exactly_that_exercise_pass(tmp_path):
    out = student_copy(tmp_path, *BY_NAME)
    write_bodies(out, BY_NAME["lr_at"], reference_bodies(ROOT, BY_NAME["lr_at"]))
    result = grade(out)
    lines = result.stdout.splitlines()
    assert result.returncode == 1 and [line.split()[1] for line in lines if " passed " in line] == ["lr_at"], lines
    assert sum("not attempted" in line for line in lines) == len(BY_NAME) - 1


@pytest.mark.graders
def test_a_right_body_waits_on_the_stub_its_tests_need(tmp_path):
    """dp_average's tests train a model, which needs init: while init is a stub, dp_average waits on it."""
    out = student_copy(tmp_path, "init", "dp_average")
    write_bodies(out, BY_NAME["dp_average"], reference_bodies(ROOT, BY_NAME["dp_average"]))
    result = grade(out, "dp_average")
    assert status_of(result, "dp_average") == "waiting" and "on exercise init" in result.stdout, result.stdout
    assert result.returncode == 1, "an exercise that waits has not passed yet"


@pytest.mark.graders
def test_a_wrong_body_fails_even_while_another_stub_is_pending(tmp_path):
    """GPipe's order under 1F1B's name breaks the bubble and memory properties, which need no other
    exercise: it fails although init, which the pipeline's equality test needs, is still a stub."""
    out = student_copy(tmp_path, "init", "one_f_one_b")
    write_bodies(out, BY_NAME["one_f_one_b"], {"one_f_one_b": GPIPE_ORDER})
    result = grade(out, "one_f_one_b")
    assert status_of(result, "one_f_one_b") == "failed", result.stdout
    assert "wait on exercise init" in result.stdout, result.stdout
    assert result.returncode == 1


def test_a_failure_says_the_property_with_expected_and_actual(tmp_path):
    out = student_copy(tmp_path, "lr_at")
    write_bodies(
        out,
        BY_NAME["lr_at"],
        {
            "lr_at": [
                "if step < cfg.warmup_iters:\n",
                "    return cfg.learning_rate * (step + 1) / cfg.warmup_iters\n",
                "return cfg.learning_rate\n",  # no decay at all
            ]
        },
    )
    result = grade(out, "lr_at")
    assert result.returncode == 1 and status_of(result, "lr_at") == "failed", result.stdout
    assert "expected" in result.stdout and "got" in result.stdout, result.stdout


@pytest.mark.parametrize("damage", ["deleted", "doubled"])
def test_a_broken_marker_names_the_file_the_exercise_and_the_line(tmp_path, damage):
    out = student_copy(tmp_path, "lr_at")
    path = out / "train.py"
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip() == "# exercise lr_at: end")
    lines[at : at + 1] = [] if damage == "deleted" else [lines[at], lines[at]]
    path.write_text("".join(lines))
    result = grade(out, "lr_at")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    said = result.stderr
    assert "train.py" in said and "lr_at" in said and "# exercise lr_at: end" in said, said
    assert ("missing" if damage == "deleted" else "appears 2 times") in said, said


@pytest.mark.graders
def test_check_graders_reports_a_wrong_body_that_passes(tmp_path):
    """A 'mutant' that is the reference itself passes the graders: check_graders must say so and exit 1;
    a real mistake in the same folder is caught."""
    folder = tmp_path / "mutants" / "lr_at"
    folder.mkdir(parents=True)
    (folder / "the_reference.py").write_text(
        "# wrong: nothing (the reference)\n" + "".join(reference_bodies(ROOT, BY_NAME["lr_at"])["lr_at"])
    )
    (folder / "no_decay.py").write_text("# wrong: the LR never decays\nreturn cfg.learning_rate\n")
    result = run_script([ROOT / "exercises" / "check_graders.py", "--mutants", tmp_path / "mutants", "lr_at"], cwd=ROOT)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "NOT CAUGHT (passed)" in result.stdout and "the_reference.py" in result.stdout, result.stdout
    assert "caught       " in result.stdout and "1/2 mutants caught" in result.stdout, result.stdout
    # graded side by side (two copies), reported in the folder's order
    assert result.stdout.index("no_decay.py") < result.stdout.index("the_reference.py"), result.stdout


@pytest.mark.parametrize(
    "args, said",
    [
        (["--jobs", "0"], "--jobs 0: grade at least one mutant at a time"),
        (["no_such_exercise"], "no_such_exercise: no such exercise"),
        (["--mutants", "no/such/folder"], "--mutants no/such/folder is not a folder"),
    ],
)
def test_check_graders_names_a_bad_argument(args, said):
    with pytest.raises(SystemExit, match=re.escape(said)):
        check_the_graders(args)


def test_every_exercise_keeps_at_least_three_mutants():
    for exercise in EXERCISES:
        mutants = mutants_of(exercise)
        assert len(mutants) >= 3, f"{exercise.name} has {len(mutants)} mutants in exercises/mutants/"
        assert all(m.wrong for m in mutants), exercise.name


def test_needs_form_no_cycle_and_name_exercises():
    for exercise in EXERCISES:
        assert set(exercise.needs) <= set(BY_NAME) - {exercise.name}, exercise.name
    assert len(in_needs_order(EXERCISES)) == len(EXERCISES)


@pytest.mark.graders
def test_the_graders_catch_every_mutant():
    result = run_script([ROOT / "exercises" / "check_graders.py"], cwd=ROOT, timeout=3000)
    total = sum(len(mutants_of(e)) for e in EXERCISES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{total}/{total} mutants caught" in result.stdout, result.stdout


@pytest.mark.graders
@pytest.mark.parametrize("name", list(BY_NAME))
def test_the_declared_needs_are_enough_to_grade(tmp_path, name):
    """Every exercise that it does not declare it needs is a stub: the reference still passes."""
    others = [n for n in BY_NAME if n != name and n not in all_needs(BY_NAME[name])]
    out = student_copy(tmp_path, *others) if others else student_copy(tmp_path, "lr_at")
    if not others:
        write_bodies(out, BY_NAME["lr_at"], reference_bodies(ROOT, BY_NAME["lr_at"]))
    result = grade(out, name)
    assert status_of(result, name) == "passed", f"{name} needs more than {BY_NAME[name].needs}:\n{result.stdout}"
