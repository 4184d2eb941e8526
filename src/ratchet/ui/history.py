"""What the study did, read back from the ledger: the kept steps, `ratchet log`, `ratchet diff`.

Views only: nothing here writes the ledger or moves a ref. Export, the progress chart
and the report all read the kept steps from `kept_steps`, so they tell the same story.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ratchet.core.candidate import Candidate
from ratchet.core.errors import UserError
from ratchet.core.verdict import Reason
from ratchet.core.vocab import Kind, Status
from ratchet.driver.spend import RowSpend
from ratchet.driver.spend import Step as SpendStep
from ratchet.job import gitrepo
from ratchet.store.ledger import OPEN, VERDICTS, Ledger

STATUSES = (*OPEN, *VERDICTS)
# names `ratchet diff` accepts besides candidate ids, job ids and commit prefixes
INCUMBENT, BASELINE = "incumbent", "baseline"


class HistoryError(UserError):
    """A request about the study's history that cannot be answered (phrased for the user)."""


@dataclass
class Step:
    """One kept candidate, with the step it improved on (the baseline for the first)."""

    cand: Candidate
    previous_metric: float | None
    previous_id: str | None

    def change(self, goal: str) -> tuple[float, float | None] | None:
        """(gain, relative gain) over the previous step; positive is better."""
        now, before = self.cand.metric, self.previous_metric
        if now is None or before is None:
            return None
        gain = before - now if goal == "minimize" else now - before
        return gain, (gain / abs(before) if before else None)


def kept_steps(ledger: Ledger) -> list[Step]:
    """Kept candidates in the order they became the incumbent (the baseline excluded)."""
    cands = ledger.candidates()
    baseline = next((c for c in cands if c.kind == Kind.BASELINE and c.metric is not None), None)
    keeps = sorted(
        (c for c in cands if c.status == Status.KEEP and c.kind != Kind.BASELINE),
        key=lambda c: (c.judged_at or 0.0, c.seq),
    )
    steps: list[Step] = []
    prev_metric = baseline.metric if baseline else None
    prev_id = baseline.id if baseline else None
    for cand in keeps:
        steps.append(Step(cand, prev_metric, prev_id))
        prev_metric, prev_id = cand.metric, cand.id
    return steps


def format_change(change: tuple[float, float | None] | None) -> str:
    """'+0.1875 (+75.00%)': signed so that + is always better, whatever the goal."""
    if change is None:
        return ""
    gain, rel = change
    return f"{gain:+.4g}" + (f" ({rel * 100:+.2f}%)" if rel is not None else "")


# ---------------------------------------------------------------------------------------
# ratchet log


def check_status(status: str | None) -> None:
    """A status `ratchet log --status` knows (HistoryError naming them if not)."""
    if status is not None and status not in STATUSES:
        raise HistoryError(f"unknown status {status!r}; one of: {', '.join(STATUSES)}")


def select(cands: Iterable[Candidate], kept: bool = False, status: str | None = None,
           round: int | None = None) -> list[Candidate]:
    """The candidates `ratchet log` shows under its filters (all of them must hold)."""
    check_status(status)
    return [
        c for c in cands
        if (not kept or c.status == Status.KEEP)
        and (status is None or c.status == status)
        and (round is None or c.round == round)
    ]


def log_line(cand: Candidate, metric: str, spent: RowSpend | None = None,
             step: SpendStep | None = None) -> str:
    """One line per candidate, like `git log --oneline`: id, commit, status, metric, gain,
    cost, text.

    The gain is the judge's: this candidate against the incumbent it was compared
    with (+ is better); the reasons of a crash or rejection follow in brackets. The cost
    is the row's own (its proposer calls, its jobs and confirmation pairs); a kept step
    ends with what it cost to get there, since the keep before it (spend.kept_steps).
    """
    value = f"{metric}=" + ("-" if cand.metric is None else f"{cand.metric:.6g}")
    gain = "gain=" + ("-" if cand.gain is None else f"{cand.gain:+.4g}")
    cost = f"cost=${spent.usd if spent else 0.0:.4f}"
    text = _one_line(cand.description)
    if cand.kind != Kind.CANDIDATE:
        text = f"({cand.kind}) {text}".rstrip()
    if cand.status in (Status.CRASH, Status.REJECTED, Status.CANCELLED) and cand.reasons:
        text += f" [{_one_line(cand.reasons)[:160]}]"
    if step is not None:
        text += f" [to get here: {step.text()}]"
    return (f"{cand.id} {cand.short or '-------':7} {cand.status:9} {value:16} {gain:12} "
            f"{cost:13} {text}").rstrip()


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


