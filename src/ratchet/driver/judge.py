"""The judge: keep / discard / crash / rejected, with the reasons written down.

A candidate is kept only if it ran cleanly, broke no rule, and beats the incumbent by
more than both the configured `min_improvement` and the measured noise; with a hold-out
evaluator it must also not regress on data it never saw.

Everything here is a pure function of results, the incumbent and the acceptance
config. The one outside action, running the hold-out of a would-be keep, is passed in as
a callable, so the same rules serve rounds, rolling search and `ratchet wait`.
"""

from __future__ import annotations

import math
import operator
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ratchet.core import stats
from ratchet.core.candidate import Incumbent
from ratchet.core.config import Config
from ratchet.core.verdict import Reason, Verdict
from ratchet.core.vocab import Kind, Outcome, Status
from ratchet.job.jobspec import JobResult

# A candidate's improvement must exceed this many standard errors of the difference
# between its samples and the incumbent's (roughly a one-sided 97.5% test).
NOISE_Z = 2.0
# The screen passes a candidate to confirmation only when its one evaluation beats the
# incumbent's pooled estimate by this many standard errors of that comparison: a filter
# on what is worth re-measuring (it spends none of the false-keep rate, which the
# confirmation alone holds), so that a loser worse by a sigma or more rarely costs a pair.
SCREEN_Z = 0.25
# The confirmation measures a pair's difference against the spread of paired differences
# (drift cancels in a pair) once the study's confirmations give it this many degrees of
# freedom; before, against twice the spread of one evaluation.
PAIRED_DF = 10
# The confirmation's design (stats.Design): the screen's evaluation counts as this many
# pairs of information (one evaluation against a pooled mean of many: about twice a
# pair's, whose difference has two evaluations' variance), and a look whose combined
# statistic Z_n is below FUTILITY discards.
SCREEN_PRIOR = 2.0
FUTILITY = 0.4
# The share of false_keep_rate the design spends; the rest is a margin for what its
# arithmetic assumes and an evaluator may bend (normal noise, a noise estimate matched
# to t on its df, the screen's one evaluation against a mean pooled over time). Power
# hardly depends on it: a 1-sigma gain is lost to the screen and the futility rule,
# not to the efficacy bar (docs/statistics.md).
SPENT = 0.75
# A metric is taken as noiseless (one reproducing pair confirms) only once the study has
# repeated at least this many evaluations, the new pair's two included, every one of them
# identical to the first of its commit: a coarse noisy metric (a rounded score) can
# reproduce by chance once or twice, far less often four times running.
NOISELESS_REPEATS = 4
# said of a would-be keep made on an older incumbent (confirmed as its own files)
STALE_NOTE = "made on an older incumbent: its own files are confirmed against the incumbent's"
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*(<=|>=|<|>|==|!=)\s*(-?[\d.eE+\-]+)\s*$")
_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
        "==": operator.eq, "!=": operator.ne}


def outcome_status(result: JobResult) -> Verdict | None:
    """The verdict a result forces on its own, before comparing it with anything."""
    if result.outcome == Outcome.OK:
        if (result.extra or {}).get("stopped_early"):
            # stopped as clearly worse: a stop only ever discards, never keeps
            return Verdict(Status.DISCARD, [f"stopped early: {result.reason or 'clearly worse'}"],
                           code=Reason.STOPPED_EARLY)
        return None
    if result.outcome == Outcome.VIOLATION:
        return Verdict(Status.REJECTED, [result.reason], code=Reason.VIOLATION)
    if result.outcome == Outcome.CANCELLED:
        return Verdict(Status.CANCELLED, [result.reason or "cancelled"], code=Reason.CANCELLED)
    if result.outcome == Outcome.FAILED and result.correct is False:  # a wrong result
        return Verdict(Status.REJECTED, [result.reason], code=Reason.FAILED)
    return Verdict(Status.CRASH, [result.reason or result.outcome], code=Reason.FAILED)


