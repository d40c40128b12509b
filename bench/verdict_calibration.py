"""How often the notebooks' verdict engine (notebooks/verdicts.py) says "yes" when nothing is there, and how often
it finds an effect that is.

    python bench/verdict_calibration.py                    # 2,000 experiments per kind and distribution, 5 and 9 seeds
    python bench/verdict_calibration.py --seeds 5,8 --draws 10000

Each simulated experiment is what a notebook runs: two arms paired seed by seed (a seed's own luck, shared by both
arms, cancels in their difference), and an A/A arm, the first arm again. The per-run noise is drawn from three
distributions, of unit spread: normal, skewed (lognormal) and heavy-tailed (Student's t, 3 degrees of freedom).

    superiority   null: both arms alike. A false alarm is a "yes" or a "partly". Power: the arm better by
                  --effect standard deviations of a per-seed difference, the chapter's stated size set at half that
    equivalence   null: the arms differ by exactly the margin, declared as --k x the A/A arm's noise before the
                  judged arm runs. A false alarm is a "yes". Power: the arms alike
    trend         null: the effect flat over 3 scales (1, 2, 4). A false alarm is "grows toward the claim". Power:
                  the effect growing by --effect standard deviations of a per-seed difference per doubling

It prints one line per kind, `KIND: false alarms X.X% (N null experiments), power Y.Y% at the stated effect`, then
the rates by distribution. tests/test_verdicts.py holds each false-alarm rate to 6% on a seeded draw.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "notebooks"))
import verdicts  # noqa: E402

SCALES = (1.0, 2.0, 4.0)


def noise(rng, distribution, shape):
    """Per-run noise of unit standard deviation, centred on zero (its mean subtracted: the skewed one too)."""
    if distribution == "normal":
        return rng.standard_normal(shape)
    if distribution == "skewed":
        sigma = 0.8
        mean, var = np.exp(sigma**2 / 2), (np.exp(sigma**2) - 1) * np.exp(sigma**2)
        return (rng.lognormal(0.0, sigma, shape) - mean) / np.sqrt(var)
    if distribution == "heavy-tailed":
        return rng.standard_t(3, shape) / np.sqrt(3.0)  # t with 3 degrees of freedom has variance 3
    raise ValueError(f"distribution {distribution!r}")


DISTRIBUTIONS = ("normal", "skewed", "heavy-tailed")


def experiment(kind, rng, distribution, seeds, effect, k, null):
    """One simulated experiment of this kind: its verdict is a false alarm (null) or a find (not null)."""
    spread = np.sqrt(2.0)  # the std of a per-seed difference of two runs of unit noise

    def arm(shape=(seeds,)):
        return noise(rng, distribution, shape)

    aa = arm() - arm()  # the A/A arm: the same configuration twice, paired by seed
    if kind == "superiority":
        shift = 0.0 if null else effect * spread
        judged = verdicts.superiority(shift + arm() - arm(), aa, size=effect * spread / 2)
        return judged["verdict"] in ("yes", "partly")
    if kind == "equivalence":
        margin = k * verdicts.aa_noise(aa)  # declared from the A/A arm, before the judged arm runs
        shift = margin if null else 0.0
        return verdicts.equivalence(shift + arm() - arm(), margin)["verdict"] == "yes"
    if kind == "trend":
        slope = 0.0 if null else effect * spread / np.log(2.0)
        effects = slope * np.log(SCALES) + arm((seeds, len(SCALES))) - arm((seeds, len(SCALES)))
        return verdicts.trend(effects, SCALES)["verdict"] == "yes"
    raise ValueError(f"kind {kind!r}")


def rates(kind, seeds, draws, effect, k, rng):
    """{distribution: (false-alarm rate, power)} over `draws` experiments each."""
    return {
        distribution: tuple(
            float(np.mean([experiment(kind, rng, distribution, seeds, effect, k, null) for _ in range(draws)]))
            for null in (True, False)
        )
        for distribution in DISTRIBUTIONS
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--seeds", default="5,9", help="seed counts per arm, comma-separated (the notebooks use 5 seeds, 5 or 9 rounds)"
    )
    parser.add_argument("--draws", type=int, default=2000, help="experiments per kind, distribution and case")
    parser.add_argument("--effect", type=float, default=1.5, help="the planted effect, in per-seed-difference stds")
    parser.add_argument("--k", type=float, default=2.0, help="equivalence margins: k x the A/A arm's noise")
    parser.add_argument("--seed", type=int, default=0, help="the simulation's random seed")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    for seeds in (int(s) for s in args.seeds.split(",")):
        table = {kind: rates(kind, seeds, args.draws, args.effect, args.k, rng) for kind in verdicts.HYPOTHESES}
        print(f"{seeds} seeds per arm, alpha {verdicts.ALPHA}, sign-flip test:")
        for kind, by_distribution in table.items():
            false_alarms = np.mean([f for f, _ in by_distribution.values()])
            power = np.mean([p for _, p in by_distribution.values()])
            nulls = args.draws * len(DISTRIBUTIONS)
            print(
                f"{kind}: false alarms {100 * false_alarms:.1f}% ({nulls} null experiments), "
                f"power {100 * power:.1f}% at the stated effect"
            )
        print(f"  {'kind':<12} " + " ".join(f"{d:>20}" for d in DISTRIBUTIONS) + "   (false alarms / power)")
        for kind, by_distribution in table.items():
            cells = [f"{100 * f:5.1f}% / {100 * p:5.1f}%" for f, p in by_distribution.values()]
            print(f"  {kind:<12} " + " ".join(f"{c:>20}" for c in cells))


if __name__ == "__main__":
    main()
