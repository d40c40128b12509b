"""A data mixture: training rows drawn from several sources, at weights that may change by step.

    python train.py --mix mix.json

where mix.json names each source (a --source as corpus.py takes it: a named source, a file, folder or glob;
each is tokenized once into its own folder, data/<source>-<tokenizer>), its starting weight, and an optional
schedule of new weights:

    {"sources": {"prose": "shakespeare", "code": "stdlib"},
     "weights": {"prose": 0.3, "code": 0.7},
     "schedule": [{"step": 1000, "weights": {"prose": 0.6, "code": 0.4}, "ramp": 200}]}

Every weights object gives every source a weight (0 leaves a source out until a later entry); they are
normalized, so they need not sum to 1. A schedule entry at step S with ramp R moves the weights linearly
from those in force before S to its own over steps S..S+R (at S + R and after they are its own); with no
ramp they switch at S. Entries come in increasing step order, each ramp ending by the next entry's step.

Rows go to sources by smooth weighted round-robin (nginx's upstream balancer): before each row every source
gains its weight in credit, the richest source (ties to the first listed) gets the row and pays 1. From the
first row on, no source is ever a whole row ahead of its share of the rows so far, nor more than about a row
behind (half a row with two sources; under 1.2 measured with up to 8): no sampling noise. The assignment
depends only on the weights and the state (rows assigned, rows read from each source, credits): plain
numbers that every rank computes alike and the checkpoint keeps, so every rank agrees on it, and a resumed
run reads exactly the rows it would have read.
"""

import json
import math
import os
from dataclasses import dataclass, replace

import numpy as np
import torch

from errors import UserError
from machinery.corpora.corpus import default_data_dir, load_or_prepare


@dataclass
class Change:
    """One schedule entry: from `step`, over `ramp` steps, the weights move to `weights` (normalized)."""

    step: int
    weights: dict[str, float]
    ramp: int = 0


@dataclass
class Mix:
    sources: dict[str, str]  # name -> its --source (a named source, a file, folder or glob), in the file's order
    weights: dict[str, float]  # name -> starting weight; sum 1, in the order of `sources`
    schedule: list[Change]  # in increasing step order, no ramp past the next entry's step

    def as_dict(self):
        """The canonical JSON form (normalized weights), for run.json: a changed mix compares unequal."""
        return {
            "sources": dict(self.sources),
            "weights": dict(self.weights),
            "schedule": [{"step": c.step, "weights": dict(c.weights), "ramp": c.ramp} for c in self.schedule],
        }


# ----------------------------------------------------------------------------
# The math: the weights at a step, and which source each row comes from


def weights_at(mix, step):
    """{source: weight} in force at `step` (sum 1): the last entry reached, or the ramp toward it."""
    weights = mix.weights
    for change in mix.schedule:
        if step < change.step:
            break
        if step < change.step + change.ramp:  # inside the ramp: a fraction f of the way to the new weights
            f = (step - change.step) / change.ramp
            return {s: (1 - f) * weights[s] + f * change.weights[s] for s in weights}
        weights = change.weights
    return dict(weights)


def assign_rows(weights, credit, n_rows):
    """(the source of each of n_rows rows, the credit after them) by smooth weighted round-robin.

    credit[s] is the rows source s is owed: its weight summed over every row so far, less the rows it got.
    Each row adds every weight (sum 1) and takes 1 from the richest, so the credits keep summing to 0 and
    each stays above -1: no source is ever a row ahead of its share. The order of `credit` breaks ties.
    """
    credit = dict(credit)
    picks = []
    for _ in range(n_rows):
        for s in credit:
            credit[s] += weights[s]
        pick = max(credit, key=credit.get)  # the first of equal credits
        credit[pick] -= 1
        picks.append(pick)
    return picks, credit


# ----------------------------------------------------------------------------
# The mix file


