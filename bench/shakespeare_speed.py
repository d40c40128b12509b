"""Tokens/s of the shakespeare preset's training step, one process, eager vs torch.compile.

    python bench/shakespeare_speed.py [--steps 50] [--device auto] [--dtype auto]

Times optimizer_step (forward, backward, clip, AdamW) on random tokens of the
preset's shape (batch 12 x block 64, 4 layers, 4 heads, width 128) after a
warm-up that absorbs compilation, and prints a table.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
from data import TokenStream  # noqa: E402
from machinery.components import run_setup  # noqa: E402
from machinery.job import config  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from parallel.grid import Layout, ProcessGrid  # noqa: E402
from parallel.layout import model_for_rank  # noqa: E402


def measure(compiled, steps, warmup, device, dtype, token_file):
    preset = config.PRESETS["shakespeare"]
    cfg = config.TrainConfig(**{k: v for k, v in preset.items() if k in config.TrainConfig.__dataclass_fields__})
    gpt_config = GPTConfig(**{k: v for k, v in preset.items() if k in GPTConfig.__dataclass_fields__})
    torch.manual_seed(0)
    autocast = run_setup.autocast_context(device, dtype)
    whole = GPT(gpt_config).to(device)
    model = model_for_rank(whole, ProcessGrid(), Layout(), cfg.batch_size, dtype, autocast, compiled)
    optimizer = run_setup.make_optimizer(model.module, cfg, device, model.dp)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    stream = TokenStream(token_file, "uint16", cfg.batch_size, gpt_config.block_size, lanes=cfg.lanes)
    t_start = time.perf_counter()
    for step in range(warmup + steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            warmup_seconds, t0 = time.perf_counter() - t_start, time.perf_counter()
        loss, _ = train.optimizer_step(model, optimizer, scaler, stream.next_batch, 1e-3, cfg)
    loss.item()
    seconds = time.perf_counter() - t0
    tokens = steps * cfg.batch_size * gpt_config.block_size
    return tokens / seconds, 1e3 * seconds / steps, warmup_seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    device = run_setup.pick_device(args.device)
    dtype = run_setup.pick_dtype(args.dtype, device)
    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "tokens.bin")
        np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint16).tofile(token_file)
        print(
            f"shakespeare preset step, {device}, {str(dtype).replace('torch.', '')}, "
            f"{torch.get_num_threads()} threads, torch {torch.__version__}"
        )
        print(f"{'mode':<10} {'tokens/s':>10} {'ms/iter':>9} {'warm-up s':>10}")
        for name, compiled in (("eager", False), ("compiled", True)):
            tokens_per_s, ms, warm = measure(compiled, args.steps, args.warmup, device, dtype, token_file)
            print(f"{name:<10} {tokens_per_s:>10,.0f} {ms:>9.1f} {warm:>10.1f}")


if __name__ == "__main__":
    main()
