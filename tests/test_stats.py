"""The statistics of a keep (ratchet.stats): distributions, the noise pool, the pooled
estimate, the sequential confirmation test and early stopping. Pure functions: numbers in,
numbers out, checked against tabulated values and against simulation."""

from __future__ import annotations

import math
import random

import pytest

from ratchet import stats
from ratchet.stats import Noise, Step


@pytest.mark.parametrize(("p", "df", "table"), [
    (0.975, 5, 2.5706), (0.99, 10, 2.7638), (0.995, 1, 63.657), (0.95, 30, 1.6973),
    (0.999, 3, 10.215), (0.975, math.inf, 1.9600),
])
def test_t_quantiles_match_the_tables(p, df, table):
    assert stats.t_ppf(p, df) == pytest.approx(table, rel=2e-4)
    assert stats.t_sf(table, df) == pytest.approx(1 - p, rel=2e-3)


def test_t_tail_is_symmetric_and_bounded():
    assert stats.t_sf(0.0, 7) == pytest.approx(0.5)
    assert stats.t_sf(-2.0, 7) == pytest.approx(1 - stats.t_sf(2.0, 7))
    assert stats.t_sf(math.inf, 4) == 0.0


def test_signed_rank_p_is_counted_exactly():
    assert stats.signed_rank_p([1, 2, 3, 4, 5]) == pytest.approx(1 / 32)
    # W+ = 1+2+3+5 = 11 of 15; subsets of ranks 1..5 summing to <= 4: 7 of 32
    assert stats.signed_rank_p([1, 2, 3, -4, 5]) == pytest.approx(7 / 32)
    assert stats.signed_rank_p([-1, -2, -3]) == pytest.approx(1.0)
    assert stats.signed_rank_p([0, 0]) == 1.0  # nothing but ties with zero: no evidence
    # tied magnitudes share their mean rank: (+1, +1, -2): ranks 1.5, 1.5, 3, W+ = 3;
    # of the 8 sign patterns, sums 3, 3, 4.5, 4.5, 6 reach it
    assert stats.signed_rank_p([1, 1, -2]) == pytest.approx(5 / 8)


def test_noise_pools_the_within_commit_spread():
    noise = stats.pooled_noise([[1.0, 3.0], [10.0, 12.0, 14.0], [5.0]])
    assert noise.df == 3  # 1 + 2 + 0
    assert noise.sigma == pytest.approx(math.sqrt((2 + 8) / 3))
    assert noise.known


def test_a_reported_error_can_only_widen_the_noise():
    floor = stats.pooled_noise([[1.0, 1.0], [2.0, 2.0]], reported=[0.5])
    assert floor.sigma == pytest.approx(0.5) and floor.df == 2
    alone = stats.pooled_noise([[4.0]], reported=[0.3, 0.4])
    assert alone.sigma == pytest.approx(math.sqrt((0.09 + 0.16) / 2)) and math.isinf(alone.df)
    assert not stats.pooled_noise([[4.0], [5.0]]).known  # one evaluation each: no estimate


def test_a_positive_metric_pools_its_noise_relative_to_its_value():
    """Timings wobble in proportion: 130 +- 13 and 20 +- 2 are the same 10% noise."""
    groups = [[117.0, 143.0], [18.0, 22.0]]
    assert stats.positive(groups) and not stats.positive([[1.0, -1.0]])
    noise = stats.pooled_noise(groups, relative=True)
    assert noise.relative and noise.df == 2
    spread = (math.log(143) - math.log(117)) / math.sqrt(2)
    assert noise.sigma == pytest.approx(spread, rel=1e-3)
    assert noise.sigma_at(20.0) == pytest.approx(20.0 * noise.sigma)
    est = stats.estimate([18.0, 22.0], noise)
    assert est.sem == pytest.approx(20.0 * noise.sigma / math.sqrt(2))


def test_pooled_estimate_uses_every_evaluation_and_the_study_noise():
    est = stats.estimate([10.0, 11.0, 12.0, 13.0], Noise(2.0, 20.0, "repeated measurements"))
    assert est.mean == pytest.approx(11.5) and est.n == 4
    assert est.sem == pytest.approx(1.0)
    half = stats.t_ppf(0.975, 20.0) * 1.0
    assert (est.low, est.high) == (pytest.approx(11.5 - half), pytest.approx(11.5 + half))
    assert "11.5 ±" in est.text() and "(n=4)" in est.text()
    unknown = stats.estimate([3.0], stats.NO_NOISE)
    assert unknown.low is None and "no noise estimate" in unknown.text()
    assert stats.estimate([], stats.NO_NOISE) is None


