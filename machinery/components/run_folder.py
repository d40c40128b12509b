"""The run's folder: one run per out_dir, and the JSON-lines logs in it.

A run writes run.json (what makes it this run; under "config", the
configuration it was trained with, which `--config OUT/run.json` repeats; under
"computed_in", the dtype each start computed in),
metrics.jsonl, incidents.jsonl, injected.json, metrics.png, pipeline.png (no
figures with --plot false), samples.txt and ckpt/ into its out_dir (and
curves.py its plots, curves.png and compare.png); the job that runs it keeps lock.json
and heartbeat/ there (cluster.py). A second command with the same out_dir
continues that run, or is refused: nothing of an earlier run, and nothing that
is not a run of ours, is overwritten unless --overwrite says so.
"""

import json
import os
import shutil
from dataclasses import asdict, dataclass

from data import read_json
from errors import UserError
from machinery.corpora.mixture import weight_changes
from machinery.job.arms import ArmsConfig
from machinery.job.files import remove_if_exists, write_json_atomic


def out_dir_of(preset, cfg):
    """--out_dir, or out/<preset> when it is not given."""
    return cfg.out_dir or os.path.join("out", preset)


@dataclass
class RunFolder:
    """A run's folder (out_dir) and the files a run keeps there, and --ckpt_mirror's second folder of checkpoints."""

    out_dir: str
    identity: dict  # what makes two runs the same run (run.json)
    continued: list[str]  # the schedule fields that differ from the run already here ("max_iters: 2000 -> 3000")
    mirror: str = ""  # --ckpt_mirror: a second folder with a copy of every checkpoint; "": none

    @property
    def ckpt_dir(self):
        return os.path.join(self.out_dir, "ckpt")

    @property
    def ckpt_dirs(self):
        """Where its checkpoints are kept: ckpt_dir, and the mirror's copy if there is one."""
        return [self.ckpt_dir] + ([os.path.join(self.mirror, "ckpt")] if self.mirror else [])

    @property
    def metrics_path(self):
        return os.path.join(self.out_dir, "metrics.jsonl")

    @property
    def incidents_path(self):
        return os.path.join(self.out_dir, "incidents.jsonl")


def run_identity(gpt_config, cfg, meta, global_batch):
    """What makes two runs the same run. The layout is not part of it: the same global batch
    on dp=1 or dp=4 reads the same rows and takes the same step, so either may resume the other.
    Nor is the attention kernel: sdpa and manual compute the same function of the same weights; nor where
    files come from (--init_url, the --mix file's path: a mix is named by what it holds), --max_epochs, where
    else the metrics go (--log_to), or whether they are drawn (--plot)."""
    layout_fields = ("out_dir", "overwrite", "device", "compile", "batch_size", "gradient_accumulation_steps")
    elsewhere = ("init_url", "mix", "max_epochs", "log_to", "plot")
    data_fields = ("mix", "tokenizer") if "mix" in meta else ("source", "source_sha256", "tokenizer")
    return {
        "GPTConfig": {k: v for k, v in asdict(gpt_config).items() if k != "attention"},
        "TrainConfig": {
            **{k: v for k, v in asdict(cfg).items() if k not in layout_fields + elsewhere},
            "global_batch": global_batch,
        },
        "data": {k: meta[k] for k in data_fields + ("val_fraction",)},
    }


def recorded_gpt_config(identity):
    """The model's GPTConfig from a run's identity, as run.json and every checkpoint's "config" record it (the
    attention kernel, which is not recorded, at its default)."""
    return ArmsConfig(**identity["GPTConfig"])


def identity_defaults(gpt_config, cfg):
    """The identity's config fields at their defaults, which fill_new_fields gives a record that lacks them."""
    return {"GPTConfig": asdict(type(gpt_config)()), "TrainConfig": asdict(type(cfg)())}


def fill_new_fields(recorded, defaults):
    """A run.json's (or a checkpoint's) identity with the config fields it lacks at their defaults: it was written
    before those fields existed, and each field came with the default that keeps what runs did before it (an
    older gpt2-small run's activation is "gelu"; a run from before --init_from started from a fresh init)."""
    return {**recorded, **{section: {**defaults[section], **recorded[section]} for section in defaults}}


# run.json last: an --overwrite cut short leaves a folder that is still recognisably a run of ours
RUN_FILES = (
    "metrics.jsonl",
    "incidents.jsonl",
    "injected.json",
    "metrics.png",
    "pipeline.png",
    "samples.txt",
    "curves.png",  # the curve reader's plots (curves.py)
    "compare.png",
    "tensorboard",  # --log_to tensorboard (tracking.py)
    "wandb",  # --log_to wandb, offline
    "ckpt",
    "run.json",
)
# What the job that runs in the folder keeps there (cluster.py), not the run: a new job writes its own over them
JOB_FILES = ("lock.json", "heartbeat")
# A run may continue with these changed: a larger max_iters trains further, a lower LR (or a
# longer warmup) is what the runbook asks of a person after repeated incidents, and a mix's sources and
# weights may change mid-run (curriculum training), the LR schedule going on as it was.
CONTINUABLE = ("max_iters", "lr_decay_iters", "learning_rate", "min_lr", "warmup_iters", "mix")


