"""Tokens/s of hand-written parallelism on 2 ranks over gloo, on the same model and global batch:
our bucketed DP, our naive DP, torch's DistributedDataParallel, our tensor parallelism
(tp=2), and one process. For TP it also counts the bytes the f/g operators and the loss
all-reduce per step, beside the closed form.

    python bench/parallel_speed.py [--steps 30] [--world_size 2]

The model is the `tiny` preset's (4 layers, width 128, block 128); the global
batch is 16 sequences (split over the ranks under DP, whole on each rank under
TP). Each rank runs with cores / ranks threads; the single process gets all cores.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
from machinery.components import run_setup  # noqa: E402
from machinery.job import config  # noqa: E402
from machinery.job.local_ranks import results_of, run_ranks  # noqa: E402
from machinery.job.torch_engines import rank_model  # noqa: E402
from machinery.planning.closed_forms import comm_bytes_per_step  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from parallel.comm_count import take_comm_bytes  # noqa: E402
from parallel.grid import Layout, ProcessGrid, destroy_distributed, init_distributed  # noqa: E402

GLOBAL_BATCH, BLOCK = 16, 128
MODEL = GPTConfig(block_size=BLOCK, vocab_size=256, n_layer=4, n_head=4, n_embd=128)
MODES = ("bucketed DP", "naive DP", "DDP", "TP", "one process")


def timed_steps(mode, rank, world_size, steps, warmup, bucket_mb):
    """Run warmup + steps optimizer steps; return (this rank's seconds for the timed ones, TP bytes of the last)."""
    torch.manual_seed(0)
    gpt = GPT(MODEL)
    cfg = config.TrainConfig(batch_size=GLOBAL_BATCH if mode in ("TP", "one process") else GLOBAL_BATCH // world_size)
    layout = {
        "bucketed DP": Layout(dp=world_size, bucket_mb=bucket_mb),
        "naive DP": Layout(dp=world_size, dp_mode="naive"),
        "DDP": Layout(dp=world_size, dp_mode="ddp", bucket_mb=bucket_mb),
        "TP": Layout(tp=world_size),
    }.get(mode)
    if layout is None:  # one process: each rank alone, outside the group
        model = rank_model(gpt, ProcessGrid(), Layout(), cfg.batch_size)
    else:
        model = rank_model(gpt, ProcessGrid(layout, rank, world_size), layout, cfg.batch_size)
    optimizer = run_setup.make_optimizer(model.module, cfg, model.device, model.dp)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    generator = torch.Generator().manual_seed(rank)

    def next_batch():
        tokens = torch.randint(256, (cfg.batch_size, BLOCK + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    for step in range(warmup + steps):
        if step == warmup:
            if dist.is_initialized():
                dist.barrier()
            t0 = time.perf_counter()
        take_comm_bytes()  # the last step's bytes are counted from zero
        train.optimizer_step(model, optimizer, scaler, next_batch, 1e-3, cfg)
    return time.perf_counter() - t0, take_comm_bytes()["tp"]


def ranked_steps(mode, world_size, steps, warmup, bucket_mb):
    """One rank of a multi-rank mode: join the group torchrun's environment describes, time its steps."""
    launch = init_distributed(120)
    try:
        return timed_steps(mode, launch.rank, world_size, steps, warmup, bucket_mb)
    finally:
        destroy_distributed()


def measure(mode, world_size, steps, warmup, bucket_mb):
    if mode == "one process":
        torch.set_num_threads(os.cpu_count() or 1)
        return timed_steps(mode, 0, 1, steps, warmup, bucket_mb)[0], 0
    # spawned: a fresh interpreter per rank, as torchrun would start them
    reports = results_of(
        run_ranks(
            world_size, ranked_steps, mode, world_size, steps, warmup, bucket_mb, timeout=600, start_method="spawn"
        )
    )
    return max(seconds for seconds, _ in reports), reports[0][1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--bucket_mb", type=float, default=1.0, help="our DP's bucket size (DDP keeps its own)")
    parser.add_argument("--rounds", type=int, default=3, help="modes run interleaved this many times; median kept")
    args = parser.parse_args()
    tokens = args.steps * GLOBAL_BATCH * BLOCK
    print(
        f"tiny GPT, global batch {GLOBAL_BATCH} x {BLOCK} tokens, {args.world_size} ranks on gloo, "
        f"{os.cpu_count()} cores, torch {torch.__version__}"
    )
    seconds, tp_bytes = {mode: [] for mode in MODES}, 0
    for round_ in range(args.rounds):  # interleaved, so a slow spell of the machine hits every mode
        for mode in MODES:
            elapsed, counted = measure(mode, args.world_size, args.steps, args.warmup, args.bucket_mb)
            seconds[mode].append(elapsed)
            tp_bytes = counted or tp_bytes
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    print(f"{'mode':<14} {'tokens/s':>10} {'ms/step':>9}   (median of {args.rounds} rounds; min-max tokens/s)")
    for mode in MODES:
        median = statistics.median(seconds[mode])
        spread = f"{tokens / max(seconds[mode]):,.0f}-{tokens / min(seconds[mode]):,.0f}"
        print(f"{mode:<14} {tokens / median:>10,.0f} {1e3 * median / args.steps:>9.1f}   {spread}")
    closed_form, formula = comm_bytes_per_step(
        MODEL, Layout(tp=args.world_size), stage=0, batch_size=GLOBAL_BATCH, accumulation=1, compute_bytes=4
    )["tp"]
    print(
        f"TP all-reduce bytes per step, per rank: counted {tp_bytes / 2**20:.2f} MiB, "
        f"closed form {closed_form / 2**20:.2f} MiB = {formula}"
    )


if __name__ == "__main__":
    main()
