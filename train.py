"""Pretrain a GPT from scratch: forward -> CLM loss -> backward -> clip -> AdamW, and the run around it.

    python train.py                                  # the `tiny` preset: stdlib corpus, bytes, CPU, minutes
    python train.py --preset shakespeare             # nanoGPT's CPU "baby GPT" on Tiny Shakespeare
    python train.py --preset gpt2-small --source 'corpus/*.txt'   # 124M parameters, one GPU, days
    python train.py --n_layer 6 --learning_rate 3e-4 # any config field, as --name value
    python train.py --sample --out_dir out/tiny      # sample from a finished run

The four stability defenses are all here: LR warmup then cosine decay
(`lr_at`), global grad-norm clipping (`clip_grad_norm`), mixed precision with
fp32 master weights and fp32 loss / norm sums (`--dtype`), and Pre-LN +
RMSNorm + scaled init (model.py). Around them, the run's life: checkpoints
every few steps (checkpoint.py), exact resume, and automatic incident
handling: a NaN or a loss spike (monitor.py) rolls back to the latest healthy
checkpoint, skips the data that caused it, lowers the LR and goes on.

A run writes into its out_dir: run.json, metrics.jsonl, incidents.jsonl,
metrics.png, samples.txt and ckpt/.
"""

import contextlib
import dataclasses
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import time
from dataclasses import asdict
from itertools import groupby

import numpy as np
import torch
import torch.distributed as dist

import checkpoint
from config import CONFIG_CLASSES, SampleConfig, TrainConfig, parse_args
from data import TokenStream, get_tokenizer, load_meta, prepare, remove_if_exists, write_json_atomic
from model import GPT, GPTConfig
from monitor import HealthMonitor, cost_estimate, device_peak_flops, plot_metrics
from parallel import (DataParallel, ProcessGrid, all_reduce_mean, check_tensor_parallel_layout,
                      destroy_distributed, full_optimizer_state_dict, full_state_dict, global_grad_norm,
                      init_distributed, load_full_optimizer_state_dict, load_full_state_dict, run_on_rank0,
                      tensor_parallel)
from pipeline import (SCHEDULES, Pipeline, PipelineStage, bubble_fraction, check_micro_batches,
                      check_pipeline_layout, plot_gantt)

# ----------------------------------------------------------------------------
# The defenses that live in the loop: LR schedule, clipping, precision


def lr_at(step, cfg):
    """Linear warmup to learning_rate over warmup_iters steps, then cosine down to min_lr.

    Early gradients point in unreliable directions: warmup takes small steps
    while the loss landscape is being found.
    """
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / cfg.warmup_iters
    if step >= decay_iters:
        return cfg.min_lr
    progress = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)  # 0 -> 1
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


def clip_grad_norm(parameters, max_norm, grid=None):
    """Scale all gradients by one factor so their global L2 norm is at most max_norm.

    Returns the norm before clipping. The sum of squares runs in fp32 whatever
    the gradients' dtype: it is the kind of sum that overflows or loses precision
    in 16 bits; under tensor parallelism it spans every rank's slices (global_grad_norm).
    """
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = global_grad_norm(parameters, grid)
    if max_norm > 0:
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale.to(g.dtype))
    return norm


def pick_device(name):
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(name, device):
    """Mixed precision: the forward/backward matmuls run in 16 bits under autocast, the
    weights and AdamW state stay fp32 ("master weights"). bf16 keeps fp32's exponent
    range, so unlike fp16 it needs no loss scaling."""
    if name == "auto":
        if device.type == "cuda":
            name = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        else:
            name = "float32"
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"--dtype {name!r}: choose auto, {', '.join(dtypes)}")
    return dtypes[name]