def not_measured(config: Config, result: JobResult) -> Verdict | None:
    """The verdict of a result that cannot be compared at all: a broken constraint
    (rejected) or no metric (crash); None when it can."""
    problems = check_constraints(config, result)
    if problems:
        return Verdict(Status.REJECTED, problems, code=Reason.CONSTRAINT)
    if result.metric is None:
        return Verdict(Status.CRASH, [f"no {config.metric.name} measured"], code=Reason.FAILED)
    return None


def check_constraints(config: Config, result: JobResult) -> list[str]:
    problems = []
    for rule in config.task.constraints:
        match = _CONSTRAINT.match(rule)
        if not match:
            continue
        name, op, bound = match.group(1), match.group(2), float(match.group(3))
        value = result.extra.get(name)
        if not isinstance(value, int | float):
            problems.append(f"constraint {rule!r}: the evaluator printed no {name}")
        elif not _OPS[op](float(value), bound):
            problems.append(f"constraint {rule!r} violated ({name} = {value:g})")
    return problems


def standard_error(samples: list[float]) -> float | None:
    if len(samples) < 2:
        return None
    return statistics.stdev(samples) / math.sqrt(len(samples))


def sem_of(result_extra: dict | None, metric: str) -> float | None:
    """The evaluator's own standard error for the metric (`<metric>_sem: ...`), if any."""
    value = (result_extra or {}).get(f"{metric}_sem")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return abs(float(value)) if math.isfinite(value) else None


def _error(samples: list[float], sem: float | None) -> float | None:
    """Standard error of the mean of `samples`: from the spread of the samples, or from
    the evaluator's reported SEM (one per evaluation, so divided by sqrt(n)), whichever
    is larger: a reported SEM can only make the judge more careful."""
    spread = standard_error(samples)
    reported = sem / math.sqrt(max(len(samples), 1)) if sem is not None else None
    known = [x for x in (spread, reported) if x is not None]
    return max(known) if known else None


def noise_margin(candidate: list[float], incumbent: list[float], paired: bool,
                 candidate_sem: float | None = None,
                 incumbent_sem: float | None = None) -> float | None:
    """How big a difference the measurements can produce by chance (NOISE_Z std errors)."""
    unpaired = None
    se_c, se_i = _error(candidate, candidate_sem), _error(incumbent, incumbent_sem)
    if se_c is not None or se_i is not None:
        unpaired = NOISE_Z * math.sqrt((se_c or 0.0) ** 2 + (se_i or 0.0) ** 2)
    if paired and len(candidate) == len(incumbent) and len(candidate) >= 2:
        diffs = [c - i for c, i in zip(candidate, incumbent, strict=True)]
        se = standard_error(diffs)
        paired_margin = None if se is None else NOISE_Z * se
        if candidate_sem is None and incumbent_sem is None:
            return paired_margin
        known = [m for m in (paired_margin, unpaired) if m is not None]
        return max(known) if known else None
    return unpaired


def compare(
    config: Config,
    result: JobResult,
    incumbent_metric: float,
    incumbent_samples: list[float],
    paired: bool = False,
    incumbent_sem: float | None = None,
) -> Verdict:
    """Is this (clean) result a real improvement over the incumbent?"""
    metric = config.metric
    unmeasured = not_measured(config, result)
    if unmeasured is not None:
        return unmeasured
    assert result.metric is not None  # else not_measured said crash
    gain = metric.gain(result.metric, incumbent_metric)
    required = config.acceptance.min_improvement.margin(incumbent_metric)
    noise = noise_margin(result.samples, incumbent_samples, paired,
                         sem_of(result.extra, metric.name), incumbent_sem)
    margin = max(required, noise or 0.0)
    verdict = Verdict(Status.DISCARD, gain=gain, margin=margin, noise=noise)
    if gain > margin and gain > 0:
        verdict.status, verdict.code = Status.KEEP, Reason.KEPT
        verdict.reasons.append(
            f"{metric.name} {result.metric:.6g} vs incumbent {incumbent_metric:.6g}: "
            f"gain {gain:.4g} > margin {margin:.4g}"
            + (f" (noise {noise:.4g})" if noise is not None else "")
        )
    elif gain <= 0:
        verdict.code = Reason.NO_GAIN
        verdict.reasons.append(f"no improvement ({metric.name} {result.metric:.6g} vs "
                               f"{incumbent_metric:.6g})")
    else:
        why = "the noise" if noise is not None and noise >= required else "min_improvement"
        verdict.code = Reason.WITHIN_MARGIN
        verdict.reasons.append(
            f"gain {gain:.4g} within margin {margin:.4g} ({why})"
        )
    return verdict


