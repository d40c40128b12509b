"""A run's checkpoints as the loop lives them: the start (refuse a finished run, resume from the newest checkpoint
that verifies, or begin at step 0 from a fresh init or --init_from's weights), what a checkpoint holds and the
resume that puts each piece back, and saving one. checkpoint.py holds the single-device form and the folders."""

import os

from errors import UserError
from machinery import checkpoint
from machinery.cluster import raise_on_every_rank, run_on_rank0
from machinery.init_from import load_initial_weights
from machinery.mixture import weights_at
from machinery.monitor import Throughput
from machinery.reporting import measure_state_at_the_first_update, print_cost_account
from machinery.run_folder import (
    config_changes,
    fill_new_fields,
    identity_defaults,
    is_finished,
    read_jsonl,
    record_config,
    record_identity,
    write_jsonl,
)

# ----------------------------------------------------------------------------
# The start


def start(run):
    """The run's first moments: refuse a finished run, print the cost account, then resume
    from the newest checkpoint that verifies, or start at step 0 (from --init_from's weights, if
    given) and save it; record this command's settings and its dtype in run.json, and start the clock of
    run.throughput. Returns the first step."""
    cfg = run.configs.train
    check_epochs(run)
    latest = load_checkpoint(run)
    if latest is not None:
        newest, state = latest
        if run_on_rank0(lambda: is_finished(run.metrics_path, newest, cfg.max_iters), run.is_rank0):
            refuse_finished_run(run, finished_at=newest)
    if run.continued:
        run.say(f"continuing the run in {run.out_dir} with {'; '.join(run.continued)}")
        run_on_rank0(lambda: record_identity(run.out_dir, run.identity), run.is_rank0)
    # the measured step runs before the RNG is restored or first saved, so every start draws alike
    print_cost_account(run)
    if latest is not None:
        step = restore_checkpoint(run, state, forget=run.configs.recovery.forgotten_on_resume)
        run.say(f"resuming from the checkpoint of step {step} in {run.ckpt_dir}")
    elif run.configs.recovery.resume:
        raise UserError(f"--resume, but {run.ckpt_dir} holds no checkpoint that verifies")
    else:
        step = 0
        if run.configs.train.init_from:
            load_initial_weights(run)
        save_checkpoint(run, 0)
    run.records = [r for r in read_jsonl(run.metrics_path) if r["step"] < step]  # the timeline that led here
    if run.is_rank0:
        write_jsonl(run.metrics_path, run.records)
    # run.json's "config": this command's settings, which `--config OUT/run.json` repeats; and its dtype
    dtype = str(run.dtype).removeprefix("torch.")
    run_on_rank0(lambda: record_config(run.out_dir, run.command, step, dtype), run.is_rank0)
    measure_state_at_the_first_update(run)
    run.throughput = Throughput(run.tokens_per_step)
    return step


def refuse_finished_run(run, finished_at):
    cfg = run.configs.train
    hint = f"; --lr_decay_iters {finished_at} keeps it at min_lr instead" if not cfg.lr_decay_iters else ""
    raise UserError(
        f"{run.out_dir} holds a finished run: its newest checkpoint is at step {finished_at} and --max_iters is "
        f"{cfg.max_iters}, so there is nothing to train. To train it further, pass a larger --max_iters "
        f"(the LR schedule stretches to the new end{hint}); to start over there, --overwrite; or choose "
        f"another --out_dir. To sample from it: python train.py --sample --out_dir {run.out_dir}"
    )


def check_epochs(run):
    """Stop before training when the plan reads its data more than --max_epochs times: a large preset
    pointed at a small corpus would mostly memorize it, and say nothing. For a mix, each source's share of
    the planned tokens (its weight, step by step) against that source's train tokens."""
    cfg = run.configs.train
    if not cfg.max_epochs:
        return
    if run.mix is None:
        planned = {"data": (cfg.max_iters * run.tokens_per_step, run.meta)}
    else:
        share = {name: 0.0 for name in run.mix.sources}  # steps' worth of each source over the plan
        for step in range(cfg.max_iters):
            for name, weight in weights_at(run.mix, step).items():
                share[name] += weight
        planned = {name: (steps * run.tokens_per_step, run.meta["sources"][name]) for name, steps in share.items()}
    for name, (tokens, meta) in planned.items():
        epochs = tokens / meta["train_tokens"]
        if epochs > cfg.max_epochs:
            whose = f"; source {name!r} of the mix ({meta['source']}) gets {tokens:,.0f} of them" if run.mix else ""
            raise UserError(
                f"this run plans {cfg.max_iters:,} steps x {run.tokens_per_step:,} tokens = "
                f"{cfg.max_iters * run.tokens_per_step:,} tokens{whose}, but its data holds "
                f"{meta['train_tokens']:,} train tokens: it would read them {epochs:.1f} times, more than "
                f"--max_epochs {cfg.max_epochs:g}. Past a few epochs a model mostly memorizes its data. Give it "
                "more data (--source, --data_dir, --mix), plan fewer tokens (--max_iters), or pass --max_epochs 0 "
                "to go on anyway"
            )


# ----------------------------------------------------------------------------
# What a checkpoint holds


