"""The statistics of a keep: the study's noise, one pooled estimate per commit, and the
sequential test that confirms a would-be winner on fresh paired measurements.

Pure functions of numbers (no ledger, no config), so the judge, the headlines and
bench/statistics.py all use the same arithmetic. docs/statistics.md says what the test
assumes and why it holds the false-keep rate the user sets.

scipy is not a dependency of ratchet: the two distributions needed here (Student's t
and the exact null distribution of the signed-rank statistic) take a few lines of
stdlib arithmetic each, tested against tabulated values, where scipy.stats would add
about 100 MB to every install and about half a second to every driver start.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

# -- Student's t, from the regularised incomplete beta function -----------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom (df = inf: the normal)."""
    if math.isinf(df):
        return 1.0 - statistics.NormalDist().cdf(t)
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=1024)  # pure, and asked the same (p, df) for every commit of a view
def t_ppf(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection on t_sf: exact enough, and never fails)."""
    if math.isinf(df):
        return statistics.NormalDist().inv_cdf(p)
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if 1.0 - t_sf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * max(1.0, abs(mid)):
            break
    return (lo + hi) / 2.0


# -- the exact signed-rank test (paired instances, e.g. a kernel's shapes) --------------------


def signed_rank_p(diffs: Sequence[float]) -> float:
    """One-sided p-value of Wilcoxon's signed-rank test that the diffs are centred above 0.

    Zeros are dropped; tied magnitudes share their mean rank. The null distribution is
    counted exactly (ranks doubled so mid-ranks stay integers): no normal approximation,
    so it holds for the dozen shapes of a kernel sweep.
    """
    values = [d for d in diffs if d != 0]
    n = len(values)
    if n == 0:
        return 1.0
    order = sorted(range(n), key=lambda i: abs(values[i]))
    ranks2 = [0] * n  # twice the (mid-)rank
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(values[order[j + 1]]) == abs(values[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks2[order[k]] = i + j + 2  # 2 x mean of ranks i+1..j+1
        i = j + 1
    observed = sum(r for r, v in zip(ranks2, values, strict=True) if v > 0)
    counts = {0: 1}  # ways to reach each doubled rank sum with a random sign per rank
    for r in ranks2:
        nxt = dict(counts)
        for total, ways in counts.items():
            nxt[total + r] = nxt.get(total + r, 0) + ways
        counts = nxt
    at_least = sum(ways for total, ways in counts.items() if total >= observed)
    return at_least / 2 ** n


# -- the study's noise --------------------------------------------------------------------------


@dataclass(frozen=True)
class Noise:
    """The spread of one evaluation (sigma), and how much evidence it rests on (df).

    From the repeated measurements of every commit of the study (between-job spread,
    df = measurements - commits), floored by what evaluators report (`<metric>_sem`,
    or the spread of a job's repeats): a reported error can only make a test stricter.

    `relative`: sigma is the spread of log(value), a fraction of the value. A metric that
    is always positive (a time, a loss, bits per byte) is pooled that way, because its
    noise grows with it: a kernel at 130 ms wobbles by more milliseconds than one at 20.
    """

    sigma: float | None
    df: float
    source: str
    relative: bool = False

    @property
    def known(self) -> bool:
        return self.sigma is not None and self.df > 0

    def sigma_at(self, value: float) -> float | None:
        """The spread of one evaluation of a commit whose value is about `value`."""
        if self.sigma is None:
            return None
        return self.sigma * abs(value) if self.relative else self.sigma


NO_NOISE = Noise(None, 0.0, "none")


def positive(groups: Iterable[Sequence[float]]) -> bool:
    """Every value > 0 (and some value at all): the noise can be pooled relative."""
    values = [v for g in groups for v in g]
    return bool(values) and all(v > 0 for v in values)


def pooled_noise(groups: Iterable[Sequence[float]], reported: Iterable[float] = (),
                 relative: bool = False) -> Noise:
    """Pool the within-commit spread of `groups` (one list of evaluations per commit).

    With `relative`, the values are positive and pooled as logs, and `reported` errors
    are fractions of their values (sem / value)."""
    squares, df = 0.0, 0
    for values in groups:
        if relative:
            values = [math.log(v) for v in values]
        if len(values) >= 2:
            mean = statistics.fmean(values)
            squares += sum((v - mean) ** 2 for v in values)
            df += len(values) - 1
    reported = [r for r in reported if r is not None and math.isfinite(r)]
    floor = math.sqrt(statistics.fmean([r * r for r in reported])) if reported else None
    if df:
        sigma = math.sqrt(squares / df)
        if floor is not None and floor > sigma:
            return Noise(floor, float(df), "repeated measurements, floored by reported SEM",
                         relative)
        return Noise(sigma, float(df), "repeated measurements", relative)
    if floor is not None:
        # a reported error alone: taken as known (the evaluator averaged many timings)
        return Noise(floor, math.inf, "reported SEM", relative)
    return NO_NOISE


# -- one estimate per commit ---------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """Every evaluation of one commit pooled: mean, its standard error, an interval."""

    mean: float
    n: int
    sem: float | None
    low: float | None
    high: float | None
    confidence: float

    def as_dict(self) -> dict:
        return {"mean": self.mean, "n": self.n, "sem": self.sem, "low": self.low,
                "high": self.high, "confidence": self.confidence}

    def text(self, digits: str = ".4g") -> str:
        """'14.2 ± 0.31 (n=5)': the interval's half width, and how many evaluations."""
        if self.low is None or self.high is None:
            return f"{self.mean:{digits}} (n={self.n}, no noise estimate)"
        return f"{self.mean:{digits}} ± {(self.high - self.low) / 2:.2g} (n={self.n})"


def estimate(values: Sequence[float], noise: Noise, confidence: float = 0.95) -> Estimate | None:
    """The pooled estimate of one commit from all its evaluations, with a two-sided
    `confidence` interval from the study's noise (t with the noise's df)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    mean = statistics.fmean(values)
    sigma = noise.sigma_at(mean) if noise.known else None
    if sigma is None:
        return Estimate(mean, len(values), None, None, None, confidence)
    sem = sigma / math.sqrt(len(values))
    half = t_ppf(0.5 + confidence / 2.0, noise.df) * sem
    return Estimate(mean, len(values), sem, mean - half, mean + half, confidence)


# -- the sequential confirmation test ---------------------------------------------------------


class Step(StrEnum):
    KEEP = "keep"
    DISCARD = "discard"
    MORE = "more"  # measure another pair


@dataclass(frozen=True)
class Test:
    step: Step
    pairs: int
    mean: float | None = None  # mean paired gain beyond min_improvement
    t: float | None = None
    critical: float | None = None
    reason: str = ""
    noise_known: bool = True


def per_look_rate(false_keep_rate: float, max_pairs: int, look: int) -> float:
    """The error rate spent at look `look` (after that many pairs), of `max_pairs` looks.

    The rates add up to `false_keep_rate` (Bonferroni), so the chance that any look
    keeps a change with no effect is at most that, whatever the stopping rule: one that
    discards early, or picks which candidate to confirm, can only lower it. Spent in
    proportion to 1/look: most real gains are confirmed in the first pairs, where a
    larger share of the rate buys the most.
    """
    looks = max(1, max_pairs)
    harmonic = sum(1.0 / j for j in range(1, looks + 1))
    return false_keep_rate / (look * harmonic)


def sequential(diffs: Sequence[float], noise: Noise, false_keep_rate: float,
               max_pairs: int, per_pair: bool = False) -> Test:
    """Keep, discard or measure another pair, from the paired gains measured so far.

    `diffs[j]` is the candidate's gain over the incumbent in confirmation pair j (both
    measured side by side, fresh), less min_improvement: in log units when the noise is
    relative. With `per_pair`, `noise` is the spread of one pair's difference. `noise` is the study's noise,
    pooled from every repeated measurement (this test's pairs included). The test is a
    one-sided t-test of mean(diffs) > 0 at every look, each at its share of
    false_keep_rate (`per_look_rate`); it discards as soon as the fresh pairs show no
    gain, and when max_pairs pairs did not suffice.
    """
    n = len(diffs)
    if n == 0:
        return Test(Step.MORE, 0, reason="no confirmation pair yet")
    mean = statistics.fmean(diffs)
    if mean <= 0:
        return Test(Step.DISCARD, n, mean=mean,
                    reason=f"not confirmed: fresh pairs show no gain (mean {mean:.4g} "
                           f"over {n} pair{'s' * (n > 1)})")
    if not noise.known or noise.sigma is None:
        if n >= max_pairs:
            return Test(Step.DISCARD, n, mean=mean, noise_known=False,
                        reason="no noise estimate: nothing is kept without one")
        return Test(Step.MORE, n, mean=mean, reason="no noise estimate yet", noise_known=False)
    rate = per_look_rate(false_keep_rate, max_pairs, min(n, max_pairs))
    critical = t_ppf(1.0 - rate, noise.df)
    # a difference of two evaluations has twice the variance of one
    # `per_pair`: noise.sigma is the spread of one pair's difference itself (pooled from
    # paired differences, where drift shared by both sides cancels); otherwise the spread
    # of one evaluation, and a difference of two has twice its variance
    se = noise.sigma * math.sqrt((1.0 if per_pair else 2.0) / n)
    t = math.inf if se == 0 else mean / se
    if t >= critical:
        return Test(Step.KEEP, n, mean=mean, t=t, critical=critical,
                    reason=f"confirmed on {n} fresh pair{'s' * (n > 1)}: t {t:.3g} >= "
                           f"{critical:.3g} (false-keep rate {false_keep_rate:.3g})")
    if n >= max_pairs:
        return Test(Step.DISCARD, n, mean=mean, t=t, critical=critical,
                    reason=f"not confirmed in {n} pairs: t {t:.3g} < {critical:.3g}")
    return Test(Step.MORE, n, mean=mean, t=t, critical=critical,
                reason=f"t {t:.3g} < {critical:.3g} after {n} pair{'s' * (n > 1)}")


# -- early stopping (discard only) ----------------------------------------------------------


def clearly_slower(candidate: Sequence[float], incumbent: Sequence[float],
                   rate: float = 0.01, min_shapes: int = 3, method: str = "t") -> float | None:
    """The p-value that the candidate is no slower than the incumbent on the shapes timed
    so far, when it is below `rate` (stop it: it is clearly slower), else None.

    Paired by shape, as Optuna's WilcoxonPruner pairs by instance. `method` "t": a
    one-sided t-test on the per-shape log time ratios (a shape's time is multiplicative;
    the default: it decides after a few shapes); "rank": Wilcoxon's signed-rank test,
    which assumes nothing about the noise but needs n shapes for p = 2**-n. Stopping only
    ever discards; a keep needs the full sweep and the confirmation, so `rate` is the
    chance of stopping a candidate that is in truth no slower.
    """
    pairs = [(c, i) for c, i in zip(candidate, incumbent, strict=False)
             if c is not None and i is not None and c > 0 and i > 0]
    if len(pairs) < min_shapes:
        return None
    logs = [math.log(c / i) for c, i in pairs]  # positive: the candidate took longer
    if method == "rank":
        p = signed_rank_p(logs)
    else:
        spread = statistics.stdev(logs)
        mean = statistics.fmean(logs)
        if spread == 0:
            p = 0.0 if mean > 0 else 1.0
        else:
            p = t_sf(mean / (spread / math.sqrt(len(logs))), len(logs) - 1)
    return p if p < rate else None


def incumbent_extra(env: dict[str, str] | None = None) -> dict[str, float]:
    """For an evaluator: the incumbent's extra metrics (e.g. per-shape times) that the
    driver passes to a proposed candidate's job in $RATCHET_INCUMBENT_EXTRA; {} when there
    are none (the baseline itself, a confirmation re-measure, or nothing recorded)."""
    text = (os.environ if env is None else env).get("RATCHET_INCUMBENT_EXTRA", "")
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float)} \
        if isinstance(data, dict) else {}
