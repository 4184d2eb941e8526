"""The statistics of a keep (ratchet.core.stats): distributions, the noise pool, the pooled
estimate, the sequential confirmation test and early stopping. Pure functions: numbers in,
numbers out, checked against tabulated values and against simulation."""

from __future__ import annotations

import math
import random

import pytest

from ratchet.core import stats
from ratchet.core.stats import Noise, Step


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
DESIGN = stats.Design(0.01, 8)


def test_boundaries_match_published_pocock_and_obrien_fleming_constants():
    # Jennison & Turnbull, Group Sequential Methods, tables 2.1 and 2.3 (two-sided 5%,
    # which to three decimals is one-sided 2.5%): Pocock 2.178 (K=2), 2.413 (K=5);
    # O'Brien & Fleming 1.977 (K=2), 2.040 (K=5)
    assert stats.wang_tsiatis(2, 0.025, 0.5, r=8) == pytest.approx(2.178, abs=2e-3)
    assert stats.wang_tsiatis(5, 0.025, 0.5, r=8) == pytest.approx(2.413, abs=2e-3)
    assert stats.wang_tsiatis(2, 0.025, 0.0, r=8) == pytest.approx(1.977, abs=2e-3)
    assert stats.wang_tsiatis(5, 0.025, 0.0, r=8) == pytest.approx(2.040, abs=2e-3)


def test_linear_spending_spends_the_rate_over_the_looks():
    # no screen, no futility: the first look spends rate/K (a normal tail), all spend it all
    plain = stats.Design(0.02, 4, prior=0.0, futility=-math.inf)
    upper = plain.upper()
    assert upper[0] == pytest.approx(stats.t_ppf(1 - 0.005, math.inf), abs=1e-3)
    kept, _ = plain.operating(0.0)
    assert kept == pytest.approx(0.02, rel=0.01)
    # with the screen look and binding futility the rate is spent on what goes on
    kept, pairs = DESIGN.operating(0.0)
    assert kept == pytest.approx(0.01, rel=0.02) and pairs < 8


def test_sequential_keeps_a_clear_gain_at_the_first_look_it_can():
    bar = DESIGN.upper()
    # z_0 = 2 and one pair: Z_1 = (sqrt(2) * 2 + d / sqrt(2)) / sqrt(3)
    need = (bar[0] * math.sqrt(3) - math.sqrt(2) * 2.0) * math.sqrt(2)
    one = stats.sequential([need + 0.01], KNOWN, DESIGN, screen=2.0)
    assert one.step == Step.KEEP and one.pairs == 1 and one.t >= one.critical
    assert "confirmed on 1 fresh pair" in one.reason
    assert stats.sequential([need - 0.05], KNOWN, DESIGN, screen=2.0).step == Step.MORE


def test_sequential_discards_when_the_combined_gain_is_gone():
    test = stats.sequential([-2.0], KNOWN, DESIGN, screen=0.5)
    assert test.step == Step.DISCARD and "no gain" in test.reason
    # a first gain of zero or less (at most min_improvement) is never confirmed
    assert stats.sequential([5.0], KNOWN, DESIGN, screen=-0.1).step == Step.DISCARD


def test_sequential_discards_when_the_budget_is_spent():
    small = [0.3] * 8
    assert stats.sequential(small[:7], KNOWN, DESIGN, screen=1.0).step == Step.MORE
    last = stats.sequential(small, KNOWN, DESIGN, screen=1.0)
    assert last.step == Step.DISCARD and "not confirmed in 8 pairs" in last.reason


def test_an_estimated_noise_raises_the_bar_by_its_t():
    few = stats.sequential([1.0], Noise(1.0, 5.0, "few"), DESIGN, screen=1.0)
    many = stats.sequential([1.0], KNOWN, DESIGN, screen=1.0)
    assert few.critical > many.critical == pytest.approx(DESIGN.upper()[0])


def test_no_noise_estimate_means_no_keep():
    design = stats.Design(0.01, 2)
    assert stats.sequential([5.0], stats.NO_NOISE, design).step == Step.MORE
    last = stats.sequential([5.0, 5.0], stats.NO_NOISE, design)
    assert last.step == Step.DISCARD and not last.noise_known
    assert "no noise estimate" in last.reason


def test_a_noise_free_evaluator_keeps_a_real_gain_on_one_pair():
    exact = Noise(0.0, 3.0, "repeated measurements")
    assert stats.sequential([0.25], exact, DESIGN, screen=math.inf).step == Step.KEEP


def run_test(rng: random.Random, effect: float, design: stats.Design) -> bool:
    """One candidate: its screen evaluation against a well-measured incumbent, then pairs
    (two evaluations of sd 1 each) until the test decides. `effect` in sigma."""
    z0 = effect + rng.gauss(0, 1)
    if z0 <= 0.25:  # the judge's screen
        return False
    diffs: list[float] = []
    while True:
        diffs.append(effect + rng.gauss(0, 1) - rng.gauss(0, 1))
        test = stats.sequential(diffs, KNOWN, design, screen=z0)
        if test.step != Step.MORE:
            return test.step == Step.KEEP


def test_the_false_keep_rate_holds_under_no_effect():
    rng = random.Random(7)
    design = stats.Design(0.05, 30)
    trials = 4000
    keeps = sum(run_test(rng, 0.0, design) for _ in range(trials))
    # the level is 5%: at most that, up to 3 binomial standard errors
    assert keeps / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)


def test_power_at_one_and_three_sigma():
    design = stats.Design(0.0075, 30)  # what the judge spends of a 1% rate
    rng = random.Random(8)
    assert sum(run_test(rng, 3.0, design) for _ in range(300)) / 300 >= 0.9
    assert sum(run_test(rng, 1.0, design) for _ in range(300)) / 300 >= 0.5
    kept, _ = design.operating(1.0 / math.sqrt(2.0))
    assert kept >= 0.55  # the same from the numerical integration


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


def test_clearly_worse_run_stops_only_a_run_worse_at_the_same_steps():
    incumbent = [(s, 4.0 / (1 + 0.1 * s)) for s in range(0, 100, 5)]
    worse = [(s, 1.1 * v) for s, v in incumbent]  # 10% worse at every step
    hit = stats.clearly_worse_run(worse, incumbent)
    assert hit is not None
    step, value, level = hit
    assert 20 <= step <= 95 and value == pytest.approx(1.1 * level)
    # the first fifth of the incumbent's run is not judged: a slow start is allowed
    assert stats.clearly_worse_run(worse[:5], incumbent) is None
    # as good, a hair worse (inside the margin), or better: never stopped
    assert stats.clearly_worse_run(incumbent, incumbent) is None
    assert stats.clearly_worse_run([(s, 1.01 * v) for s, v in incumbent], incumbent) is None
    assert stats.clearly_worse_run([(s, 0.9 * v) for s, v in incumbent], incumbent) is None
    # worse early, catching up: the last reports decide
    catching = [(s, v * (1.2 if s < 50 else 1.0)) for s, v in incumbent]
    assert stats.clearly_worse_run(catching, incumbent) is None
    # steps past the incumbent's last report, or no incumbent curve: nothing to compare
    assert stats.clearly_worse_run([(s + 1000, v) for s, v in worse], incumbent) is None
    assert stats.clearly_worse_run(worse, []) is None
