"""The judge: keep / discard / crash / rejected, with the reasons written down.

A candidate is kept only if it ran cleanly, broke no rule, and beats the incumbent by
more than both the configured `min_improvement` and the measured noise; with a hold-out
evaluator it must also not regress on data it never saw.
"""

from __future__ import annotations

import math
import operator
import re
import statistics
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


def noise_margin(candidate: list[float], incumbent: list[float], paired: bool) -> float | None:
    """How big a difference the measurements can produce by chance (NOISE_Z std errors)."""
    if paired and len(candidate) == len(incumbent) and len(candidate) >= 2:
        diffs = [c - i for c, i in zip(candidate, incumbent, strict=True)]
        se = standard_error(diffs)
        return None if se is None else NOISE_Z * se
    se_c, se_i = standard_error(candidate), standard_error(incumbent)
    if se_c is None and se_i is None:
        return None
    return NOISE_Z * math.sqrt((se_c or 0.0) ** 2 + (se_i or 0.0) ** 2)


def compare(
    config: Config,
    result: JobResult,
    incumbent_metric: float,
    incumbent_samples: list[float],
    paired: bool = False,
) -> Verdict:
    """Is this (clean) result a real improvement over the incumbent?"""
    metric = config.metric
    problems = check_constraints(config, result)
    if problems:
        return Verdict("rejected", problems)
    gain = metric.gain(result.metric, incumbent_metric)
    required = config.acceptance.min_improvement.margin(incumbent_metric)
    noise = noise_margin(result.samples, incumbent_samples, paired)
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
