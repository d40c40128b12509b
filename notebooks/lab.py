"""What every notebook needs around the project's modules: a quiet training run, and the verdict table.

A notebook does `from lab import plt, run, verdict` in its first cell. That makes
the project's root folder the working directory and importable, so the notebook uses the
same modules as `python train.py`, and its runs write under out/notebooks/.
Nothing here trains or measures by itself: runs go through train.main, with
the same flags as the command line.
"""

import contextlib
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT)  # relative paths from here on: data/..., out/notebooks/...
sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt  # noqa: E402
from IPython.display import display  # noqa: E402

import train  # noqa: E402
from local_ranks import run_ranks  # noqa: E402
from run_folder import read_jsonl  # noqa: E402

plt.rcParams.update({"figure.dpi": 72, "figure.figsize": (10, 3.6), "axes.grid": True, "grid.alpha": 0.3})


@dataclass
class Run:
    """A finished (or stopped) run: its folder, the metrics and incidents it logged, and what it printed."""

    out_dir: str
    records: list
    incidents: list
    log: str
    error: str = ""  # the error a refused or stopped run exits with

    def series(self, key):
        """(steps, values) of one logged number, e.g. run.series("loss")."""
        rows = [r for r in self.records if key in r]
        return [r["step"] for r in rows], [r[key] for r in rows]

    def last(self, key):
        return self.series(key)[1][-1]

    def at(self, key, step):
        steps, values = self.series(key)
        return values[steps.index(step)]

    def lines(self, containing):
        return [line for line in self.log.splitlines() if containing in line]


def run(name, *flags, fresh=True, ranks=1):
    """Train with `flags` (as on the command line) into out/notebooks/<name>, printing nothing.
    fresh=True starts over there (--overwrite); fresh=False continues or resumes what is there.
    ranks > 1 runs that many ranks over gloo on this machine, as torchrun would start them
    (local_ranks.run_ranks); the log is rank 0's. The dtype is float32 unless the flags say
    otherwise, so that every CPU, with native bf16 or without, measures what the notebook shows."""
    out_dir = f"out/notebooks/{name}"
    argv = ["--out_dir", out_dir, "--dtype", "float32", *(["--overwrite"] if fresh else []), *map(str, flags)]
    if ranks == 1:
        log, error = _train_quietly(argv)
    else:
        outcome = run_ranks(ranks, _train_quietly, argv, timeout=600)
        status, value = outcome[0]
        log, error = value if status == "ok" else ("", f"rank 0 {status}: {value}")
        error = error or next((f"rank {r} {s}: {v}" for r, (s, v) in outcome.items() if s != "ok"), "")
    return Run(out_dir, read_jsonl(f"{out_dir}/metrics.jsonl"), read_jsonl(f"{out_dir}/incidents.jsonl"), log, error)


def _train_quietly(argv):
    """train.main(argv) with its printing kept: (log, the error it exited with or "")."""
    log, error = io.StringIO(), ""
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            train.main(argv)
        except SystemExit as e:  # train.main exits with the error's text when a run is refused or stopped
            error = str(e.code)
    return log.getvalue(), error


# ----------------------------------------------------------------------------
# The verdict table: claim | what the textbook says | what we measured | holds?

VERDICT_MIME = "application/vnd.minipretrain.verdict+json"  # what tests/test_notebooks.py reads back


def verdict(rows):
    """Show the notebook's verdict. rows: (claim, textbook, measured, holds) with holds computed
    from the measurements (a bool, never typed in). The table is shown as Markdown and kept,
    machine-readable, beside it, so the notebook test can fail on a claim that does not hold."""
    rows = [(claim, textbook, measured, bool(holds)) for claim, textbook, measured, holds in rows]
    table = ["| claim | the textbook says | measured here | holds? |", "| --- | --- | --- | --- |"]
    table += [f"| {c} | {t} | {m} | {'yes' if h else '**no**'} |" for c, t, m, h in rows]
    data = [{"claim": c, "textbook": t, "measured": m, "holds": h} for c, t, m, h in rows]
    display({"text/markdown": "\n".join(table), VERDICT_MIME: json.dumps(data)}, raw=True)