# ---------------------------------------------------------------------------------------
# ratchet diff


@dataclass
class Rev:
    label: str  # what the user asked for, resolved: "c0003", "incumbent (c0005)", ...
    commit: str


def resolve(repo: Path, ledger: Ledger, ref: str) -> Rev:
    """A candidate (id, job id, commit prefix), `incumbent` or `baseline` -> its commit."""
    if ref == INCUMBENT:
        commit = ledger.study().incumbent.commit
        if not commit:
            raise HistoryError("the study has not started: no incumbent yet")
        inc_id = ledger.study().incumbent.id
        return Rev(f"incumbent ({inc_id})" if inc_id else "incumbent (the study start)", commit)
    if ref == BASELINE:
        commit = ledger.study().pinned
        if not commit:
            raise HistoryError("the study has not started: no baseline yet")
        return Rev("baseline (the study start)", commit)
    cand = ledger.find(ref)
    if cand is None:
        raise HistoryError(f"no candidate {ref!r} in this study (an id such as c0003, "
                           "a commit prefix, `incumbent` or `baseline`)")
    if not cand.commit_sha:
        raise HistoryError(f"{cand.id} has no commit ({cand.status}: "
                           f"{cand.reasons or 'it never materialised'})")
    if gitrepo.try_rev_parse(repo, cand.commit_sha) is None:
        raise HistoryError(f"{cand.id}'s commit {cand.short} is not in this repository")
    return Rev(cand.id, cand.commit_sha)


def diff(repo: Path, ledger: Ledger, a: str, b: str) -> tuple[Rev, Rev, str]:
    """The `git diff` from A to B (empty when their trees are equal)."""
    rev_a, rev_b = resolve(repo, ledger, a), resolve(repo, ledger, b)
    return rev_a, rev_b, gitrepo.diff_text(repo, rev_a.commit, rev_b.commit)


# ---------------------------------------------------------------------------------------
# success shares, by proposer and by idea


OUTCOMES = ("keep", "discard", "crash", "rejected", "cancelled")
_NUMBER = re.compile(r"[-+]?\d[\d.eE+-]*")


@dataclass
class Share:
    """How one proposer's (or idea's) candidates fared."""

    name: str
    counts: dict[str, int]
    reasons: dict[str, int]  # crash / rejection reasons, numbers masked, with how often

    @property
    def judged(self) -> int:
        return sum(self.counts.get(s, 0) for s in OUTCOMES)

    def share(self, status: str) -> float:
        return self.counts.get(status, 0) / self.judged if self.judged else 0.0


def success_shares(cands: Iterable[Candidate], by: str) -> list[Share]:
    """Per proposer (`by="proposer"`) or per idea (`by="idea"`), most candidates first.

    Only proposed candidates count (not the baseline or re-measurements); reasons of a
    crash or rejection are grouped with their numbers masked, so "hold-out 99" and
    "hold-out 98" read as one reason.
    """
    groups: dict[str, Share] = {}
    for cand in cands:
        if cand.kind != Kind.CANDIDATE:
            continue
        key = _group_of(cand, by)
        share = groups.setdefault(key, Share(key, {}, {}))
        share.counts[cand.status] = share.counts.get(cand.status, 0) + 1
        if cand.status in (Status.CRASH, Status.REJECTED) and cand.reasons:
            for reason in failure_reasons(cand):
                label = f"{cand.status}: {reason_kind(reason)}"
                share.reasons[label] = share.reasons.get(label, 0) + 1
    return sorted(groups.values(), key=lambda s: (-sum(s.counts.values()), s.name))


def failure_reasons(cand: Candidate) -> list[str]:
    """The parts of a crash's or rejection's reasons that say why it failed. A candidate
    rejected as overfit had passed the comparison first: its reasons begin with the
    judge's pass text (`gain N > margin N`) and end with the failure, so by its code
    (judge.Reason), only the last part is a reason it failed."""
    parts = (cand.reasons or "").split("; ")
    if cand.code == Reason.OVERFIT:
        return parts[-1:]
    return parts


def _group_of(cand: Candidate, by: str) -> str:
    if by == "proposer":
        return cand.proposer or "(unknown)"
    if by == "idea":
        return _one_line(cand.idea) or "(no queued idea)"
    raise ValueError(f"cannot group by {by!r}")


def reason_kind(reason: str) -> str:
    """A reason without its numbers and quoted output: what kind of failure it was."""
    text = _one_line(reason)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = _NUMBER.sub("N", text)
    return text[:80]