def config_changes(old, new, ignore=()):
    """['n_layer: 2 -> 3', ...] for every field of the nested config dicts that differs."""
    return [
        f"{name}: {old.get(section, {}).get(name)!r} -> {value!r}"
        for section, fields in new.items()
        for name, value in fields.items()
        if old.get(section, {}).get(name) != value and name not in ignore
    ]


def check_out_dir_is_ours(out_dir, flag="--out_dir"):
    """Refuse, before anything is written, a folder that holds anything but a run of ours (flag: the flag that
    named it: --out_dir, or --ckpt_mirror, a run folder for the checkpoints' second copy)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"{flag} {out_dir} is a file, not a folder: choose another {flag}")
    held = set(os.listdir(out_dir)) - set(JOB_FILES) if os.path.isdir(out_dir) else set()
    if held and not os.path.exists(os.path.join(out_dir, "run.json")):
        raise UserError(
            f"{flag} {out_dir} is not empty and holds no run.json, so it is not a run of ours; nothing in it "
            f"was touched. Choose a new or empty {flag}."
        )


def prepare_out_dir(out_dir, identity, overwrite, defaults, flag="--out_dir"):
    """Make out_dir this run's folder, refusing to mix two runs in one: a folder of another run is
    refused unless --overwrite starts this one afresh there. Returns the CONTINUABLE fields that
    differ from the run already there, for the caller to record (record_identity) once it has
    decided that the run goes on. defaults (identity_defaults): what an older run.json's missing fields were."""
    path = os.path.join(out_dir, "run.json")
    os.makedirs(out_dir, exist_ok=True)
    if overwrite:
        for name in RUN_FILES:
            target = os.path.join(out_dir, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            else:
                remove_if_exists(target)
    if not os.path.exists(path):
        record_identity(out_dir, identity)
        return []
    old = fill_new_fields(read_json(path), defaults)
    changed = config_changes(old, identity, ignore=CONTINUABLE)
    if changed:
        raise UserError(
            f"{out_dir} holds a different run, whose checkpoints cannot continue with this config "
            f"({'; '.join(changed)}). Choose another {flag}, or start over there with --overwrite."
        )
    return config_changes(old, identity, ignore=("mix",)) + data_changes(old["data"], identity["data"])


def data_changes(old, new):
    """What differs between the data two runs read (run.json's "data"), in words: a mix's sources, weights and
    schedule (mixture.weight_changes), or the one source."""
    old_mix, new_mix = old.get("mix"), new.get("mix")
    if new_mix:
        return weight_changes(old_mix, new_mix) if old_mix != new_mix else []
    if old_mix:
        return [f"mix: {', '.join(old_mix['sources'])} -> none; source: {new['source']}"]
    same = old.get("source_sha256") == new["source_sha256"]  # .get: a record from before it was kept
    return [] if same else [f"source: {old.get('source')} -> {new['source']}"]


COMMAND_RECORDS = ("config", "computed_in")  # what run.json holds beside the identity (record_config)


def record_identity(out_dir, identity):
    """Write the run's identity into run.json, keeping what the commands that trained it recorded (record_config)."""
    path = os.path.join(out_dir, "run.json")
    kept = {}
    if os.path.exists(path):
        kept = {k: v for k, v in read_json(path).items() if k in COMMAND_RECORDS}
    write_json_atomic(path, {**identity, **kept})


def record_config(out_dir, config, step, compute_dtype):
    """Add to run.json what the command that trains this run from `step` on brings: its configuration in
    config.py's config-file format under "config", so that `python train.py --config OUT/run.json` repeats the
    run; and under "computed_in" the dtype it computes in ([[first step, "bfloat16"], ...], an entry more where a
    resume computes in another: --dtype auto resolves by the hardware), which the curve reader names. Neither is
    part of the identity: prepare_out_dir compares only the identity's keys, so another layout or a larger
    max_iters still continues the run, and the command that does records its own configuration here."""
    path = os.path.join(out_dir, "run.json")
    recorded = read_json(path)
    computed_in = [entry for entry in recorded.get("computed_in", []) if entry[0] < step]  # a rollback's redo
    if not computed_in or computed_in[-1][1] != compute_dtype:
        computed_in.append([step, compute_dtype])
    identity = {k: v for k, v in recorded.items() if k not in COMMAND_RECORDS}
    write_json_atomic(path, {**identity, "config": config, "computed_in": computed_in})


def is_finished(metrics_path, step, max_iters):
    """Whether a run whose newest checkpoint is at `step` has nothing left to do: it is past
    max_iters, or at it with the final check logged (the last record: a val loss and no train
    loss). A run that died between its last checkpoint and its final check is not finished, and
    --eval_only's check of that checkpoint does not finish it."""
    if step != max_iters:
        return step > max_iters
    final_checks = [r for r in read_jsonl(metrics_path) if "loss" not in r and not r.get("eval_only")]
    return any(r["step"] == step for r in final_checks)


def read_jsonl(path):
    """The records of a JSON-lines file; a last line cut short by a crash is dropped."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    try:
        records = [json.loads(line) for line in lines[:-1]]
    except ValueError as e:  # a crash cuts the last line only: an earlier one that does not parse was changed
        raise UserError(f"{path} is not JSON lines ({e}): restore it from a copy, or start the run over") from None
    try:
        records += [json.loads(line) for line in lines[-1:]]
    except json.JSONDecodeError:
        pass
    return records


def write_jsonl(path, records):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(tmp, path)


def append_jsonl(path, record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
