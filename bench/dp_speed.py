"""Tokens/s of data parallelism on 2 ranks over gloo: our bucketed DP, our naive DP,
torch's DistributedDataParallel, and one process, on the same model and global batch.

    python bench/dp_speed.py [--steps 30] [--world_size 2]

The model is the `tiny` preset's (4 layers, width 128, block 128); the global
batch is 16 sequences, split over the ranks. Each rank runs with
cores / ranks threads; the single process gets all cores.
"""

import argparse
import multiprocessing
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from parallel import DataParallel  # noqa: E402

GLOBAL_BATCH, BLOCK = 16, 128


def timed_steps(mode, rank, world_size, steps, warmup):
    """Run warmup + steps optimizer steps; return this rank's seconds for the timed ones."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=BLOCK, vocab_size=256, n_layer=4, n_head=4, n_embd=128))
    cfg = train.TrainConfig(batch_size=GLOBAL_BATCH // world_size)
    device = torch.device("cpu")
    forward, dp = model, None
    if mode in ("bucketed", "naive"):
        dp = DataParallel(model, dist.group.WORLD, world_size, mode, bucket_mb=25)
    elif mode == "DDP":
        forward = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = train.make_optimizer(model, cfg, device)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    autocast = train.autocast_context(device, torch.float32)
    generator = torch.Generator().manual_seed(rank)

    def next_batch():
        tokens = torch.randint(256, (cfg.batch_size, BLOCK + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    for step in range(warmup + steps):
        if step == warmup:
            if dist.is_initialized():
                dist.barrier()
            t0 = time.perf_counter()
        train.optimizer_step(forward, model, optimizer, scaler, next_batch, cfg, 1e-3, autocast, device, dp)
    return time.perf_counter() - t0


def worker(mode, rank, world_size, port, steps, warmup, results):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=120))
    try:
        results.put((rank, timed_steps(mode, rank, world_size, steps, warmup)))
    except Exception as e:  # tell the parent at once instead of leaving it waiting
        results.put((rank, e))
        raise
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(mode, world_size, steps, warmup):
    if mode == "one process":
        torch.set_num_threads(os.cpu_count() or 1)
        return timed_steps(mode, 0, 1, steps, warmup)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter per rank, as torchrun would start
    results = context.Queue()
    port = free_port()
    workers = [context.Process(target=worker, args=(mode, r, world_size, port, steps, warmup, results))
               for r in range(world_size)]
    for w in workers:
        w.start()
    reports = [results.get(timeout=600)[1] for _ in workers]
    for w in workers:
        w.join()
    failures = [r for r in reports if isinstance(r, Exception)]
    if failures:
        raise RuntimeError(f"{mode}: a rank failed: {failures[0]!r}")
    return max(reports)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--world_size", type=int, default=2)
    args = parser.parse_args()
    tokens = args.steps * GLOBAL_BATCH * BLOCK
    print(f"tiny GPT, global batch {GLOBAL_BATCH} x {BLOCK} tokens, {args.world_size} ranks on gloo, "
          f"{os.cpu_count()} cores, torch {torch.__version__}")
    print(f"{'mode':<14} {'tokens/s':>10} {'ms/step':>9}")
    for mode in ("bucketed", "naive", "DDP", "one process"):
        seconds = measure(mode, args.world_size, args.steps, args.warmup)
        print(f"{mode:<14} {tokens / seconds:>10,.0f} {1e3 * seconds / args.steps:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
