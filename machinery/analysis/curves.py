"""Loss curves that talk: a run's curve read against the chapter's shapes and against a band of its recipe over
seeds (runs compared checkpoint by checkpoint on one fixed evaluation are compare.py's).

    python -m machinery.curves RUN [--band FILE] [--plot FILE]      # a few lines, RUN/curves.png, a verdict

The chapter's first intuition: a run starts near ln V (a uniform guess over the vocabulary), falls fast, then
descends in a long tail; loss that stops falling early points at the LR or the data, a jump mid-run at bad data
or instability, and a plateau at the end is convergence. Its fourth: trust checkpoints compared on one fixed
evaluation at equal steps, not a feeling.

The band itself, its edge and its p-value are bands.py's.

Reading a run is a pure function of its files (run.json, metrics.jsonl, incidents.jsonl): it imports no training
code, trains nothing, and writes only its plot.
"""

import argparse
import math
import os
import statistics
import sys
import textwrap
from dataclasses import dataclass, field

from errors import UserError
from machinery.analysis.bands import (
    BANDS_DIR,
    LR_SCHEDULE,
    P_ALARM,
    SETTINGS,
    anchor_lines,
    data_shifts,
    edge,
    find_band,
    jumps,
    read_run,
    stretches_out,
    val_p,
)

MIN_POINTS = 12  # logged steps before a curve has a shape: three per quarter
NEAR_LN_V = 0.05  # a first loss within 5% of ln V is a uniform guess
TAIL_RATIO = 3  # a curve is in its tail once it falls 3x slower per step than in its first quarter


# ----------------------------------------------------------------------------
# Reading one curve


def phase(logged):
    """(name, words): where the train curve is, by its shape alone. The logged steps are cut into quarters, each
    summed up by its median (a noisy batch moves a mean); two quarters differ when their medians are further apart
    than twice the error of that difference (the points' noise: the std of their step-to-step differences in the
    last quarter, / √2). The last quarter above the second: rising. The second quarter already at the last one's
    level: an early plateau (the chapter: the LR or the data). The third at it: a final plateau (the chapter:
    convergence). Otherwise the fall per step over the first quarter is set against the fall over the last: a long
    tail once it is TAIL_RATIO times slower, else the fast fall goes on."""
    steps, losses = list(logged.train), list(logged.train.values())
    n = len(steps)
    if n < MIN_POINTS or steps[-1] < logged.settings["warmup_iters"]:
        return "start", f"{n} logged steps, to step {steps[-1]}: too early for a shape (the warmup, or few points)"
    q = n // 4
    quarters = [losses[i * q : (i + 1) * q] for i in range(3)] + [losses[3 * q :]]
    levels = [statistics.median(part) for part in quarters]
    point_noise = statistics.stdev(b - a for a, b in zip(quarters[3], quarters[3][1:])) / math.sqrt(2)
    error = 2 * math.sqrt(2) * 1.25 * point_noise / math.sqrt(q)  # a median of q points: 1.25 x a mean's error
    last = f"{levels[3]:.4f} over steps {steps[3 * q]}-{steps[-1]}"
    inherited = (
        " (weights inherited from --init_from: a flat start is expected)" if logged.settings["init_from"] else ""
    )
    if levels[3] - levels[1] > error:
        return "rising", (
            f"rising: the last quarter ({last}) above the second ({levels[1]:.4f}; the noise {error:.4f}): a run "
            "that diverges, or a model overfitting data it has read too often"
        )
    if levels[1] - levels[3] <= error:
        return "early plateau", (
            f"an early plateau: the second quarter (steps {steps[q]}-{steps[2 * q - 1]}, LR {logged.lr[steps[q]]:.2g} "
            f"at its start) is at the last one's level ({levels[1]:.4f} against {last}; the noise {error:.4f}): a "
            f"curve that stops falling by mid-run points at the data or the LR{inherited}"
        )
    if levels[2] - levels[3] <= error:
        floor, lr_now = logged.settings["min_lr"], logged.lr[steps[-1]]
        schedule = "at its floor" if lr_now <= 1.5 * floor else f"above its floor {floor:.2g}"  # 1.5: near it
        return "final plateau", (
            f"a final plateau: the third quarter is at the last one's level ({levels[2]:.4f} against {last}; the "
            f"noise {error:.4f}), the LR {lr_now:.2g}, {schedule}: the chapter reads a plateau at the end as "
            "convergence"
        )
    early = (levels[0] - levels[1]) / (steps[q] - steps[0])
    late = (levels[2] - levels[3]) / (steps[3 * q] - steps[2 * q])
    if early < TAIL_RATIO * late:
        return "fast fall", (
            f"the fast fall goes on: {late * 1000:.2f} per 1000 steps lately, {early * 1000:.2f} over the first quarter"
        )
    return (
        "long tail",
        f"a long tail: {late * 1000:.3f} per 1000 steps lately, {early / late:.0f}x slower than at first",
    )