def read_mix(path):
    """The Mix in the JSON file at path, every key checked; UserError naming the file and the key."""
    try:
        with open(path) as f:
            spec = json.load(f)
    except FileNotFoundError:
        raise UserError(f"--mix {path}: no such file") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise UserError(f"--mix {path} is not JSON ({e}): write one object with sources, weights, schedule") from None

    def refuse(key, problem):
        return UserError(f'--mix {path}, "{key}": {problem}')

    if not isinstance(spec, dict):
        raise UserError(f"--mix {path} holds a JSON {type(spec).__name__}, not an object with sources and weights")
    check_keys(spec, {"sources", "weights", "schedule"}, "", refuse)
    for key in ("sources", "weights"):
        if key not in spec:
            raise refuse(key, 'missing: the file needs "sources" (name -> --source) and "weights" (name -> weight)')
    sources = spec["sources"]
    if not isinstance(sources, dict) or not sources:
        raise refuse("sources", 'must be a non-empty object of name -> --source, e.g. {"code": "stdlib"}')
    for name, source in sources.items():
        if not isinstance(source, str) or not source:
            raise refuse(f"sources.{name}", f"{source!r} is not a --source (a named source, a file, folder or glob)")
    weights = read_weights(spec["weights"], sources, "weights", refuse)
    schedule = spec.get("schedule", [])
    if not isinstance(schedule, list):
        raise refuse("schedule", 'must be a list of {"step": S, "weights": {...}, "ramp": R}')
    changes = []
    for i, entry in enumerate(schedule):
        key = f"schedule[{i}]"
        if not isinstance(entry, dict):
            raise refuse(key, 'must be an object {"step": S, "weights": {...}, "ramp": R}')
        check_keys(entry, {"step", "weights", "ramp"}, f"{key}.", refuse)
        for field in ("step", "weights"):
            if field not in entry:
                raise refuse(f"{key}.{field}", 'missing: each entry needs "step" and "weights" ("ramp" is optional)')
        step = read_steps(entry["step"], f"{key}.step", refuse)
        ramp = read_steps(entry.get("ramp", 0), f"{key}.ramp", refuse)
        if changes and step <= changes[-1].step:
            raise refuse(
                f"{key}.step",
                f"{step} does not come after schedule[{i - 1}]'s step {changes[-1].step}: "
                "list the entries in increasing step order",
            )
        if changes and changes[-1].step + changes[-1].ramp > step:
            raise refuse(
                f"schedule[{i - 1}].ramp",
                f"schedule[{i - 1}] ramps until step {changes[-1].step + changes[-1].ramp}, past schedule[{i}] "
                f"at step {step}: shorten the ramp or start schedule[{i}] later",
            )
        changes.append(Change(step, read_weights(entry["weights"], sources, f"{key}.weights", refuse), ramp))
    return Mix(dict(sources), weights, changes)


def check_keys(obj, allowed, prefix, refuse):
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise refuse(f"{prefix}{unknown[0]}", f"unknown key; the keys here are {', '.join(sorted(allowed))}")


def read_weights(weights, sources, key, refuse):
    """{source: weight} normalized to sum 1, in the order of `sources`; every source needs one."""
    if not isinstance(weights, dict):
        raise refuse(key, "must be an object of source name -> weight")
    for name, weight in weights.items():
        if name not in sources:
            raise refuse(f"{key}.{name}", f"{name!r} is not one of the sources ({', '.join(sources)})")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise refuse(f"{key}.{name}", f"{weight!r} is not a number")
        if weight < 0:
            raise refuse(f"{key}.{name}", f"{weight} is negative: a weight is 0 or more")
    missing = [name for name in sources if name not in weights]
    if missing:
        raise refuse(key, f"gives no weight to {', '.join(missing)}: give every source one (0 leaves it out)")
    total = sum(weights.values())
    if total == 0:
        raise refuse(key, "are all zero: give at least one source a positive weight")
    return {name: weights[name] / total for name in sources}


