"""The statistics of a keep: the study's noise, one pooled estimate per commit, and the
sequential test that confirms a would-be winner on fresh paired measurements.

Pure functions of numbers (no ledger, no config), so the judge, the headlines and
bench/keep_statistics.py all use the same arithmetic. docs/statistics.md says what the test
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


def _t_pdf(t: float, df: float) -> float:
    front = math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
    return math.exp(front - (df + 1.0) / 2.0 * math.log1p(t * t / df))


@functools.lru_cache(maxsize=1024)  # pure, and asked the same (p, df) for every commit of a view
def t_ppf(p: float, df: float) -> float:
    """The t with P(T <= t) = p: Newton's method from the normal quantile (a few steps),
    bisection on t_sf where Newton does not settle (exact enough, and never fails)."""
    if math.isinf(df):
        return statistics.NormalDist().inv_cdf(p)
    if 1e-12 < p < 1.0 - 1e-12:
        t = statistics.NormalDist().inv_cdf(p)
        for _ in range(30):
            density = _t_pdf(t, df)
            if density <= 0:
                break
            step = ((1.0 - t_sf(t, df)) - p) / density
            if not math.isfinite(step) or abs(step) > max(1.0, abs(t)):
                break  # far out in a heavy tail: bisection below
            t -= step
            if abs(step) < 1e-11 * max(1.0, abs(t)):
                return t
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
        more, more_df = spread_sums(values, relative)
        squares, df = squares + more, df + more_df
    return noise_from_sums(squares, df, reported, relative)


def spread_sums(values: Sequence[float], relative: bool = False) -> tuple[float, int]:
    """One commit's part of the pooled noise: (squared deviations from its mean, df)."""
    if len(values) < 2:
        return 0.0, 0
    if relative:
        values = [math.log(v) for v in values]
    mean = statistics.fmean(values)
    return sum((v - mean) ** 2 for v in values), len(values) - 1


def noise_from_sums(squares: float, df: int, reported: Iterable[float] = (),
                    relative: bool = False) -> Noise:
    """The pooled noise from its sums (pooled_noise, for a caller that caches them)."""
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


# -- group-sequential boundaries (numerical integration over looks) ---------------------------

_SQRT2 = math.sqrt(2.0)


def _upper_tail(x: float) -> float:
    """P(N(0, 1) > x)."""
    return 0.5 * math.erfc(x / _SQRT2)


