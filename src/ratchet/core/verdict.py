"""A verdict and its reason code: what the judge (driver/judge.py) decides of a
candidate, stored with it (the ledger's `status` and `code` columns)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ratchet.core import stats
from ratchet.core.vocab import Status


class Reason(StrEnum):
    """Why a verdict is what it is: matched by code, never by its text."""

    KEPT = "kept"
    BASELINE = "baseline"
    REFERENCE = "reference"
    NO_GAIN = "no-gain"
    WITHIN_MARGIN = "within-margin"  # min_improvement or the noise
    NOT_CONFIRMED = "not-confirmed"  # the fresh paired measurements did not confirm it
    NO_NOISE = "no-noise-estimate"
    BEATEN = "beaten"
    STALE = "not-based-on-incumbent"
    OVERFIT = "overfit"
    CONSTRAINT = "constraint"
    FAILED = "failed"
    VIOLATION = "violation"
    CANCELLED = "cancelled"
    # made on a would-be keep that was not kept, stopped and carried onto the incumbent
    # (driver/beside.py): never the candidate's fault, and not one of the study's made
    WITHDRAWN = "withdrawn"
    NO_INCUMBENT = "no-incumbent"
    STOPPED_EARLY = "stopped-early"


@dataclass
class Verdict:
    status: Status  # keep | discard | crash | rejected | cancelled | reference
    reasons: list[str] = field(default_factory=list)
    gain: float | None = None
    margin: float | None = None
    noise: float | None = None
    code: Reason | None = None
    confirmation: stats.Test | None = None  # the sequential test of a would-be keep
    pairs: list[tuple[float, float]] = field(default_factory=list)  # its fresh pairs
