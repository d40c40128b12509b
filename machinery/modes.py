"""The modes that replace training: --sample (text from a run's newest checkpoint), --eval_only (the final check of
it, logged) and --export_hf DIR (a transformers folder)."""

import os
from dataclasses import replace

from errors import UserError
from machinery import checkpoint
from machinery.evaluation import final_check, validate
from machinery.resume import load_checkpoint
from machinery.run_folder import append_jsonl, out_dir_of, read_jsonl
from machinery.run_setup import pick_device, set_up
from machinery.sample import sample
from machinery.transfer import export_run


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
    with run.watch:
        evaluate_newest(run)


def evaluate_newest(run):
    """The final check of the newest checkpoint (or --ckpt_step's), logged to metrics.jsonl."""
    latest = load_checkpoint(run, ckpt_step=run.configs.recovery.ckpt_step)
    if latest is None:
        raise UserError(f"--eval_only: no checkpoint in {run.ckpt_dir} verifies")
    step, state = latest
    checkpoint.load_full_state_dict(run.model, state["model"], run.grid)
    record, _ = final_check(
        run.model,
        run.grid,
        step,
        validate(run, step)["val_loss"],
        run.configs.model,
        run.meta,
        run.benchmark_examples,
        run.say,
        eval_only=True,
    )
    if run.is_rank0:
        append_jsonl(run.metrics_path, record)
        run.tracker.log(read_jsonl(run.metrics_path))  # the timeline this record now ends, as the loop sends it
        run.tracker.close()