def check_holdout(config: Config, result: JobResult, incumbent_holdout: float | None) -> str | None:
    """Why a would-be keep fails the hold-out, or None. Tolerance: task.holdout_tolerance."""
    if not config.task.holdout:
        return None
    if result.holdout is None:
        return "overfit: no hold-out result"
    if incumbent_holdout is None:
        return None
    tolerance = config.task.holdout_tolerance.margin(incumbent_holdout)
    regression = -config.metric.gain(result.holdout, incumbent_holdout)
    if regression > tolerance:
        return (
            f"overfit: hold-out {config.metric.name} {result.holdout:.6g} vs incumbent "
            f"{incumbent_holdout:.6g} (regression {regression:.4g} > tolerance {tolerance:.4g})"
        )
    return None


# -- a group of finished candidates (a round, a rolling finish, `ratchet wait`) ------------


@dataclass
class Entry:
    """One finished candidate, as the judge sees it."""

    id: str
    kind: str  # a Kind: baseline | incumbent (a co-run reference) | candidate
    seq: int
    result: JobResult
    commit: str | None = None
    # its commit descends from the current incumbent (a callable is asked only for the
    # would-be winner: it may cost a git call)
    based_on_incumbent: bool | Callable[[], bool] = True


@dataclass
class Decision:
    verdicts: dict[str, Verdict]
    incumbent: Incumbent  # after this group (the winner's, or re-measured)
    winner: str | None = None
    holdouts: dict[str, float] = field(default_factory=dict)  # hold-out values measured


# runs the hold-out of one entry (a follow-up job, or the value its own job measured)
HoldoutRunner = Callable[[Entry], JobResult]
# measures fresh pairs (candidate, incumbent) of a would-be keep, side by side, until
# there are at least n; returns every pair so far, or why they could not be measured
Confirmer = Callable[[Entry, int], "list[tuple[float, float]] | str"]


