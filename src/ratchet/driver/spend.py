"""What a study spent: every proposer call and every job, in the ledger, and their sums.

Two rooms of spend, both recorded as they happen, never inferred afterwards:

- **proposer calls** (the ledger's `calls` table): each HTTP request an LLM proposer
  sends and each agent run, written by the proposer's `Meter` the moment it ends
  (store/calls.py, where the plug-ins reach it without the driver);
- **compute** (the candidates' rows): each job's slot time (its phases on the slot,
  `ledger.slot_seconds`) plus what its row's other jobs held (a hold-out follow-up, a
  lost or interrupted attempt: `extra_slot_s`), priced by `backend.gpu_hourly_usd` or
  `cpu_hourly_usd` into `cost_usd`.

`summary` sums them into proposer spend, compute spend and waste (calls that made no
candidate; proposals and jobs of candidates that crashed or were rejected), which
`status`, `show`, `log`, the report and the budget (budget.py) read; `per_candidate`
gives each row's (its confirmation pairs' compute included), `kept_steps` what each keep
cost to get to since the keep before it.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from ratchet.core.candidate import Candidate
from ratchet.core.vocab import CallOutcome, Kind, Status
from ratchet.store.ledger import JOB_SLOT_S, VERDICTS, Ledger, active_seconds, slot_seconds


def _rounded(spend: Any) -> dict[str, Any]:
    """A spend dataclass as JSON-ready fields, its dollars and hours to 6 places."""
    # the flat fields by name (asdict deep-copies each: slow over 10,000 rows)
    return {f.name: (round(v, 6) if isinstance(v := getattr(spend, f.name), float) else v)
            for f in fields(spend)}


# -- the sums ------------------------------------------------------------------------------

WASTED = (Status.CRASH, Status.REJECTED)  # a job or a proposal that measured nothing


@dataclass
class Spend:
    """A study's spend, split as the user asks for it."""

    calls: int = 0  # proposer calls: HTTP requests and agent runs
    input_tokens: int = 0
    output_tokens: int = 0
    proposer_usd: float = 0.0
    proposer_s: float = 0.0  # the calls' own time, summed (calls overlap)
    jobs: int = 0  # rows that ran a job (confirmation and hold-out jobs included)
    slot_hours: float = 0.0  # what the jobs held of their slots (GPU/CPU-hours)
    compute_usd: float = 0.0
    wall_hours: float = 0.0  # while a driver session or a job ran
    wasted_usd: float = 0.0  # calls that made no candidate, crashed and rejected ones
    wasted_slot_hours: float = 0.0
    unused_calls: int = 0  # calls whose proposal never became a candidate
    unused_usd: float = 0.0
    interrupted_calls: int = 0  # in flight when the study was stopped at once

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def usd(self) -> float:
        return self.proposer_usd + self.compute_usd

    def as_dict(self) -> dict[str, Any]:
        return {**_rounded(self), "tokens": self.tokens, "usd": round(self.usd, 6)}

    def line(self) -> str:
        """One line for `status` and the end of `ratchet run`."""
        parts = [f"spent ${self.usd:.4f}: proposer ${self.proposer_usd:.4f} "
                 f"({self.calls} call{'s' * (self.calls != 1)}, {self.tokens:,} tokens "
                 f"{self.input_tokens:,} in / {self.output_tokens:,} out)",
                 f"compute ${self.compute_usd:.4f} ({_held(self.slot_hours)} over "
                 f"{self.jobs} job{'s' * (self.jobs != 1)})"]
        if self.wasted_usd or self.wasted_slot_hours or self.unused_calls:
            cut = (f", {self.interrupted_calls} interrupted" if self.interrupted_calls
                   else "")
            parts.append(f"wasted ${self.wasted_usd:.4f}, {_held(self.wasted_slot_hours)} "
                         f"({self.unused_calls} unused call"
                         f"{'s' * (self.unused_calls != 1)}{cut})")
        parts.append(f"wall {duration(self.wall_hours)}")
        return "; ".join(parts)