def first_loss_words(logged):
    """Whether the first logged loss is near ln V, in words."""
    first_step = min(logged.train)
    first = logged.train[first_step]
    if abs(first / logged.ln_vocab - 1) < NEAR_LN_V:
        return f"first loss {first:.3f} at step {first_step}, near ln V = {logged.ln_vocab:.3f}: a uniform guess"
    if logged.settings["init_from"]:
        return f"first loss {first:.3f}, under ln V = {logged.ln_vocab:.3f}: weights inherited from --init_from"
    return (
        f"first loss {first:.3f}, not near ln V = {logged.ln_vocab:.3f}: a fresh init that does not guess uniformly "
        "(notebook 01 measures what a wrong init costs)"
    )


def leading_indicators(logged):
    """[(step, words)] of the chapter's leading indicators in the logged metrics, by the run's own thresholds (as
    incidents.HealthMonitor fires them, seen at the logged steps only): the grad norm's z-score above
    --grad_z_threshold, and the val loss up --val_rise_evals evals in a row while the train loss (the median of
    the logged losses over the monitor's window before each eval) fell."""
    rcfg = logged.recovery
    threshold, k = rcfg.grad_z_threshold, rcfg.val_rise_evals
    fired = [
        (t, f"grad-norm z {z:.1f} > {threshold:g}") for t, z in logged.grad_z.items() if threshold and z > threshold
    ]

    def train_level(step):
        recent = [loss for t, loss in logged.train.items() if step - rcfg.monitor_window <= t < step]
        return statistics.median(recent) if recent else math.inf

    evals = [(t, logged.val[t], train_level(t)) for t in logged.val]
    for i in range(k, len(evals) if k else 0):
        recent = evals[i - k : i + 1]
        if all(b[1] > a[1] and b[2] < a[2] for a, b in zip(recent, recent[1:])):
            fired.append((recent[-1][0], f"val loss up {k} evals in a row, to {recent[-1][1]:.4f}, train loss down"))
    return sorted(fired)


