"""Pretrain a GPT from scratch: forward -> CLM loss -> backward -> clip -> AdamW, and the run around it.

    python train.py                                  # the `tiny` preset: stdlib corpus, bytes, CPU, minutes
    python train.py --preset shakespeare             # nanoGPT's CPU "baby GPT" on Tiny Shakespeare
    python train.py --preset gpt2-small --source 'corpus/*.txt'   # 124M parameters, one GPU, days
    python train.py --n_layer 6 --learning_rate 3e-4 # any config field, as --name value
    python train.py --sample --out_dir out/tiny      # sample from a finished run
    python train.py --eval_only --benchmark hellaswag --out_dir out/tiny   # evaluate a run's newest checkpoint
    python train.py --preset gpt2-small --init_from gpt2 --source my_texts/   # continue GPT-2 on your own data
    python train.py --mix mix.json                   # several sources, their weights changing by step (mixture.py)
    python train.py --export_hf out/hf --out_dir out/gpt2-run  # a transformers GPT-2 folder (transfer.py)

Read `train()` first: the chapter's loop, on one screen. What it calls comes
before it in the order the math needs it (the defenses, one optimizer step,
evaluation) and after it in the order a run lives it (start, resume and the
final check; what a checkpoint holds; the incident runbook; logging). The
set-up that builds the `Run` they share is run_setup.py's.

The four stability defenses: LR warmup then cosine decay (`lr_at`), global
grad-norm clipping (`clip_gradients`), mixed precision with fp32 master weights
and fp32 loss / norm sums (`--dtype`: run_setup.pick_dtype, the autocast the model
runs under, the GradScaler here), and Pre-LN + RMSNorm + scaled init (model.py).
The loop never asks how the model is laid out across ranks: it talks to the
model as this rank holds it (layout.ShardedModel, or pipeline.PipelineModel)
through the small interface parallel/layout.py describes (RankModel).

A run writes into its out_dir: run.json, metrics.jsonl, incidents.jsonl,
metrics.png, samples.txt and ckpt/.
"""

import math
import os
import sys
import time
from dataclasses import asdict, replace

import torch
import torch.distributed as dist

from machinery import checkpoint
from machinery import cost
from machinery.cluster import PREEMPTED
from parallel.comm_count import take_busiest_comm_bytes, take_comm_bytes
from machinery.config import config_file_form, parse_args
from machinery.curves import find_band
from machinery.corpus import get_tokenizer
from machinery.evaluation import evaluate, final_check
from machinery.mixture import weights_at
from machinery.monitor import SavedActivations, Throughput, peak_memory_bytes, plot_metrics, state_bytes
from parallel.grid import all_reduce_mean, destroy_distributed, raise_on_every_rank, run_on_rank0
from machinery.sample import sample, sample_texts
from machinery.run_setup import check_epochs, load_initial_weights, pick_device, set_up
from machinery.runbook import RUNGS, Recovery, runbook_response
from machinery.run_folder import (
    append_jsonl,
    config_changes,
    fill_new_fields,
    identity_defaults,
    is_finished,
    out_dir_of,
    read_jsonl,
    record_config,
    record_identity,
    write_jsonl,
)
from machinery.transfer import export_run

# ----------------------------------------------------------------------------
# The defenses that live in the loop: LR schedule, clipping


def lr_at(step, cfg):
    """Linear warmup to learning_rate over warmup_iters steps, then cosine down to min_lr.

    Early gradients point in unreliable directions: warmup takes small steps
    while the loss landscape is being found.
    """
    # exercise lr_at: begin
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / cfg.warmup_iters
    if step >= decay_iters:
        return cfg.min_lr
    progress = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)  # 0 -> 1
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)
    # exercise lr_at: end


def step_lr(step, cfg, recovery_cfg, recovery):
    """The LR this step trains at: lr_at's schedule, counted from recovery.schedule_from, times
    what the incident runbook did to it (recovery: a Recovery, below): its cuts (lr_scale), and a
    re-warm from recovery.rewarm_from over --rewarm_iters steps (default: warmup_iters)."""
    lr = lr_at(step - recovery.schedule_from, cfg) * recovery.lr_scale
    rewarm_iters = recovery_cfg.rewarm_iters or cfg.warmup_iters
    if 0 <= recovery.rewarm_from <= step < recovery.rewarm_from + rewarm_iters:
        lr *= (step - recovery.rewarm_from + 1) / rewarm_iters
    return lr


