"""The notebooks' verdict engine (notebooks/verdicts.py): the sign-flip test against counting every sign pattern,
its confidence bound against the test it inverts, each hypothesis on arms built to pass and to fail, and the false
alarms of each kind on simulated nulls (bench/verdict_calibration.py) held to 6%."""

import itertools
import re
import sys

import numpy as np
import pytest
from conftest import ROOT, run_script

sys.path.insert(0, str(ROOT / "notebooks"))
import verdicts  # noqa: E402


@pytest.mark.parametrize("seeds", [5, 6, 8])
def test_the_p_value_counts_the_sign_patterns_and_the_bound_inverts_it(seeds):
    """p: the share of the 2^n sign patterns whose sum is at least the observed one, counted one by one here; the
    bound: the differences less any delta below it are significant, less any delta above it are not."""
    rng = np.random.default_rng(seeds)
    for _ in range(100):
        d = rng.standard_normal(seeds) + 0.7
        patterns = [np.dot(signs, d) >= d.sum() - 1e-12 for signs in itertools.product((1, -1), repeat=seeds)]
        assert verdicts.p_value(d) == pytest.approx(np.mean(patterns), abs=1e-12), d
        bound = verdicts.lower_bound(d)
        assert verdicts.p_value(d - (bound - 1e-9)) <= verdicts.ALPHA < verdicts.p_value(d - (bound + 1e-9)), (
            f"{d}: the bound {bound} is where the test of d - delta stops being significant"
        )


def test_five_seeds_are_significant_only_all_on_the_claimed_side():
    """With 5 seeds the smallest p is 1/32 = 0.031 < 0.05: all five differences positive, and the bound is the
    smallest of them; four seeds can never be significant at 0.05 (1/16)."""
    assert verdicts.p_value([0.2, 0.5, 0.1, 0.9, 0.3]) == 1 / 32
    assert verdicts.lower_bound([0.2, 0.5, 0.1, 0.9, 0.3]) == pytest.approx(0.1)
    assert verdicts.p_value([0.2, 0.5, -0.1, 0.9, 0.3]) > verdicts.ALPHA
    assert verdicts.lower_bound([1.0, 2.0, 3.0, 4.0]) == -np.inf


def test_superiority_says_yes_partly_or_no_by_the_bound_and_the_aa_arm():
    """Significant with the bound past the stated size: yes; significant and short of it: partly; not significant:
    no; an A/A arm that itself comes out superior: no, whatever the judged arm shows."""
    aa = [0.1, -0.2, 0.05, -0.1, 0.15]
    d = [1.2, 1.5, 1.1, 1.9, 1.3]
    assert verdicts.superiority(d, aa, size=1.0)["verdict"] == "yes"
    assert verdicts.superiority(d, aa, size=1.5)["verdict"] == "partly"
    assert verdicts.superiority([1.2, -0.5, 1.1, 1.9, 1.3], aa)["verdict"] == "no"
    judged = verdicts.superiority(d, [0.3, 0.2, 0.1, 0.4, 0.2])
    assert judged["verdict"] == "no" and "A/A" in judged["why"], judged


def test_equivalence_passes_a_tie_and_refuses_a_planted_difference_at_the_margin():
    """TOST: differences well inside the margin are equivalent; an arm with a planted difference between 1x and 2x
    the margin is not."""
    rng = np.random.default_rng(0)
    tie = 0.1 * rng.standard_normal(5)
    assert verdicts.equivalence(tie, margin=0.5)["verdict"] == "yes"
    for planted in (0.5, 0.75, 1.0):
        assert verdicts.equivalence(planted + tie, margin=0.5)["verdict"] == "no", planted


def test_trend_needs_every_seed_growing_at_five_seeds():
    scales = [1, 2, 4]
    growing = [[0.1, 0.4, 0.8], [0.0, 0.5, 0.7], [0.2, 0.3, 0.9], [0.1, 0.6, 0.8], [0.0, 0.2, 0.6]]
    assert verdicts.trend(growing, scales)["verdict"] == "yes"
    flat = [[0.1, 0.4, 0.0], *growing[1:]]
    assert verdicts.trend(flat, scales)["verdict"] == "no"


def test_a_stored_row_is_judged_again_from_its_values():
    """The values a row stores are what the test reads from its arms (per_unit): paired log ratios here, and each
    seed's slope for a trend, judged as the trend test judges them."""
    arms = {"a": [2.0, 2.1, 2.2, 2.05, 2.3], "b": [1.0, 1.1, 1.0, 1.2, 1.1]}
    row = dict(
        hypothesis="superiority",
        alpha=0.05,
        values=verdicts.per_unit(arms, log=True).tolist(),
        aa=[0.01, -0.02, 0.03, -0.01, 0.0],
        log=True,
        size=float(np.log(1.5)),
    )
    assert row["values"] == pytest.approx(np.log(np.array(arms["a"]) / arms["b"]))
    judged = verdicts.judge(row)
    assert judged["verdict"] == "yes" and judged["p_value"] == 1 / 32, judged
    with pytest.raises(ValueError, match="hypothesis 'bigger'"):
        verdicts.judge({**row, "hypothesis": "bigger"})
    trend = {"effects": [[0.1, 0.4, 0.8], [0.0, 0.5, 0.7], [0.2, 0.3, 0.9], [0.1, 0.6, 0.8], [0.0, 0.2, 0.6]]}
    trend["scales"] = [1, 2, 4]
    stored = dict(hypothesis="trend", alpha=0.05, values=verdicts.per_unit(trend).tolist(), aa=[0.0] * 5)
    direct = verdicts.trend(trend["effects"], trend["scales"])
    assert verdicts.judge(stored)["p_value"] == direct["p_value"] and direct["verdict"] == "yes"
    assert verdicts.judge({**stored, "toward": -1})["verdict"] == "no"


def test_false_alarms_stay_under_six_percent_on_simulated_nulls():
    """bench/verdict_calibration.py, seeded: 2,000 null experiments per kind and distribution at the notebooks' 5
    seeds and 9 timing rounds."""
    result = run_script(
        [ROOT / "bench" / "verdict_calibration.py", "--draws", "2000", "--seeds", "5,9"], cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr
    rates = re.findall(r"^(\w+): false alarms ([\d.]+)%", result.stdout, re.MULTILINE)
    assert sorted(kind for kind, _ in rates) == sorted(2 * verdicts.HYPOTHESES), result.stdout
    for kind, rate in rates:
        assert float(rate) <= 6.0, f"{kind}: a false alarm in {rate}% of null experiments, at most 6%"
