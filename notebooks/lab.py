"""What every notebook needs around the project's modules: a quiet training run, and the verdict table.

A notebook does `from lab import plt, run, tested, computed, mechanism, verdict` in its first cell. That makes
the project's root folder the working directory and importable, so the notebook uses the
same modules as `python train.py`, and its runs write under out/notebooks/.
Nothing here trains or measures by itself: runs go through train.main, with
the same flags as the command line.
"""

import contextlib
import io
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import verdicts  # beside this file: imported before the chdir below moves away from it

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT)  # relative paths from here on: data/..., out/notebooks/...
sys.path.insert(0, str(ROOT))

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from IPython.display import display  # noqa: E402

import train  # noqa: E402
from machinery.components.run_folder import read_jsonl  # noqa: E402
from machinery.job.local_ranks import run_ranks  # noqa: E402

# One thread: models this small gain little from a second core, every number repeats on a machine with more,
# and two notebooks run side by side on two cores (tests/test_notebooks.py). Multi-rank runs give each rank one.
torch.set_num_threads(1)

# 150 dpi and no text under 9 pt: a committed figure reads on a code-hosting site without zooming
plt.rcParams.update(
    {
        "figure.dpi": 150,
        "figure.figsize": (10, 3.6),
        "axes.grid": True,
        "grid.alpha": 0.3,
        "font.size": 10,
        "legend.fontsize": 9,
        "xtick.labelsize": 9,
        "ytick.labelsize": 9,
    }
)


