"""The modes that replace training: --sample (text from a run's newest checkpoint), --eval_only (the final check of
it, logged) and --export_hf DIR (a transformers folder)."""

import os
from dataclasses import replace

from errors import UserError
from machinery.components.run_folder import out_dir_of
from machinery.components.run_setup import pick_device, set_up
from machinery.components.sample import sample
from machinery.interchange.transfer import export_run


def run_mode(mode, preset, configs):
    """mode: "sample", "eval_only" or "export_hf" (config.parse_args's), for the run in --out_dir."""
    if mode == "sample":
        sample(preset, configs, pick_device(configs.train.device))
    elif mode == "eval_only":
        evaluate_only(preset, configs)
    elif mode == "export_hf":
        export_run(
            out_dir_of(preset, configs.train),
            configs.export.export_hf,
            configs.recovery.ckpt_step,
            max_shard_mb=configs.export.max_shard_mb,
        )
    else:
        raise ValueError(f"no mode {mode!r}")


def evaluate_only(preset, configs):
    """--eval_only: the final check of the newest checkpoint in out_dir (or --ckpt_step's), with no training."""
    out_dir = out_dir_of(preset, configs.train)
    if not os.path.isdir(os.path.join(out_dir, "ckpt")):
        raise UserError(f"--eval_only: {out_dir} holds no checkpoints; train there first, or point --out_dir at a run")
    run = set_up(preset, replace(configs, sample=replace(configs.sample, num_samples=0)))  # it writes no samples
    with run.job.watch:
        run.evaluate_newest()