def autocast_context(device, dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_optimizer(model, cfg, device):
    """AdamW; weight decay pulls matrices and embeddings toward zero, never norm gains or biases."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(
        groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), fused=device.type == "cuda"
    )


def make_forward_backward(forward, autocast, scaler):
    """(x, y, loss_scale) -> loss: forward under autocast, backward of loss * loss_scale."""

    def forward_backward(x, y, loss_scale):
        with autocast:
            _, loss = forward(x, y)
        scaler.scale(loss * loss_scale).backward()
        return loss.detach()

    return forward_backward


def optimizer_step(forward_backward, model, optimizer, scaler, next_batch, cfg, lr, device, dp=None, grid=None,
                   after_backward=None):
    """One update at learning rate lr: gradients of the mean loss over
    cfg.gradient_accumulation_steps micro-batches from next_batch(), averaged over
    the data-parallel ranks if dp is given, clipped, then AdamW.
    Returns (this rank's mean loss, global grad norm before clipping), both 0-dim tensors."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=device)
    for micro_step in range(cfg.gradient_accumulation_steps):
        if dp is not None:  # average across ranks once, after the last micro-batch
            dp.sync = micro_step == cfg.gradient_accumulation_steps - 1
        x, y = (t.to(device, non_blocking=True) for t in next_batch())  # (B, T) each
        # dividing by the number of micro-batches makes the summed gradient that of their mean loss
        loss_sum += forward_backward(x, y, 1 / cfg.gradient_accumulation_steps)
    if after_backward is not None:
        after_backward()
    if dp is not None:
        dp.finish()
    scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
    grad_norm = clip_grad_norm(model.parameters(), cfg.grad_clip, grid)
    scaler.step(optimizer)  # skips the step if fp16 gradients overflowed
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum / cfg.gradient_accumulation_steps, grad_norm


@torch.no_grad()
def evaluate(loss_of, module, stream, batches, device, grid):
    """Mean loss over the first `batches` micro-batches of each rank's share of the stream,
    averaged over the DP ranks: the same rows every time, and the same rows for any layout
    that reads the same number of global batches."""
    module.eval()  # no dropout
    stream.load_state_dict({"position": 0})
    loss_sum = torch.zeros((), device=device)
    for _ in range(batches):
        x, y = stream.next_batch()
        loss_sum += loss_of(x.to(device), y.to(device)).float()
    module.train()
    return all_reduce_mean(loss_sum / batches, grid.dp_group, grid.dp).item()


def timed_step_seconds(forward_backward, model, batch, device, repeats=3):
    """The fastest of a few forward + backward passes (the first one warms up), then drop the gradients."""
    x, y = batch
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        forward_backward(x, y, 1.0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return min(times)


# ----------------------------------------------------------------------------
# Fault injection: the incidents of a real run, on demand, for teaching and tests


class FaultInjector:
    """--inject nan@S,spike@S,crash@S. Each fault fires once, ever: fired faults are
    remembered in out_dir/injected.json, so a resumed run does not crash again.

    - nan: one weight becomes NaN before step S (a flipped bit); every loss after is NaN.
    - spike: step S trains on garbage instead of its batch (see garbage_batches).
    - crash: the process kills itself with SIGKILL before step S (a dying machine).
    """

    KINDS = ("nan", "spike", "crash")

    def __init__(self, spec, out_dir, active=True):
        self.active = active  # every rank checks the spec; only the active one fires
        self.path = os.path.join(out_dir, "injected.json")
        self.planned = []
        for item in filter(None, spec.split(",")):
            kind, _, at = item.partition("@")
            if kind not in self.KINDS or not at.isdigit():
                raise ValueError(f"--inject {item!r}: write KIND@STEP with KIND one of {', '.join(self.KINDS)}")
            self.planned.append(f"{kind}@{int(at)}")
        self.fired = []
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.fired = json.load(f)

    def due(self, step):
        """Faults planned for this step that have not fired yet; they count as fired from now on."""
        if not self.active:
            return []
        due = [f for f in self.planned if f.endswith(f"@{step}") and f not in self.fired]
        if due:
            self.fired += due
            write_json_atomic(self.path, self.fired)
        return [f.split("@")[0] for f in due]


def garbage_batches(stream, vocab_size, seed):
    """next_batch() for a spike: it consumes the real batch (the data position moves on as
    usual) but returns random tokens, inputs and targets, as a corrupt shard would."""
    generator = torch.Generator().manual_seed(seed)

    def next_batch():
        x, _ = stream.next_batch()
        return tuple(torch.randint(vocab_size, x.shape, generator=generator) for _ in range(2))

    return next_batch


# ----------------------------------------------------------------------------
# Sampling


def sample_texts(model, tokenizer, scfg, device):
    """num_samples continuations of the prompt; document boundaries shown as <|endoftext|>."""
    prompt = tokenizer.encode(scfg.prompt) if scfg.prompt else [tokenizer.eot]
    idx = torch.tensor([prompt] * scfg.num_samples, dtype=torch.long, device=device)
    model.eval()
    out = model.generate(idx, scfg.max_new_tokens, temperature=scfg.temperature, top_k=scfg.top_k or None)
    model.train()
    texts = []
    for row in out[:, len(prompt) :].tolist():
        # cut at end-of-text; a padded-vocab id (never a target, rarely sampled) has no text either
        pieces = groupby(row, key=lambda t: t == tokenizer.eot or t >= tokenizer.vocab_size)
        texts.append(scfg.prompt + "\n<|endoftext|>\n".join(tokenizer.decode(list(g)) for cut, g in pieces if not cut))
    return texts


# ----------------------------------------------------------------------------
# The run's folder


def default_data_dir(dcfg):
    """data/<source>-<tokenizer>, the source reduced to a folder-safe name: 'texts/*.txt' -> texts_txt."""
    name = re.sub(r"[^A-Za-z0-9]+", "_", dcfg.source).strip("_") or "corpus"
    return os.path.join("data", f"{name}-{dcfg.tokenizer}")


RUN_FILES = ("run.json", "metrics.jsonl", "incidents.jsonl", "injected.json", "metrics.png", "pipeline.png",
             "samples.txt", "ckpt")


def config_changes(old, new):
    """['n_layer: 2 -> 3', ...] for every field of the nested config dicts that differs."""
    return [
        f"{name}: {old.get(section, {}).get(name)!r} -> {value!r}"
        for section, fields in new.items()
        for name, value in fields.items()
        if old.get(section, {}).get(name) != value
    ]


def load_or_prepare(dcfg, data_dir):
    """The meta of data_dir's token files, tokenizing the corpus there first if it has none."""
    if not os.path.exists(os.path.join(data_dir, "meta.json")):
        return prepare(dcfg, data_dir)
    meta = load_meta(data_dir)  # prepared earlier, here or by data.py
    if meta["tokenizer"] != dcfg.tokenizer:
        raise ValueError(
            f"{data_dir} holds data tokenized with {meta['tokenizer']!r}, not --tokenizer {dcfg.tokenizer!r}: "
            "pass the tokenizer it was prepared with, or another --data_dir"
        )
    return meta


def prepare_out_dir(out_dir, run, overwrite):
    """Refuse to mix two runs in one folder; --overwrite starts this one afresh there."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "run.json")
    if overwrite:
        for name in RUN_FILES:
            target = os.path.join(out_dir, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            else:
                remove_if_exists(target)
    elif os.path.exists(path):
        with open(path) as f:
            changed = config_changes(json.load(f), run)
        if changed:
            raise ValueError(
                f"{out_dir} holds a different run, whose checkpoints cannot continue with this config "
                f"({'; '.join(changed)}). Choose another --out_dir, or start over there with --overwrite true."
            )
    write_json_atomic(path, run)


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


def rng_state():
    """Every random generator a step may draw from. numpy's key becomes a tensor: a checkpoint
    holds tensors and plain containers only."""
    numpy_state = np.random.get_state(legacy=False)
    numpy_key = torch.from_numpy(numpy_state["state"]["key"].astype(np.int64))
    return {
        "python": random.getstate(),
        "numpy": {**numpy_state, "state": {**numpy_state["state"], "key": numpy_key}},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state):
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    numpy_key = numpy_state["state"]["key"].numpy().astype(np.uint32)
    np.random.set_state({**numpy_state, "state": {**numpy_state["state"], "key": numpy_key}})
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------
# The run


def train(preset, configs):
    mcfg, dcfg, cfg, pcfg, rcfg, scfg = (configs[c] for c in CONFIG_CLASSES)
    # bad layouts are named before any process group work, which would wait for peers
    check_tensor_parallel_layout(mcfg, pcfg.tp)
    if pcfg.pp > 1:
        check_pipeline_layout(mcfg.n_layer, pcfg.pp)
        check_micro_batches(cfg.batch_size, pcfg.micro_batches)
        if pcfg.schedule not in SCHEDULES:
            raise ValueError(f"--schedule {pcfg.schedule!r}: choose one of {', '.join(SCHEDULES)}")
        if pcfg.tp > 1:
            raise ValueError("--tp with --pp: the training loop combines each with --dp, not yet both")
    launch = init_distributed(pcfg.dist_timeout)
    grid = ProcessGrid(pcfg.dp, pcfg.tp, pcfg.pp, launch.rank, launch.world_size)
    is_rank0 = launch.rank == 0
    say = print if is_rank0 else (lambda *args, **kwargs: None)  # one voice for the whole group
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device if cfg.device != "auto" else launch.device)
    dtype = pick_dtype(cfg.dtype, device)
    autocast = autocast_context(device, dtype)
    if pcfg.pp > 1 and dtype == torch.float16:
        raise ValueError(f"--dtype {cfg.dtype} gives float16 here, which needs loss scaling, which the pipeline "
                         "path lacks: pass --dtype bfloat16 or float32")
    out_dir = cfg.out_dir or os.path.join("out", preset)
    data_dir = cfg.data_dir or default_data_dir(dcfg)

    meta = run_on_rank0(lambda: load_or_prepare(dcfg, data_dir), is_rank0)
    # Pad V to a multiple of 64 for fast matmuls (50257 -> 50304); the extra ids are never targets.
    mcfg = dataclasses.replace(mcfg, vocab_size=64 * math.ceil(meta["vocab_size"] / 64))
    # What makes two runs the same run. The layout is not part of it: the same global batch
    # on dp=1 or dp=4 reads the same rows and takes the same step, so either may resume the other.
    global_batch = grid.dp * cfg.batch_size * cfg.gradient_accumulation_steps  # sequences per optimizer step
    layout_fields = ("out_dir", "overwrite", "device", "compile", "batch_size", "gradient_accumulation_steps")
    run = {
        "GPTConfig": asdict(mcfg),
        "TrainConfig": {**{k: v for k, v in asdict(cfg).items() if k not in layout_fields}, "global_batch": global_batch},
        "data": {k: meta[k] for k in ("source", "source_sha256", "tokenizer", "val_fraction")},
    }
    run_on_rank0(lambda: prepare_out_dir(out_dir, run, cfg.overwrite), is_rank0)
    say(f"{grid}" if grid.world_size > 1 else "single process")
    say(f"data {data_dir}: {meta['source']}, {meta['tokenizer']} tokens, "
          f"{meta['train_tokens']:,} train + {meta['val_tokens']:,} val")

    def stream(split, rank=0, world_size=1):
        path = os.path.join(data_dir, f"{split}.bin")
        return TokenStream(path, meta["dtype"], cfg.batch_size, mcfg.block_size, rank, world_size, cfg.lanes)

    train_stream = stream("train", grid.dp_rank, grid.dp)  # each DP rank reads its share of every batch
    val_stream = stream("val", grid.dp_rank, grid.dp)
    # an eval reads eval_iters global batches (fewer if val.bin is smaller), in this rank's micro-batches
    eval_iters = max(1, min(cfg.eval_iters, val_stream.windows_per_epoch // global_batch))
    eval_batches = eval_iters * cfg.gradient_accumulation_steps

    model = GPT(mcfg).to(device)  # initialized whole on every rank, so any layout starts from the same weights
    # the single-device parameter names of each optimizer group: how a checkpoint lists AdamW's state
    optimizer_groups = [[n for n, p in model.named_parameters() if p.dim() >= 2],
                        [n for n, p in model.named_parameters() if p.dim() < 2]]
    if grid.tp > 1:
        tensor_parallel(model, grid)  # each rank keeps its slices of the matrices
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)  # fp16 needs loss scaling
    forward = torch.compile(model) if cfg.compile else model
    trained, pipeline = model, None  # trained: the parameters this rank updates
    if grid.pp > 1:
        trained = PipelineStage(model, grid.pp_rank, grid.pp)  # this rank keeps only its stage
        pipeline = Pipeline(trained, grid, pcfg.schedule, pcfg.micro_batches, mcfg.n_embd, autocast)
        forward_backward, loss_of = pipeline.forward_backward, pipeline.loss
    else:
        forward_backward = make_forward_backward(forward, autocast, scaler)

        def loss_of(x, y):
            with autocast:
                return forward(x, y)[1]

    optimizer = make_optimizer(trained, cfg, device)
    tokens_per_iter = global_batch * mcfg.block_size
    peak_flops = device_peak_flops(device, cfg.peak_tflops)
    ln_vocab = math.log(meta["vocab_size"])
    monitor = HealthMonitor(rcfg.monitor_window, rcfg.spike_factor, rcfg.grad_z_threshold,
                            rcfg.val_rise_evals, rcfg.triggers.split(","))
    # faults strike one process, the last rank, as a failing machine would
    injector = FaultInjector(rcfg.inject, out_dir, active=launch.rank == launch.world_size - 1)
    recovery = {"lr_scale": 1.0, "incidents": 0}  # what incidents changed; saved with every checkpoint
    ckpt_dir = os.path.join(out_dir, "ckpt")
    metrics_path, incidents_path = os.path.join(out_dir, "metrics.jsonl"), os.path.join(out_dir, "incidents.jsonl")

    say(f"device {device}, dtype {str(dtype).replace('torch.', '')}, out {out_dir}")
    step_seconds = timed_step_seconds(forward_backward, trained, [t.to(device) for t in val_stream.next_batch()], device)
    for line in cost_estimate(model, cfg.batch_size, cfg.max_iters, tokens_per_iter, 4 if dtype == torch.float32 else 2,
                              step_seconds * cfg.gradient_accumulation_steps):
        say("cost: " + line)
    # wrapped after the timing pass above, whose backward must not start gradient all-reduces
    dp = DataParallel(trained, grid.dp_group, grid.dp, pcfg.dp_mode, pcfg.bucket_mb, overlap=pipeline is None) \
        if grid.dp > 1 else None

    # A checkpoint holds all that the next step depends on: weights, AdamW moments, the
    # step (so the LR schedule continues), the data position, the RNG, the monitor's baselines.
    # It is saved as a single-device run would save it (tensor-parallel slices gathered), so
    # any layout can resume it.
    def save(step):
        if pipeline is None:
            weights, moments = full_state_dict(model, grid), full_optimizer_state_dict(optimizer, grid)
        else:
            weights, moments = pipeline.full_state_dict(), pipeline.full_optimizer_state_dict(optimizer, optimizer_groups)
        healthy = monitor.take_healthy_mark()  # before the monitor's state is captured below
        state = {
            "model": weights, "optimizer": moments, "scaler": scaler.state_dict(),
            "step": step, "data": train_stream.state_dict(), "rng": rng_state(),
            "monitor": monitor.state_dict(), "recovery": dict(recovery), "config": run, "meta": meta,
        }

        def write():  # one rank writes; every rank may read it back after this returns
            checkpoint.save(ckpt_dir, step, state, healthy)
            checkpoint.retain(ckpt_dir, rcfg.keep_last, rcfg.keep_every)

        run_on_rank0(write, is_rank0)

    def restore(state):
        changed = config_changes(state["config"], {"GPTConfig": run["GPTConfig"]})
        if changed:
            raise ValueError(f"the checkpoint holds a model of another shape ({'; '.join(changed)})")
        if pipeline is None:
            load_full_state_dict(model, state["model"], grid)
        else:
            pipeline.load_full_state_dict(state["model"])
        if "optimizer" in state and pipeline is None:
            load_full_optimizer_state_dict(optimizer, state["optimizer"], grid)
        elif "optimizer" in state:
            pipeline.load_full_optimizer_state_dict(optimizer, state["optimizer"], optimizer_groups)
        elif not rcfg.reset_optimizer:
            raise ValueError(
                f"the checkpoint of step {state['step']} in {ckpt_dir} has no optimizer state. Resuming would "
                "restart AdamW's moment estimates from zero, a jolt in update size and direction that weights "
                "alone cannot undo. Pass --reset_optimizer true to accept that and continue anyway."
            )
        else:
            say("warning: no optimizer state in the checkpoint; AdamW restarts from zero moments")
        if state.get("scaler"):  # empty when the saving run had no fp16 loss scaling
            scaler.load_state_dict(state["scaler"])
        train_stream.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        monitor.load_state_dict(state["monitor"])
        recovery.update(state["recovery"])
        return state["step"]

    latest = checkpoint.load_latest(ckpt_dir, warn=say)  # onto the CPU: RNG states must stay there
    if latest is not None:
        step = restore(latest[1])
        say(f"resuming from the checkpoint of step {step} in {ckpt_dir}")
    elif rcfg.resume:
        raise ValueError(f"--resume true, but {ckpt_dir} holds no checkpoint that verifies")
    else:
        step = 0
        save(0)
    records = [r for r in read_jsonl(metrics_path) if r["step"] < step]  # the timeline that led here
    if is_rank0:
        write_jsonl(metrics_path, records)

    def roll_back(step, fired):
        """The runbook: restore the latest healthy checkpoint, skip the data that led here, lower the LR."""
        recovery["incidents"] += 1
        detector, values = fired[0]
        if recovery["incidents"] > rcfg.max_incidents:
            raise ValueError(
                f"stopping after {recovery['incidents']} incidents (--max_incidents {rcfg.max_incidents}); the last: "
                f"{detector} at step {step} {values}. The healthy checkpoints in {ckpt_dir} are intact: read "
                f"{incidents_path}, then resume with a lower --learning_rate or a larger --max_incidents."
            )
        bad_end, incidents, lr_scale = train_stream.position, recovery["incidents"], recovery["lr_scale"]
        latest = checkpoint.load_latest(ckpt_dir, healthy_only=True, warn=say)
        if latest is None:
            raise ValueError(f"{detector} at step {step}, and no healthy checkpoint in {ckpt_dir} to roll back to")
        restored = restore(latest[1])
        skipped = [train_stream.position, bad_end]
        train_stream.position = bad_end
        recovery.update(incidents=incidents, lr_scale=lr_scale * rcfg.incident_lr_scale)
        discarded = run_on_rank0(lambda: checkpoint.discard_after(ckpt_dir, restored), is_rank0)
        save(restored)  # the restored state, with the skip and the lower LR, so a crash now keeps them
        records[:] = [r for r in records if r["step"] < restored]
        incident = {"step": step, "detector": detector, "values": values, "action": {
            "restored_step": restored, "skipped_rows": skipped, "lr_scale": recovery["lr_scale"],
            "discarded_checkpoints": discarded}}
        if is_rank0:
            write_jsonl(metrics_path, records)
            append_jsonl(incidents_path, incident)
        say(f"INCIDENT at step {step}: {detector} {values} -> rolled back to step {restored}, skipped data rows "
              f"{skipped[0]}..{skipped[1]}, LR x{recovery['lr_scale']:.3g}", flush=True)
        return restored

    interval_start, interval_steps, eval_seconds, run_start = time.perf_counter(), 0, 0.0, time.perf_counter()
    while True:
        record = {"step": step}
        if step % cfg.eval_interval == 0 or step == cfg.max_iters:
            t0 = time.perf_counter()
            record["val_loss"] = evaluate(loss_of, trained, val_stream, eval_batches, device, grid)
            eval_seconds += time.perf_counter() - t0
            fired = monitor.check_eval(record["val_loss"])
            if monitor.is_incident(fired):
                step = roll_back(step, fired)
                continue
        if step == cfg.max_iters:
            break

        next_batch = train_stream.next_batch
        for fault in injector.due(step):
            print(f"rank {launch.rank}: injecting fault: {fault} at step {step}", flush=True)
            if fault == "crash":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault == "nan":
                with torch.no_grad():
                    next(trained.parameters()).view(-1)[0] = float("nan")
            elif fault == "spike":
                next_batch = garbage_batches(train_stream, meta["vocab_size"], seed=step)
        lr = lr_at(step, cfg) * recovery["lr_scale"]
        loss, grad_norm = optimizer_step(forward_backward, trained, optimizer, scaler, next_batch, cfg, lr, device, dp,
                                         grid, pipeline.after_backward if pipeline else None)
        # the logged loss is the mean over DP ranks; the grad norm is already that of the averaged gradient
        loss = all_reduce_mean(loss, grid.dp_group, grid.dp).item()  # .item() waits for the device
        grad_norm = grad_norm.item()
        grad_norm_z, step_fired = monitor.check_step(loss, grad_norm)
        fired = step_fired + fired if "val_loss" in record else step_fired
        if monitor.is_incident(fired):
            step = roll_back(step, fired)
            continue
        for detector, values in fired:
            say(f"warning at step {step}: {detector} {values}; the next checkpoint is marked unhealthy")
        interval_steps += 1

        if step % cfg.log_interval == 0 or "val_loss" in record or step == cfg.max_iters - 1:
            elapsed = time.perf_counter() - interval_start - eval_seconds
            tokens_per_s = interval_steps * tokens_per_iter / max(elapsed, 1e-9)
            record.update(loss=loss, lr=lr, grad_norm=grad_norm, grad_norm_z=grad_norm_z, tokens_per_s=tokens_per_s)
            line = f"step {step:5d} | loss {loss:.4f} | lr {lr:.2e} | grad norm {grad_norm:.3f}"
            line += f" | {tokens_per_s:,.0f} tok/s"
            if peak_flops:
                # tokens/s counts the whole group; each of its devices has this peak
                record["mfu"] = model.flops_per_token() * tokens_per_s / (peak_flops * grid.world_size)
                line += f" | MFU {100 * record['mfu']:.1f}%"
            line += f" | ETA {(cfg.max_iters - step - 1) * elapsed / interval_steps / 60:.1f} min"
            if "val_loss" in record:
                line += f" | val loss {record['val_loss']:.4f}"
            if step == 0:
                line += f"\n  a fresh model guesses uniformly: loss ~ ln(vocab) = ln {meta['vocab_size']} = {ln_vocab:.4f}"
            say(line, flush=True)
            records.append(record)
            if is_rank0:
                append_jsonl(metrics_path, record)
            interval_start, interval_steps, eval_seconds = time.perf_counter(), 0, 0.0
        step += 1
        if step % rcfg.ckpt_interval == 0 or step == cfg.max_iters:
            save(step)

    # final evaluation: val loss and perplexity, plot, samples
    val_loss = record["val_loss"]
    records.append(record)
    say(f"final val loss {val_loss:.4f}, perplexity {math.exp(val_loss):.2f} "
          f"(uniform guessing: {meta['vocab_size']}) after {(time.perf_counter() - run_start) / 60:.1f} min")
    # every rank takes part in gathering the slices and stages
    whole = full_state_dict(model, grid) if pipeline is None else pipeline.full_state_dict()
    timeline = pipeline.gather_timeline() if pipeline else None
    if not is_rank0:
        return
    if timeline:  # the last training step, as the pipeline ran it
        formula = (grid.pp - 1) / (pcfg.micro_batches + grid.pp - 1)
        say(f"pipeline bubble of the last step: measured {bubble_fraction(timeline):.3f}, "
            f"(p - 1) / (m + p - 1) = {formula:.3f} ({pcfg.schedule}, p={grid.pp}, m={pcfg.micro_batches})")
        plot_gantt(timeline, os.path.join(out_dir, "pipeline.png"),
                   f"{pcfg.schedule}, p={grid.pp}, m={pcfg.micro_batches}: bubble {bubble_fraction(timeline):.2f}")
    if grid.tp > 1 or grid.pp > 1:
        model = GPT(mcfg).to(device)
        model.load_state_dict(whole)
    append_jsonl(metrics_path, record)
    plot_metrics(records, read_jsonl(incidents_path), os.path.join(out_dir, "metrics.png"), ln_vocab)
    samples = sample_texts(model, get_tokenizer(meta["tokenizer"]), scfg, device)
    with open(os.path.join(out_dir, "samples.txt"), "w") as f:
        f.write("\n\n==========\n\n".join(samples) + "\n")
    print(f"samples:\n{samples[0]}\nwrote {out_dir}: metrics.jsonl, metrics.png, samples.txt, ckpt/")


def sample(preset, configs):
    cfg, scfg = configs[TrainConfig], configs[SampleConfig]
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    ckpt_dir = os.path.join(cfg.out_dir or os.path.join("out", preset), "ckpt")
    latest = checkpoint.load_latest(ckpt_dir, device)
    if latest is None:
        raise ValueError(f"no checkpoint in {ckpt_dir}: train first (python train.py --out_dir ...)")
    state = latest[1]
    model = GPT(GPTConfig(**state["config"]["GPTConfig"])).to(device)
    model.load_state_dict(state["model"])
    for text in sample_texts(model, get_tokenizer(state["meta"]["tokenizer"]), scfg, device):
        print(text, "\n==========")


def main(argv=None):
    try:
        preset, sample_mode, configs = parse_args(sys.argv[1:] if argv is None else argv)
        (sample if sample_mode else train)(preset, configs)
    except ValueError as e:
        sys.exit(f"error: {e}")
    except RuntimeError as e:
        if not dist.is_initialized():
            raise
        # gloo and NCCL report a peer that died or stopped answering as a RuntimeError in a collective
        sys.exit(f"error: rank {dist.get_rank()} lost contact with the other ranks ({str(e).splitlines()[0][:300]}). "
                 "If another rank died, run the same command again to resume from the last checkpoint.")
    finally:
        destroy_distributed()


if __name__ == "__main__":
    main()