@dataclass
class Confirmation:
    """What a would-be keep is confirmed with: fresh pairs, and the study's noise."""

    measure: Confirmer
    # every evaluation of every commit so far, by commit (the noise pool), and what the
    # evaluators reported about their own error: (sem, the value it was reported with)
    groups: dict[str, list[float]] = field(default_factory=dict)
    reported: list[tuple[float, float]] = field(default_factory=list)
    # the (candidate, incumbent) pairs of every earlier confirmation of the study
    pairs: list[list[tuple[float, float]]] = field(default_factory=list)
    # how many pairs the next look of a candidate (its id) adds, given the pairs measured
    # so far: 1, or a group when slots are free (settle.Confirming.next_look); never a
    # function of the pairs' values
    next_look: Callable[[str, int], int] = field(default=lambda _id, _n: 1, repr=False,
                                             compare=False)

    # each pooled commit's (all positive, sums absolute, sums relative): asked at every
    # look of every confirmation, so computed once per commit
    _sums: dict[str, tuple[bool, tuple[float, int], tuple[float, int]]] = field(
        default_factory=dict, repr=False, compare=False)
    _pair_sums: dict[str, tuple[float, int]] = field(default_factory=dict, repr=False,
                                                      compare=False)

    def _commit(self, key: str, values: list[float]) -> tuple[bool, tuple[float, int],
                                                               tuple[float, int]]:
        # A commit's first evaluation is the one that made it a contender (picked for
        # looking good, it sits in the tail): left out of the spread, which would be
        # inflated by it, and the test's power with it. The rest (A/A floor, co-runs,
        # confirmation pairs) were measured whatever they showed.
        positive = all(v > 0 for v in values)
        rest = values[1:]
        return (positive, stats.spread_sums(rest),
                stats.spread_sums(rest, relative=True) if positive else (0.0, 0))

    def paired_sums(self, relative: bool, gain: Callable[[float, float], float]
                    ) -> tuple[float, int]:
        """The spread sums of the earlier confirmations' paired gains (log ratios when
        `relative`: those with a value <= 0 left out), computed once per scale."""
        key = f"pairs {relative}"
        if key not in self._pair_sums:
            squares, df = 0.0, 0
            for group in self.pairs:
                if relative and not all(c > 0 and i > 0 for c, i in group):
                    continue
                more, more_df = stats.spread_sums([gain(c, i) for c, i in group])
                squares, df = squares + more, df + more_df
            self._pair_sums[key] = (squares, df)
        return self._pair_sums[key]

    def noise(self, extra: dict[str, list[float]] | None = None) -> stats.Noise:
        """The study's noise with `extra` evaluations (by commit) replacing the pool's:
        relative (of log values) when every value is positive."""
        extra = extra or {}
        for key, values in self.groups.items():
            if key not in self._sums:
                self._sums[key] = self._commit(key, values)
        parts = [self._sums[key] for key in self.groups if key not in extra]
        parts += [self._commit(key, values) for key, values in extra.items()]
        relative = bool(parts) and all(p[0] for p in parts) \
            and all(v > 0 for _, v in self.reported)
        reported = [sem / abs(v) if relative else sem for sem, v in self.reported]
        sums = [p[2] if relative else p[1] for p in parts]
        return stats.noise_from_sums(sum(s[0] for s in sums), sum(s[1] for s in sums),
                                     reported, relative)


def reported_noise(result: JobResult, metric: str) -> float | None:
    """The error one evaluation reports about itself: the evaluator's `<metric>_sem`,
    or the spread of the job's repeats (as the error of their median, ~ of their mean)."""
    reported = sem_of(result.extra, metric)
    spread = standard_error(list(result.samples))
    known = [x for x in (reported, spread) if x is not None]
    return max(known) if known else None


