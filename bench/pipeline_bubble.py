"""The pipeline bubble, measured: p stages on gloo, GPipe and 1F1B, m micro-batches,
wall-clock idle fraction beside the formula (p - 1) / (m + p - 1), plus a Gantt chart.

    python bench/pipeline_bubble.py [--out out/bench]

Each stage runs in its own process with one thread; a stage is 2 blocks of a
width-128 GPT, the batch 16 sequences of 64 tokens. With more processes than
cores (p = 4 on 2 cores) stages also wait for a core: that shows up as extra bubble.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig  # noqa: E402
from local_ranks import results_of, run_ranks  # noqa: E402
from parallel import ProcessGrid, destroy_distributed, init_distributed  # noqa: E402
from pipeline import SCHEDULES, PipelineStage, bubble_fraction, plot_gantt, run_schedule  # noqa: E402

BATCH, BLOCK, N_EMBD, BLOCKS_PER_STAGE = 16, 64, 128, 2


def stage_timeline(p, m, schedule):
    """One stage (one rank): run the schedule twice, return every stage's timeline of the second."""
    launch = init_distributed(120)
    try:
        grid = ProcessGrid(1, 1, p, launch.rank, p)
        torch.manual_seed(0)
        cfg = GPTConfig(block_size=BLOCK, vocab_size=256, n_layer=BLOCKS_PER_STAGE * p, n_head=4, n_embd=N_EMBD)
        stage = PipelineStage(GPT(cfg), launch.rank, p)
        x = torch.randint(256, (BATCH, BLOCK))
        order = SCHEDULES[schedule](p, m, launch.rank)
        for _ in range(2):  # the first run warms up; the second is measured
            stage.zero_grad(set_to_none=True)
            dist.barrier()
            _, records, _ = run_schedule(stage, order, x, x, m, grid, N_EMBD)
        timelines = [None] * p
        dist.all_gather_object(timelines, records)
        return timelines
    finally:
        destroy_distributed()


def measure(p, m, schedule):
    return results_of(run_ranks(p, stage_timeline, p, m, schedule, timeout=300, start_method="spawn"))[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join("out", "bench"), help="folder for the Gantt charts")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"batch {BATCH} x {BLOCK} tokens, {BLOCKS_PER_STAGE} blocks of width {N_EMBD} per stage, "
          f"gloo, {os.cpu_count()} cores")
    print(f"{'p':>2} {'m':>3} {'formula':>8} {'GPipe':>7} {'1F1B':>7}")
    for p in (2, 4):
        for m in (1, 2, 4, 8, 16):
            measured = {}
            for schedule in ("gpipe", "1f1b"):
                timelines = measure(p, m, schedule)
                measured[schedule] = bubble_fraction(timelines)
                if m == 8:
                    path = os.path.join(args.out, f"pipeline_{schedule}_p{p}_m{m}.png")
                    plot_gantt(timelines, path, f"{schedule}, p={p}, m={m}: measured bubble "
                               f"{measured[schedule]:.2f}, formula {(p - 1) / (m + p - 1):.2f}")
            print(f"{p:>2} {m:>3} {(p - 1) / (m + p - 1):>8.3f} {measured['gpipe']:>7.3f} {measured['1f1b']:>7.3f}",
                  flush=True)
    print(f"Gantt charts for m = 8 in {args.out}")


if __name__ == "__main__":
    main()
