"""Bands: one recipe trained over seeds, the yardstick a run's curve is read against (curves.py), and a run's files
read back by step.

A band (bands/<preset>.json, made by bench/bands.py with make_band) is one recipe trained over K seeds, each with
its own data order: at every logged step, the mean, std and 5/50/95% quantiles of the K train losses (and of the
val losses at the evaluated steps). It applies to runs of the same model, data (by sha256), tokenizer, batch, block
size and evaluation rows (`recipe`); the LR, its schedule, clipping, the seed and the data order may differ: the band
shows what the recipe's own settings give, which is how a run with an LR that is off shows it. Its edge is a rule,
not the raw quantiles (with K ~ 10 the 5% and 95% quantiles are nearly the min and the max, which a healthy run
leaves by chance):

    edge(t) = mean(t) ± z · s(t)    s: the per-step std averaged over SMOOTH logged points around t
    a run has left the band where PERSIST logged train losses in a row lie outside the edge,
    and has jumped where one lies above mean + JUMP · z · s

make_band calibrates z on held-out healthy seeds: each of the K seeds is judged against the band of the other K - 1,
and z is the smallest of Z_CHOICES that flags none of them (the band records the whole table). The final val loss's
p-value is two-sided, from Student's t with K - 1 degrees of freedom of (x - mean) / (std · √(1 + 1/K)): where one
more seed of the recipe would land (a prediction interval).
"""

import math
import os
import statistics
from dataclasses import dataclass, field

import numpy as np

from data import read_json
from errors import UserError
from machinery.components.run_folder import COMMAND_RECORDS, fill_new_fields, identity_defaults, read_jsonl
from machinery.job.arms import ArmsConfig
from machinery.job.config import RecoveryConfig, TrainConfig

BANDS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bands")
MIN_SEEDS = 8  # fewer seeds than this leave the std too uncertain to draw an edge with
SMOOTH = 5  # logged points the std is averaged over (centred): a per-step std of K seeds is itself noisy
PERSIST = 3  # logged train losses in a row outside the edge: one point out is the noise of a batch
JUMP = 2  # ...unless it is above the mean by more than twice the edge's distance: a jump
Z_CHOICES = (2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0)  # from the normal's 95% point up: calibration takes the first that fits
P_ALARM = 0.01  # a final val loss where fewer than 1 in 100 seeds of the recipe would land
# where a recipe's settings differ from the band's, the reader names them (the ones a user tunes); the first four
# shape the LR, and are the LR's evidence where a run's loss stays above the band
LR_SCHEDULE = ("learning_rate", "min_lr", "warmup_iters", "lr_decay_iters")
SETTINGS = (*LR_SCHEDULE, "max_iters", "grad_clip", "weight_decay")


# ----------------------------------------------------------------------------
# A run's files, read


@dataclass
class LoggedRun:
    """What a run folder's files say, by step: train loss, LR and grad norm (with its z-score) at the logged
    steps, val loss at the evaluated ones, the incidents and the injected faults."""

    folder: str
    identity: dict  # run.json without "config", every field filled: what makes it this run (run_folder)
    config: dict  # run.json's "config": the preset and every section's settings
    train: dict = field(default_factory=dict)  # {step: loss}
    val: dict = field(default_factory=dict)  # {step: val loss}
    lr: dict = field(default_factory=dict)
    grad_norm: dict = field(default_factory=dict)
    grad_z: dict = field(default_factory=dict)
    skipped: int = 0  # steps fp16's loss scaler skipped
    incidents: list = field(default_factory=list)
    injected: list = field(default_factory=list)  # the faults --inject planted (injected.json)
    computed_in: list = field(default_factory=list)  # [[first step, dtype]] of each start (run.json; [] if older)

    @property
    def ln_vocab(self):
        return math.log(self.identity["GPTConfig"]["vocab_size"])

    @property
    def settings(self):
        return self.identity["TrainConfig"]

    @property
    def preset(self):
        return self.config.get("preset", "")

    @property
    def recovery(self):
        """The run's RecoveryConfig (its detectors' thresholds, the runbook's window)."""
        recorded = self.config.get("recovery", {})
        return RecoveryConfig(**{k: v for k, v in recorded.items() if k in RecoveryConfig.__dataclass_fields__})