def confirm(config: Config, entry: Entry, incumbent: Incumbent,
            confirmation: Confirmation) -> tuple[stats.Test, list[tuple[float, float]]]:
    """The sequential test of a would-be keep on fresh pairs beside the incumbent.

    The test (stats.Design) combines the candidate's own first gain over the incumbent's
    pooled estimate (the screen's z_0) with the fresh pairs, and has level
    false_keep_rate for every candidate that reaches it: picking the best of K siblings
    only decides which candidates are tested, so it cannot raise any candidate's chance
    of a false keep above that (docs/statistics.md).
    """
    acceptance, metric = config.acceptance, config.metric
    need, looks = 1, [1]
    while True:
        pairs = confirmation.measure(entry, need)
        if isinstance(pairs, str):
            return stats.Test(stats.Step.DISCARD, need - 1, reason=f"not confirmed: {pairs}"), []
        if len(pairs) < need:  # the measurement gave what it could, and it is not enough
            return stats.Test(stats.Step.DISCARD, len(pairs),
                              reason=f"not confirmed: {len(pairs)} of {need} pairs measured"), \
                list(pairs)
        # the noise of the candidate's evaluations (its own first one too: picked for
        # looking good, it can only widen the spread) and of every incumbent evaluation
        own = [entry.result.metric] if entry.result.metric is not None else []
        extra = {entry.commit or entry.id: [*own, *(c for c, _ in pairs)],
                 incumbent.commit or "incumbent": [*incumbent.samples,
                                                   *(i for _, i in pairs)]}
        noise = confirmation.noise(extra)
        required = acceptance.min_improvement.margin(incumbent.metric or 0.0)
        repeated = identical_repeats(entry, incumbent, pairs, confirmation, extra)
        if repeated is not None and repeated >= NOISELESS_REPEATS:
            gain_now = metric.gain(pairs[0][0], pairs[0][1])
            single = len(pairs) == 1
            if gain_now > required and gain_now > 0:
                return stats.Test(stats.Step.KEEP, len(pairs), mean=gain_now - required,
                                  t=math.inf, reason=(
                                      f"confirmed on {'1 fresh pair' if single else f'{len(pairs)} fresh pairs'}: "
                                      f"the metric is noiseless ({repeated} repeated evaluations "
                                      f"in the study, all identical), and the "
                                      f"{'pair' if single else 'pairs'} reproduced both values"
                                  )), list(pairs)
            return stats.Test(stats.Step.DISCARD, len(pairs), mean=gain_now - required,
                              reason="not confirmed: the metric is noiseless and the fresh "
                                     f"{'pair shows' if single else 'pairs show'} no gain beyond "
                                     "min_improvement"), list(pairs)

        def gain(c: float, i: float, relative: bool = noise.relative) -> float:
            # the gain as a log ratio when the noise is relative
            return metric.gain(math.log(c), math.log(i)) if relative else metric.gain(c, i)

        if noise.relative:  # min_improvement as a log ratio too
            shift = math.log1p(required / abs(incumbent.metric)) if incumbent.metric else 0.0
        else:
            shift = required
        diffs = [gain(c, i) - shift for c, i in pairs]
        # The spread of a pair's difference, pooled over every confirmation of the study:
        # drift shared by the two sides of a pair (a neighbour's load, a GPU warming up)
        # cancels there, where it inflates the spread of a commit's evaluations over
        # time. It is used once it rests on PAIRED_DF degrees of freedom (a rule on
        # counts alone, so either estimate keeps the rate); a reported error floors it.
        earlier = confirmation.paired_sums(noise.relative, gain)
        mine = stats.spread_sums(diffs)
        paired = stats.noise_from_sums(earlier[0] + mine[0], earlier[1] + mine[1])
        per_pair = paired.known and paired.df >= PAIRED_DF and paired.df > noise.df
        # the spread of one evaluation, for the screen's z_0: the commits' own spread over
        # time, drift included (z_0 compares today's evaluation with a mean over time)
        one = noise.sigma if noise.known else None
        if per_pair:
            floor = stats.pooled_noise([], [sem / abs(v) if noise.relative else sem
                                            for sem, v in confirmation.reported])
            sigma = paired.sigma or 0.0
            if floor.sigma is not None:
                sigma = max(sigma, math.sqrt(2.0) * floor.sigma)
            # z_0's spread is never below the commits' own (drift included); the test's
            # df are those of the larger pool, which this is
            one = max(one or 0.0, sigma / math.sqrt(2.0))
            noise = stats.Noise(sigma, paired.df, "paired differences", noise.relative)
        test = stats.sequential(diffs, noise, design(config), per_pair=per_pair,
                                screen=screen_z(entry, incumbent, one, gain, shift,
                                                noise.relative), looks=looks)
        if test.step != stats.Step.MORE:
            return test, list(pairs)
        need = min(len(pairs) + max(1, confirmation.next_look(entry.id, len(pairs))),
                   acceptance.confirm_pairs)
        looks.append(need)


