"""The run's folder: one run per out_dir, and the JSON-lines logs in it.

A run writes run.json (what makes it this run), metrics.jsonl, incidents.jsonl,
injected.json, metrics.png, pipeline.png, samples.txt and ckpt/ into its
out_dir. A second command with the same out_dir continues that run, or is
refused: nothing of an earlier run, and nothing that is not a run of ours, is
overwritten unless --overwrite says so.
"""

import json
import os
import shutil
from dataclasses import asdict

from data import remove_if_exists, write_json_atomic


def run_identity(mcfg, cfg, meta, global_batch):
    """What makes two runs the same run. The layout is not part of it: the same global batch
    on dp=1 or dp=4 reads the same rows and takes the same step, so either may resume the other."""
    layout_fields = ("out_dir", "overwrite", "device", "compile", "batch_size", "gradient_accumulation_steps")
    return {
        "GPTConfig": asdict(mcfg),
        "TrainConfig": {**{k: v for k, v in asdict(cfg).items() if k not in layout_fields}, "global_batch": global_batch},
        "data": {k: meta[k] for k in ("source", "source_sha256", "tokenizer", "val_fraction")},
    }


RUN_FILES = ("run.json", "metrics.jsonl", "incidents.jsonl", "injected.json", "metrics.png", "pipeline.png",
             "samples.txt", "ckpt")
CONTINUABLE = ("max_iters", "lr_decay_iters")  # a run may go on with these changed: a larger max_iters trains further


def config_changes(old, new, ignore=()):
    """['n_layer: 2 -> 3', ...] for every field of the nested config dicts that differs."""
    return [
        f"{name}: {old.get(section, {}).get(name)!r} -> {value!r}"
        for section, fields in new.items()
        for name, value in fields.items()
        if old.get(section, {}).get(name) != value and name not in ignore
    ]


def prepare_out_dir(out_dir, identity, overwrite):
    """Make out_dir this run's folder, refusing to mix two runs in one: a folder of another run
    is refused unless --overwrite starts this one afresh there, and a folder that holds
    anything but a run of ours is refused and left untouched."""
    path = os.path.join(out_dir, "run.json")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or (os.listdir(out_dir) and not os.path.exists(path))):
        raise ValueError(
            f"--out_dir {out_dir} is not empty and holds no run.json, so it is not a run of ours; nothing in it "
            "was touched. Choose a new or empty --out_dir."
        )
    os.makedirs(out_dir, exist_ok=True)
    if overwrite:
        for name in RUN_FILES:
            target = os.path.join(out_dir, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            else:
                remove_if_exists(target)
    elif os.path.exists(path):
        with open(path) as f:
            changed = config_changes(json.load(f), identity, ignore=CONTINUABLE)
        if changed:
            raise ValueError(
                f"{out_dir} holds a different run, whose checkpoints cannot continue with this config "
                f"({'; '.join(changed)}). Choose another --out_dir, or start over there with --overwrite."
            )
    write_json_atomic(path, identity)


def read_jsonl(path):
    """The records of a JSON-lines file; a last line cut short by a crash is dropped."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    records = [json.loads(line) for line in lines[:-1]]
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