def read_run(folder):
    """LoggedRun of a run folder; a UserError naming the folder and what is missing."""
    recorded = read_json(os.path.join(folder, "run.json"))
    if recorded is None:
        raise UserError(f"{folder}: no run.json, so not a run folder (python train.py --out_dir DIR makes one)")
    records = [r for r in read_jsonl(os.path.join(folder, "metrics.jsonl")) if not r.get("eval_only")]
    if not any("loss" in r for r in records):
        raise UserError(f"{folder}: metrics.jsonl holds no logged step yet; read it once the run has logged one")
    identity = {k: v for k, v in recorded.items() if k not in COMMAND_RECORDS}
    identity = fill_new_fields(identity, identity_defaults(ArmsConfig(), TrainConfig()))  # an older run.json
    logged = LoggedRun(folder, identity, recorded.get("config", {}), computed_in=recorded.get("computed_in", []))
    for r in records:
        if "loss" in r:
            logged.train[r["step"]], logged.lr[r["step"]] = r["loss"], r["lr"]
            logged.grad_norm[r["step"]], logged.grad_z[r["step"]] = r["grad_norm"], r["grad_norm_z"]
            logged.skipped += "skipped" in r
        if "val_loss" in r:
            logged.val[r["step"]] = r["val_loss"]
    logged.incidents = read_jsonl(os.path.join(folder, "incidents.jsonl"))
    logged.injected = read_json(os.path.join(folder, "injected.json")) or []
    return logged


def recipe(identity):
    """What a band applies to: the model, the data (its sha256 and tokenizer, not its description), the global batch
    and the evaluation's rows, and the starting weights. The settings a user tunes are not in it."""
    train = identity["TrainConfig"]
    return {
        "model": {k: v for k, v in identity["GPTConfig"].items() if k != "attention"},  # one function, two kernels
        "data": {k: v for k, v in identity["data"].items() if k != "source"},
        "batch": {k: train[k] for k in ("global_batch", "eval_iters", "lanes")},
        "start": {"init_from": train["init_from"]},
    }


def recipe_differences(run_recipe, band_recipe):
    """['model n_layer 6 (the band's 4)', ...]: where a run's recipe is not the band's."""
    return [
        f"{section} {key} {run_recipe[section].get(key)!r} (the band's {value!r})"
        for section, fields in band_recipe.items()
        for key, value in fields.items()
        if run_recipe[section].get(key) != value
    ]


# ----------------------------------------------------------------------------
# Bands: one recipe over seeds


def summary(runs, steps):
    """Per step, the mean, std and 5/50/95% quantiles over runs ({step: value} each), and every run's values."""
    values = np.array([[logged[t] for t in steps] for logged in runs])  # (K, steps)
    q05, q50, q95 = np.quantile(values, [0.05, 0.5, 0.95], axis=0)

    def rounded(a):
        return [round(float(x), 6) for x in a]

    return {
        "step": list(steps),
        "mean": rounded(values.mean(0)),
        "std": rounded(values.std(0, ddof=1)),
        "q05": rounded(q05),
        "q50": rounded(q50),
        "q95": rounded(q95),
        "runs": [rounded(row) for row in values],
    }


def shared_summary(series):
    """summary() over the steps every one of the {step: value} dicts holds."""
    return summary(series, sorted(set.intersection(*(set(s) for s in series))))