def read_steps(value, key, refuse):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise refuse(key, f"{value!r} is not a whole number of steps (0 or more)")
    return value


def weight_changes(old, new):
    """What differs between two Mix.as_dict() forms, in words; old None: the run read no mix before."""
    if old is None:
        return ["mix: none -> " + ", ".join(f"{n} ({s})" for n, s in new["sources"].items())]
    changes = [f"source added: {n} ({s})" for n, s in new["sources"].items() if n not in old["sources"]]
    changes += [f"source dropped: {n} ({s})" for n, s in old["sources"].items() if n not in new["sources"]]
    changes += [
        f"source {n}: {old['sources'][n]} -> {s}"
        for n, s in new["sources"].items()
        if n in old["sources"] and old["sources"][n] != s
    ]
    names = [*new["sources"], *(n for n in old["sources"] if n not in new["sources"])]
    moved = [
        f"{n} {old['weights'].get(n, 0):.4g} -> {new['weights'].get(n, 0):.4g}"
        for n in names
        if old["weights"].get(n, 0) != new["weights"].get(n, 0)  # a source not in the mix has weight 0
    ]
    if moved:
        changes.append("weights: " + ", ".join(moved))
    if old["schedule"] != new["schedule"]:
        changes.append(f"schedule: {describe_schedule(old['schedule'])} -> {describe_schedule(new['schedule'])}")
    return changes


def describe_schedule(schedule):
    """'none', or each entry as 'step 1000: prose 0.6, code 0.4 over 200 steps'."""
    if not schedule:
        return "none"
    entries = []
    for entry in schedule:
        weights = ", ".join(f"{name} {weight:.4g}" for name, weight in entry["weights"].items())
        entries.append(f"step {entry['step']}: {weights}" + (f" over {entry['ramp']} steps" if entry["ramp"] else ""))
    return "; ".join(entries)


def prepare_sources(mix, dcfg, root="data"):
    """{name: (data_dir, meta)}: each source tokenized once into its own folder, <root>/<source>-<tokenizer>,
    with the run's other data settings (--tokenizer, --val_fraction, --text_field, ...)."""
    prepared = {}
    for name, source in mix.sources.items():
        config = replace(dcfg, source=source)
        data_dir = os.path.join(root, os.path.basename(default_data_dir(config)))
        prepared[name] = (data_dir, load_or_prepare(config, data_dir))
    return prepared


def mix_meta(mix, metas):
    """The meta of a mix's token files together ({name: meta} of each source): what a run reads of one
    source's meta.json (tokenizer, vocab_size, dtype, token counts), "mix" (the mix and each source's
    sha256: what names it in run.json) and "sources" (each meta)."""
    first = next(iter(metas.values()))
    return {
        "source": "mix of " + ", ".join(mix.sources),
        "mix": {**mix.as_dict(), "sha256": {name: meta["source_sha256"] for name, meta in metas.items()}},
        **{key: first[key] for key in ("tokenizer", "vocab_size", "dtype", "val_fraction")},
        "train_tokens": sum(meta["train_tokens"] for meta in metas.values()),
        "val_tokens": sum(meta["val_tokens"] for meta in metas.values()),
        "sources": metas,
    }


# ----------------------------------------------------------------------------
# MixedStream: the training reader over several token files