def _held(hours: float) -> str:
    """Slot time as read at a glance: 0.000 slot-h says nothing of a few seconds."""
    return f"{hours:.3f} slot-h" if hours >= 0.1 or hours == 0 else f"{hours * 3600:.1f} slot-s"


def job_slot_seconds(cand: Candidate) -> float:
    """Every second this row's jobs held a slot: its own phases and its other jobs."""
    ran = slot_seconds(cand) if (cand.phases or cand.run_s is not None) else 0.0
    return ran + (cand.extra_slot_s or 0.0)


def compute_usd(config: Any, slot_s: float) -> float:
    """The price of `slot_s` slot seconds (backend.gpu_hourly_usd, else cpu_hourly_usd)."""
    backend = config.backend
    rate = backend.gpu_hourly_usd or backend.cpu_hourly_usd
    return round(rate * slot_s / 3600.0, 6)


def summary(ledger: Ledger) -> Spend:
    """The whole study's spend, from the ledger alone: SQL sums over the calls and the
    rows (no row decoded), so every view can afford it at any size of study."""
    out = Spend()
    wasted = ", ".join("?" * len(WASTED))
    (out.calls, out.input_tokens, out.output_tokens, out.proposer_usd, out.proposer_s,
     out.interrupted_calls, out.unused_calls, out.unused_usd, calls_wasted) = \
        ledger.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
            "TOTAL(k.cost_usd), TOTAL(seconds), COALESCE(SUM(outcome = ?), 0), "
            "COALESCE(SUM(c.id IS NULL), 0), TOTAL(CASE WHEN c.id IS NULL THEN k.cost_usd END), "
            f"TOTAL(CASE WHEN c.id IS NULL OR c.status IN ({wasted}) THEN k.cost_usd END) "
            "FROM calls k LEFT JOIN candidates c ON c.id = k.candidate",
            (CallOutcome.INTERRUPTED.value, *WASTED)).fetchone()
    jobs, held_s, usd, wasted_usd, wasted_s = ledger.db.execute(
        f"SELECT COALESCE(SUM(COALESCE(job_id, '') != '' OR held > 0), 0), TOTAL(held), "
        f"TOTAL(cost_usd), TOTAL(CASE WHEN waste THEN cost_usd END), "
        f"TOTAL(CASE WHEN waste THEN held END) FROM ("
        f"SELECT job_id, cost_usd, {JOB_SLOT_S} AS held, "
        f"(status IN ({wasted}) AND kind = ?) AS waste FROM candidates) "
        f"WHERE held > 0 OR cost_usd IS NOT NULL",
        (*WASTED, Kind.CANDIDATE.value)).fetchone()
    out.jobs = jobs
    out.slot_hours = held_s / 3600
    out.compute_usd = usd
    out.wasted_usd = calls_wasted + wasted_usd
    out.wasted_slot_hours = wasted_s / 3600
    out.wall_hours = active_seconds([*ledger.spans(), *ledger.sessions()]) / 3600
    return out


@dataclass
class RowSpend:
    """One row's spend: its proposer calls, and its compute with its confirmation pairs'
    (both sides of each pair are measured to judge it)."""

    calls: int = 0
    tokens: int = 0
    proposer_usd: float = 0.0
    slot_s: float = 0.0  # its own jobs and its confirmation pairs'
    compute_usd: float = 0.0
    confirm_slot_s: float = 0.0  # of which its confirmation pairs'
    confirm_usd: float = 0.0

    @property
    def usd(self) -> float:
        return self.proposer_usd + self.compute_usd

    def as_dict(self) -> dict[str, Any]:
        return {**_rounded(self), "usd": round(self.usd, 6)}