def make_band(runs, preset, made_by):
    """The band of LoggedRun `runs`: one recipe with one set of settings, at least MIN_SEEDS seeds, none of which
    had an incident; its edge calibrated on them."""
    if len(runs) < MIN_SEEDS:
        raise UserError(f"a band needs at least {MIN_SEEDS} seeds; got {len(runs)}")
    first = runs[0]
    for logged in runs:
        if differences := recipe_differences(recipe(logged.identity), recipe(first.identity)):
            raise UserError(f"{logged.folder} is another recipe than {first.folder}: {'; '.join(differences)}")
        if changed := [k for k in SETTINGS if logged.settings[k] != first.settings[k]]:
            raise UserError(f"{logged.folder} trained with other settings than {first.folder}: {', '.join(changed)}")
        if logged.incidents:
            raise UserError(f"{logged.folder} had {len(logged.incidents)} incident(s): a band is made of healthy runs")
    band = {
        "preset": preset,
        "about": "a recipe over seeds, each with its own data order (curves.py reads runs against it)",
        "seeds": [logged.settings["seed"] for logged in runs],
        "data_orders": [logged.settings["data_order"] for logged in runs],
        "made_by": made_by,
        "recipe": recipe(first.identity),
        "settings": {k: first.settings[k] for k in SETTINGS},
        "train": shared_summary([logged.train for logged in runs]),
        "val": shared_summary([logged.val for logged in runs]),
        "grad_norm": shared_summary([logged.grad_norm for logged in runs]),
    }
    band["rule"] = calibrate(band["train"])
    return band


def calibrate(train):
    """The edge rule of a band's train series: z, the smallest of Z_CHOICES that flags none of its seeds when each
    is judged against the band of the others (the seeds held out in turn), and the table of how many each z flags.
    A z chosen so flags a new healthy seed about 1 time in K + 1: as often as it would flag the most extreme of
    the K + 1 seeds."""
    held_out = []  # (a seed's {step: loss}, the summary of the others)
    for k, row in enumerate(train["runs"]):
        others = [dict(zip(train["step"], r)) for j, r in enumerate(train["runs"]) if j != k]
        held_out.append((dict(zip(train["step"], row)), summary(others, train["step"])))
    rules = {z: {"z": z, "persist": PERSIST, "jump": JUMP, "smooth": SMOOTH} for z in Z_CHOICES}
    seeds_flagged = {z: sum(flagged(values, others, rule) for values, others in held_out) for z, rule in rules.items()}
    z = next((z for z in Z_CHOICES if seeds_flagged[z] == 0), Z_CHOICES[-1])
    table = ", ".join(f"z {z:g}: {n}" for z, n in seeds_flagged.items())
    widest = "" if seeds_flagged[z] == 0 else f"; no z flags none of them, so the widest, {z:g}"
    seeds = len(train["runs"])
    calibration = f"each of the {seeds} seeds against the band of the other {seeds - 1}, seeds flagged by {table}"
    return {**rules[z], "calibration": calibration + widest}


def edge(series, rule):
    """(mean, s) per step of a band's series: s, the std averaged over rule["smooth"] logged points around t."""
    std = np.array(series["std"])
    half = rule["smooth"] // 2
    smoothed = [std[max(0, i - half) : i + half + 1].mean() for i in range(len(std))]
    return np.array(series["mean"]), np.maximum(np.array(smoothed), 1e-12)


def deviations(values, series, rule):
    """[(step, (value - mean) / s)] at the band's steps that the run logged (values: {step: loss})."""
    mean, s = edge(series, rule)
    return [(t, (values[t] - mean[i]) / s[i]) for i, t in enumerate(series["step"]) if t in values]


def stretches_out(values, series, rule):
    """[(first step, last step, side)] of every stretch of rule["persist"] or more logged points in a row outside
    mean ± z·s, on one side: where the run left the band."""
    found, stretch = [], []  # stretch: [(step, above?)]
    for t, d in deviations(values, series, rule) + [(None, 0.0)]:
        outside = abs(d) > rule["z"]
        if outside and (not stretch or (d > 0) == stretch[0][1]):
            stretch.append((t, d > 0))
            continue
        if len(stretch) >= rule["persist"]:
            found.append((stretch[0][0], stretch[-1][0], "above" if stretch[0][1] else "below"))
        stretch = [(t, d > 0)] if outside else []
    return found


def jumps(values, series, rule, before=math.inf):
    """[(step, deviation)] of single logged points before step `before` above the band by more than rule["jump"] x
    its edge, outside any stretch out of it: the chapter's mid-run jump, which one bad batch makes and the next step
    may already have undone. (A jump that the spike detector caught is an incident instead: the runbook rolled it
    back before it was logged.) A single point is one batch's loss, judged against what the band logged at that
    step: from a runbook's skip on, the run reads other batches at the band's logged steps (data_shifts)."""
    stretches = stretches_out(values, series, rule)
    return [
        (t, d)
        for t, d in deviations(values, series, rule)
        if t < before and d > rule["jump"] * rule["z"] and not any(a <= t <= b for a, b, _ in stretches)
    ]


