"""Wall time to a val loss: `python train.py --preset shakespeare` against nanoGPT's CPU command.

    python bench/time_to_loss.py [--target 1.886] [--rounds 2] [--nanogpt DIR] [-- extra train.py flags]

Each round launches our run from scratch, data preparation included (into a fresh
folder), and, with --nanogpt DIR (a checkout of karpathy/nanoGPT whose
data/shakespeare_char is prepared), nanoGPT's README command for the same 4-layer,
128-wide model on the CPU, one after the other so that a slow spell of the machine
hits both. Every line either prints is time-stamped from its launch; the table shows
the median over rounds of:

    tokens/s      training throughput (median of the logged rates, evaluation excluded)
    reached at    the first evaluated step whose val loss is <= --target, and the seconds
                  from launch to that line: start-up, data, compilation and evaluation count
    final val     the val loss at the end (2000 steps for both)

Flags after `--` go to our train.py (e.g. `-- --url file:///path/to/tinyshakespeare.txt`
on a machine without network, or `--dtype float32` to see the CPU's fp32 speed).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NANOGPT_COMMAND = [
    "train.py",
    "config/train_shakespeare_char.py",
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--log_interval=1",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--max_iters=2000",
    "--lr_decay_iters=2000",
    "--dropout=0.0",
]
TOKENS_PER_ITER = 12 * 64  # both: batch 12 x block 64

# what the two logs say: (step, val loss) at each evaluation, and the training rate
OURS_VAL = re.compile(r"^step\s+(\d+) \|.*\| val loss ([\d.]+)")
OURS_RATE = re.compile(r"^step\s+(\d+) \|.*\| ([\d,]+) tok/s")
NANOGPT_VAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)")
NANOGPT_RATE = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms")


def timed_lines(command, cwd):
    """Run command; return [(seconds since launch, line)] of its output, and its exit code."""
    start, lines = time.perf_counter(), []
    with subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as process:
        for line in process.stdout:
            lines.append((time.perf_counter() - start, line.rstrip()))
    if process.returncode:
        tail = "\n".join(line for _, line in lines[-20:])
        sys.exit(f"{' '.join(command)} failed with exit code {process.returncode}:\n{tail}")
    return lines


def summarize(lines, val_pattern, rate_of, target):
    """(tokens/s, step and seconds at which val loss first <= target, final val loss, wall seconds)."""
    evals = [(seconds, int(m[1]), float(m[2])) for seconds, line in lines if (m := val_pattern.match(line))]
    rates = [rate for _, line in lines if (rate := rate_of(line))]
    reached = next(((step, seconds) for seconds, step, loss in evals if loss <= target), (None, None))
    return statistics.median(rates), *reached, evals[-1][2], lines[-1][0]


def ours(extra, target):
    with tempfile.TemporaryDirectory() as tmp:
        # fmt: off
        command = [
            sys.executable,
            os.path.join(ROOT, "train.py"),
            "--preset", "shakespeare", "--out_dir", os.path.join(tmp, "out"),
            "--data_dir", os.path.join(tmp, "data"), "--num_samples", "0",
            *extra,
        ]
        # fmt: on
        lines = timed_lines(command, tmp)

    def rate(line):  # our log's rate; the lines that also evaluated are left out (their rate is lower)
        m = OURS_RATE.match(line)
        return float(m[2].replace(",", "")) if m and "val loss" not in line else None

    return summarize(lines, OURS_VAL, rate, target)


def nanogpt(folder, target):
    lines = timed_lines([sys.executable, *NANOGPT_COMMAND], folder)

    def rate(line):  # nanoGPT times each iteration; the ones that evaluated are at multiples of 250
        m = NANOGPT_RATE.match(line)
        return TOKENS_PER_ITER / (float(m[2]) / 1e3) if m and int(m[1]) % 250 else None

    return summarize(lines, NANOGPT_VAL, rate, target)


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=float, default=1.886, help="val loss to reach (nanoGPT's final, by default)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--nanogpt", default="", help="a nanoGPT checkout with data/shakespeare_char prepared")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.nanogpt and not os.path.exists(os.path.join(args.nanogpt, "data", "shakespeare_char", "train.bin")):
        sys.exit(
            f"--nanogpt {args.nanogpt}: no data/shakespeare_char/train.bin there; "
            "run `python data/shakespeare_char/prepare.py` in it first"
        )
    runners = {"minipretrain": lambda: ours(extra, args.target)}
    if args.nanogpt:
        runners["nanoGPT"] = lambda: nanogpt(args.nanogpt, args.target)
    results = {name: [] for name in runners}
    for round_ in range(args.rounds):
        for name, run in runners.items():
            results[name].append(run())
            rate, step, seconds, final, wall = results[name][-1]
            print(
                f"round {round_ + 1}/{args.rounds} {name}: {rate:,.0f} tokens/s, val <= {args.target} at step "
                f"{step} after {seconds if seconds is None else round(seconds, 1)} s, final val {final:.4f}, "
                f"{wall:.1f} s in all",
                flush=True,
            )
    print(
        f"\n{'run':<14} {'tokens/s':>9} {'reached at':>11} {'seconds':>8} {'final val':>10} {'wall s':>7}"
        f"   (median of {args.rounds} rounds; target val loss {args.target})"
    )
    medians = {}
    for name, rows in results.items():
        columns = list(zip(*rows))
        reached = [s for s in columns[2] if s is not None]
        medians[name] = [statistics.median(columns[0]), statistics.median(reached) if reached else None]
        steps = [s for s in columns[1] if s is not None]
        print(
            f"{name:<14} {medians[name][0]:>9,.0f} {statistics.median(steps) if steps else 'never':>11} "
            f"{medians[name][1] if medians[name][1] is None else round(medians[name][1], 1):>8} "
            f"{statistics.median(columns[3]):>10.4f} {statistics.median(columns[4]):>7.1f}"
        )
    if "nanoGPT" in medians:
        (our_rate, our_seconds), (their_rate, their_seconds) = medians["minipretrain"], medians["nanoGPT"]
        print(f"tokens/s: {our_rate / their_rate:.2f}x nanoGPT's", end="")
        if our_seconds and their_seconds:
            print(f"; wall time to val {args.target}: {our_seconds / their_seconds:.2f}x nanoGPT's", end="")
        print()


if __name__ == "__main__":
    main()
