"""How often the curve reader calls a healthy run of a band's recipe not normal: its false-alarm rates, measured
over the band's own seeds held out in turn, for the final val loss's p-value and for the band's edge apart.

    python bench/band_false_alarms.py [--band bands/shakespeare.json] [RUN ...]

Each of the band's K seeds is a healthy run of another seed and data order, judged against the other K - 1:
- the p-value: its final val loss against the others' (Student's t, K - 2 degrees of freedom, bands.p_against);
  counted below 0.05 and below bands.P_ALARM, where the reader says "not normal";
- the edge: z calibrated on the K - 1 alone (bands.calibrate, each of them against the other K - 2), then the
  held-out seed's train curve judged by that rule (bands.flagged: out of the band PERSIST points in a row, or a
  jump). Calibrating on all K and judging one of them would flag none by construction; this is the rate a new seed
  meets.
RUN folders (healthy runs of the recipe, a --data_order of their own, say) are read against the whole band too.
Prints a table; docs/curves.md quotes it.
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from data import read_json  # noqa: E402
from machinery.analysis import bands, curves  # noqa: E402


def held_out_p(val, k):
    """The p-value of seed k's final val loss against the band's other seeds (val: the band's val summary)."""
    seeds = [row[-1] for row in val["runs"]]
    return bands.p_against(seeds[k], seeds[:k] + seeds[k + 1 :])


def held_out_edge(train, k):
    """(z calibrated without seed k, whether that rule flags seed k against the band of the others)."""
    steps = train["step"]
    others = [dict(zip(steps, row)) for j, row in enumerate(train["runs"]) if j != k]
    without_k = bands.summary(others, steps)
    rule = bands.calibrate(without_k)
    return rule["z"], bands.flagged(dict(zip(steps, train["runs"][k])), without_k, rule)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", metavar="RUN", help="run folders of the band's recipe, read against it")
    parser.add_argument("--band", default=os.path.join(ROOT, "bands", "shakespeare.json"))
    args = parser.parse_args()
    band = read_json(args.band)
    if band is None or "train" not in band:
        sys.exit(f"error: {args.band} holds no band (python bench/bands.py makes one)")
    train, val = band["train"], band["val"]
    K = len(train["runs"])
    z_all, last = band["rule"]["z"], val["step"][-1]
    print(f"{args.band}: {K} seeds, the edge's z {z_all:g} calibrated on all of them; final val at step {last}")
    print(f"{'held out':>8} | {'final val':>9} | {'p':>6} | {'z without it':>12} | flagged by that edge")
    p_values, flags = [], []
    for k, seed in enumerate(band["seeds"]):
        p = held_out_p(val, k)
        z, flagged = held_out_edge(train, k)
        p_values.append(p)
        flags.append(flagged)
        said = "yes" if flagged else "no"
        print(f"{'seed ' + str(seed):>8} | {val['runs'][k][-1]:9.4f} | {p:6.3f} | {z:12g} | {said}")
    below = {threshold: sum(p < threshold for p in p_values) for threshold in (0.05, bands.P_ALARM)}
    print(
        f"false alarms over {K} held-out seeds: p < 0.05 in {below[0.05]}, p < {bands.P_ALARM:g} (the reader's "
        f"'not normal') in {below[bands.P_ALARM]}; the edge in {sum(flags)}"
    )
    for folder in args.runs:
        run = bands.read_run(folder)
        reading = curves.read_curve(run, band)
        step, value, p = bands.val_p(run, band)
        above = sum(value > row[val["step"].index(step)] for row in val["runs"])
        edge = "flags" if reading.stretches or reading.jumps else "passes"
        print(f"{folder}: val loss {value:.4f} at step {step}, above {above} of {K} seeds, p = {p:.3f}; edge {edge} it")


if __name__ == "__main__":
    main()