def data_shifts(logged):
    """[(step, batches)]: from each step a runbook's rollback restored on, how many steps earlier than a run without
    incidents the run reads each batch, all the skips so far counted. The runbook rolls back to a checkpoint and
    skips the rows up to the incident, so each skip moves every later batch to an earlier step; [] without one."""
    shifts, skipped_rows = [], 0
    for action in sorted((i["action"] for i in logged.incidents if "action" in i), key=lambda a: a["restored_step"]):
        start, end = action["skipped_rows"]
        skipped_rows += end - start
        shifts.append((action["restored_step"], skipped_rows / logged.settings["global_batch"]))
    return shifts


def flagged(values, series, rule):
    """True if the rule flags a run's train losses: out of the band for long enough, or a jump."""
    return bool(stretches_out(values, series, rule) or jumps(values, series, rule))


def student_t_p(t, dof):
    """Two-sided p-value of Student's t with dof degrees of freedom: 1 - the density integrated over [-|t|, |t|]
    (the trapezoid rule on 20,001 points: the density is smooth, the error under 1e-6 for any t)."""
    u = np.linspace(0.0, abs(t), 20001)
    log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    density = np.exp(log_c - (dof + 1) / 2 * np.log1p(u * u / dof))
    inside = 2.0 * float(((density[1:] + density[:-1]) / 2 * np.diff(u)).sum())
    return min(1.0, max(0.0, 1.0 - inside))


def val_p(logged, band):
    """(step, the run's val loss, p) at the last evaluated step the run and the band share, or None: where one more
    seed of the recipe would land, by Student's t with K - 1 degrees of freedom (a prediction interval)."""
    shared = [t for t in band["val"]["step"] if t in logged.val]
    if not shared:
        return None
    step = shared[-1]
    seeds = [row[band["val"]["step"].index(step)] for row in band["val"]["runs"]]
    return step, logged.val[step], p_against(logged.val[step], seeds)


def p_against(value, seeds):
    """The two-sided p-value of `value` as one more seed of the recipe whose final losses are `seeds`: Student's t
    with K - 1 degrees of freedom of (value - mean) / (std · √(1 + 1/K)), a prediction interval."""
    k = len(seeds)
    spread = max(statistics.stdev(seeds), 1e-12) * math.sqrt(1 + 1 / k)  # 1e-12: K identical seeds
    return student_t_p((value - statistics.fmean(seeds)) / spread, k - 1)


def find_band(identity, preset, path=""):
    """(band, None) where the band file at `path` (default bands/<preset>.json) applies to a run of `identity`
    (run.json's, filled), else (None, why). Reading a band never fails a caller: a file it cannot read is a why."""
    path = path or os.path.join(BANDS_DIR, f"{preset}.json")
    shown = os.path.relpath(path)
    try:
        band = read_json(path)
    except (OSError, ValueError) as e:
        return None, f"{shown} cannot be read ({type(e).__name__}: {e})"
    if band is None:
        return None, f"no band file {shown} (make one: python bench/bands.py --preset {preset or 'PRESET'})"
    if "train" not in band:
        return None, f"{shown} holds published anchors only, not a band measured here"
    if differences := recipe_differences(recipe(identity), band["recipe"]):
        return None, f"{shown} is another recipe: {'; '.join(differences)}"
    return band, None


def anchor_lines(path):
    """The published reference points a band file holds (bands/gpt2-small.json), one line each."""
    try:
        anchors = (read_json(path) or {}).get("anchors", [])
    except (OSError, ValueError):
        return []
    lines = []
    for a in anchors:
        numbers = [f"val loss {a['val_loss']:g} ({a['val_on']})"] if "val_loss" in a else []
        numbers += [f"HellaSwag acc_norm {a['hellaswag_acc_norm']:.2%}"] if "hellaswag_acc_norm" in a else []
        lines.append(f"published: {a['what']}: {', '.join(numbers)} ({a['source']})")
    return lines