def per_candidate(ledger: Ledger, ids: Collection[str] | None = None
                  ) -> dict[str, RowSpend]:
    """{id: RowSpend} of every row but the confirmation measurements, which are counted
    with the candidate they confirm; of the rows `ids` only, when given (a page of a
    table). SQL sums grouped by the row they belong to."""
    owner = f"CASE WHEN kind = '{Kind.CONFIRM.value}' THEN confirms ELSE id END"
    only, args = "", list[object]()
    if ids is not None:
        if not ids:
            return {}
        only = f" AND ({owner}) IN ({', '.join('?' * len(ids))})"
        args = list(ids)
    out = {row[0]: RowSpend() for row in ledger.db.execute(
        f"SELECT id FROM candidates WHERE kind != ?"
        f"{' AND id IN (' + ', '.join('?' * len(ids)) + ')' if ids is not None else ''} "
        "ORDER BY seq", (Kind.CONFIRM.value, *(ids or ())))}
    for who, held, usd, confirm_held, confirm_usd in ledger.db.execute(
            f"SELECT {owner} AS who, TOTAL(held), TOTAL(cost_usd), "
            f"TOTAL(CASE WHEN confirm THEN held END), "
            f"TOTAL(CASE WHEN confirm THEN cost_usd END) FROM ("
            f"SELECT id, kind, confirms, cost_usd, {JOB_SLOT_S} AS held, "
            f"kind = '{Kind.CONFIRM.value}' AS confirm FROM candidates WHERE 1=1{only}) "
            "GROUP BY who", args):
        entry = out.get(who or "")
        if entry is not None:
            entry.slot_s, entry.compute_usd = held, usd
            entry.confirm_slot_s, entry.confirm_usd = confirm_held, confirm_usd
    call_only = "" if ids is None else f" WHERE candidate IN ({', '.join('?' * len(ids))})"
    for who, n, tokens, usd in ledger.db.execute(
            "SELECT candidate, COUNT(*), SUM(input_tokens + output_tokens), TOTAL(cost_usd) "
            f"FROM calls{call_only} GROUP BY candidate", list(ids or ())):
        entry = out.get(who or "")
        if entry is not None:
            entry.calls, entry.tokens, entry.proposer_usd = n, tokens, usd
    return out


@dataclass
class Step:
    """What one kept step cost to get to: the proposer and compute spend of everything
    judged since the keep before it (the study's start for the first), itself included."""

    since: str | None  # the keep before it (None: the study's start)
    candidates: int = 0  # proposed candidates among them (the baseline, re-measures not)
    calls: int = 0
    proposer_usd: float = 0.0
    compute_usd: float = 0.0

    @property
    def usd(self) -> float:
        return self.proposer_usd + self.compute_usd

    def text(self) -> str:
        return (f"${self.usd:.4f} = proposer ${self.proposer_usd:.4f} + compute "
                f"${self.compute_usd:.4f}, {self.candidates} candidate"
                f"{'s' * (self.candidates != 1)} since {self.since or 'the start'}")


def kept_steps(ledger: Ledger) -> tuple[dict[str, Step], Step]:
    """({kept id: Step}, what was spent since the last keep). A row belongs to the first
    keep judged at or after its verdict (a round is judged at one moment, so its
    candidates go with its keep); one not judged yet, to what follows the last keep; a
    confirmation measurement, to the candidate it confirms; a call, to its candidate, or
    by when it was made when it made none. Reads eight columns of each row, no JSON."""
    rows = [_Row(*r) for r in ledger.db.execute(
        "SELECT id, seq, kind, status, confirms, judged_at, finished_at, created_at, "
        "cost_usd FROM candidates ORDER BY seq")]
    keeps = sorted((c for c in rows if c.status == Status.KEEP and c.kind != Kind.BASELINE),
                   key=lambda c: (c.judged_at or 0.0, c.seq))
    times = [k.judged_at or 0.0 for k in keeps]
    steps, since = {}, None
    for keep in keeps:
        steps[keep.id] = Step(since)
        since = keep.id
    tail = Step(since)
    by_id = {c.id: c for c in rows}

    def when(cand: _Row) -> float:
        if cand.kind == Kind.CONFIRM and cand.confirms in by_id:
            cand = by_id[cand.confirms]
        if cand.status not in VERDICTS:
            return float("inf")
        return cand.judged_at or cand.finished_at or cand.created_at

    def step_at(t: float) -> Step:
        i = bisect.bisect_left(times, t)
        return steps[keeps[i].id] if i < len(keeps) else tail

    for cand in rows:
        step = step_at(when(cand))
        step.compute_usd += cand.cost_usd or 0.0
        step.candidates += cand.kind == Kind.CANDIDATE
    for made_id, t, usd in ledger.db.execute(
            "SELECT candidate, t, cost_usd FROM calls ORDER BY id"):
        made = by_id.get(made_id or "")
        step = step_at(when(made) if made is not None else t)
        step.calls += 1
        step.proposer_usd += usd
    return steps, tail


