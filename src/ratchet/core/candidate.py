"""The records of a study: a proposal, the candidate it becomes, the incumbent.

Plain dataclasses of the standard library: the ledger stores them (store/ledger.py),
the proposers make proposals and read candidates, the views read them. A candidate's
status and kind are the vocabulary's members (core.vocab), whatever the row held.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from ratchet.core.vocab import Kind, Status, kind_of, status_of


@dataclass
class Proposal:
    """What a proposer hands over: new file contents, or a commit it already made."""

    description: str
    files: dict[str, bytes | None] = field(default_factory=dict)
    commit: str | None = None
    params: dict | None = None
    idea: str | None = None
    context: str | None = None  # exactly what the proposer saw (saved with the candidate)
    error: str | None = None  # a proposal that failed to materialise (bad patch, ...)
    calls: list[int] = field(default_factory=list)  # the ledger's calls that made it (spend.py)
    # the same change as proposal N (0-based) of the same reply: it never runs
    duplicate_of: int | None = None


@dataclass(frozen=True)
class Candidate:
    """One row of the ledger: a candidate, a baseline or a re-measure, as last written.
    Frozen: a change is a ledger write (`Ledger.update`), read back as a new record."""

    id: str
    seq: int
    round: int
    status: Status
    kind: Kind = Kind.CANDIDATE
    parent: str | None = None
    commit_sha: str | None = None
    description: str = ""
    proposer: str | None = None
    params: dict[str, Any] | None = None
    idea: str | None = None
    context_path: str | None = None
    job_id: str | None = None
    attempt: int = 0
    metric: float | None = None
    samples: list[float] | None = None
    extra: dict[str, Any] | None = None
    holdout: float | None = None
    phases: list[dict[str, Any]] | None = None
    reasons: str | None = None
    failed_stage: str | None = None
    slot: str | None = None
    gain: float | None = None
    margin: float | None = None
    noise: float | None = None
    queue_s: float | None = None
    run_s: float | None = None
    cost_usd: float | None = None
    created_at: float = field(default_factory=time.time)
    submitted_at: float | None = None
    finished_at: float | None = None
    judged_at: float | None = None
    result: dict[str, Any] | None = None
    confirms: str | None = None  # a confirmation row: the id of the candidate it confirms
    code: str | None = None  # the verdict's reason code (judge.Reason)
    # slot seconds of this row's other jobs (hold-out follow-up, lost or interrupted
    # attempts): compute spent beyond `phases`
    extra_slot_s: float | None = None
    rev: int = 0  # the ledger's change counter when this row was last written

    def __post_init__(self) -> None:
        # a row read back (or a word handed in) becomes the member; an unknown one is a
        # ValueError naming it and the known ones
        object.__setattr__(self, "status", status_of(self.status))
        object.__setattr__(self, "kind", kind_of(self.kind))

    @property
    def short(self) -> str:
        return (self.commit_sha or "")[:7]

    @property
    def is_judged(self) -> bool:
        return self.status.is_verdict


@dataclass
class Incumbent:
    """The one incumbent record: the kept commit and every evaluation of it (its own,
    co-runs, confirmations, the A/A floor), pooled: `metric` is their mean, never one
    re-measure. Read and written whole (`Ledger.incumbent`, `Ledger.incumbent_meta`), and
    the guard's trusted keys are derived from it, so no list of its fields can disagree.
    """

    commit: str | None = None
    id: str | None = None
    metric: float | None = None
    samples: list[float] = field(default_factory=list)
    holdout: float | None = None
    sem: float | None = None

    def pooled(self, value: float) -> Incumbent:
        """This record with one more evaluation of its commit."""
        samples = [*self.samples, value]
        return Incumbent(commit=self.commit, id=self.id, metric=statistics.fmean(samples),
                         samples=samples, holdout=self.holdout, sem=self.sem)