KNOWN = Noise(1.0, math.inf, "known")


def test_sequential_keeps_a_clear_gain_at_the_first_look_it_can():
    crit = stats.t_ppf(1 - stats.per_look_rate(0.01, 8, 2), math.inf)
    gain = crit * math.sqrt(2 / 2) + 0.01  # just over the bar after two pairs
    one = stats.sequential([gain], KNOWN, 0.01, 8)
    assert one.step == Step.MORE  # one pair is not enough for this gain
    two = stats.sequential([gain, gain], KNOWN, 0.01, 8)
    assert two.step == Step.KEEP and two.pairs == 2 and two.t >= two.critical
    assert "confirmed on 2 fresh pairs" in two.reason


def test_sequential_discards_at_once_when_fresh_pairs_show_no_gain():
    test = stats.sequential([0.5, -1.0], KNOWN, 0.01, 8)
    assert test.step == Step.DISCARD and "no gain" in test.reason


def test_sequential_discards_when_the_budget_is_spent():
    small = [0.3] * 4
    assert stats.sequential(small[:3], KNOWN, 0.01, 4).step == Step.MORE
    last = stats.sequential(small, KNOWN, 0.01, 4)
    assert last.step == Step.DISCARD and "not confirmed in 4 pairs" in last.reason


def test_no_noise_estimate_means_no_keep():
    assert stats.sequential([5.0], stats.NO_NOISE, 0.01, 2).step == Step.MORE
    last = stats.sequential([5.0, 5.0], stats.NO_NOISE, 0.01, 2)
    assert last.step == Step.DISCARD and not last.noise_known
    assert "no noise estimate" in last.reason


def test_a_noise_free_evaluator_keeps_a_real_gain_on_one_pair():
    exact = Noise(0.0, 3.0, "repeated measurements")
    assert stats.sequential([0.25], exact, 0.01, 8).step == Step.KEEP


def test_per_look_rates_add_up_to_the_false_keep_rate():
    rates = [stats.per_look_rate(0.02, 8, n) for n in range(1, 9)]
    assert sum(rates) == pytest.approx(0.02)
    assert rates == sorted(rates, reverse=True)  # most of it early, where gains confirm


def run_test(rng: random.Random, effect: float, noise: Noise, rate: float, pairs: int) -> bool:
    diffs: list[float] = []
    while True:  # a pair's difference: two evaluations of sd 1
        diffs.append(effect + rng.gauss(0, 1) - rng.gauss(0, 1))
        test = stats.sequential(diffs, noise, rate, pairs)
        if test.step != Step.MORE:
            return test.step == Step.KEEP


def test_the_false_keep_rate_holds_under_no_effect():
    rng = random.Random(7)
    rate, trials = 0.05, 4000
    keeps = sum(run_test(rng, 0.0, KNOWN, rate, 8) for _ in range(trials))
    assert keeps / trials <= rate  # Bonferroni over the looks: at most the rate


def test_a_three_sigma_gain_is_almost_always_confirmed():
    rng = random.Random(8)
    kept = sum(run_test(rng, 3.0, KNOWN, 0.01, 8) for _ in range(500))
    assert kept / 500 >= 0.9


def test_clearly_slower_stops_only_a_slower_candidate():
    incumbent = [1.0, 2.0, 4.0, 8.0]
    slower = [1.25, 2.4, 5.1, 9.7]
    assert stats.clearly_slower(slower, incumbent) is not None
    assert stats.clearly_slower(slower[:2], incumbent) is None  # too few shapes yet
    same = [1.01, 1.98, 4.05, 7.9]
    assert stats.clearly_slower(same, incumbent) is None
    faster = [0.8, 1.7, 3.1, 6.5]
    assert stats.clearly_slower(faster, incumbent) is None
    assert stats.clearly_slower(faster, incumbent, method="rank") is None
    many = [t * 1.3 for t in [1.0] * 7]
    assert stats.clearly_slower(many, [1.0] * 7, method="rank") is not None  # p = 1/128