class _Row(NamedTuple):
    """What kept_steps reads of a row."""

    id: str
    seq: int
    kind: str
    status: str
    confirms: str | None
    judged_at: float | None
    finished_at: float | None
    created_at: float
    cost_usd: float | None


def candidate_lines(ledger: Ledger, cand_id: str, steps: dict[str, Step] | None = None,
                    spent: dict[str, RowSpend] | None = None) -> list[str]:
    """`ratchet show`'s spend lines for one candidate: each call, and its compute.
    `steps` (kept_steps) and `spent` (per_candidate of every row): read once by a caller
    that shows many candidates (the report), instead of once per candidate."""
    lines = []
    calls = ledger.calls(cand_id)
    if calls:
        tokens_in = sum(c["input_tokens"] for c in calls)
        tokens_out = sum(c["output_tokens"] for c in calls)
        usd = sum(c["cost_usd"] for c in calls)
        seconds = sum(c["seconds"] for c in calls)
        outcomes = ", ".join(f"{n} {o}" for o, n in _count(c["outcome"] for c in calls))
        lines.append(f"proposer: {len(calls)} call{'s' * (len(calls) != 1)} ({outcomes}), "
                     f"{tokens_in:,} tokens in / {tokens_out:,} out, ${usd:.4f}, "
                     f"{seconds:.1f} s")
    cand = ledger.candidate(cand_id)
    if cand is None:
        return lines
    mine = (spent if spent is not None else per_candidate(ledger, [cand.id])
            ).get(cand.id, RowSpend())
    held = job_slot_seconds(cand)
    if held > 0 or cand.cost_usd:
        extra = (f" (of which {cand.extra_slot_s:.1f} s in other jobs: hold-out, lost "
                 "or interrupted attempts)") if cand.extra_slot_s else ""
        pairs = (f"; its confirmation pairs {mine.confirm_slot_s:.1f} slot-s, "
                 f"${mine.confirm_usd:.4f}") if mine.confirm_slot_s or mine.confirm_usd else ""
        lines.append(f"compute: {held:.1f} slot-s{extra}, ${cand.cost_usd or 0.0:.4f}{pairs}")
    if lines:
        wasted = (f"; all of it wasted ({cand.status}: it measured nothing)"
                  if cand.status in WASTED and cand.kind == Kind.CANDIDATE else "")
        lines.append(f"spend: ${mine.usd:.4f} = proposer ${mine.proposer_usd:.4f} + compute "
                     f"${mine.compute_usd:.4f}{wasted}")
    step = (steps if steps is not None else kept_steps(ledger)[0]).get(cand.id)
    if step is not None:
        lines.append(f"to get here: {step.text()}")
    return lines


def _count(values: Any) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return sorted(counts.items())


def duration(hours: float) -> str:
    """Hours as a person says them: '20 s', '12.5 min', '3.00 h'."""
    seconds = hours * 3600
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{hours:.2f} h"
