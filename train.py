"""Pretrain a GPT from scratch: forward -> CLM loss -> backward -> clip -> AdamW, and the run around it.

    python train.py                                  # the `tiny` preset: stdlib corpus, bytes, CPU, minutes
    python train.py --preset shakespeare             # nanoGPT's CPU "baby GPT" on Tiny Shakespeare
    python train.py --preset gpt2-small --source 'corpus/*.txt'   # 124M parameters, one GPU, days
    python train.py --n_layer 6 --learning_rate 3e-4 # any config field, as --name value
    python train.py --sample --out_dir out/tiny      # sample from a finished run

The four stability defenses are all here: LR warmup then cosine decay
(`lr_at`), global grad-norm clipping (`clip_grad_norm`), mixed precision with
fp32 master weights and fp32 loss / norm sums (`--dtype`), and Pre-LN +
RMSNorm + scaled init (model.py). A run writes into its out_dir:
metrics.jsonl, metrics.png, samples.txt, ckpt.pt and run.json.
"""

import argparse
import contextlib
import dataclasses
import difflib
import json
import math
import os
import re
import sys
import time
from itertools import groupby
from dataclasses import asdict, dataclass

import numpy as np
import torch

from data import DataConfig, TokenStream, get_tokenizer, load_meta, prepare, write_json_atomic
from model import GPT, GPTConfig

# ----------------------------------------------------------------------------
# Configuration: one dataclass per concern; defaults are the `tiny` preset


@dataclass
class TrainConfig:
    out_dir: str = ""  # where the run writes; "" = out/<preset>
    data_dir: str = ""  # prepared token files; "" = data/<source>-<tokenizer>, prepared on first use
    overwrite: bool = False  # allow replacing a different run in out_dir
    seed: int = 1337
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto (bfloat16 on GPUs that have it, else float16; float32 on CPU) | float32 | bfloat16 | float16
    compile: bool = False  # torch.compile the model
    # batch: one optimizer step sees batch_size * gradient_accumulation_steps sequences of block_size tokens
    batch_size: int = 16  # sequences per forward pass (per process)
    gradient_accumulation_steps: int = 1
    lanes: int = 64  # the token file is read as this many interleaved lanes (see data.TokenStream)
    # AdamW, LR schedule, clipping
    max_iters: int = 2000
    learning_rate: float = 2e-3  # peak LR, reached at the end of warmup
    min_lr: float = 2e-4  # the cosine ends here, at lr_decay_iters
    warmup_iters: int = 100
    lr_decay_iters: int = 0  # 0 = max_iters
    weight_decay: float = 0.1  # on matrices and embeddings; never on norms and biases
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    # monitoring
    log_interval: int = 25
    eval_interval: int = 250
    eval_iters: int = 20  # batches per val-loss estimate: always the same first batches of val.bin
    peak_tflops: float = 0.0  # device peak for MFU; 0 = look it up by GPU name


@dataclass
class SampleConfig:
    prompt: str = ""  # text to continue; "" = start from the end-of-text token
    num_samples: int = 3
    max_new_tokens: int = 300
    temperature: float = 0.8
    top_k: int = 200


PRESETS = {
    "tiny": {},  # the defaults above: ~0.8M parameters on Python's own source code, minutes on a laptop CPU
    # nanoGPT's CPU "baby GPT" (README of karpathy/nanoGPT): val loss ~1.88 at 2000 iterations
    "shakespeare": dict(
        source="shakespeare", block_size=64, batch_size=12, n_layer=4, n_head=4, n_embd=128,
        max_iters=2000, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, beta2=0.99,
        eval_iters=200, log_interval=10,
    ),
    # GPT-2 small (124M) on one GPU: 2^19 tokens per step (16 x 1024 x 32), 19073 steps = 10B tokens.
    "gpt2-small": dict(
        tokenizer="gpt2", block_size=1024, n_layer=12, n_head=12, n_embd=768,
        batch_size=16, gradient_accumulation_steps=32, lanes=512, max_iters=19073,
        learning_rate=6e-4, min_lr=6e-5, warmup_iters=700, beta2=0.95,
        log_interval=10, eval_interval=500, eval_iters=50, compile=True,
    ),
}


def parse_bool(text):
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


CONFIG_CLASSES = (GPTConfig, DataConfig, TrainConfig, SampleConfig)