def identical_repeats(entry: Entry, incumbent: Incumbent, pairs: list[tuple[float, float]],
                      confirmation: Confirmation, extra: dict[str, list[float]]) -> int | None:
    """The study's repeated evaluations when every one so far gave its commit's value
    exactly, or None. Counted: every fresh pair reproduced the candidate's first value and
    the incumbent's value, every commit measured more than once in the study gave the same
    value every time, no evaluator reported an error above 0, and no earlier
    confirmation's pair differed from its first. At NOISELESS_REPEATS the metric is taken
    as noiseless (a deterministic evaluator, a count, a size): the pairs measured confirm.
    One differing value anywhere brings back the full test, for good."""
    if not pairs or entry.result.metric is None or not incumbent.samples:
        return None
    if any(sem > 0 for sem, _ in confirmation.reported):
        return None
    reference = incumbent.samples[0]
    if any(c != entry.result.metric or i != reference for c, i in pairs):
        return None
    if any(v != reference for v in incumbent.samples):
        return None
    if len(set(entry.result.samples or [entry.result.metric])) > 1:
        return None  # the job's own repeats differ
    groups = {**confirmation.groups, **extra}
    if any(len(set(values)) > 1 for values in groups.values()):
        return None
    if any(len({c for c, _ in got}) > 1 or len({i for _, i in got}) > 1
           for got in confirmation.pairs):
        return None
    return sum(len(values) - 1 for values in groups.values() if len(values) > 1)


def design(config: Config) -> stats.Design:
    """The confirmation's group-sequential design, from [acceptance]."""
    acceptance = config.acceptance
    return stats.Design(SPENT * acceptance.rate, acceptance.confirm_pairs, prior=SCREEN_PRIOR,
                        screen_z=0.0, futility=FUTILITY)


def screen_z(entry: Entry, incumbent: Incumbent, sigma: float | None,
             gain: Callable[[float, float], float], shift: float,
             relative: bool = False) -> float | None:
    """z_0: the candidate's own first gain over the incumbent's pooled estimate (of n
    evaluations), less min_improvement, in standard errors sigma sqrt(1 + 1/n) of that
    comparison (`gain` in log units when the noise is `relative`, as `sigma` is); None
    while the noise is unknown.

    With relative noise the pooled level is the mean of the incumbent's logs (its
    geometric mean), on the scale sigma was pooled on and the pairs are tested on: the
    log of the arithmetic mean sits above it by about sigma^2 / 2 (Jensen), which moved
    every candidate's z_0 by about sigma / 2 (0.05 at 10% noise): up for a minimized
    metric (more false keeps), down for a maximized one (less power)."""
    value, level = entry.result.metric, incumbent.metric
    if sigma is None or value is None or level is None:
        return None
    if relative and incumbent.samples and all(v > 0 for v in incumbent.samples):
        level = statistics.geometric_mean(incumbent.samples)
    x0 = gain(value, level) - shift
    se = sigma * math.sqrt(1.0 + 1.0 / max(1, len(incumbent.samples)))
    if se == 0:
        return math.inf if x0 > 0 else -math.inf
    return x0 / se