@dataclass
class TrainedRun:
    """What a notebook reads of a finished (or stopped) run: its folder, the metrics and incidents it
    logged, and what it printed. (run_setup.Run is the live run inside train.py.)"""

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
    otherwise, so that every CPU, with native bf16 or without, measures what the notebook shows; no samples
    are written at the end (--num_samples 0), nor metrics.png drawn (--plot false; the notebook draws its own
    figures), unless the flags ask for them."""
    out_dir = f"out/notebooks/{name}"
    argv = ["--out_dir", out_dir, "--dtype", "float32", "--num_samples", "0", "--plot", "false"]
    argv += ["--overwrite"] if fresh else []
    argv += map(str, flags)  # after the defaults: the last value of a flag wins
    if ranks == 1:
        log, error = _train_quietly(argv)
    else:
        outcome = run_ranks(ranks, _train_quietly, argv, timeout=600)
        status, value = outcome[0]
        log, error = value if status == "ok" else ("", f"rank 0 {status}: {value}")
        error = error or next((f"rank {r} {s}: {v}" for r, (s, v) in outcome.items() if s != "ok"), "")
    return TrainedRun(
        out_dir, read_jsonl(f"{out_dir}/metrics.jsonl"), read_jsonl(f"{out_dir}/incidents.jsonl"), log, error
    )


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
# The verdict table: every row says what kind of evidence it is.
#   measured:  an experiment whose outcome was not known before it ran, judged by one of the verdict engine's
#              standard tests (verdicts.py) on 5 or more seeds and an A/A arm: `tested`
#   computed:  arithmetic, or the cost model
#   mechanism: the code does what it says (a property of how it is written, shown by running it)

VERDICT_MIME = "application/vnd.minipretrain.verdict+json"  # what tests/test_notebooks.py reads back
KINDS = ("measured", "computed", "mechanism")


CONTROL_KINDS = ("counterfactual", "noise")
THRESHOLD_FROM = ("chapter", "noise", "both", "declared")  # declared: a margin the notebook sets before the run


def tested(
    claim,
    textbook,
    shown,
    hypothesis,
    arms,
    aa,
    units,
    control_kind,
    threshold,
    threshold_from,
    unit="seeds",
    fmt="{:.3g}",
    topic=None,
    **test,
):
    """A claim put to one of the verdict engine's standard tests (verdicts.py), chosen before the run; the row
    stores what the engine judged, so the notebook test judges it again from the same values.
    hypothesis: "superiority", "equivalence" or "trend" (verdicts.HYPOTHESES);
    arms:      {"a": per-unit values of the judged arm, "b": the other arm's, paired} (b may repeat one computed
               reference), or for a trend {"effects": (units, points), "scales": the axis}; the row stores them, and
               as `values` what the test reads from them (verdicts.per_unit): the differences, or each seed's slope;
    aa:        the A/A arm's signed per-unit gaps, on the scale of a - b (log ratios where log);
    units:     the seeds or timing rounds the arms ran, fixed before the run (5 or more);
    control_kind: "counterfactual" (the chapter's other choice at the same budget, the arm where the claim says the
               outcome differs) or "noise" (the A/A arm); never an arm built to fail;
    threshold_from: where the bar comes from: "chapter" (a size it states), "noise" (the A/A arm), "both", or
               "declared" (a size or margin the notebook sets before the run, said in `threshold`);
    test:      the test's own settings: log, toward (-1 where the claim says negative), size (superiority: the
               chapter's stated size), margin and margin_from (equivalence: a number, or (low, high) for a range,
               declared before the run, and where it comes from).
    The control is the A/A arm itself for superiority (it must not come out superior), for equivalence a planted
    difference of 1.5 x the margin on the A/A arm (it must not come out equivalent)."""
    for name, value, allowed in [
        ("control_kind", control_kind, CONTROL_KINDS),
        ("threshold_from", threshold_from, THRESHOLD_FROM),
    ]:
        if value not in allowed:
            raise ValueError(f"{claim!r}: {name} {value!r} is not one of {allowed}")
    values = verdicts.per_unit(arms, test.get("log", False)).tolist()
    row = {"hypothesis": hypothesis, "values": values, "seeds": len(values), "units": list(units), "arms": arms}
    row.update(alpha=verdicts.ALPHA, aa=aa, **test)
    judged = verdicts.judge(row)
    if hypothesis == "equivalence":
        high = row["margin"] if isinstance(row["margin"], (int, float)) else row["margin"][1]
        control = [gap + 1.5 * high for gap in aa]
        control_p = verdicts.equivalence(control, row["margin"])["p_value"]
        control_shown = f"A/A + 1.5 x the margin: p = {control_p:.3f}"
    elif hypothesis == "trend" and len(aa) and not isinstance(aa[0], (int, float)):  # A/A effects at each scale
        control, control_p = (
            [statistics.fmean(e) for e in aa],
            verdicts.trend([[test.get("toward", 1) * x for x in e] for e in aa], arms["scales"])["p_value"],
        )
        control_shown = f"A/A trend: p = {control_p:.3f}"
    else:  # signed as the claim is: the A/A arm must not come out as the claim says
        control, control_p = aa, verdicts.p_value([test.get("toward", 1) * gap for gap in aa])
        control_shown = f"A/A: p = {control_p:.3f}"
    if "a" in arms:  # the per-unit effect the test reads: a - b, or a / b where it reads log ratios
        effects = [a / b if test.get("log") else a - b for a, b in zip(arms["a"], arms["b"])]
    else:  # a trend: each unit's effect, averaged over the scales
        effects = [statistics.fmean(e) for e in arms["effects"]]
    value, spread = statistics.fmean(effects), statistics.stdev(effects)
    row.update(
        claim=claim,
        textbook=textbook,
        kind="measured",
        holds=judged["verdict"],
        p_value=judged["p_value"],
        measured=f"{fmt.format(value)} ± {fmt.format(spread)} ({len(units)} {unit}, p = {judged['p_value']:.3f}): "
        f"{shown}" + (f"; {judged['why']}: no" if "why" in judged else ""),
        value=value,
        spread=spread,
        control=statistics.fmean(control),
        control_kind=control_kind,
        control_fails=control_p > verdicts.ALPHA,  # it must not come out as the claim says
        control_shown=control_shown,
        threshold=threshold,
        threshold_from=threshold_from,
    )
    if topic is not None:
        row["topic"] = topic
    return row


def computed(claim, textbook, shown, holds, partly=False):
    """A claim checked by arithmetic or the cost model: holds is computed from its numbers (never typed
    in); partly=True where the direction is right and the size is not."""
    return {
        "claim": claim,
        "textbook": textbook,
        "kind": "computed",
        "measured": shown,
        "holds": "yes" if holds else "partly" if partly else "no",
    }


def mechanism(claim, textbook, shown, holds):
    """A claim about what the code does, shown by running it (it could only fail through a bug)."""
    return {
        "claim": claim,
        "textbook": textbook,
        "kind": "mechanism",
        "measured": shown,
        "holds": "yes" if holds else "no",
    }


def verdict(rows):
    """Show the notebook's verdict: the measured rows as a Markdown table, the computed and mechanism rows below it
    as checks, each kept machine-readable beside it so the notebook test can judge every row again; the headline
    counts measured rows only, beside how many "yes" they would give by chance at the engine's alpha."""
    measured = [r for r in rows if r["kind"] == "measured"]
    checks = [r for r in rows if r["kind"] != "measured"]
    table = [
        "| claim | the textbook says | found here (mean ± std of the per-unit effect, p) | control arm | threshold | "
        "holds? |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    table += [
        f"| {r['claim']} | {r['textbook']} | {r['measured']} | {r['control_shown']} | {r['threshold']} | "
        f"{r['holds'] if r['holds'] == 'yes' else '**' + r['holds'] + '**'} |"
        for r in measured
    ]
    counts = {v: sum(r["holds"] == v for r in measured) for v in ("yes", "partly", "no")}
    headline = (
        f"**{len(measured)} measured claims: {counts['yes']} yes, {counts['partly']} partly, {counts['no']} no "
        f"(measured yes: {yes_by_control(rows)}). Were none of them true, each test at alpha = {verdicts.ALPHA} "
        f"would say yes or partly by chance at most {verdicts.ALPHA:.0%} of the time: "
        f"{len(measured) * verdicts.ALPHA:.1f} of {len(measured)} expected.**"
        if measured
        else "**No measured claims: this notebook computes and checks.**"
    )
    check_table = ["| check | the textbook says | kind | found here | holds? |", "| --- | --- | --- | --- | --- |"]
    check_table += [
        f"| {r['claim']} | {r['textbook']} | {r['kind']} | {r['measured']} | "
        f"{r['holds'] if r['holds'] == 'yes' else '**' + r['holds'] + '**'} |"
        for r in checks
    ]
    parts = [headline, "\n".join(table) if measured else ""]
    if checks:
        parts += [f"**Checks ({len(checks)}: computed or mechanism, not counted above)**", "\n".join(check_table)]
    display({"text/markdown": "\n\n".join(p for p in parts if p), VERDICT_MIME: json.dumps(rows)}, raw=True)


