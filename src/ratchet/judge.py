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
from dataclasses import dataclass, field

from ratchet.config import Config
from ratchet.jobspec import JobResult

# A candidate's improvement must exceed this many standard errors of the difference
# between its samples and the incumbent's (roughly a one-sided 97.5% test).
NOISE_Z = 2.0
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*(<=|>=|<|>|==|!=)\s*(-?[\d.eE+\-]+)\s*$")
_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
        "==": operator.eq, "!=": operator.ne}


@dataclass
class Verdict:
    status: str  # keep | discard | crash | rejected | cancelled
    reasons: list[str] = field(default_factory=list)
    gain: float | None = None
    margin: float | None = None
    noise: float | None = None


def outcome_status(result: JobResult) -> Verdict | None:
    """The verdict a result forces on its own, before comparing it with anything."""
    if result.outcome == "ok":
        return None
    if result.outcome == "violation":
        return Verdict("rejected", [result.reason])
    if result.outcome == "cancelled":
        return Verdict("cancelled", [result.reason or "cancelled"])
    if result.outcome == "failed" and result.failed_stage and "correct: false" in result.reason:
        return Verdict("rejected", [result.reason])
    return Verdict("crash", [result.reason or result.outcome])


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
    problems = check_constraints(config, result)
    if problems:
        return Verdict("rejected", problems)
    gain = metric.gain(result.metric, incumbent_metric)
    required = config.acceptance.min_improvement.margin(incumbent_metric)
    noise = noise_margin(result.samples, incumbent_samples, paired,
                         sem_of(result.extra, metric.name), incumbent_sem)
    margin = max(required, noise or 0.0)
    verdict = Verdict("discard", gain=gain, margin=margin, noise=noise)
    if gain > margin and gain > 0:
        verdict.status = "keep"
        verdict.reasons.append(
            f"{metric.name} {result.metric:.6g} vs incumbent {incumbent_metric:.6g}: "
            f"gain {gain:.4g} > margin {margin:.4g}"
            + (f" (noise {noise:.4g})" if noise is not None else "")
        )
    elif gain <= 0:
        verdict.reasons.append(f"no improvement ({metric.name} {result.metric:.6g} vs "
                               f"{incumbent_metric:.6g})")
    else:
        why = "the noise" if noise is not None and noise >= required else "min_improvement"
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
class Incumbent:
    """What the candidates are compared with: the best kept measurement so far."""

    commit: str | None = None
    id: str | None = None
    metric: float | None = None
    samples: list[float] = field(default_factory=list)
    holdout: float | None = None
    sem: float | None = None


@dataclass
class Entry:
    """One finished candidate, as the judge sees it."""

    id: str
    kind: str  # baseline | incumbent (a co-run reference) | candidate | submitted
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


def judge_group(config: Config, entries: list[Entry], incumbent: Incumbent,
                holdout: HoldoutRunner) -> Decision:
    """Verdicts for a group judged together; the best improving candidate wins.

    Baselines and co-run references are measured first and become the comparison.
    Among the candidates beating it beyond noise and `min_improvement`, the one with the
    largest gain (earliest on ties) must pass the hold-out (run only for it) and descend
    from the incumbent; the others are discarded as beaten.
    """
    name = config.metric.name
    current = Incumbent(**incumbent.__dict__)
    verdicts: dict[str, Verdict] = {}
    holdouts: dict[str, float] = {}
    for entry in entries:
        if entry.kind not in ("baseline", "incumbent"):
            continue
        forced = outcome_status(entry.result)
        if forced is not None:
            verdicts[entry.id] = Verdict(
                "crash", [f"{entry.kind} failed: {'; '.join(forced.reasons)}"])
            continue
        verdicts[entry.id] = Verdict("keep" if entry.kind == "baseline" else "reference",
                                     [f"{entry.kind}: {name} {entry.result.metric:.6g}"])
        current.metric = entry.result.metric
        current.samples = list(entry.result.samples)
        current.sem = sem_of(entry.result.extra, name)
        if config.task.holdout:
            held = holdout(entry)
            if held.outcome == "ok" and held.holdout is not None:
                current.holdout = held.holdout
                holdouts[entry.id] = held.holdout
        if entry.kind == "baseline":
            current.id = entry.id
    paired = any(e.kind == "incumbent" for e in entries)
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
                "discard", ["no incumbent measurement to compare with (baseline failed)"])
            continue
        verdict = compare(config, entry.result, current.metric, current.samples,
                          paired=paired, incumbent_sem=current.sem)
        verdicts[entry.id] = verdict
        if verdict.status == "keep":
            contenders.append((verdict.gain or 0.0, entry))
    winner: Entry | None = None
    for _, entry in sorted(contenders, key=lambda t: (-t[0], t[1].seq)):
        verdict = verdicts[entry.id]
        if winner is not None:
            verdict.status = "discard"
            verdict.reasons.append(f"beaten by {winner.id} this round")
            continue
        result = entry.result
        if config.task.holdout:
            held = holdout(entry)
            result.holdout = held.holdout
            if held.outcome != "ok":
                verdict.status = "rejected"
                verdict.reasons.append(f"overfit: {held.reason}")
                continue
            if held.holdout is not None:
                holdouts[entry.id] = held.holdout
        overfit = check_holdout(config, result, current.holdout)
        if overfit:
            verdict.status = "rejected"
            verdict.reasons.append(overfit)
            continue
        based = entry.based_on_incumbent
        if not (based() if callable(based) else based):
            verdict.status = "discard"
            verdict.reasons.append("not based on the current incumbent")
            continue
        winner = entry
    if winner is not None:
        current = Incumbent(commit=winner.commit, id=winner.id, metric=winner.result.metric,
                            samples=list(winner.result.samples),
                            holdout=winner.result.holdout,
                            sem=sem_of(winner.result.extra, name))
    return Decision(verdicts=verdicts, incumbent=current,
                    winner=winner.id if winner else None, holdouts=holdouts)
