"""Verdicts a statistician would sign: the standard tests a measured row of the notebooks is judged by.

Each measured claim is one of three hypotheses, chosen before the run, on arms paired seed by seed (seed s runs in
both arms, so the seed's own luck cancels in their difference):

    superiority   "A beats B", "X lowers Y": one-sided, on the per-seed differences A - B (log A - log B for a
                  ratio or a timing); "yes" where the chapter states a size needs the confidence bound at or past it
    equivalence   "A is about B", "tied": two one-sided tests (TOST) against a margin declared before the run
    trend         "grows with scale", where the chapter's scale is out of reach: each seed's effect regressed on
                  log(scale), the slopes tested one-sided

Underneath all three, one test: the exact sign-flip permutation test of a mean (Fisher 1935). Where nothing
differs, each per-seed difference is as likely to be +x as -x, so all 2^n patterns of signs are equally likely; the
p-value is the share of them whose sum is at least the observed one. It is exact at any n and assumes no normal
distribution. With 5 seeds its smallest p is 1/32 = 0.031: all five differences on the claimed side. Its confidence
bound is the test inverted, the largest shift delta for which the differences less delta would still be
significant: the (K+1)-th smallest mean of a non-empty subset of them, K = floor(alpha 2^n) - 1 (with 5 seeds and
alpha 0.05, the smallest difference).

The A/A arm (one configuration twice, seeds paired the same way) is its own argument: signed gaps, one per seed
pair. It checks the experiment (the A/A arm itself must not come out superior) and sets equivalence margins
(k x aa_noise); the judged arm never enters its own threshold.

    python bench/verdict_calibration.py   # how often each test says "yes" when nothing is there, and its power
"""

import math

import numpy as np

ALPHA = 0.05
MAX_SEEDS = 16  # 2^16 sign patterns: beyond that, sample the patterns instead
HYPOTHESES = ("superiority", "equivalence", "trend")


# ----------------------------------------------------------------------------
# The sign-flip test and its confidence bound


def subset_sums(n):
    """(2^n, n) of 0/1: row m holds the bits of m, the subset of seeds whose sign pattern flips."""
    if not 1 <= n <= MAX_SEEDS:
        raise ValueError(f"{n} seeds: the exact sign-flip test takes 1 to {MAX_SEEDS}")
    return (np.arange(2**n)[:, None] >> np.arange(n)) & 1


def p_value(differences):
    """One-sided p-value of mean(differences) > 0: the share of the 2^n sign patterns whose sum is at least the
    observed sum. Flipping the subset F changes the sum by -2 sum_F d, so a pattern counts when sum_F d <= 0."""
    d = np.asarray(differences, dtype=float)
    flipped = subset_sums(len(d)) @ d  # (2^n,) sum_F d of each subset F (F empty: 0, the observed pattern)
    return float(np.mean(flipped <= 1e-12 * np.abs(d).sum()))  # ties, to rounding, count: the test stays exact


def lower_bound(differences, alpha=ALPHA):
    """The one-sided (1 - alpha) confidence bound on the mean difference: the largest delta for which the
    differences less delta are still significant. Pattern F counts against delta when mean_F d <= delta, so the
    bound is the (K+1)-th smallest subset mean, K = floor(alpha 2^n) - 1; -inf when no delta can be significant
    (alpha 2^n < 1: too few seeds)."""
    d = np.asarray(differences, dtype=float)
    subsets = subset_sums(len(d))[1:]  # non-empty
    means = np.sort(subsets @ d / subsets.sum(axis=1))
    k = math.floor(alpha * 2 ** len(d) + 1e-9) - 1
    return -math.inf if k < 0 else float(means[k])


def upper_bound(differences, alpha=ALPHA):
    return -lower_bound(-np.asarray(differences, dtype=float), alpha)


# ----------------------------------------------------------------------------
# The three hypotheses


def paired(a, b, log=False):
    """Per-seed differences a_s - b_s (log a_s - log b_s: a ratio's log, for ratios and timings)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired arms need one value per seed each: got {a.shape} and {b.shape}")
    return np.log(a) - np.log(b) if log else a - b


def aa_noise(aa):
    """The A/A arm's noise: the RMS of its signed per-seed gaps, taken about zero (what an A/A gap should be)."""
    return math.sqrt(float(np.mean(np.square(aa))))


