"""The pipeline bubble, measured: p stages on gloo, GPipe and 1F1B, m micro-batches,
wall-clock idle fraction beside the formula (p - 1) / (m + p - 1), plus a Gantt chart;
and interleaved 1F1B with v = 2 and 4 chunks a rank beside (p - 1) / (v m + p - 1).

    python bench/pipeline_bubble.py [--batch 32] [--block 128] [--n_embd 256] [--repeats 3] [--out out/bench]

Each bubble is the median over --repeats runs of the schedule, after one to warm up.

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

Interleaving sends v times the activations and gradients, each operation 1/v of a
stage's work: the fixed cost of a message and of an operation weighs v times more, so
the measured gap to its formula grows as micro-batches shrink.
"""

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery.health.monitor import plot_gantt  # noqa: E402
from machinery.job.local_ranks import results_of, run_ranks  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from parallel.grid import Layout, ProcessGrid, destroy_distributed, init_distributed  # noqa: E402
from parallel.pipeline import PipelineRank, bubble_fraction, run_schedule, schedule_for  # noqa: E402

BATCH, BLOCK, N_EMBD, BLOCKS_PER_STAGE = 32, 128, 256, 4  # >= 4 rows per micro-batch up to m = 8


def stage_timeline(p, m, schedule, chunks, repeats, batch=BATCH, block=BLOCK, n_embd=N_EMBD):
    """One rank: run the schedule 1 + repeats times, return every rank's timelines of the last repeats runs."""
    launch = init_distributed(120)
    try:
        grid = ProcessGrid(Layout(pp=p), launch.rank, p)
        torch.manual_seed(0)
        gpt_config = GPTConfig(block_size=block, vocab_size=256, n_layer=BLOCKS_PER_STAGE * p, n_head=4, n_embd=n_embd)
        rank = PipelineRank(GPT(gpt_config), launch.rank, p, chunks)
        x = torch.randint(256, (batch, block))
        order = schedule_for(schedule, chunks)(p, m, launch.rank)
        runs = []
        for _ in range(1 + repeats):  # the first run warms up
            rank.zero_grad(set_to_none=True)
            dist.barrier()
            runs.append(run_schedule(rank, order, x, x, m, grid, n_embd)[1])
        timelines = [None] * p
        dist.all_gather_object(timelines, runs[1:])
        return [[timelines[r][run] for r in range(p)] for run in range(repeats)]
    finally:
        destroy_distributed()


def measure(p, m, schedule, chunks, repeats, batch, block, n_embd):
    """(the median bubble over the repeats, the timeline of the run nearest it)."""
    runs = results_of(
        run_ranks(
            p, stage_timeline, p, m, schedule, chunks, repeats, batch, block, n_embd, timeout=300, start_method="spawn"
        )
    )[0]
    bubbles = [bubble_fraction(timeline) for timeline in runs]
    median = statistics.median(bubbles)
    return median, runs[min(range(len(runs)), key=lambda r: abs(bubbles[r] - median))]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=BATCH, help="sequences per step, cut into m micro-batches")
    parser.add_argument("--block", type=int, default=BLOCK, help="tokens per sequence")
    parser.add_argument("--n_embd", type=int, default=N_EMBD)
    parser.add_argument("--repeats", type=int, default=3, help="measured runs of each schedule; their median")
    parser.add_argument("--out", default=os.path.join("out", "bench"), help="folder for the Gantt charts")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(
        f"batch {args.batch} x {args.block} tokens, {BLOCKS_PER_STAGE} blocks of width {args.n_embd} per rank, "
        f"gloo, {os.cpu_count()} cores, median of {args.repeats} runs"
    )
    print(
        f"{'p':>2} {'m':>3} {'rows':>5} {'formula':>8} {'GPipe':>7} {'1F1B':>7} {'v2 form.':>8} {'1F1B v2':>8} "
        f"{'v4 form.':>8} {'1F1B v4':>8}   (each measured - its formula)"
    )
    schedules = {"gpipe": ("gpipe", 1), "1f1b": ("1f1b", 1), "1f1b-v2": ("1f1b", 2), "1f1b-v4": ("1f1b", 4)}
    for p in (2, 4):
        for m in (1, 2, 4, 8):
            measured = {}
            for name, (schedule, chunks) in schedules.items():
                if chunks > 1 and m % p:  # interleaving runs micro-batches in groups of p
                    measured[name] = float("nan")
                    continue
                measured[name], timeline = measure(
                    p, m, schedule, chunks, args.repeats, args.batch, args.block, args.n_embd
                )
                if m == 8:
                    plot_gantt(
                        timeline,
                        os.path.join(args.out, f"pipeline_{name}_p{p}_m{m}.png"),
                        f"{name}, p={p}, m={m}: measured bubble {measured[name]:.2f}, "
                        f"formula {(p - 1) / (chunks * m + p - 1):.2f}",
                    )
            formula = {name: (p - 1) / (chunks * m + p - 1) for name, (_, chunks) in schedules.items()}
            gaps = ", ".join(f"{measured[name] - formula[name]:+.3f}" for name in schedules)
            print(
                f"{p:>2} {m:>3} {args.batch // m:>5} {formula['1f1b']:>8.3f} {measured['gpipe']:>7.3f} "
                f"{measured['1f1b']:>7.3f} {formula['1f1b-v2']:>8.3f} {measured['1f1b-v2']:>8.3f} "
                f"{formula['1f1b-v4']:>8.3f} {measured['1f1b-v4']:>8.3f}   ({gaps})",
                flush=True,
            )
    print(f"Gantt charts for m = 8 in {args.out}")


if __name__ == "__main__":
    main()