def late_grad_norm(grad_norms, steps):
    """The median grad norm ({step: grad norm}) over the last quarter of `steps`."""
    late = steps[len(steps) - len(steps) // 4 :]
    return statistics.median(grad_norms[t] for t in late if t in grad_norms)


# the chapter's causes of an abnormal curve, in its order of frequency, and what each --inject fault stands for
CAUSES = ("bad data", "an LR too high where the loss is high", "numeric precision", "a hardware bit flip")
PLANTED_AS = {"spike": "bad data", "nan": "a hardware bit flip"}  # faults.py: garbage for a batch; a NaN weight
# how strongly a run's files point at a cause: planted by --inject; pointed at (the runbook's cure, a setting the
# band does not share where the run left it, notebook 05's grad-norm sign of a data plateau); consistent with it
PLANTED, POINTED_AT, CONSISTENT, NO_SIGN = 3, 2, 1, 0
EVIDENCE = {PLANTED: "planted", POINTED_AT: "pointed at", CONSISTENT: "consistent with it", NO_SIGN: "no sign of it"}


def likely_causes(logged, band, shape, stretches=(), jumped=()):
    """The chapter's causes under a heading, ordered by the evidence this run's files hold for each (EVIDENCE), the
    chapter's order of frequency among equals, each with that evidence in words. stretches: out of the band."""
    planted = {PLANTED_AS[f.split("@")[0]] for f in logged.injected if f.split("@")[0] in PLANTED_AS}
    found = {
        "bad data": data_evidence(logged, band, shape, jumped),
        "an LR too high where the loss is high": lr_evidence(logged, band, stretches),
        "numeric precision": precision_evidence(logged),
        "a hardware bit flip": bit_flip_evidence(logged),
    }
    for cause in planted:  # what --inject planted (injected.json) outranks whatever else the files show
        found[cause] = PLANTED, f"injected.json names {', '.join(logged.injected)}; " + found[cause][1]
    ranked = sorted(CAUSES, key=lambda cause: (-found[cause][0], CAUSES.index(cause)))
    return [
        "what the chapter names as causes, by this run's evidence (planted, pointed at, consistent, none; the "
        "chapter's order of frequency among equals):",
        *(f"{n}. {cause} ({EVIDENCE[found[cause][0]]}): {found[cause][1]}" for n, cause in enumerate(ranked, 1)),
    ]


def data_evidence(logged, band, shape, jumped):
    """(strength, words) for bad data: did the runbook's skip end the incidents? a jump? a plateau's grad norm?"""
    if logged.incidents:
        responses = [i.get("response") for i in logged.incidents]
        retried = [r for r in responses[1:] if r in ("lower_lr", "rewarm")]
        words = f"the runbook rolled back and skipped the batches before step {logged.incidents[0]['step']}; " + (
            f"it came back ({', '.join(retried)} then): more than one bad batch, or not the data"
            if retried
            else "it did not come back, as one bad batch would behave"
        )
        words += "; the runbook then stopped the run" if "stop" in responses else ""
        # a skip that ended it points at the data, unless the loss was non-finite: the rollback restores the
        # weights too, which ends a flipped bit's NaN as well
        cured = not retried and "stop" not in responses
        nonfinite = any(i["detector"] == "nonfinite" for i in logged.incidents)
        return (POINTED_AT if cured and not nonfinite else CONSISTENT), words
    if jumped:
        return (
            CONSISTENT,
            f"one point far above the band at step {jumped[0][0]}, undone by the next: as one bad batch behaves",
        )
    if shape.endswith("plateau") and band:
        # notebook 05, section 1a: a curve stalled by its data sits at the best the data allow, its gradient noise
        mine, seeds = plateau_grad_norms(logged, band)
        under = mine < min(seeds)
        reading = (
            "under all of them: a model at the best its data allow"
            if under
            else "within or above them: a gradient that still points somewhere (the LR, rather)"
        )
        band_range = f"{min(seeds):.2f}-{max(seeds):.2f}"
        words = f"a plateau, the grad norm {mine:.2f} over the last quarter, the band's {band_range}, {reading}"
        return (POINTED_AT if under else NO_SIGN), words
    if shape == "early plateau":
        return (
            CONSISTENT,
            "a plateau while the LR is high: data with nothing more to teach (shuffled, repeated) stalls a curve",
        )
    return NO_SIGN, "no incident or jump in this run's files points at a batch"


def plateau_grad_norms(logged, band):
    """(the run's median grad norm over the last quarter of the steps it shares with the band, each seed's)."""
    steps = [t for t in band["grad_norm"]["step"] if t in logged.grad_norm]
    seeds = [late_grad_norm(dict(zip(band["grad_norm"]["step"], row)), steps) for row in band["grad_norm"]["runs"]]
    return late_grad_norm(logged.grad_norm, steps), seeds


def lr_evidence(logged, band, stretches):
    """(strength, words) for the LR: the run's LR schedule against the band's (a cause where the run left the band,
    on either side: a schedule of its own moves the whole curve), the LR at its first incident, what the runbook's
    lowering or re-warming did. Other settings that differ (grad_clip, say) are named by band_lines, not here."""
    words = f"peak LR {logged.settings['learning_rate']:g}"
    differing = [k for k in settings_differing(logged, band) if k in LR_SCHEDULE]
    if "learning_rate" in differing:
        ratio = logged.settings["learning_rate"] / band["settings"]["learning_rate"]
        words += f", {ratio:g}x the band's {band['settings']['learning_rate']:g}"
    if others := [k for k in differing if k != "learning_rate"]:
        named = ", ".join(f"{k} {logged.settings[k]:g} (the band's {band['settings'][k]:g})" for k in others)
        words += f"; its schedule differs from the band's: {named}"
        if logged.settings["warmup_iters"] < band["settings"]["warmup_iters"]:
            words += " (a shorter warmup: the peak LR reached sooner, while the loss is still high)"
    if differing:
        words += "; the run left the band, so these settings are a cause" if stretches else "; it stayed in the band"
    if logged.incidents:
        first = logged.incidents[0]["step"]
        before = [t for t in logged.lr if t <= first]
        words += f"; the LR near the first incident {logged.lr[max(before)]:.2g}" if before else ""
    responses = [i.get("response") for i in logged.incidents]
    taken_down = [(i["step"], i["response"]) for i in logged.incidents if i.get("response") in ("lower_lr", "rewarm")]
    cured = bool(taken_down) and responses[-1] in ("lower_lr", "rewarm")  # no incident after it took the LR down
    if taken_down:
        step, response = taken_down[0]
        words += f"; the runbook {'lowered' if response == 'lower_lr' else 're-warmed'} it at step {step}"
        words += ", and no incident followed" if cured else ""
    return (POINTED_AT if (differing and stretches) or cured else NO_SIGN), words


def settings_differing(logged, band):
    """The settings (SETTINGS) this run holds other than its band's, in SETTINGS' order; none without a band."""
    return [k for k in SETTINGS if band and logged.settings[k] != band["settings"][k]]


def precision_evidence(logged):
    """(strength, words) for numeric precision: the dtype this run computed in, which --dtype auto resolves by the
    hardware (run.json's "computed_in"), and fp16's skipped steps."""
    requested = logged.settings["dtype"]
    used = ", ".join(f"{dtype} from step {step}" for step, dtype in logged.computed_in)
    if len(logged.computed_in) == 1 and logged.computed_in[0][0] == 0:  # one dtype from the first step on
        used = logged.computed_in[0][1]
    if requested == "auto":
        said = (
            f"--dtype auto, which this run resolved to {used}"
            if used
            else "--dtype auto; this run's files do not say what it resolved to (bfloat16 where the hardware has "
            "it, float16 on GPUs without it, float32 on other CPUs)"
        )
    else:
        said = f"--dtype {requested}"
    dtypes = {dtype for _, dtype in logged.computed_in} or {requested}
    if "float16" in dtypes:
        return (
            CONSISTENT if logged.skipped else NO_SIGN
        ), f"{said}: loss scaling, {logged.skipped} step(s) skipped for overflow"
    if "bfloat16" in dtypes:
        return NO_SIGN, f"{said}: bfloat16 autocast with fp32 master weights and loss sums, rarely the cause today"
    if dtypes == {"float32"}:
        return NO_SIGN, f"{said}: float32 throughout, no precision boundary in play"
    return NO_SIGN, f"{said}: rarely the cause"


def bit_flip_evidence(logged):
    """(strength, words) for a hardware bit flip: a single non-finite loss that a rollback ended."""
    nonfinite = [i["step"] for i in logged.incidents if i["detector"] == "nonfinite"]
    if len(nonfinite) == 1 and len(logged.incidents) == 1:
        return CONSISTENT, (
            f"a non-finite loss at step {nonfinite[0]} that did not return: replay that batch to tell data from a flip"
        )
    return NO_SIGN, "rarest of all, and nothing here singles it out"


@dataclass
class Reading:
    lines: list  # what the reader says, in order
    verdict: str  # the last line: "verdict: ..."
    normal: bool | None  # None: no band to judge by
    stretches: list = field(default_factory=list)  # [(first step, last step, side)] out of the band
    jumps: list = field(default_factory=list)  # [(step, deviation)] of single points far above it

    @property
    def left(self):
        """Where the run first left the band: (first step, last step, side), or None."""
        return self.stretches[0] if self.stretches else None


def read_curve(logged, band=None, why_no_band=""):
    """The reading of one run: its phase, its start, its place in the band, the evidence and a verdict that leads
    with what decides it."""
    shape, shape_words = phase(logged)
    lines = [
        f"run {logged.folder}: {len(logged.train)} logged steps, to step {max(logged.train)}",
        first_loss_words(logged),
    ]
    lines.append(shape_words)
    for incident in logged.incidents:
        lines.append(f"incident at step {incident['step']}: {incident['detector']} -> {incident.get('response', '')}")
    indicators = leading_indicators(logged)
    shown = ", ".join(f"step {t}: {words}" for t, words in indicators[:5])
    more = f" (and {len(indicators) - 5} more)" if len(indicators) > 5 else ""
    lines.append(f"leading indicators: {shown}{more}" if indicators else "leading indicators: none fired")
    if logged.injected:
        lines.append(f"faults planted by --inject (injected.json): {', '.join(logged.injected)}")
    problems = (
        [f"incident{'s' if len(logged.incidents) > 1 else ''}: " + incidents_named(logged)] if logged.incidents else []
    )
    if shape in ("early plateau", "rising"):
        problems.append(f"its shape: {shape}")
    if band is None:
        found = f"; not normal by its own files: {'; '.join(problems)}" if problems else f"; its shape: {shape}"
        causes = likely_causes(logged, None, shape) if problems else []
        return Reading(lines + causes, f"verdict: no band for this run: {why_no_band}{found}", None)
    judged, problems_in_band, stretches, jumped = band_lines(logged, band)
    lines += judged
    problems = problems_in_band + problems
    if stretches and stretches[-1][2] == "above" and shape.endswith("plateau"):
        problems = [p for p in problems if not p.startswith("its shape")] + [
            "a plateau above the band: the data or the LR"
        ]
    p = val_p(logged, band)
    if problems or (p and p[2] < P_ALARM):
        lines += likely_causes(logged, band, shape, stretches, jumped)
        # what decides it first: the longest stretch out of the band (band_lines' first problem), then the final
        # val loss where its p-value alarms; where it does not, the p-value closes the line
        final = f"val loss {p[1]:.4f} at step {p[0]}, p = {p[2]:.2g}" if p else "no val step shared with the band"
        if p and p[2] < P_ALARM:
            problems.insert(1 if stretches else 0, final)
        else:
            problems.append(final)
        return Reading(lines, f"verdict: not normal: {'; '.join(problems)}", False, stretches, jumped)
    return Reading(
        lines, f"verdict: normal ({f'p = {p[2]:.2f}' if p else 'no val step shared'})", True, stretches, jumped
    )


def incidents_named(logged):
    return ", ".join(f"{i['detector']} at step {i['step']}" for i in logged.incidents)


def band_lines(logged, band):
    """(lines, problems, the stretches out of the band, the jumps) of a run read against its band. The problems
    lead with the longest stretch out of the band: a short one early (a faster warmup) decides less than a long one
    later. The final val loss's p-value is read_curve's to place."""
    rule, series = band["rule"], band["train"]
    shared = [t for t in series["step"] if t in logged.train]
    if not shared:
        raise UserError(
            f"{logged.folder} logged steps {min(logged.train)}-{max(logged.train)} and its band steps "
            f"{series['step'][0]}-{series['step'][-1]}: no step in common"
        )
    last = shared[-1]
    mean, s = edge(series, rule)
    i = series["step"].index(last)
    lines = [
        f"band: {len(band['seeds'])} seeds of {band['preset']}; edge mean ± {rule['z']:g} std, left after "
        f"{rule['persist']} logged points out in a row. At step {last} the run's loss {logged.train[last]:.4f} is "
        f"{(logged.train[last] - mean[i]) / s[i]:+.1f} std from the band's mean {mean[i]:.4f}"
    ]
    if max(logged.train) > series["step"][-1]:
        lines.append(f"steps past the band's last ({series['step'][-1]}) to {max(logged.train)}: not judged")
    if differing := settings_differing(logged, band):
        named = ", ".join(f"{k} {logged.settings[k]} (the band's {band['settings'][k]})" for k in differing)
        lines.append(f"settings that differ from the band's: {named}")
    problems = []
    stretches = stretches_out(logged.train, series, rule)

    def duration(stretch):  # to the first logged step back inside (or one past the last)
        start, end, _ = stretch
        return next((t for t in logged.train if t > end), end + 1) - start

    for stretch in stretches[:3]:
        start, end, side = stretch
        lines.append(f"left the band at step {start}, {side} it, for {duration(stretch)} steps (to step {end})")
    if len(stretches) > 3:
        lines.append(f"... and {len(stretches) - 3} more stretches out of it")
    if stretches:
        longest = max(stretches, key=duration)  # the first of the longest
        problems.append(f"left the band at step {longest[0]} for {duration(longest)} steps, {longest[2]} it")
        if len(stretches) > 1:
            first = stretches[0]
            problems[-1] += (
                f", the longest of {len(stretches)} stretches out of it (the first at step {first[0]}, {first[2]} it, "
                f"for {duration(first)} steps)"
            )
    if shifts := data_shifts(logged):
        earlier = ", then ".join(f"{n:g} step{'' if n == 1 else 's'} from step {t}" for t, n in shifts)
        lines.append(
            f"the run reads each batch earlier than a run without its incidents ({earlier}), so its logged points "
            "there are other batches than the band's: single points there are not judged as jumps, stretches out "
            "of the band are"
        )
    jumped = jumps(logged.train, series, rule, before=shifts[0][0] if shifts else math.inf)
    if jumped:
        shown = ", ".join(f"step {t} ({logged.train[t]:.3f}, {d:+.0f} std)" for t, d in jumped[:3])
        lines.append(f"jumped above the band: {shown}" + (f" and {len(jumped) - 3} more" if len(jumped) > 3 else ""))
        problems.append(f"a jump at step {jumped[0][0]} to {logged.train[jumped[0][0]]:.3f}, {jumped[0][1]:+.0f} std")
    p = val_p(logged, band)
    if p:
        step, value, p_value = p
        where = (
            "its last" if step == max(logged.val) else f"the last the band shares; the run goes on to {max(logged.val)}"
        )
        lines.append(f"val loss {value:.4f} at step {step} ({where}): p = {p_value:.2g} against the band's seeds")
    return lines, problems, stretches, jumped


# ----------------------------------------------------------------------------
# The pictures


def reading_figure(logged, band, reading):
    """The run's train and val loss over the band (its edge, mean, and the seeds' 5% and 95% quantiles), incidents
    in red, the stretches out of the band shaded, each jump marked; the verdict, whole, as its title. The loss axis
    spans the second half of the steps the run reached (of the band's, or the run's without one), where runs of a
    recipe differ by hundredths: the start near ln V lies above it, and a point above it is drawn at its top edge,
    its value beside."""
    from matplotlib.figure import Figure  # no pyplot: drawing to a file leaves a notebook's plotting alone

    title = textwrap.fill(reading.verdict, 120)
    fig = Figure(figsize=(12, 4.2 + 0.18 * title.count("\n")), layout="constrained")
    ax = fig.subplots()
    steps = band["train"]["step"] if band else list(logged.train)
    reached = [t for t in steps if t <= max(logged.train)] or steps  # a run read early: the half of it so far
    half = reached[0] + (reached[-1] - reached[0]) / 2
    jumped = {t for t, _ in reading.jumps}  # drawn at the axis' top edge, not stretching the axis
    points = [*logged.train.items(), *logged.val.items()]
    shown = [loss for t, loss in points if t >= half and t not in jumped]
    if band:
        mean, s = edge(band["train"], band["rule"])
        z = band["rule"]["z"]
        ax.fill_between(
            steps, mean - z * s, mean + z * s, color="tab:blue", alpha=0.15, label=f"edge: mean ± {z:g} std"
        )
        ax.plot(steps, mean, color="tab:blue", lw=0.8, label=f"band mean, {len(band['seeds'])} seeds")
        for q in ("q05", "q95"):
            ax.plot(
                steps, band["train"][q], ":", color="tab:blue", lw=0.6, label="seeds' 5-95%" if q == "q05" else None
            )
        ax.plot(band["val"]["step"], band["val"]["mean"], "s", color="tab:blue", ms=4, label="band's val mean")
        late = [i for i, t in enumerate(steps) if half <= t <= reached[-1]]
        shown += [*(mean - z * s)[late], *(mean + z * s)[late]]
    ax.plot(list(logged.train), list(logged.train.values()), color="black", lw=1, label="this run: train loss")
    ax.plot(list(logged.val), list(logged.val.values()), "o-", color="tab:orange", ms=4, label="this run: val loss")
    low, high = min(shown), max(shown)
    low, high = low - 0.15 * (high - low), high + 0.15 * (high - low)
    ax.set_ylim(low, high)
    for k, (start, end, _) in enumerate(reading.stretches):
        ax.axvspan(start, end, color="tab:red", alpha=0.12, label="out of the band" if k == 0 else None)
    for k, (t, d) in enumerate(reading.jumps):
        y = min(logged.train[t], high)
        ax.plot(t, y, "v" if y < logged.train[t] else "x", color="tab:red", ms=8, label="jump" if k == 0 else None)
        ax.annotate(f"{logged.train[t]:.2f} ({d:+.0f} std)", (t, y), color="tab:red", fontsize=8, va="top", ha="left")
    for k, incident in enumerate(logged.incidents):
        ax.axvline(incident["step"], color="red", alpha=0.7, label="incident" if k == 0 else None)
        ax.annotate(incident["detector"], (incident["step"], high), color="red", rotation=90, va="top")
    ax.set(xlabel="step", ylabel=f"loss (the second half's range; ln V = {logged.ln_vocab:.2f} above)")
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: the curves stay in view
    return fig


# ----------------------------------------------------------------------------
# Command line


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m machinery.curves", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", metavar="RUN", help="a run folder (out_dir)")
    parser.add_argument("--band", default="", help="a band file (default: bands/<the run's preset>.json)")
    parser.add_argument("--plot", default="", help="where the plot goes (default: RUN/curves.png)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        logged = read_run(args.run)
        band, why = find_band(logged.identity, logged.preset, args.band)
        reading = read_curve(logged, band, why)
        print("\n".join(reading.lines + anchor_lines(args.band or os.path.join(BANDS_DIR, f"{logged.preset}.json"))))
        reading_figure(logged, band, reading).savefig(args.plot or os.path.join(logged.folder, "curves.png"), dpi=100)
    except UserError as e:
        sys.exit(f"error: {e}")
    print(reading.verdict)


if __name__ == "__main__":
    main()
