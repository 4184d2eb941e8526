"""The words a study is recorded in: a candidate's status and kind, a job's state and
outcome.

Each is a `StrEnum`, so a member *is* its string: the values stored in SQLite, printed
in `results.tsv` and returned by `--json` are unchanged, `Status.KEEP == "keep"` holds,
and a row read back from the ledger compares equal to a member without conversion.
What a state means (is it judged, is a job in flight for it) is a property here, in one
place, instead of a tuple of strings in every module that asks (after Ray's `JobStatus`
with `is_terminal`, and Optuna's `TrialState` with `is_finished`).

Standard library only: every side (driver, worker, evaluator SDK) may import it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar


class Status(StrEnum):
    """Where a candidate is. A candidate moves down this list and never back up, except
    that a job lost to infrastructure goes from `interrupted` back to `committed`."""

    # in flight: not judged yet
    PROPOSED = "proposed"  # recorded, before its commit exists
    COMMITTED = "committed"  # its commit exists; no job yet
    SUBMITTED = "submitted"  # a job is placed (queued or running)
    INTERRUPTED = "interrupted"  # its job was lost to infrastructure; it runs again
    FINISHED = "finished"  # its job reported (or was lost for good); awaiting the judge
    # verdicts: final
    KEEP = "keep"  # better than the incumbent by more than the noise: now the incumbent
    DISCARD = "discard"  # ran and measured, not better
    CRASH = "crash"  # a phase failed (build, run, evaluate) or timed out
    REJECTED = "rejected"  # broke a rule: protected file, incorrect result, hold-out, guard
    CANCELLED = "cancelled"  # cancelled by the user
    REFERENCE = "reference"  # a measurement of the incumbent itself (baseline, co-run)

    @property
    def is_open(self) -> bool:
        """Not judged yet (the candidate may still become anything)."""
        return self in OPEN

    @property
    def is_verdict(self) -> bool:
        """Judged: the status is final."""
        return self in VERDICTS

    is_terminal = is_verdict  # Ray's name for the same thing

    @property
    def has_commit(self) -> bool:
        """In flight with its commit made: what a resumed driver picks up again
        (`proposed` has no commit yet and is proposed afresh)."""
        return self in IN_FLIGHT

    @property
    def is_failure(self) -> bool:
        """A verdict that says the candidate did not work (never counted as a measurement)."""
        return self in (Status.CRASH, Status.REJECTED)


OPEN: frozenset[Status] = frozenset(
    {Status.PROPOSED, Status.COMMITTED, Status.SUBMITTED, Status.INTERRUPTED, Status.FINISHED})
IN_FLIGHT: frozenset[Status] = OPEN - {Status.PROPOSED}
VERDICTS: frozenset[Status] = frozenset(Status) - OPEN


class Kind(StrEnum):
    """What a candidate row stands for."""

    BASELINE = "baseline"  # the study's start, measured first
    CANDIDATE = "candidate"  # a proposed change: a hypothesis under test
    INCUMBENT = "incumbent"  # the incumbent re-measured (co_run_incumbent, A/A noise floor)
    # one side of a confirmation pair of a would-be keep (its row names the candidate it
    # confirms): the candidate's commit or the incumbent's, measured again side by side
    CONFIRM = "confirm"

    @property
    def is_reference(self) -> bool:
        """A measurement of code already accepted (the start or the incumbent), not a
        change: its failure is a broken setup, never a candidate's fault."""
        return self in (Kind.BASELINE, Kind.INCUMBENT)


# The proposers whose candidates are recorded from outside a `ratchet run`: a person's
# `ratchet submit`, and their agent's `submit` tool (`ratchet mcp`). A row of theirs that
# appears while a run drives the study is a legitimate act, queued, never tampering.
SUBMITTED_FROM_OUTSIDE: frozenset[str] = frozenset({"submit", "mcp"})


class Outcome(StrEnum):
    """What the worker says became of a job (its view; the judge decides the status)."""

    OK = "ok"  # every phase ran and the evaluator reported the metric
    FAILED = "failed"  # a phase failed, or the evaluator reported no metric or `correct: false`
    TIMEOUT = "timeout"  # stopped at the job's time limit
    CANCELLED = "cancelled"  # cancelled by the user (or before it started)
    VIOLATION = "violation"  # broke a rule: a protected file touched, tampering with a metric
    ERROR = "error"  # the machine's fault (worker error, sandbox start, lost job): never the candidate's


class CallOutcome(StrEnum):
    """How one proposer call ended."""

    OK = "ok"  # a reply (or an agent run that ended by itself)
    RETRIED = "retried"  # failed, and was sent again (rate limit, 5xx, dropped connection)
    FAILED = "failed"  # failed, and was not sent again (the proposal fails or the study)
    UNUSABLE = "unusable"  # a reply that cannot be used (too large, not the protocol's)
    TIMEOUT = "timeout"  # an agent killed at its timeout, a request past its deadline
    # in flight when a second Ctrl-C stopped the study at once: billed with its time so
    # far and what is known of its tokens (the prompt as sent; no reply came)
    INTERRUPTED = "interrupted"
    # a reply (or agent run) re-applying a proposal made on an older incumbent onto the
    # new one, where git could not merge it (cheaper than a new proposal)
    REPAIRED = "repaired"


class JobState(StrEnum):
    """Where a backend's job is (the same four words for every engine)."""

    PENDING = "pending"  # queued, or waiting for a slot
    RUNNING = "running"
    DONE = "done"  # the worker reported a result
    LOST = "lost"  # gone without a result: an infrastructure fault (may be rerun)

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.DONE, JobState.LOST)


_Word = TypeVar("_Word", bound=StrEnum)


def _member(words: type[_Word], value: str, what: str) -> _Word:
    """A stored word as a member of `words`; one line naming the value when it is not one."""
    try:
        return words(value)
    except ValueError:
        known = ", ".join(w.value for w in words)
        raise ValueError(f"unknown candidate {what} {value!r} (known: {known})") from None


def kind_of(value: str) -> Kind:
    return _member(Kind, value, "kind")


def status_of(value: str) -> Status:
    return _member(Status, value, "status")