def judge_group(config: Config, entries: list[Entry], incumbent: Incumbent,
                holdout: HoldoutRunner, confirmation: Confirmation | None = None) -> Decision:
    """Verdicts for a group judged together; the best improving candidate wins.

    Baselines and co-run references are measured first and pool into the incumbent's
    estimate. The candidates beating it by more than `min_improvement` are contenders;
    the one with the largest gain (earliest on ties) must be confirmed on fresh pairs
    beside the incumbent (with `confirmation`; without one, the measured noise decides on
    the one measurement, as with acceptance.noise = "ignore") and pass the hold-out; the
    others are discarded as beaten. One made on an older incumbent (stale: it does not
    descend from this one) is confirmed as its own files against the incumbent's, and
    kept as them; without a confirmation it is discarded and the next one tried.
    """
    name = config.metric.name
    current = Incumbent(**incumbent.__dict__)
    current.samples = list(current.samples)
    verdicts: dict[str, Verdict] = {}
    holdouts: dict[str, float] = {}
    for entry in entries:
        if entry.kind not in (Kind.BASELINE, Kind.INCUMBENT):
            continue
        forced = outcome_status(entry.result)
        if forced is not None:
            verdicts[entry.id] = Verdict(
                Status.CRASH, [f"{entry.kind} failed: {'; '.join(forced.reasons)}"],
                code=Reason.FAILED)
            continue
        baseline = entry.kind == Kind.BASELINE
        verdicts[entry.id] = Verdict(Status.KEEP if baseline else Status.REFERENCE,
                                     [f"{entry.kind}: {name} {entry.result.metric:.6g}"],
                                     code=Reason.BASELINE if baseline else Reason.REFERENCE)
        # every measurement of the incumbent pools into its estimate: a re-measure
        # never replaces it
        if entry.result.metric is not None:
            current = current.pooled(entry.result.metric)
        current.sem = sem_of(entry.result.extra, name) if baseline else current.sem
        if config.task.holdout and current.holdout is None:
            held = holdout(entry)
            if held.outcome == Outcome.OK and held.holdout is not None:
                current.holdout = held.holdout
                holdouts[entry.id] = held.holdout
        if baseline:
            current.id = entry.id
            current.commit = entry.commit or current.commit
    paired = any(e.kind == Kind.INCUMBENT for e in entries)
    measure = config.acceptance.noise == "measure" and confirmation is not None
    noise_now = stats.NO_NOISE
    if measure and confirmation is not None:
        # what this group's evaluations report about their own error joins the pool
        own = [(reported_noise(e.result, name), e.result.metric) for e in entries
               if outcome_status(e.result) is None and e.result.metric is not None]
        confirmation = replace(confirmation, reported=[
            *confirmation.reported, *((sem, v) for sem, v in own if sem is not None)])
        noise_now = confirmation.noise({current.commit or "incumbent": current.samples})
    contenders: list[tuple[float, Entry]] = []
    for entry in entries:
        if entry.id in verdicts:
            continue
        forced = outcome_status(entry.result)
        if forced is not None:
            verdicts[entry.id] = forced
            continue
        if current.metric is None:
            verdicts[entry.id] = Verdict(
                Status.DISCARD, ["no incumbent measurement to compare with (baseline failed)"],
                code=Reason.NO_INCUMBENT)
            continue
        if measure:
            verdict = screen(config, entry.result, current.metric,
                             screen_noise(noise_now, len(current.samples), current.metric))
        else:
            verdict = compare(config, entry.result, current.metric, current.samples,
                              paired=paired, incumbent_sem=current.sem)
        verdicts[entry.id] = verdict
        if verdict.status == Status.KEEP:
            contenders.append((verdict.gain or 0.0, entry))
    winner: Entry | None = None
    failed: str | None = None  # the round's best, not confirmed: the rest are no better
    for _, entry in sorted(contenders, key=lambda t: (-t[0], t[1].seq)):
        verdict = verdicts[entry.id]
        if winner is not None or failed is not None:
            verdict.status, verdict.code = Status.DISCARD, Reason.BEATEN
            verdict.reasons.append(f"beaten by {winner.id} this round" if winner else
                                   f"the round's best ({failed}) was not confirmed")
            continue
        based = entry.based_on_incumbent
        stale = not (based() if callable(based) else based)
        confirmed = measure and confirmation is not None
        if stale and not confirmed:
            # one measurement of files made before the incumbent moved: no claim about
            # them against the incumbent's (noise = "ignore" has no fresh pairs)
            verdict.status, verdict.code = Status.DISCARD, Reason.STALE
            verdict.reasons.append("not based on the current incumbent")
            continue
        if stale:
            # made on an older incumbent (it ran while the incumbent moved): its files,
            # as they were measured, are confirmed against the current incumbent's on
            # fresh pairs, the same test as any would-be keep (docs/statistics.md)
            verdict.reasons.append(STALE_NOTE)
        if confirmed and confirmation is not None:
            test, pairs = confirm(config, entry, current, confirmation)
            verdict.confirmation, verdict.pairs = test, pairs
            for _, value in pairs:  # the incumbent's side pools into its estimate
                current = current.pooled(value)
            if test.step != stats.Step.KEEP:
                verdict.status = Status.DISCARD
                verdict.code = Reason.NOT_CONFIRMED if test.noise_known else Reason.NO_NOISE
                verdict.reasons = [verdict.reasons[0], *[STALE_NOTE] * stale, test.reason]
                failed = entry.id
                continue
            verdict.reasons.append(test.reason)
        result = entry.result
        if config.task.holdout:
            held = holdout(entry)
            result.holdout = held.holdout
            if held.outcome != Outcome.OK:
                verdict.status, verdict.code = Status.REJECTED, Reason.OVERFIT
                verdict.reasons.append(f"overfit: {held.reason}")
                continue
            if held.holdout is not None:
                holdouts[entry.id] = held.holdout
        overfit = check_holdout(config, result, current.holdout)
        if overfit:
            verdict.status, verdict.code = Status.REJECTED, Reason.OVERFIT
            verdict.reasons.append(overfit)
            continue
        winner = entry
    if winner is not None:
        first = [winner.result.metric] if winner.result.metric is not None else []
        samples = first + [c for c, _ in verdicts[winner.id].pairs]
        current = Incumbent(commit=winner.commit, id=winner.id,
                            metric=statistics.fmean(samples), samples=samples,
                            holdout=winner.result.holdout,
                            sem=sem_of(winner.result.extra, name))
    return Decision(verdicts=verdicts, incumbent=current,
                    winner=winner.id if winner else None, holdouts=holdouts)