class MixedStream:
    """Sequential batches (x, y), each int64 (B, T), drawn from several sources at the mix's weights.

    Answers the calls of data.TokenStream that training makes (next_batch, state_dict, load_state_dict,
    position). Each source is an open TokenStream over its train.bin, read only through its window(row):
    source s's rows are its own walk 0, 1, 2, ... (lanes and order_seed as usual; a source smaller than its
    share is read again, epoch after epoch).

    Each call takes the whole data-parallel group's G = world_size * B rows: assign_rows gives each a source
    at the weights of the current step, and row i of the G is that source's next unread row. Rank r reads
    rows r*B ... r*B + B - 1. The step is rows_assigned // (G * accumulation_steps): the weights follow the
    optimizer step without the loop telling the stream, and any layout with the same global batch assigns
    the same rows in the same order.
    """

    def __init__(self, mix, streams, batch_size, rank=0, world_size=1, accumulation_steps=1):
        if set(streams) != set(mix.sources):
            raise ValueError(
                f"the mix's sources are {', '.join(mix.sources)}, but streams were opened for "
                f"{', '.join(streams)}: open one TokenStream per source"
            )
        block_sizes = {s.block_size for s in streams.values()}
        if len(block_sizes) != 1:
            raise ValueError(f"the sources' streams have block sizes {sorted(block_sizes)}: open them all alike")
        self.mix, self.streams = mix, {name: streams[name] for name in mix.sources}
        self.batch_size, self.block_size = batch_size, block_sizes.pop()
        self.rank, self.world_size = rank, world_size
        self.rows_per_step = world_size * batch_size * accumulation_steps  # the global batch, in rows
        self.load_state_dict({"position": 0})

    def next_batch(self):
        B, T, G = self.batch_size, self.block_size, self.world_size * self.batch_size
        weights = weights_at(self.mix, self.rows_assigned // self.rows_per_step)
        picks, self.credit = assign_rows(weights, self.credit, G)  # the same on every rank
        rows, taken = [], dict.fromkeys(self.mix.sources, 0)  # taken: this call's rows of each source so far
        for i, source in enumerate(picks):
            if self.rank * B <= i < self.rank * B + B:  # this rank's slice of the group's rows
                stream = self.streams[source]
                start = stream.window(self.rows[source] + taken[source]) * T
                rows.append(stream.tokens[start : start + T + 1])
            taken[source] += 1
        rows = np.stack(rows).astype(np.int64)  # (B, T+1)
        for source, n in taken.items():
            self.rows[source] += n
        self.rows_assigned += G
        x, y = rows[:, :-1], rows[:, 1:]  # y is x shifted by one: the next token
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))

    def state_dict(self):
        """Plain numbers (it goes into torch.save): rows assigned by the group, rows read from each source,
        each source's credit."""
        return {"rows_assigned": self.rows_assigned, "rows": dict(self.rows), "credit": dict(self.credit)}

    def load_state_dict(self, state):
        """Restore a state_dict. {"position": 0} (--resume_without data_position) reads every source from its
        start, the schedule too. A state from another mix keeps what it knows of the sources still in it: new
        ones start at row 0 with no credit, dropped ones are forgotten."""
        if "rows_assigned" not in state:
            if state.get("position") != 0:
                raise UserError(
                    f"the checkpoint's data state {state} is a single stream's position, not a mix's: "
                    "resume with --resume_without data_position to read every source from its start"
                )
            state = {"rows_assigned": 0, "rows": {}, "credit": {}}
        self.rows_assigned = int(state["rows_assigned"])
        self.rows = {s: int(state["rows"].get(s, 0)) for s in self.mix.sources}  # in the mix's order: ties
        self.credit = {s: float(state["credit"].get(s, 0.0)) for s in self.mix.sources}

    @property
    def position(self):
        """{source: rows the group has read from it}."""
        return dict(self.rows)

    @position.setter
    def position(self, rows):
        """Move the sources' rows only (the runbook skips the data that led to an incident); the step and the
        credits stay."""
        unknown = [s for s in rows if s not in self.rows]
        if unknown:
            raise ValueError(f"position names {', '.join(unknown)}, not sources of the mix ({', '.join(self.rows)})")
        self.rows.update({s: int(n) for s, n in rows.items()})

    def mix_tokens(self):
        """{source: tokens read from it by the group} (skipped rows included), for the metrics line."""
        return {s: n * self.block_size for s, n in self.rows.items()}