def parse_args(argv):
    """--preset NAME, --sample, and --field value for every field of the config dataclasses.

    Precedence: dataclass default < preset < command line. Returns
    (preset, sample_mode, {config class: instance}).
    """
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--preset", default="tiny", help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("--sample", action="store_true", help="sample from the checkpoint in --out_dir")
    owner = {}
    for cls in CONFIG_CLASSES:
        for f in dataclasses.fields(cls):
            if f.name in ("vocab_size",):  # set from the data, not by hand
                continue
            owner[f.name] = cls
            kind = parse_bool if f.type is bool else f.type
            parser.add_argument(f"--{f.name}", type=kind, default=None, help=f"{cls.__name__} (default {f.default!r})")
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        flag = unknown[0].split("=")[0]
        valid = ["--preset", "--sample"] + [f"--{name}" for name in owner]
        close = difflib.get_close_matches(flag, valid, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        parser.error(f"unknown flag {flag}{hint}. Valid flags: {' '.join(valid)}")
    if args.preset not in PRESETS:
        parser.error(f"unknown preset {args.preset!r}: choose one of {', '.join(PRESETS)}")
    values = {**PRESETS[args.preset], **{k: v for k, v in vars(args).items() if v is not None and k in owner}}
    configs = {cls: cls(**{k: v for k, v in values.items() if owner[k] is cls}) for cls in CONFIG_CLASSES}
    return args.preset, args.sample, configs


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


def clip_grad_norm(parameters, max_norm):
    """Scale all gradients by one factor so their global L2 norm is at most max_norm.

    Returns the norm before clipping. The sum of squares runs in fp32 whatever
    the gradients' dtype: it is the kind of sum that overflows or loses precision in 16 bits.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.sqrt(sum(g.detach().float().pow(2).sum() for g in grads))
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


# ----------------------------------------------------------------------------
# Monitoring and the cost account

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, matched against the device name.
GPU_PEAK_FLOPS = {
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "A10G": 70e12, "A10": 125e12, "L40S": 362e12,
    "L4": 121e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12,
}


def device_peak_flops(device, cfg):
    if cfg.peak_tflops > 0:
        return cfg.peak_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_FLOPS.items() if key in name), None)


def cost_estimate(model, cfg, tokens_per_iter, dtype, step_seconds):
    """Lines of the run's cost account: compute, memory and time, before training starts."""
    N, mc = model.num_params(), model.config
    tokens = cfg.max_iters * tokens_per_iter
    flops = model.flops_per_token() * tokens  # 6 N D + attention
    act_bytes = 2 if dtype != torch.float32 else 4
    # Activations kept for backward per layer ~ B T C (34 + 5 H T / C) bytes at 16 bits
    # (Korthikanti et al. 2022, no recomputation), plus the logits and their fp32 copy.
    B, T, C, H, L, V = cfg.batch_size, mc.block_size, mc.n_embd, mc.n_head, mc.n_layer, mc.vocab_size
    activations = L * B * T * C * (34 + 5 * H * T / C) * act_bytes / 2 + B * T * V * (act_bytes + 4)
    hours = step_seconds * cfg.max_iters / 3600
    h100_hours = flops / (0.4 * GPU_PEAK_FLOPS["H100"]) / 3600
    gib = 2**30
    return [
        f"parameters: {N / 1e6:.2f}M; planned tokens: {tokens / 1e6:.1f}M ({tokens / N:.1f} per parameter)",
        f"training compute: {flops:.3g} FLOPs (6 N D = {6 * N * tokens:.3g}, plus attention)",
        f"memory: weights {4 * N / gib:.3f} GiB + grads {4 * N / gib:.3f} + AdamW {8 * N / gib:.3f} "
        f"+ activations ~{activations / gib:.3f} per micro-batch",
        f"measured step: {step_seconds * 1e3:.0f} ms -> ~{hours * 60:.1f} min for {cfg.max_iters} steps on this device",
        f"the same FLOPs on one H100 at 40% MFU: {h100_hours:.3g} GPU-hours (~${2 * h100_hours:.3g} at $2/GPU-hour)",
    ]


def timed_step_seconds(model, batch, autocast, device, repeats=3):
    """The fastest of a few forward + backward passes (the first one warms up), then drop the gradients."""
    x, y = batch
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return min(times)


def optimizer_step(forward, model, optimizer, scaler, stream, cfg, lr, autocast, device):
    """One update at learning rate lr: gradients of the mean loss over
    cfg.gradient_accumulation_steps micro-batches, clip, AdamW.
    Returns (mean loss, global grad norm before clipping), both 0-dim tensors."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=device)
    for _ in range(cfg.gradient_accumulation_steps):
        x, y = (t.to(device, non_blocking=True) for t in stream.next_batch())  # (B, T) each
        with autocast:
            _, loss = forward(x, y)
        # dividing by the number of micro-batches makes the summed gradient that of their mean loss
        scaler.scale(loss / cfg.gradient_accumulation_steps).backward()
        loss_sum += loss.detach()
    scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
    grad_norm = clip_grad_norm(model.parameters(), cfg.grad_clip)
    scaler.step(optimizer)  # skips the step if fp16 gradients overflowed
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum / cfg.gradient_accumulation_steps, grad_norm


@torch.no_grad()
def evaluate(model, stream, iters, autocast, device):
    """Mean loss over the first `iters` batches of the stream: the same batches every time."""
    model.eval()
    stream.load_state_dict({"position": 0})
    losses = []
    for _ in range(iters):
        x, y = stream.next_batch()
        with autocast:
            _, loss = model(x.to(device), y.to(device))
        losses.append(loss.item())
    model.train()
    return float(np.mean(losses))


def plot_metrics(records, path, ln_vocab):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    train = [r for r in records if "loss" in r]  # the final record holds only the val loss
    steps = [r["step"] for r in train]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    axes[0].plot(steps, [r["loss"] for r in train], label="train loss")
    if val:
        axes[0].plot(*zip(*val), "o-", label="val loss")
    axes[0].axhline(ln_vocab, color="gray", ls="--", label="ln V (uniform guess)")
    axes[0].set(xlabel="step", ylabel="loss", title="loss")
    axes[0].legend()
    axes[1].plot(steps, [r["grad_norm"] for r in train])
    axes[1].set(xlabel="step", yscale="log", title="grad norm (before clipping)")
    axes[2].plot(steps, [r["lr"] for r in train])
    axes[2].set(xlabel="step", title="learning rate")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------
# Checkpoint and sampling


def save_checkpoint(path, model, optimizer, step, stream, configs, meta):
    """Everything needed to sample now and to resume later, written atomically."""
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "data": stream.state_dict(),
        "config": {cls.__name__: asdict(c) for cls, c in configs.items()},
        "meta": meta,
    }
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_model(path, device):
    """Rebuild the model of a checkpoint. weights_only=True: loading can never run code."""
    if not os.path.exists(path):
        raise ValueError(f"{path} not found: train first (python train.py --out_dir {os.path.dirname(path)})")
    state = torch.load(path, map_location=device, weights_only=True)
    model = GPT(GPTConfig(**state["config"]["GPTConfig"])).to(device)
    model.load_state_dict(state["model"])
    return model, state["meta"]


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
# The run


def default_data_dir(dcfg):
    """data/<source>-<tokenizer>, the source reduced to a folder-safe name: 'texts/*.txt' -> texts_txt."""
    name = re.sub(r"[^A-Za-z0-9]+", "_", dcfg.source).strip("_") or "corpus"
    return os.path.join("data", f"{name}-{dcfg.tokenizer}")


def prepare_out_dir(out_dir, run, overwrite):
    """Refuse to write over a different run; record this run's config as run.json."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "run.json")
    if os.path.exists(path) and not overwrite:
        with open(path) as f:
            old = json.load(f)
        changed = [
            f"{name}: {old[section].get(name)!r} -> {value!r}"
            for section, fields in run.items()
            for name, value in fields.items()
            if old.get(section, {}).get(name) != value
        ]
        if changed:
            raise ValueError(
                f"{out_dir} holds a different run ({'; '.join(changed)}). "
                "Choose another --out_dir, or replace it with --overwrite true."
            )
    write_json_atomic(path, run)


def train(preset, configs):
    mcfg, dcfg, cfg, scfg = (configs[c] for c in CONFIG_CLASSES)
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device)
    dtype = pick_dtype(cfg.dtype, device)
    autocast = autocast_context(device, dtype)
    out_dir = cfg.out_dir or os.path.join("out", preset)
    data_dir = cfg.data_dir or default_data_dir(dcfg)

    if os.path.exists(os.path.join(data_dir, "meta.json")):  # prepared earlier, here or by data.py
        meta = load_meta(data_dir)
        if meta["tokenizer"] != dcfg.tokenizer:
            raise ValueError(
                f"{data_dir} holds data tokenized with {meta['tokenizer']!r}, not --tokenizer {dcfg.tokenizer!r}: "
                "pass the tokenizer it was prepared with, or another --data_dir"
            )
    else:
        meta = prepare(dcfg, data_dir)
    # Pad V to a multiple of 64 for fast matmuls (50257 -> 50304); the extra ids are never targets.
    mcfg = dataclasses.replace(mcfg, vocab_size=64 * math.ceil(meta["vocab_size"] / 64))
    configs[GPTConfig] = mcfg
    run = {
        "GPTConfig": asdict(mcfg),
        "TrainConfig": {k: v for k, v in asdict(cfg).items() if k not in ("out_dir", "overwrite")},
        "data": {k: meta[k] for k in ("source", "source_sha256", "tokenizer", "val_fraction")},
    }
    prepare_out_dir(out_dir, run, cfg.overwrite)
    print(f"data {data_dir}: {meta['source']}, {meta['tokenizer']} tokens, "
          f"{meta['train_tokens']:,} train + {meta['val_tokens']:,} val")

    def stream(split):
        path = os.path.join(data_dir, f"{split}.bin")
        return TokenStream(path, meta["dtype"], cfg.batch_size, mcfg.block_size, lanes=cfg.lanes)

    train_stream, val_stream = stream("train"), stream("val")
    eval_iters = max(1, min(cfg.eval_iters, val_stream.windows_per_epoch // cfg.batch_size))

    model = GPT(mcfg).to(device)
    optimizer = make_optimizer(model, cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)  # fp16 needs loss scaling
    forward = torch.compile(model) if cfg.compile else model
    tokens_per_iter = cfg.batch_size * cfg.gradient_accumulation_steps * mcfg.block_size
    peak_flops = device_peak_flops(device, cfg)
    ln_vocab = math.log(meta["vocab_size"])

    print(f"device {device}, dtype {str(dtype).replace('torch.', '')}, out {out_dir}")
    step_seconds = timed_step_seconds(forward, (t.to(device) for t in val_stream.next_batch()), autocast, device)
    for line in cost_estimate(model, cfg, tokens_per_iter, dtype, step_seconds * cfg.gradient_accumulation_steps):
        print("cost: " + line)

    records = []
    metrics_file = open(os.path.join(out_dir, "metrics.jsonl"), "w")
    interval_start, interval_steps, eval_seconds, run_start = time.perf_counter(), 0, 0.0, time.perf_counter()
    for step in range(cfg.max_iters + 1):
        last = step == cfg.max_iters
        record = {"step": step}
        if step % cfg.eval_interval == 0 or last:
            t0 = time.perf_counter()
            record["val_loss"] = evaluate(forward, val_stream, eval_iters, autocast, device)
            eval_seconds += time.perf_counter() - t0
        if last:
            break

        lr = lr_at(step, cfg)
        loss, grad_norm = optimizer_step(forward, model, optimizer, scaler, train_stream, cfg, lr, autocast, device)
        interval_steps += 1

        if step % cfg.log_interval == 0 or "val_loss" in record or step == cfg.max_iters - 1:
            loss = loss.item()  # waits for the device: only on logged steps
            elapsed = time.perf_counter() - interval_start - eval_seconds
            tokens_per_s = interval_steps * tokens_per_iter / max(elapsed, 1e-9)
            record.update(loss=loss, lr=lr, grad_norm=grad_norm.item(), tokens_per_s=tokens_per_s)
            line = f"step {step:5d} | loss {loss:.4f} | lr {lr:.2e} | grad norm {record['grad_norm']:.3f}"
            line += f" | {tokens_per_s:,.0f} tok/s"
            if peak_flops:
                record["mfu"] = model.flops_per_token() * tokens_per_s / peak_flops
                line += f" | MFU {100 * record['mfu']:.1f}%"
            line += f" | ETA {(cfg.max_iters - step - 1) * elapsed / interval_steps / 60:.1f} min"
            if "val_loss" in record:
                line += f" | val loss {record['val_loss']:.4f}"
            if step == 0:
                line += f"\n  a fresh model guesses uniformly: loss ~ ln(vocab) = ln {meta['vocab_size']} = {ln_vocab:.4f}"
            print(line, flush=True)
            records.append(record)
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()
            interval_start, interval_steps, eval_seconds = time.perf_counter(), 0, 0.0

    # final evaluation: val loss and perplexity, plot, samples, checkpoint
    val_loss = record["val_loss"]
    records.append(record)
    metrics_file.write(json.dumps(record) + "\n")
    metrics_file.close()
    print(f"final val loss {val_loss:.4f}, perplexity {math.exp(val_loss):.2f} "
          f"(uniform guessing: {meta['vocab_size']}) after {(time.perf_counter() - run_start) / 60:.1f} min")
    plot_metrics(records, os.path.join(out_dir, "metrics.png"), ln_vocab)
    save_checkpoint(os.path.join(out_dir, "ckpt.pt"), model, optimizer, cfg.max_iters, train_stream, configs, meta)
    samples = sample_texts(model, get_tokenizer(meta["tokenizer"]), scfg, device)
    with open(os.path.join(out_dir, "samples.txt"), "w") as f:
        f.write("\n\n==========\n\n".join(samples) + "\n")
    print(f"samples:\n{samples[0]}\nwrote {out_dir}/metrics.jsonl, metrics.png, samples.txt, ckpt.pt")


def sample(preset, configs):
    cfg, scfg = configs[TrainConfig], configs[SampleConfig]
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    out_dir = cfg.out_dir or os.path.join("out", preset)
    model, meta = load_model(os.path.join(out_dir, "ckpt.pt"), device)
    for text in sample_texts(model, get_tokenizer(meta["tokenizer"]), scfg, device):
        print(text, "\n==========")


def main(argv=None):
    try:
        preset, sample_mode, configs = parse_args(sys.argv[1:] if argv is None else argv)
        (sample if sample_mode else train)(preset, configs)
    except ValueError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