def screen_noise(noise: stats.Noise, incumbent_n: int, level: float) -> float | None:
    """The standard error of one evaluation against the incumbent's pooled mean of
    `incumbent_n` evaluations; recorded with the verdict."""
    sigma = noise.sigma_at(level) if noise.known else None
    if sigma is None:
        return None
    return sigma * math.sqrt(1.0 + 1.0 / max(1, incumbent_n))


def screen(config: Config, result: JobResult, incumbent_metric: float,
           noise: float | None = None) -> Verdict:
    """The first, cheap filter: does this one measurement beat the incumbent's pooled
    estimate by more than min_improvement, and by more than SCREEN_Z standard errors
    (`noise`) of that comparison? Losers stop here, after one evaluation; a pass makes
    it a contender (status keep until the confirmation decides)."""
    metric = config.metric
    unmeasured = not_measured(config, result)
    if unmeasured is not None:
        return unmeasured
    assert result.metric is not None  # else not_measured said crash
    gain = metric.gain(result.metric, incumbent_metric)
    required = config.acceptance.min_improvement.margin(incumbent_metric)
    verdict = Verdict(Status.DISCARD, gain=gain, margin=required, noise=noise)
    if gain <= 0:
        verdict.code = Reason.NO_GAIN
        verdict.reasons.append(f"no improvement ({metric.name} {result.metric:.6g} vs "
                               f"{incumbent_metric:.6g})")
    elif gain <= required:
        verdict.code = Reason.WITHIN_MARGIN
        verdict.reasons.append(f"gain {gain:.4g} within margin {required:.4g} "
                               "(min_improvement)")
    elif noise is not None and gain <= SCREEN_Z * noise:
        verdict.code = Reason.WITHIN_MARGIN
        verdict.reasons.append(f"gain {gain:.4g} inside the noise of one evaluation "
                               f"({noise:.4g}): not worth re-measuring")
    else:
        verdict.status, verdict.code = Status.KEEP, Reason.KEPT
        verdict.reasons.append(f"{metric.name} {result.metric:.6g} vs incumbent "
                               f"{incumbent_metric:.6g}: gain {gain:.4g} > margin {required:.4g}")
    return verdict
