"""Pretrain a GPT from scratch: forward -> CLM loss -> backward -> clip -> AdamW, in a loop that survives its incidents.

    python train.py                                  # the `tiny` preset: stdlib corpus, bytes, CPU, minutes
    python train.py --preset shakespeare             # nanoGPT's CPU "baby GPT" on Tiny Shakespeare
    python train.py --preset gpt2-small --source 'corpus/*.txt'   # 124M parameters, one GPU, days
    python train.py --n_layer 6 --learning_rate 3e-4 # any config field, as --name value
    python train.py --sample --out_dir out/tiny      # sample from a finished run (docs/tiers.md: the other modes)

Read `train()`: the chapter's loop, on one screen. Before it, the defenses that live in the loop and one
optimizer step, in the order the math needs them.

The four stability defenses: LR warmup then cosine decay (`lr_at`), global grad-norm clipping
(`clip_gradients`), mixed precision with fp32 master weights and fp32 loss and norm sums (`--dtype`: the
autocast the model runs under, the GradScaler in `optimizer_step`), and Pre-LN + RMSNorm + scaled init
(model.py). Incidents the detectors catch are answered by the runbook: roll back, skip the data, lower the LR.

The loop never asks how the model is laid out across ranks (it talks to parallel/layout.py's RankModel), nor holds
the machinery a real run needs: machinery's run_setup.py builds the `Run` of a few components, whose methods it
calls. A run writes one folder, --out_dir (docs/runs-and-checkpoints.md lists its files).
"""

import math
import sys

import torch
import torch.distributed as dist

from errors import UserError
from machinery.components.modes import run_mode
from machinery.components.run_setup import set_up
from machinery.job.config import parse_args
from parallel.comm_count import take_comm_bytes
from parallel.grid import all_reduce_mean, destroy_distributed

# ----------------------------------------------------------------------------
# The defenses that live in the loop: LR schedule, clipping


def lr_at(step, cfg):
    """Linear warmup to learning_rate over warmup_iters steps, then cosine down to min_lr. Early gradients point in
    unreliable directions: warmup takes small steps while the loss landscape is being found."""
    # exercise lr_at: begin
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / cfg.warmup_iters
    if step >= decay_iters:
        return cfg.min_lr
    progress = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)  # 0 -> 1
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)
    # exercise lr_at: end


def clip_gradients(parameters, grad_norm, max_norm):
    """Scale all gradients by one factor so that their global L2 norm, grad_norm, is at most max_norm (0: no
    clipping). One factor for all keeps the update's direction. grad_norm is the norm of the whole model's gradient,
    summed in fp32 over every rank's share (the model's grad_norm()), so every rank scales by the same factor."""
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
    run = set_up(preset, configs)  # the job, data, model, optimizer, watchers: the Run's components (machinery/)
    job, learner, checkpointer, reporter = run.job, run.learner, run.checkpointer, run.reporter
    monitor, recovery = run.incidents.monitor, run.incidents.recovery
    with job.watch:  # the stop signals, heartbeats and the folder's lock, until the job ends (machinery/job/cluster.py)
        cfg = job.configs.train
        step = run.start()  # 0, or where the newest checkpoint left off
        while True:
            record, eval_warnings = {"step": step}, []
            if evaluation_due(step, cfg):
                record.update(run.validate(step))  # val_loss; for a mix, each source's too
                eval_warnings = monitor.check_eval(record["val_loss"])
                if monitor.is_incident(eval_warnings):
                    step = run.respond_to_incident(step, eval_warnings)
                    continue
            if step == cfg.max_iters:
                final_evaluation = record  # evaluation_due(max_iters): the last weights were just judged
                break

            job.watch.beat(step)  # this rank's heartbeat: alive, at this step
            next_batch = run.batches(step)  # the data, unless a fault is due
            # the schedule, counted from where it restarted, times what incidents did to it (machinery's incidents.py)
            lr = lr_at(recovery.schedule_step(step), cfg) * recovery.lr_factor(step)
            take_comm_bytes()  # this step's communication is counted from zero (the reporter reads it)
            loss, grad_norm = optimizer_step(learner.model, learner.optimizer, learner.scaler, next_batch, lr, cfg)
            # the logged loss is the mean over DP ranks; the grad norm is already that of the averaged gradient
            loss = all_reduce_mean(loss, job.grid.dp_group, job.grid.dp).item()  # .item() waits for the device
            grad_norm = grad_norm.item()
            overflow = skipped_for_fp16_overflow(learner.scaler, loss, grad_norm)
            grad_norm_z, fired = (0.0, []) if overflow else monitor.check_step(loss, grad_norm)
            fired += eval_warnings
            if monitor.is_incident(fired):
                step = run.respond_to_incident(step, fired)  # roll back, skip the data, maybe lower the LR
                continue
            reporter.warn(step, fired)  # leading indicators only: the next checkpoint is marked unhealthy
            reporter.throughput.step_done()

            record.update(loss=loss, lr=lr, grad_norm=grad_norm, grad_norm_z=grad_norm_z)
            if overflow:
                record["skipped"] = f"fp16 overflow; loss scale now {learner.scaler.get_scale():g}"
            if log_due(step, record, cfg):
                reporter.log(record)
            step += 1
            stop = job.watch.stop_requested(learner.model.device)  # SIGTERM or SIGUSR1, on any rank
            if stop or step % job.configs.recovery.ckpt_interval == 0 or step == cfg.max_iters:
                checkpointer.save(step)
            if stop:
                reporter.stop_for_signal(step)
        reporter.finish(final_evaluation)


def evaluation_due(step, cfg):
    return step % cfg.eval_interval == 0 or step == cfg.max_iters


def log_due(step, record, cfg):
    """Every log_interval steps, and every step that was evaluated, was skipped, or is the last."""
    return step % cfg.log_interval == 0 or "val_loss" in record or "skipped" in record or step == cfg.max_iters - 1


def skipped_for_fp16_overflow(scaler, loss, grad_norm):
    """fp16: overflowing gradients are the loss scaler's business, not an incident: it skipped the step and lowered its
    scale, as it is meant to (a rollback would restore the old scale)."""
    return scaler.is_enabled() and math.isfinite(loss) and not math.isfinite(grad_norm)


def main(argv=None):
    try:
        preset, mode, configs = parse_args(sys.argv[1:] if argv is None else argv)
        if mode == "train":
            train(preset, configs)
        else:  # --sample, --eval_only, --export_hf
            run_mode(mode, preset, configs)
    except UserError as e:  # a refusal names the input in one line; any other exception is a bug: its traceback
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
