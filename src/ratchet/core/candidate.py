"""The records of a study: a proposal, the candidate it becomes, the incumbent, the study.

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


# the meta key of each field of the incumbent record
INCUMBENT_KEYS = {"commit": "incumbent", "id": "incumbent_id", "metric": "incumbent_metric",
                  "samples": "incumbent_samples", "holdout": "incumbent_holdout",
                  "sem": "incumbent_sem"}


@dataclass(frozen=True)
class StudyRecord:
    """The study's own facts: what the ledger's meta table holds, typed, one key a field
    (its JSON value, as ledgers have always stored it), the incumbent under its
    `incumbent*` keys. Read whole by `Ledger.study()`; `Ledger.set` writes these names
    and no other (META_KEYS)."""

    study: str | None = None  # the task's name
    created: float | None = None  # when the study pinned its start
    pinned: str | None = None  # the commit the study started from
    pins: dict[str, dict[str, Any]] = field(default_factory=dict)  # protected files, pinned
    config: str | None = None  # ratchet.toml as committed at the start: what it runs by
    round: int | None = None  # the next round to run
    incumbent: Incumbent = field(default_factory=Incumbent)
    budget_stop: dict[str, Any] | None = None  # the limit that stopped the last run
    data_dir: str | None = None  # prepared data ([prep])
    data_digest: str | None = None
    reference_audit: str | None = None  # "<incumbent id> <candidate id>" (driver/reference.py)

    # what a started study always has (its start is pinned with all three at once)
    @property
    def start(self) -> str:
        """The commit the study started from."""
        return _started(self.pinned, "start commit")

    @property
    def incumbent_commit(self) -> str:
        return _started(self.incumbent.commit, "incumbent")

    @property
    def next_round(self) -> int:
        return _started(self.round, "round counter")

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> StudyRecord:
        """The record of the meta table's {key: decoded value}; a key it does not know
        (an older ratchet's) is left out."""
        fields: dict[str, Any] = {f: meta.get(k) for f, k in INCUMBENT_KEYS.items()}
        inc = Incumbent(**fields)
        inc.samples = list(inc.samples or [])
        own = {k: v for k, v in meta.items() if k in _STUDY_FIELDS and v is not None}
        return cls(**own, incumbent=inc)


def _started(value: Any, what: str) -> Any:
    if value is None:
        raise LookupError(f"the study has no {what} yet: it has not pinned its start")
    return value


_STUDY_FIELDS = frozenset(StudyRecord.__dataclass_fields__) - {"incumbent"}
# every key of the meta table: the record's own and the incumbent's
META_KEYS = _STUDY_FIELDS | frozenset(INCUMBENT_KEYS.values())
