"""The layout planner (cost.py) against this machine: predicted and measured step times of the tiny model.

    python bench/cost_calibration.py [--steps 5] [--mfu 0.5]

cost.py's `cpu` hardware is measured first: fp32 matmul FLOP/s at the model's MLP shape with the
threads each rank gets (2 cores: 2 threads for one process, 1 each for two), and the latency and
bandwidth of a gloo all-reduce between two local processes that also compute. Then each layout (one process,
dp=2, tp=2, pp=2 with m = 1 and 4) trains a few steps of the tiny preset's model (4 blocks of
width 128, block 128) on 16 sequences per step, and its measured step time is printed beside the
planner's prediction (planner.plan_layout), with the parts the planner adds up. --mfu is the share of the matmul rate
the whole forward and backward achieve (norms, attention, softmax and the optimizer run slower).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.layouts import measure_layout  # noqa: E402
from machinery.planning import cost, planner  # noqa: E402
from parallel.grid import Layout  # noqa: E402

MODEL = cost.MODELS["tiny"].gpt_config
BATCH_ROWS = 16
LAYOUTS = [((1, 1, 1), 1), ((2, 1, 1), 1), ((1, 2, 1), 1), ((1, 1, 2), 1), ((1, 1, 2), 4)]  # (dp, tp, pp), m


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--mfu", type=float, default=0.42)
    args = parser.parse_args()
    hardware = {ranks: planner.measure_cpu(MODEL, BATCH_ROWS * MODEL.block_size, ranks) for ranks in (1, 2)}
    for ranks, hw in hardware.items():
        print(
            f"cpu as {ranks} rank(s): {hw.peak_flops / 1e9:.1f} GFLOP/s per rank (fp32 matmul); gloo all-reduce "
            f"{hw.intra_bandwidth / 1e9:.2f} GB/s, {hw.latency * 1e6:.0f} us latency"
        )
    print(
        f"{'dp tp pp  m':>11} {'measured ms':>12} {'predicted ms':>13} {'error':>7}   "
        "predicted parts (ms): compute | bubble | tp | pp | dp"
    )
    rows = []
    for (dp, tp, pp), m in LAYOUTS:
        layout = Layout(dp=dp, tp=tp, pp=pp, micro_batches=m)
        measured = measure_layout(layout, steps=args.steps, gpt_config=MODEL, global_batch=BATCH_ROWS)["step_seconds"]
        plan = planner.plan_layout(
            MODEL, hardware[layout.world_size], layout, BATCH_ROWS, BATCH_ROWS // dp // m, args.mfu, compute_bytes=4
        )
        rows.append((measured, plan.step_seconds))
        parts = " | ".join(f"{1e3 * plan.parts[k]:.1f}" for k in ("compute", "bubble", "tp", "pp", "dp"))
        print(
            f"{dp:>2} {tp:>2} {pp:>2} {m:>2} {1e3 * measured:>12.1f} {1e3 * plan.step_seconds:>13.1f} "
            f"{100 * (plan.step_seconds / measured - 1):>+6.0f}%   {parts}",
            flush=True,
        )
    # the order of two layouts whose measured times differ by under 5% is this machine's noise
    pairs = [(a, b) for a in rows for b in rows if a[0] < b[0] / 1.05]
    agree = sum(pa < pb for (_, pa), (_, pb) in pairs)
    print(
        f"largest error {100 * max(abs(p / m - 1) for m, p in rows):.0f}%; of the {len(pairs)} pairs of layouts "
        f"whose measured times differ by more than 5%, the planner orders {agree} as measured"
    )


if __name__ == "__main__":
    main()
