"""The pipeline bubble, measured: p stages on gloo, GPipe and 1F1B, m micro-batches,
wall-clock idle fraction beside the formula (p - 1) / (m + p - 1), plus a Gantt chart.

    python bench/pipeline_bubble.py [--batch 32] [--block 128] [--n_embd 256] [--out out/bench]

Each stage runs in its own process with one thread; a stage is 4 blocks of a GPT of
width 256, the batch 32 sequences of 128 tokens, so even at m = 8 a micro-batch is 4
rows and its compute (~15 ms forward) dwarfs sending its activation (512 KB). With
small micro-batches the fixed cost of each message and operation is a larger share of
the time, and shows up as extra bubble the formula does not have.

p = 2 measures the formula. p = 4 on a 2-core machine cannot: four processes take
turns on two cores, so a stage also waits for a core. That wait lands inside an
operation (stretching the work) or between operations (adding idle time) as the
operating system happens to schedule it, so the measured fraction falls on either
side of the formula.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig  # noqa: E402
from local_ranks import results_of, run_ranks  # noqa: E402
from parallel.grid import ProcessGrid, destroy_distributed, init_distributed  # noqa: E402
from parallel.pipeline import SCHEDULES, PipelineStage, bubble_fraction, plot_gantt, run_schedule  # noqa: E402

BATCH, BLOCK, N_EMBD, BLOCKS_PER_STAGE = 32, 128, 256, 4  # >= 4 rows per micro-batch up to m = 8


def stage_timeline(p, m, schedule, batch=BATCH, block=BLOCK, n_embd=N_EMBD):
    """One stage (one rank): run the schedule twice, return every stage's timeline of the second."""
    launch = init_distributed(120)
    try:
        grid = ProcessGrid(1, 1, p, launch.rank, p)
        torch.manual_seed(0)
        gpt_config = GPTConfig(block_size=block, vocab_size=256, n_layer=BLOCKS_PER_STAGE * p, n_head=4, n_embd=n_embd)
        stage = PipelineStage(GPT(gpt_config), launch.rank, p)
        x = torch.randint(256, (batch, block))
        order = SCHEDULES[schedule](p, m, launch.rank)
        for _ in range(2):  # the first run warms up; the second is measured
            stage.zero_grad(set_to_none=True)
            dist.barrier()
            _, records, _ = run_schedule(stage, order, x, x, m, grid, n_embd)
        timelines = [None] * p
        dist.all_gather_object(timelines, records)
        return timelines
    finally:
        destroy_distributed()


def measure(p, m, schedule, batch, block, n_embd):
    return results_of(
        run_ranks(p, stage_timeline, p, m, schedule, batch, block, n_embd, timeout=300, start_method="spawn")
    )[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=BATCH, help="sequences per step, cut into m micro-batches")
    parser.add_argument("--block", type=int, default=BLOCK, help="tokens per sequence")
    parser.add_argument("--n_embd", type=int, default=N_EMBD)
    parser.add_argument("--out", default=os.path.join("out", "bench"), help="folder for the Gantt charts")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(
        f"batch {args.batch} x {args.block} tokens, {BLOCKS_PER_STAGE} blocks of width {args.n_embd} per stage, "
        f"gloo, {os.cpu_count()} cores"
    )
    print(f"{'p':>2} {'m':>3} {'rows':>5} {'formula':>8} {'GPipe':>7} {'1F1B':>7}   (GPipe - formula, 1F1B - formula)")
    for p in (2, 4):
        for m in (1, 2, 4, 8):
            measured = {}
            for schedule in ("gpipe", "1f1b"):
                timelines = measure(p, m, schedule, args.batch, args.block, args.n_embd)
                measured[schedule] = bubble_fraction(timelines)
                if m == 8:
                    path = os.path.join(args.out, f"pipeline_{schedule}_p{p}_m{m}.png")
                    plot_gantt(
                        timelines,
                        path,
                        f"{schedule}, p={p}, m={m}: measured bubble "
                        f"{measured[schedule]:.2f}, formula {(p - 1) / (m + p - 1):.2f}",
                    )
            formula = (p - 1) / (m + p - 1)
            print(
                f"{p:>2} {m:>3} {args.batch // m:>5} {formula:>8.3f} {measured['gpipe']:>7.3f} {measured['1f1b']:>7.3f}"
                f"   ({measured['gpipe'] - formula:+.3f}, {measured['1f1b'] - formula:+.3f})",
                flush=True,
            )
    print(f"Gantt charts for m = 8 in {args.out}")


if __name__ == "__main__":
    main()
