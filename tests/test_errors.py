"""Refusals and bugs, told apart in every entry point: a UserError (a refusal of the user's input) prints one line,
`error: ...`, naming the input; any other exception, a ValueError from a bug included, keeps its traceback."""

import importlib
import sys

import pytest
from conftest import ROOT, run_script

from errors import UserError
from machinery.job.local_ranks import run_ranks

sys.path.insert(0, str(ROOT / "exercises"))

# (the entry point's module, the function its main calls that we make raise, argv that reaches it)
ENTRY_POINTS = {
    "train.py": ("machinery.components.run_setup", "prepare_data", ["--max_iters", "1", "--plot", "false"]),
    "python -m machinery.corpus": (
        "machinery.corpora.corpus",
        "prepare",
        ["--source", "x.txt", "--out_dir", "{tmp}/data"],
    ),
    "python -m machinery.cost": (
        "machinery.planning.cost",
        "account",
        ["--model", "124M", "--gpu", "H100", "--gpus", "1"],
    ),
    "python -m machinery.curves": ("machinery.analysis.curves", "read_run", ["{tmp}/run"]),
    "python -m machinery.compare": ("machinery.analysis.compare", "compare_runs", ["{tmp}/a", "{tmp}/b"]),
    "exercises/check_graders.py": ("check_graders", "mutants_of", ["lr_at"]),
    "exercises/grade.py": ("grade", "body", ["lr_at"]),
    "exercises/make.py": ("make", "stub", ["{tmp}/copy", "--only", "lr_at"]),
}
MAINS = {
    "train.py": "train",
    "python -m machinery.corpus": "machinery.corpora.corpus",
    "python -m machinery.cost": "machinery.planning.cost",
    "python -m machinery.curves": "machinery.analysis.curves",
    "python -m machinery.compare": "machinery.analysis.compare",
    "exercises/check_graders.py": "check_graders",
    "exercises/grade.py": "grade",
    "exercises/make.py": "make",
}


def call_main_raising(entry, error, monkeypatch, tmp_path):
    """Run the entry point's main in this process with `error` raised where its work begins."""
    module, function, argv = ENTRY_POINTS[entry]

    def raising(*args, **kwargs):
        raise error

    monkeypatch.setattr(importlib.import_module(module), function, raising)
    if entry == "exercises/make.py":  # a copy of the one file the exercise is cut from, not the whole project
        monkeypatch.setattr(importlib.import_module("make"), "project_files", lambda *args: ["train.py"])
    monkeypatch.chdir(tmp_path)  # whatever a run would write lands here
    importlib.import_module(MAINS[entry]).main([a.format(tmp=tmp_path) for a in argv])


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_refusal_is_one_line_naming_the_input(entry, monkeypatch, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        call_main_raising(entry, UserError("--source x.txt: no such file"), monkeypatch, tmp_path)
    assert exit_info.value.code == "error: --source x.txt: no such file", (
        f"{entry}: a UserError exits with one line naming the input: got {exit_info.value.code!r}"
    )


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_bug_keeps_its_traceback(entry, monkeypatch, tmp_path):
    bug = ValueError("operands could not be broadcast together with shapes (3,) (4,)")
    with pytest.raises(ValueError) as raised:
        call_main_raising(entry, bug, monkeypatch, tmp_path)
    assert raised.value is bug, f"{entry}: a ValueError from a bug goes up whole, not {raised.value!r}"


def test_train_py_prints_a_bugs_traceback_and_a_refusal_in_one_line(tmp_path):
    """The whole process, as a user sees it: a ValueError raised inside the run's set-up prints a traceback that
    names where it came from; a foreign --out_dir prints one line naming the folder, and no traceback."""
    bug = (
        "import sys, train, machinery.components.run_setup as setup\n"
        "def prepare_data(*args, **kwargs):\n"
        "    raise ValueError('shapes (3,) and (4,) not aligned')\n"
        "setup.prepare_data = prepare_data\n"
        "train.main(sys.argv[1:])\n"
    )
    result = run_script(["-c", bug, "--out_dir", tmp_path / "run", "--plot", "false"], cwd=ROOT, timeout=120)
    assert result.returncode != 0 and "Traceback" in result.stderr, result.stderr[-2000:]
    assert "in prepare_data" in result.stderr and "ValueError: shapes (3,)" in result.stderr, result.stderr
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep me")
    result = run_script(["train.py", "--out_dir", foreign], cwd=ROOT, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[-1].startswith(f"error: --out_dir {foreign} is not empty"), lines
    assert (foreign / "mine.txt").read_text() == "keep me"


def _rank0_fails(kind):
    """On 2 gloo ranks: rank 0's work raises `kind`, once through ProcessGrid.on_rank0 and once as --init_from's read
    in init_from.read_initial_weights; returns what this rank raised each time."""
    from machinery.components import init_from
    from machinery.job.config import parse_args
    from parallel.grid import Layout, ProcessGrid, destroy_distributed, init_distributed

    def fail(*args):
        raise kind("--init_from w.safetensors: no such file")

    init_from.initial_weights = fail  # this rank's process only
    launch = init_distributed(30)
    configs = parse_args(["--init_from", "w.safetensors"])[2]
    grid = ProcessGrid(Layout(dp=2), launch.rank, launch.world_size)
    attempts = (lambda: grid.on_rank0(fail), lambda: init_from.read_initial_weights(configs, {}, grid))
    raised = []
    for attempt in attempts:
        try:
            attempt()
        except Exception as e:
            raised.append(f"{type(e).__name__}: {e}")
    destroy_distributed()
    return raised


@pytest.mark.parametrize("kind", [UserError, ValueError])
def test_rank_0s_failure_stops_every_rank_and_a_bug_keeps_its_type_there(kind):
    """Rank 0 alone does some work (a download, preparing data): whatever it raises stops every rank, so none waits
    in a collective. A refusal reads the same one line on each; a bug is raised whole on rank 0, and the other ranks
    say whose traceback to read."""
    outcome = run_ranks(2, _rank0_fails, kind, timeout=60)
    for rank in range(2):
        status, raised = outcome.get(rank, ("missing", None))
        assert status == "ok" and len(raised) == 2, f"rank {rank} ends both attempts: got {status}: {raised}"
    for attempt, (on_rank0, on_rank1) in enumerate(zip(outcome[0][1], outcome[1][1])):
        assert on_rank0 == f"{kind.__name__}: --init_from w.safetensors: no such file", (attempt, on_rank0)
        if kind is UserError:
            assert on_rank1 == on_rank0, f"attempt {attempt}: a refusal reads the same on every rank: {on_rank1!r}"
        else:
            want = "UserError: rank 0 stopped on a bug (ValueError: --init_from w.safetensors: no such file)"
            assert on_rank1.startswith(want), f"attempt {attempt}: rank 1 names rank 0's bug: {on_rank1!r}"