def checkpoint_state(run, step):
    """Everything the next step depends on. The chapter's three pieces: "model" and "optimizer" (the weights, AdamW's
    moments), "step" (where the LR schedule goes on) and "data" (the stream's position); "rng", "monitor" (baselines),
    "recovery" (the runbook) and "scaler" make the resume exact; "config" and "meta" name the run. Weights and moments
    are in single-device form (checkpoint.py): any layout resumes them. Every rank calls it: it gathers the parts."""
    # exercise checkpoint, checkpoint_state: begin
    return {
        "model": checkpoint.full_state_dict(run.model, run.grid),
        "optimizer": checkpoint.full_optimizer_state_dict(run.optimizer, run.model, run.grid, run.optimizer_groups),
        "scaler": run.scaler.state_dict(),  # empty unless fp16 loss scaling is on
        "step": step,
        "data": run.train_stream.state_dict(),
        "rng": checkpoint.rng_state(),
        "monitor": run.monitor.state_dict(),
        "recovery": run.recovery.state_dict(),
        "config": run.identity,
        "meta": run.meta,
    }
    # exercise checkpoint, checkpoint_state: end


def restore_checkpoint(run, state, forget=()):
    """The inverse of checkpoint_state: every rank takes its share. Returns the checkpoint's step.

    forget (--resume_without) leaves out some of the chapter's three pieces, to show what each
    one is for: "optimizer" (AdamW restarts from zero moments), "data_position" (train.bin is
    read again from its start) or "schedule" (the LR schedule starts over, warmup first)."""
    recorded = fill_new_fields(state["config"], identity_defaults(run.configs.model, run.configs.train))
    if changed := config_changes(recorded, {"GPTConfig": run.identity["GPTConfig"]}):
        raise UserError(f"the checkpoint holds a model of another shape ({'; '.join(changed)})")
    if "optimizer" not in state and not (run.configs.recovery.reset_optimizer or "optimizer" in forget):
        raise UserError(
            f"the checkpoint of step {state['step']} in {run.ckpt_dir} has no optimizer state. Resuming "
            "would restart AdamW's moment estimates from zero, a jolt in update size and direction that "
            "weights alone cannot undo. Pass --reset_optimizer to accept that and continue anyway."
        )
    if forget:
        run.say(f"warning: resuming without the checkpoint's {', '.join(forget)} (--resume_without)")
    if "optimizer" not in state or "optimizer" in forget:
        run.say("warning: no optimizer state taken from the checkpoint; AdamW restarts from zero moments")
    # exercise checkpoint, restore_checkpoint: begin
    checkpoint.load_full_state_dict(run.model, state["model"], run.grid)
    if "optimizer" in state and "optimizer" not in forget:
        checkpoint.load_full_optimizer_state_dict(
            run.optimizer, state["optimizer"], run.model, run.grid, run.optimizer_groups
        )
    if state.get("scaler"):  # empty when the saving run had no fp16 loss scaling
        run.scaler.load_state_dict(state["scaler"])
    run.train_stream.load_state_dict({"position": 0} if "data_position" in forget else state["data"])
    checkpoint.set_rng_state(state["rng"])
    run.monitor.load_state_dict(state["monitor"])
    run.recovery.load_state_dict(state["recovery"])
    if "schedule" in forget:
        run.recovery.schedule_from = state["step"]
    return state["step"]
    # exercise checkpoint, restore_checkpoint: end


def load_checkpoint(run, healthy_only=False, ckpt_step=-1):
    """(step, state) of the newest checkpoint that verifies (and is marked healthy, if asked), or None; given
    ckpt_step (--ckpt_step), that step's, which must verify (checkpoint.load_chosen).

    Rank 0 chooses and every rank loads its choice: a rank that looked for itself could find
    a checkpoint rank 0 wrote a moment ago, and resume while the others start afresh. Every
    rank then confirms its load, so none goes on (and rank 0 re-saves that step) while
    another still reads it. Loaded onto the CPU: the RNG states must stay there."""
    latest, problem = None, None

    def choose():
        nonlocal latest
        if ckpt_step != -1:
            latest = checkpoint.load_chosen(run.ckpt_dir, ckpt_step, healthy_only=healthy_only, warn=run.say)
            return None if latest is None else checkpoint.step_path(run.ckpt_dir, ckpt_step)
        found = checkpoint.find_latest(run.ckpt_dirs, healthy_only=healthy_only, warn=run.say)
        if found is None:
            return None
        step, path, state = found
        if os.path.dirname(path) != run.ckpt_dir:
            run.say(f"taking the checkpoint of step {step} from the mirror: {path}")
        latest = step, state
        return path

    path = run_on_rank0(choose, run.is_rank0)
    if path is not None and not run.is_rank0:
        try:
            state = checkpoint.load(path)
            latest = state["step"], state
        except Exception as e:  # unreadable here: stop every rank with the reason, rather than hang them
            problem = f"rank {run.grid.rank} could not load {path}, which rank 0 chose ({type(e).__name__}: {e})"
    raise_on_every_rank(problem)
    return latest


def save_checkpoint(run, step):
    """checkpoint_state, written by rank 0 (every rank may read it back after this returns), then retention."""
    healthy = run.monitor.take_healthy_mark()  # before checkpoint_state captures the monitor's state
    state = checkpoint_state(run, step)

    def write():
        checkpoint.save(run.ckpt_dir, step, state, healthy)
        if run.configs.recovery.ckpt_mirror:
            checkpoint.mirror(*run.ckpt_dirs, step)
        for folder in run.ckpt_dirs:
            checkpoint.retain(folder, run.configs.recovery.keep_last, run.configs.recovery.keep_every)

    run_on_rank0(write, run.is_rank0)