def superiority(d, aa, size=0.0, alpha=ALPHA):
    """Superiority, "A beats B": d are the per-seed differences, signed so that the claim says positive; size the
    effect the chapter states (0: any). yes: significant and the bound at or past size; partly: significant, the
    bound short of it; no: not significant, or the A/A arm came out superior itself (the experiment's noise is not
    the test's)."""
    p, bound = p_value(d), lower_bound(d, alpha)
    aa_p = p_value(aa)
    if aa_p <= alpha:
        return dict(verdict="no", p_value=p, bound=bound, aa_p=aa_p, why="the A/A arm itself came out superior")
    verdict = "no" if p > alpha else "yes" if bound >= size else "partly"
    return dict(verdict=verdict, p_value=p, bound=bound, aa_p=aa_p)


def equivalence(d, margin, alpha=ALPHA):
    """Equivalence, "A is about B": two one-sided tests that the mean difference lies within (-margin, margin), or
    within (low, high) for a margin given as a pair (a claimed range), each at alpha; p is the larger of the two.
    yes: both significant; no: otherwise (not shown equivalent, which is not shown different)."""
    d = np.asarray(d, dtype=float)
    low, high = (-margin, margin) if np.isscalar(margin) else margin
    p = max(p_value(d - low), p_value(high - d))
    return dict(
        verdict="yes" if p <= alpha else "no",
        p_value=p,
        interval=[lower_bound(d, alpha), upper_bound(d, alpha)],  # the (1 - 2 alpha) interval TOST reads
    )


def slopes(effects, scales):
    """Each seed's least-squares slope of its effects against log(scale): effects (seeds, points)."""
    x = np.log(np.asarray(scales, dtype=float))
    y = np.asarray(effects, dtype=float)
    if y.ndim != 2 or y.shape[1] != len(x) or len(x) < 3:
        raise ValueError(f"a trend takes each seed's effect at 3 or more scales: got {y.shape} for {len(x)} scales")
    x = x - x.mean()
    return (y - y.mean(axis=1, keepdims=True)) @ x / (x @ x)


def trend(effects, scales, alpha=ALPHA):
    """A trend, "the effect grows toward the claim with scale": the per-seed slopes against log(scale), signed so
    that the claim says positive, tested one-sided. yes ("grows toward the claim") only when the bound excludes 0."""
    s = slopes(effects, scales)
    p = p_value(s)
    return dict(verdict="yes" if p <= alpha else "no", p_value=p, bound=lower_bound(s, alpha), slopes=s.tolist())


def judge(row):
    """A measured row judged again from what it stores: its hypothesis, `values` (the per-unit numbers the test
    reads: paired differences, or a trend's per-seed slopes), A/A values, alpha and, by kind, toward, size or
    margin. Returns the engine's judgement (verdict, p_value, ...)."""
    kind, alpha, toward = row["hypothesis"], row["alpha"], row.get("toward", 1)
    values = np.asarray(row["values"], dtype=float)
    if kind == "superiority":  # the A/A gaps signed as the judged differences are, so "superior" means the same
        return superiority(values * toward, np.asarray(row["aa"], dtype=float) * toward, row.get("size", 0.0), alpha)
    if kind == "equivalence":
        return equivalence(values, row["margin"], alpha)
    if kind == "trend":
        p = p_value(values * toward)
        return dict(verdict="yes" if p <= alpha else "no", p_value=p, bound=lower_bound(values * toward, alpha))
    raise ValueError(f"hypothesis {kind!r}: one of {', '.join(HYPOTHESES)}")


def per_unit(arms, log=False):
    """What a test reads from a row's arms: the paired differences of {"a", "b"} (log ratios where log), or each
    seed's slope of a trend's {"effects", "scales"}."""
    return paired(arms["a"], arms["b"], log) if "a" in arms else slopes(arms["effects"], arms["scales"])


def equivalence_power(seeds, margin_in_noise, alpha=ALPHA, draws=4000, seed=0):
    """How often TOST shows equivalence at this margin (in units of the per-seed differences' std) when the arms
    truly tie: with 5 seeds, a margin under about 1.5 std is rarely shown. Simulated, normal, seeded."""
    rng = np.random.default_rng(seed)
    d = rng.standard_normal((draws, seeds))
    return float(np.mean([equivalence(row, margin_in_noise, alpha)["verdict"] == "yes" for row in d]))