def clip_gradients(parameters, grad_norm, max_norm):
    """Scale all gradients by one factor so that their global L2 norm, grad_norm, is at most
    max_norm (0: no clipping). One factor for all keeps the update's direction.

    grad_norm is the norm of the whole model's gradient, summed in fp32 over every rank's
    share (the model's grad_norm()), so every rank scales by the same factor."""
    # exercise clip_gradients: begin
    if max_norm > 0:
        scale = torch.clamp(max_norm / (grad_norm + 1e-6), max=1.0)
        for p in parameters:
            if p.grad is not None:
                p.grad.mul_(scale.to(p.grad.dtype))
    # exercise clip_gradients: end


# ----------------------------------------------------------------------------
# One optimizer step


def optimizer_step(model, optimizer, scaler, next_batch, lr, cfg):
    """One update at learning rate lr: the gradient of the mean loss over
    cfg.gradient_accumulation_steps micro-batches from next_batch(), averaged over the
    data-parallel ranks, clipped to cfg.grad_clip, then AdamW.

    model is the model as this rank holds it (layout.ShardedModel, pipeline.PipelineModel).
    Returns (this rank's mean loss, global grad norm before clipping), both 0-dim tensors."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    micro_steps = cfg.gradient_accumulation_steps
    # Each micro-batch's loss is multiplied by 1 / micro_steps, so the summed gradient is that of their
    # mean loss (data-parallel ranks average it once, after the last micro-batch: sync), and, under fp16,
    # by the loss scale, which lifts small gradients above fp16's floor (unscale_ divides it out again).
    loss_weight = scaler.scale(torch.tensor(1 / micro_steps, device=model.device))
    loss_sum = torch.zeros((), device=model.device)
    for micro_step in range(micro_steps):
        x, y = (t.to(model.device, non_blocking=True) for t in next_batch())  # (B, T) each
        loss_sum += model.forward_backward(x, y, loss_weight, sync=micro_step == micro_steps - 1)
    model.reduce_gradients()  # wait for the DP average (a pipeline also sums its two copies of the tied matrix)
    scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
    grad_norm = model.grad_norm()
    # the gradients AdamW reads: the parameters' own, or under ZeRO this rank's shard of them (zero.py)
    clip_gradients([p for group in optimizer.param_groups for p in group["params"]], grad_norm, cfg.grad_clip)
    scaler.step(optimizer)  # skips the step if fp16 gradients overflowed
    scaler.update()
    model.clear_gradients()
    return loss_sum / micro_steps, grad_norm


# ----------------------------------------------------------------------------
# The loop


def train(preset, configs):
    """The chapter's loop: forward -> CLM loss -> backward -> clip -> AdamW, evaluated and
    watched as it goes, checkpointed every few steps, rolled back when an incident strikes."""
    run = set_up(preset, configs)
    with run.watch:  # the stop signals, heartbeats and the folder's lock, until the job ends (cluster.py)
        cfg, monitor = run.configs.train, run.monitor
        step = start(run)  # 0, or where the newest checkpoint left off
        # run.json's "config": this command's settings, which `--config OUT/run.json` repeats; and its dtype
        dtype = str(run.dtype).removeprefix("torch.")
        run_on_rank0(lambda: record_config(run.out_dir, config_file_form(preset, configs), step, dtype), run.is_rank0)
        measure_state_at_the_first_update(run)
        throughput = Throughput(run.tokens_per_step)
        while True:
            record, eval_warnings = {"step": step}, []
            if evaluation_due(step, cfg):
                with throughput.paused():
                    record.update(validate(run, step))  # val_loss; for a mix, each source's too, and the tokens read
                eval_warnings = monitor.check_eval(record["val_loss"])
                if monitor.is_incident(eval_warnings):
                    step = respond_to_incident(run, step, eval_warnings)
                    continue
            if step == cfg.max_iters:
                final_evaluation = record  # evaluation_due(max_iters): the last weights were just judged
                break

            run.watch.beat(step)  # this rank's heartbeat: alive, at this step
            next_batch = run.injector.strike(step, run.model, run.train_stream)  # the data, unless a fault is due
            lr = step_lr(step, cfg, run.configs.recovery, run.recovery)
            take_comm_bytes()  # this step's communication is counted from zero (log_step reads it)
            loss, grad_norm = optimizer_step(run.model, run.optimizer, run.scaler, next_batch, lr, cfg)
            # the logged loss is the mean over DP ranks; the grad norm is already that of the averaged gradient
            loss = all_reduce_mean(loss, run.grid.dp_group, run.grid.dp).item()  # .item() waits for the device
            grad_norm = grad_norm.item()
            overflow = skipped_for_fp16_overflow(run.scaler, loss, grad_norm)
            grad_norm_z, fired = (0.0, []) if overflow else monitor.check_step(loss, grad_norm)
            fired += eval_warnings
            if monitor.is_incident(fired):
                step = respond_to_incident(run, step, fired)
                continue
            for detector, values in fired:
                run.say(f"warning at step {step}: {detector} {values}; the next checkpoint is marked unhealthy")
            throughput.step_done()

            record.update(loss=loss, lr=lr, grad_norm=grad_norm, grad_norm_z=grad_norm_z)
            if overflow:
                record["skipped"] = f"fp16 overflow; loss scale now {run.scaler.get_scale():g}"
            if log_due(step, record, cfg):
                log_step(run, record, throughput)
            step += 1
            stop = run.watch.stop_requested(run.model.device)  # SIGTERM or SIGUSR1, on any rank
            if stop or step % run.configs.recovery.ckpt_interval == 0 or step == cfg.max_iters:
                save_checkpoint(run, step)
            if stop:
                stop_for_signal(run, step)
        finish(run, final_evaluation, preset)


def evaluation_due(step, cfg):
    return step % cfg.eval_interval == 0 or step == cfg.max_iters


def validate(run, step):
    """{"val_loss": ...}: the mean loss on the first val rows. A mix adds "val_loss_by_source", and
    "mix_tokens" (each source's tokens read so far); its val_loss weighs the sources by the weights in
    force at `step`, the mix the train loss is drawn from, so the two stay comparable (the val-rise
    detector sets one against the other) when the mix changes."""
    losses = {name: evaluate(run.model, stream, run.eval_batches, run.grid) for name, stream in run.val_streams.items()}
    if run.mix is None:
        (val_loss,) = losses.values()
        return {"val_loss": val_loss}
    return {
        "val_loss": sum(weights_at(run.mix, step)[name] * loss for name, loss in losses.items()),
        "val_loss_by_source": losses,
        "mix_tokens": run.train_stream.mix_tokens(),
    }


def log_due(step, record, cfg):
    """Every log_interval steps, and every step that was evaluated, was skipped, or is the last."""
    return step % cfg.log_interval == 0 or "val_loss" in record or "skipped" in record or step == cfg.max_iters - 1


def skipped_for_fp16_overflow(scaler, loss, grad_norm):
    """fp16: gradients that overflow are the loss scaler's business, not an incident: it skipped
    the step and lowered its scale, as it is meant to (a rollback would restore the old scale)."""
    return scaler.is_enabled() and math.isfinite(loss) and not math.isfinite(grad_norm)


def evaluate_only(preset, configs):
    """--eval_only: the final check of the newest checkpoint in out_dir (or --ckpt_step's), with no training."""
    out_dir = out_dir_of(preset, configs.train)
    if not os.path.isdir(os.path.join(out_dir, "ckpt")):
        raise ValueError(f"--eval_only: {out_dir} holds no checkpoints; train there first, or point --out_dir at a run")
    run = set_up(preset, replace(configs, sample=replace(configs.sample, num_samples=0)))  # it writes no samples
    with run.watch:
        evaluate_newest(run)


def evaluate_newest(run):
    """The final check of the newest checkpoint (or --ckpt_step's), logged to metrics.jsonl."""
    latest = load_checkpoint(run, ckpt_step=run.configs.recovery.ckpt_step)
    if latest is None:
        raise ValueError(f"--eval_only: no checkpoint in {run.ckpt_dir} verifies")
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


# ----------------------------------------------------------------------------
# Start, resume, finish


def start(run):
    """The run's first moments: refuse a finished run, print the cost account, then resume
    from the newest checkpoint that verifies, or start at step 0 (from --init_from's weights, if
    given) and save it. Returns the first step."""
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
        raise ValueError(f"--resume, but {run.ckpt_dir} holds no checkpoint that verifies")
    else:
        step = 0
        if run.configs.train.init_from:
            load_initial_weights(run)
        save_checkpoint(run, 0)
    run.records = [r for r in read_jsonl(run.metrics_path) if r["step"] < step]  # the timeline that led here
    if run.is_rank0:
        write_jsonl(run.metrics_path, run.records)
    return step


def stop_for_signal(run, step):
    """A stop signal reached the job and the checkpoint of `step` is written: end every rank with cluster.PREEMPTED,
    which a scheduler's script (examples/slurm/train.sbatch) reads as "requeue me"."""
    received = run.watch.signals.received or "a stop signal to another rank"
    run.say(
        f"{received}: stopped after step {step - 1} and wrote the checkpoint of step {step} in {run.ckpt_dir}. Run "
        f"the same command to resume from it (exit code {PREEMPTED})",
        flush=True,
    )
    run.tracker.close()
    sys.exit(PREEMPTED)


def refuse_finished_run(run, finished_at):
    cfg = run.configs.train
    hint = f"; --lr_decay_iters {finished_at} keeps it at min_lr instead" if not cfg.lr_decay_iters else ""
    raise ValueError(
        f"{run.out_dir} holds a finished run: its newest checkpoint is at step {finished_at} and --max_iters is "
        f"{cfg.max_iters}, so there is nothing to train. To train it further, pass a larger --max_iters "
        f"(the LR schedule stretches to the new end{hint}); to start over there, --overwrite; or choose "
        f"another --out_dir. To sample from it: python train.py --sample --out_dir {run.out_dir}"
    )


def timed_step_seconds(model, batch, repeats=3):
    """The fastest of a few forward + backward passes (the first one warms up), then drop the
    gradients. sync=False: data parallelism starts no all-reduce for these."""
    x, y = batch
    synchronize = torch.cuda.synchronize if model.device.type == "cuda" else lambda: None  # wait for the GPU
    times = []
    for _ in range(repeats):
        synchronize()
        t0 = time.perf_counter()
        model.forward_backward(x, y, 1.0, sync=False)
        synchronize()
        times.append(time.perf_counter() - t0)
    model.clear_gradients()
    return min(times)


def print_cost_account(run):
    """What the run will cost (cost.py's account): parameters, tokens, FLOPs, memory, and the time from
    one measured step."""
    cfg, model = run.configs.train, run.model  # rank 0's model: the first stage, which keeps the most activations
    run.say(f"device {model.device}, dtype {str(run.dtype).replace('torch.', '')}, out {run.out_dir}")
    batch = [t.to(model.device) for t in next(iter(run.val_streams.values())).next_batch()]
    step_seconds = timed_step_seconds(model, batch) * cfg.gradient_accumulation_steps
    with SavedActivations(model.module) as saved:  # one more pass, to weigh what backward keeps
        model.forward_backward(*batch, 1.0, sync=False)
    model.clear_gradients()
    for line in cost.account_lines(
        run.configs.model,
        run.configs.parallel,
        cfg.batch_size // model.micro_batches,
        model.in_flight,
        cfg.max_iters,
        run.tokens_per_step,
        run.dtype.itemsize,
        step_seconds,
        measured_activations=saved.peak,
    ):
        run.say("cost: " + line)


def finish(run, final_evaluation, preset):
    """The end of a run: its peak memory, the layout's own account, the final check of the last weights (judged
    in final_evaluation, validate's record), the metrics plot, samples; where a band of its recipe over seeds
    exists (bands/<preset>.json), how to read the curve against it."""
    peak = peak_memory_bytes(run.model.device)  # set against the cost account's memory line at the start
    run.say(
        f"training took {(time.perf_counter() - run.started) / 60:.1f} min"
        + (f"; peak memory {peak / 2**30:.2f} GiB" if peak else "")
    )
    run.model.report(run.out_dir, run.say, run.is_rank0)  # its collectives before rank 0 scores the benchmark alone
    record, model = final_check(
        run.model,
        run.grid,
        run.configs.train.max_iters,
        final_evaluation["val_loss"],
        run.configs.model,
        run.meta,
        run.benchmark_examples,
        run.say,
    )
    if not run.is_rank0:
        return
    record = {**final_evaluation, **record}  # a mix's val_loss_by_source and mix_tokens beside the final check's
    run.records.append(record)
    append_jsonl(run.metrics_path, record)
    run.tracker.log(run.records)
    run.tracker.close()
    plot_metrics(
        run.records,
        read_jsonl(run.incidents_path),
        os.path.join(run.out_dir, "metrics.png"),
        math.log(run.meta["vocab_size"]),
    )
    samples = sample_texts(model, get_tokenizer(run.meta["tokenizer"]), run.configs.sample, run.model.device)
    with open(os.path.join(run.out_dir, "samples.txt"), "w") as f:
        f.write("\n\n==========\n\n".join(samples) + "\n")
    shown = f"samples:\n{samples[0]}\n" if samples else ""  # --num_samples 0: none
    print(f"{shown}wrote {run.out_dir}: metrics.jsonl, metrics.png, samples.txt, ckpt/")
    band, _ = find_band(run.identity, preset)
    if band:  # a band of this recipe over seeds (bands/<preset>.json): the reader sets the run against it
        seeds = len(band["seeds"])
        print(f"is this curve normal? Against {seeds} seeds of its recipe: python -m machinery.curves {run.out_dir}")


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
        "recovery": asdict(run.recovery),
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
        raise ValueError(f"the checkpoint holds a model of another shape ({'; '.join(changed)})")
    if "optimizer" not in state and not (run.configs.recovery.reset_optimizer or "optimizer" in forget):
        raise ValueError(
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
    run.recovery = Recovery(**state["recovery"])
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


# ----------------------------------------------------------------------------
# The incident runbook
# (runbook.py: the rungs and the choice among them; here they act on the run)


def respond_to_incident(run, step, fired):
    """Climb the runbook for the incident `fired` at `step`; returns the step to go on from."""
    detector, values = fired[0]
    response = runbook_response(run.recovery, step, run.configs.recovery)
    incident = {"step": step, "detector": detector, "values": values, "rung": RUNGS[response], "response": response}
    if response == "stop":
        run.tracker.incident(incident)
        run.tracker.close()
        stop_for_incidents(run, incident)
    bad_end = run.train_stream.position  # the data up to here led to the incident
    recovery = replace(run.recovery, incidents=run.recovery.incidents + 1, last_incident_step=step)
    latest = load_checkpoint(run, healthy_only=True)
    if latest is None:
        raise ValueError(f"{detector} at step {step}, and no healthy checkpoint in {run.ckpt_dir} to roll back to")
    _, state = latest
    restored = restore_checkpoint(run, state)
    skipped = [run.train_stream.position, bad_end]
    run.train_stream.position = bad_end
    if response == "lower_lr":
        recovery.lr_scale *= run.configs.recovery.incident_lr_scale
    elif response == "rewarm":
        recovery.rewarm_from = restored
    run.recovery = recovery  # what the incidents did survives the restore of the older state
    discarded = run_on_rank0(
        lambda: sorted({s for folder in run.ckpt_dirs for s in checkpoint.discard_after(folder, restored)}),
        run.is_rank0,
    )
    save_checkpoint(run, restored)  # the restored state, with the skip and the response, so a crash now keeps them
    run.records = [r for r in run.records if r["step"] < restored]
    incident["action"] = {
        "restored_step": restored,
        "skipped_rows": skipped,
        "lr_scale": recovery.lr_scale,
        "rewarm_from": recovery.rewarm_from,
        "discarded_checkpoints": discarded,
    }
    if run.is_rank0:
        write_jsonl(run.metrics_path, run.records)
        append_jsonl(run.incidents_path, incident)
        run.tracker.incident(incident)
    run.say(
        f"INCIDENT at step {step}: {detector} {values} -> rung {RUNGS[response]} ({response}): rolled back to "
        f"step {restored}, skipped data rows {skipped[0]}..{skipped[1]}, LR x{recovery.lr_scale:.3g}",
        flush=True,
    )
    return restored


def stop_for_incidents(run, incident):
    """The runbook's last rung: log the incident and stop every rank, naming what was tried."""
    if run.is_rank0:
        append_jsonl(run.incidents_path, incident)
    tried = "rolling back and skipping data" + (
        f" and an LR lowered to x{run.recovery.lr_scale:.3g}" if run.recovery.lr_scale < 1 else ""
    )
    raise ValueError(
        f"stopping after {run.recovery.incidents + 1} incidents (--max_incidents "
        f"{run.configs.recovery.max_incidents}); the last: {incident['detector']} at step {incident['step']} "
        f"{incident['values']}. {tried.capitalize()} did not end them, so suspect something deeper: the data around "
        f"the skipped rows (in {run.incidents_path}), --dtype, the init. The healthy checkpoints in {run.ckpt_dir} "
        "are intact: resume from them with a lower --learning_rate or a longer --warmup_iters, or a larger "
        "--max_incidents."
    )


# ----------------------------------------------------------------------------
# Logging


def log_step(run, record, throughput):
    """One line on the console, one record in metrics.jsonl and in the trackers --log_to names (tracking.py)."""
    step = record["step"]
    tokens_per_s, seconds_per_step = throughput.read()
    record["tokens_per_s"] = tokens_per_s
    line = f"step {step:5d} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | grad norm {record['grad_norm']:.3f}"
    line += f" | {tokens_per_s:,.0f} tok/s"
    if run.peak_flops:
        # tokens/s counts the whole group and FLOPs the whole model; each of the group's devices has this peak
        record["mfu"] = run.flops_per_token * tokens_per_s / (run.peak_flops * run.grid.world_size)
        line += f" | MFU {100 * record['mfu']:.1f}%"
    line += f" | ETA {(run.configs.train.max_iters - step - 1) * seconds_per_step / 60:.1f} min"
    if "val_loss" in record:
        line += f" | val loss {record['val_loss']:.4f}"
    if "skipped" in record:
        line += f" | step skipped: {record['skipped']}"
    if step == 0 and not run.configs.train.init_from:
        vocab = run.meta["vocab_size"]
        line += f"\n  a fresh model guesses uniformly: loss ~ ln(vocab) = ln {vocab} = {math.log(vocab):.4f}"
    if run.grid.world_size > 1:  # the step's communication, each dimension on its busiest rank
        record.update({f"comm_bytes_{d}": b for d, b in take_busiest_comm_bytes(run.model.device).items()})
    run.say(line, flush=True)
    if run.measured_state is not None:
        print_state_beside_closed_form(run, record)
    if run.grid.world_size > 1 and not run.comm_compared:
        print_comm_beside_closed_form(run, record)
    run.records.append(record)
    if run.is_rank0:
        append_jsonl(run.metrics_path, record)
        run.tracker.log(run.records)  # the timeline: a tracker drops what a resume or rollback dropped


def measure_state_at_the_first_update(run):
    """run.measured_state: monitor.state_bytes once, just after the first update, when the weights, their
    gradients and AdamW's moments all exist (log_step prints it beside cost.py's closed form)."""

    def measure(optimizer, args, kwargs):
        run.measured_state = state_bytes(run.model.module, optimizer)
        hook.remove()

    hook = run.optimizer.register_step_post_hook(measure)


def print_state_beside_closed_form(run, record):
    """The state bytes of the first update, on the fullest rank, beside cost.py's closed form."""
    layout = run.configs.parallel
    measured = torch.tensor(run.measured_state, dtype=torch.int64, device=run.model.device)
    if dist.is_initialized():
        dist.all_reduce(measured, op=dist.ReduceOp.MAX)
    record["state_bytes"] = measured.item()
    closed_form = cost.fullest_rank_state_bytes(run.configs.model, layout)
    run.say(
        f"state at the first update, on the fullest rank: measured {record['state_bytes']:,} B | closed form "
        f"{closed_form:,.0f} B = {cost.state_bytes_formula(layout.dp, layout.zero_stage)} per parameter held"
    )
    run.measured_state = None


def print_comm_beside_closed_form(run, record):
    """The communication of the first logged step, each dimension on its busiest rank, beside cost.py's closed form."""
    cfg = run.configs.train
    closed_forms = cost.busiest_stage_comm_bytes(
        run.configs.model,
        run.configs.parallel,
        batch_size=cfg.batch_size,
        accumulation=cfg.gradient_accumulation_steps,
        compute_bytes=run.dtype.itemsize,
    )  # {dimension: (bytes, formula)}
    run.say("communication of that step, payload bytes on the busiest rank: measured | closed form")
    for d, (closed_form, formula) in closed_forms.items():
        run.say(f"  {d} {record[f'comm_bytes_{d}']:>13,} | {closed_form:>13,} = {formula}")
    run.comm_compared = True


def main(argv=None):
    try:
        preset, mode, configs = parse_args(sys.argv[1:] if argv is None else argv)
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
            train(preset, configs)
    except ValueError as e:
        sys.exit(f"error: {e}")
    except RuntimeError as e:
        if not dist.is_initialized():
            raise
        # gloo and NCCL report a peer that died or stopped answering as a RuntimeError in a collective
        sys.exit(
            f"error: rank {dist.get_rank()} lost contact with the other ranks ({str(e).splitlines()[0][:300]}). "
            "If another rank died, run the same command again to resume from the last checkpoint."
        )
    finally:
        destroy_distributed()


if __name__ == "__main__":
    main()