def _density(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _nodes(mean: float, lower: float, upper: float, r: int) -> tuple[list[float], list[float]]:
    """Integration nodes and Simpson weights over (lower, upper) for a statistic of mean
    `mean`: Jennison & Turnbull's grid (Group Sequential Methods, ch. 19), dense within
    3 sd of the mean, sparse out to about 8, cut at the continuation region's ends."""
    base = []
    for i in range(1, 6 * r):
        if i < r:
            x = -3.0 - 4.0 * math.log(r / i)
        elif i <= 5 * r:
            x = -3.0 + 3.0 * (i - r) / (2.0 * r)
        else:
            x = 3.0 + 4.0 * math.log(r / (6 * r - i))
        base.append(mean + x)
    inside = [x for x in base if lower < x < upper]
    ends = [max(lower, base[0])] + inside + [min(upper, base[-1])]
    if ends[-1] <= ends[0]:
        return [], []
    points: list[float] = []
    weights: list[float] = []
    for left, right in zip(ends, ends[1:], strict=False):
        width = right - left
        if not points:
            points.append(left)
            weights.append(0.0)
        weights[-1] += width / 6.0
        points += [(left + right) / 2.0, right]
        weights += [4.0 * width / 6.0, width / 6.0]
    return points, weights


class _Walk:
    """The density of the standardised statistic Z_k = S_k / sqrt(I_k) (S: the score,
    a sum of independent normal increments of variance I_k - I_{k-1} and mean theta
    times it) over the paths that have not stopped at any look so far."""

    def __init__(self, info: float, lower: float, upper: float, theta: float, r: int) -> None:
        self.theta, self.r, self.info = theta, r, info
        mean = theta * math.sqrt(info)
        self.points, weights = _nodes(mean, lower, upper, r)
        self.mass = [w * _density(z - mean) for z, w in zip(self.points, weights, strict=True)]

    def _shift(self, info: float) -> tuple[float, float]:
        gap = info - self.info
        return gap, math.sqrt(gap)

    def cross_above(self, info: float, bound: float) -> float:
        """P(not stopped yet, and Z at the next look (information `info`) >= bound)."""
        if math.isinf(bound):
            return 0.0
        gap, root = self._shift(info)
        top, prev = bound * math.sqrt(info), math.sqrt(self.info)
        return sum(m * _upper_tail((top - z * prev - self.theta * gap) / root)
                   for z, m in zip(self.points, self.mass, strict=True))

    def cross_below(self, info: float, bound: float) -> float:
        if math.isinf(bound):
            return 0.0
        gap, root = self._shift(info)
        top, prev = bound * math.sqrt(info), math.sqrt(self.info)
        return sum(m * (1.0 - _upper_tail((top - z * prev - self.theta * gap) / root))
                   for z, m in zip(self.points, self.mass, strict=True))

    def step(self, info: float, lower: float, upper: float) -> None:
        """Move to the next look and drop the paths that stop there."""
        gap, root = self._shift(info)
        mean = self.theta * math.sqrt(info)
        points, weights = _nodes(mean, lower, upper, self.r)
        scale, prev = math.sqrt(info) / root, math.sqrt(self.info)
        mass = []
        for z, w in zip(points, weights, strict=True):
            at = z * math.sqrt(info) - self.theta * gap
            mass.append(w * scale * sum(m * _density((at - u * prev) / root)
                                        for u, m in zip(self.points, self.mass, strict=True)))
        self.points, self.mass, self.info = points, mass, info


def crossings(info: Sequence[float], upper: Sequence[float], lower: Sequence[float],
              theta: float = 0.0, r: int = 16) -> tuple[list[float], list[float]]:
    """For looks at information levels `info` with boundaries on the standardised
    statistic (stop for efficacy at Z >= upper, for futility at Z < lower; inf/-inf for
    none), the probability of stopping first above, and below, at each look, when the
    drift per unit of information is `theta`."""
    walk = _Walk(info[0], lower[0], upper[0], theta, r)
    mean = theta * math.sqrt(info[0])
    above = [_upper_tail(upper[0] - mean) if not math.isinf(upper[0]) else 0.0]
    below = [1.0 - _upper_tail(lower[0] - mean) if not math.isinf(lower[0]) else 0.0]
    for k in range(1, len(info)):
        above.append(walk.cross_above(info[k], upper[k]))
        below.append(walk.cross_below(info[k], lower[k]))
        walk.step(info[k], lower[k], upper[k])
    return above, below


def wang_tsiatis(looks: int, alpha: float, shape: float, r: int = 16) -> float:
    """The constant C of the one-sided boundary Z_k >= C (k/K)^(shape - 1/2) at K equally
    spaced looks with level `alpha`: shape 0.5 is Pocock's, 0 O'Brien & Fleming's."""
    info = [float(k) for k in range(1, looks + 1)]
    lower = [-math.inf] * looks
    lo, hi = 1.0, 8.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        upper = [mid * (k / looks) ** (shape - 0.5) for k in info]
        if sum(crossings(info, upper, lower, 0.0, r)[0]) > alpha:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


@functools.lru_cache(maxsize=256)
def spending_bounds(info: tuple[float, ...], lower: tuple[float, ...], rate: float,
                    spends: tuple[bool, ...], r: int = 12) -> tuple[float, ...]:
    """Efficacy boundaries on Z_k that spend `rate` in proportion to information (Lan &
    DeMets' linear spending function, alpha * I_k / I_K), over the looks where `spends`
    is true (inf elsewhere), with the futility boundaries `lower` binding: the paths they
    stop can never be kept, so the rate is spent on the paths that go on."""
    upper: list[float] = []
    spent = 0.0
    walk: _Walk | None = None
    for k, level in enumerate(info):
        target = rate * level / info[-1] - spent
        if not spends[k] or target <= 0:
            bound = math.inf
        else:
            def tail(b: float, k: int = k, walk: _Walk | None = walk) -> float:
                if walk is None:
                    return _upper_tail(b)
                return walk.cross_above(info[k], b)
            lo, hi = -8.0, 12.0
            for _ in range(50):
                mid = (lo + hi) / 2.0
                if tail(mid) > target:
                    lo = mid
                else:
                    hi = mid
            bound = hi
            spent += tail(bound)
        upper.append(bound)
        if walk is None:
            walk = _Walk(level, lower[k], bound, 0.0, r)
        else:
            walk.step(level, lower[k], bound)
    return tuple(upper)


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
    t: float | None = None  # the combined statistic Z_n (t-like: the noise is estimated)
    critical: float | None = None
    reason: str = ""
    noise_known: bool = True


@dataclass(frozen=True)
class Design:
    """The group-sequential design of a confirmation (docs/statistics.md).

    Look 0 is the candidate's own first evaluation against the incumbent's pooled
    estimate (the screen), worth `prior` pairs of information; looks 1..max_pairs follow
    each fresh pair. The statistic at look n is the inverse-normal combination
    Z_n = (sqrt(prior) z_0 + sum of the pairs' z_j) / sqrt(prior + n), each z standard
    normal under no effect, so its null distribution is that of a sum of independent
    increments whatever the real weights: the boundaries below hold the rate exactly.
    Futility is binding: look 0 stops at z_0 <= screen_z (the screen: a gain of at most
    min_improvement, whatever the noise, is never re-measured), every later look at
    Z_n < futility; the efficacy boundaries
    spend `rate` linearly in information over the paths that go on (Lan & DeMets).
    `prior = 0`: no screen look (fresh pairs alone).
    """

    rate: float
    max_pairs: int
    prior: float = 2.0
    screen_z: float = 0.0
    futility: float = 0.4
    # z_0 counts at most this much: one lucky evaluation (an outlier of a noise that is
    # not normal) cannot carry a keep; capping only lowers Z_n, so the rate still holds
    screen_cap: float = 3.0

    def _looks(self) -> tuple[tuple[float, ...], tuple[float, ...], tuple[bool, ...]]:
        pairs = range(1, self.max_pairs + 1)
        if self.prior > 0:
            info = (self.prior, *(self.prior + n for n in pairs))
            return (info, (self.screen_z, *(self.floor(n) for n in pairs)),
                    (False, *(True for _ in pairs)))
        return (tuple(float(n) for n in pairs), tuple(self.floor(n) for n in pairs),
                tuple(True for _ in pairs))

    def bound_at(self, taken: Sequence[int]) -> float:
        """The efficacy boundary on Z_n at the last of the looks `taken` (the pairs
        measured at each look so far, rising: 1, 3, 5 for a first pair and then groups of
        two). Lan & DeMets' linear spending over the information the looks actually had,
        with the final information fixed at max_pairs, so a look of several pairs spends
        what the single looks it replaces would have spent together, and the rate holds
        whatever the group sizes, as long as they do not depend on the pairs' values
        (docs/statistics.md, "Grouped looks"). With one pair a look it is `upper()`."""
        pairs = sorted({min(n, self.max_pairs) for n in taken if n > 0})
        tail = () if pairs[-1] >= self.max_pairs else (self.max_pairs,)
        levels = (*pairs, *tail)
        if self.prior > 0:
            info = (self.prior, *(self.prior + n for n in levels))
            lower = (self.screen_z, *(self.floor(n) for n in levels))
            spends = (False, *(True for _ in levels))
            return spending_bounds(info, lower, self.rate, spends)[len(pairs)]
        bounds = spending_bounds(tuple(float(n) for n in levels),
                                 tuple(self.floor(n) for n in levels), self.rate,
                                 tuple(True for _ in levels))
        return bounds[len(pairs) - 1]

    def floor(self, n: int) -> float:
        """The futility boundary on Z_n after n pairs (the same at every look: a gain
        that is not even `futility` standard errors above zero is given up on)."""
        return self.futility

    def upper(self) -> tuple[float, ...]:
        """The efficacy boundary on Z_n after n = 1..max_pairs pairs (known noise)."""
        info, lower, spends = self._looks()
        bounds = spending_bounds(info, lower, self.rate, spends)
        return bounds[1:] if self.prior > 0 else bounds

    def operating(self, theta: float) -> tuple[float, float]:
        """(P(keep), expected pairs) for a gain of `theta` per unit of a pair's
        information (a gain of delta sigma: theta = delta / sqrt(2)), known noise; the
        screen look included (its rejections cost no pair)."""
        info, lower, spends = self._looks()
        upper = spending_bounds(info, lower, self.rate, spends)
        above, below = crossings(info, upper, lower, theta, 12)
        gone, pairs = 0.0, 0.0
        first = 1 if self.prior > 0 else 0
        if first:
            gone = above[0] + below[0]
        for k in range(first, len(info)):
            pairs += 1.0 - gone
            gone += above[k] + below[k]
        return sum(above), pairs


def _matched(z: float, df: float) -> float:
    """A boundary on a normal statistic as the t of the same tail (the noise estimated on
    `df` degrees of freedom): Jennison & Turnbull's significance-level approach."""
    if math.isinf(z) or math.isinf(df):
        return z
    return t_ppf(1.0 - _upper_tail(z), df)


def sequential(diffs: Sequence[float], noise: Noise, design: Design,
               per_pair: bool = False, screen: float | None = None,
               looks: Sequence[int] = ()) -> Test:
    """Keep, discard or measure another pair, from the paired gains measured so far.

    `diffs[j]` is the candidate's gain over the incumbent in confirmation pair j (both
    measured side by side, fresh), less min_improvement: in log units when the noise is
    relative. `noise` is the study's noise (the spread of one evaluation, or with
    `per_pair` of one pair's difference). `screen` is z_0: the candidate's own first
    gain over the incumbent's pooled estimate, in standard errors of that comparison
    (None: the design has no screen look). The test is `design` (see Design); with an
    estimated noise each boundary is the t of the same tail on the noise's df.
    `looks`: the pairs measured at each look so far, the last one `len(diffs)` (grouped
    looks, Design.bound_at); empty: one pair a look.
    """
    n = len(diffs)
    mean = statistics.fmean(diffs) if diffs else None
    if design.prior > 0 and screen is not None and screen <= design.screen_z:
        return Test(Step.DISCARD, n, mean=mean, t=screen,
                    reason=f"not confirmed: its first gain is inside the noise ({screen:.3g} "
                           f"standard errors <= {design.screen_z:g})")
    if n == 0:
        return Test(Step.MORE, 0, reason="no confirmation pair yet")
    assert mean is not None
    if not noise.known or noise.sigma is None:
        if n >= design.max_pairs:
            return Test(Step.DISCARD, n, mean=mean, noise_known=False,
                        reason="no noise estimate: nothing is kept without one")
        return Test(Step.MORE, n, mean=mean, reason="no noise estimate yet", noise_known=False)
    look = min(n, design.max_pairs)
    # a difference of two evaluations has twice the variance of one; with `per_pair`
    # the noise is the spread of a pair's difference itself
    spread = noise.sigma * (1.0 if per_pair else math.sqrt(2.0))
    prior = design.prior if screen is not None else 0.0
    if spread == 0:
        z = math.inf if sum(diffs) > 0 else -math.inf
    else:
        first = min(screen, design.screen_cap) if screen is not None else 0.0
        score = sum(diffs) / spread + math.sqrt(prior) * first
        z = score / math.sqrt(prior + n)
    plan = design if screen is not None or design.prior == 0 else Design(
        design.rate, design.max_pairs, 0.0, design.screen_z, design.futility)
    taken = [m for m in looks if m < n] + [n] if looks else []
    grouped = bool(taken) and taken != list(range(1, len(taken) + 1))
    bound = plan.bound_at(taken) if grouped else plan.upper()[look - 1]
    critical = _matched(bound, noise.df)
    floor = _matched(plan.floor(look), noise.df)
    pairs = f"{n} fresh pair{'s' * (n > 1)}"
    # a keep also needs the fresh pairs themselves to show a gain (an extra condition
    # for a keep: it can only lower the rate)
    if z >= critical and mean > 0:
        return Test(Step.KEEP, n, mean=mean, t=z, critical=critical,
                    reason=f"confirmed on {pairs}: Z {z:.3g} >= {critical:.3g} "
                           f"(false-keep rate {design.rate:.3g})")
    if n >= design.max_pairs:
        return Test(Step.DISCARD, n, mean=mean, t=z, critical=critical,
                    reason=f"not confirmed in {n} pairs: Z {z:.3g} < {critical:.3g}"
                           + ("" if z < critical else " or no gain in the fresh pairs"))
    if z < floor:
        return Test(Step.DISCARD, n, mean=mean, t=z, critical=critical,
                    reason=f"not confirmed: no gain after {pairs} (Z {z:.3g} < {floor:.3g})")
    return Test(Step.MORE, n, mean=mean, t=z, critical=critical,
                reason=f"Z {z:.3g} < {critical:.3g} after {pairs}")


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


def _at(curve: Sequence[tuple[float, float]], step: float) -> float:
    """The curve's value at `step`, linear between its reports (step within its range)."""
    for (s0, v0), (s1, v1) in zip(curve, curve[1:], strict=False):
        if s0 <= step <= s1:
            return v0 if s1 == s0 else v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return curve[-1][1]


def clearly_worse_run(candidate: Sequence[tuple[float, float]],
                      incumbent: Sequence[tuple[float, float]], rate: float = 0.01,
                      margin: float = 0.02, window: int = 5, start: float = 0.2
                      ) -> tuple[float, float, float] | None:
    """(step, value, incumbent's value there) when a training run is clearly worse than
    the incumbent's at the same step, else None. Values: lower is better (a loss).

    Clearly worse: each of the candidate's last `window` reports, past `start` of the
    incumbent's run (a slow start is not judged), is worse than the incumbent's curve at
    the same step by more than `margin` (relative), and a one-sided paired t-test on
    their log ratios says so at `rate` (as clearly_slower does for a kernel's shapes).
    Reports of one run are correlated, so the t-test alone would be too quick; the
    margin on every one of them is what makes the rule blunt. Stopping only ever
    discards: its error is a lost candidate, never a false keep.
    """
    inc = sorted((s, v) for s, v in incumbent if math.isfinite(s) and math.isfinite(v) and v > 0)
    if len(inc) < 2:
        return None
    first, last = inc[0][0], inc[-1][0]
    begin = first + start * (last - first)
    points = [(s, v, _at(inc, s)) for s, v in candidate
              if math.isfinite(v) and v > 0 and begin <= s <= last]
    recent = points[-window:]
    if len(recent) < window or not all(v > (1.0 + margin) * i for _, v, i in recent):
        return None
    p = clearly_slower([v for _, v, _ in recent], [i for _, _, i in recent], rate=rate,
                       min_shapes=window)
    return recent[-1] if p is not None else None


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