def yes_by_control(rows):
    """The measured rows that hold "yes", counted by the kind of control they beat, in words."""
    yes = [r for r in rows if r["kind"] == "measured" and r["holds"] == "yes"]
    return ", ".join(f"{sum(r.get('control_kind') == k for r in yes)} against {k}" for k in CONTROL_KINDS)


def committed_rows(path):
    """The verdict rows a committed notebook shows, read from its saved outputs (nothing is run)."""
    cells = json.loads(Path(path).read_text())["cells"]
    outputs = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]
    return [row for o in outputs for row in json.loads(o.get("data", {}).get(VERDICT_MIME, "[]"))]


def summary(folder=ROOT / "notebooks"):
    """The verdicts of every committed notebook, one line each and a total: rows by kind, measured rows by
    verdict, and the measured "yes" rows by the kind of control they beat. python notebooks/lab.py prints it."""
    lines, everything = [], []
    for path in sorted(Path(folder).glob("[0-9]*.ipynb")):
        rows = committed_rows(path)
        everything += rows
        lines.append(f"{path.stem:32s} {_counts(rows)}")
    return "\n".join([*lines, f"{'all notebooks':32s} {_counts(everything)}"])


def _counts(rows):
    kinds = {k: [r for r in rows if r["kind"] == k] for k in KINDS}
    verdicts = {v: sum(r["holds"] == v for r in kinds["measured"]) for v in ("yes", "partly", "no")}
    return (
        f"{len(rows):3d} rows: {len(kinds['measured'])} measured ({verdicts['yes']} yes, {verdicts['partly']} partly, "
        f"{verdicts['no']} no), {len(kinds['computed'])} computed, {len(kinds['mechanism'])} mechanism; "
        f"measured yes: {yes_by_control(rows)}"
    )


if __name__ == "__main__":
    print(summary())
