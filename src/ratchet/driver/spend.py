"""What a study spent: every proposer call and every job, in the ledger, and their sums.

Two rooms of spend, both recorded as they happen, never inferred afterwards:

- **proposer calls** (the ledger's `calls` table): each HTTP request an LLM proposer
  sends, retries included (the SDK's own and ours), and each agent run, with its tokens,
  cost, seconds and outcome. A call is written by the `Meter` the moment it ends, from
  the proposer's own thread, whatever becomes of its proposal: the proposal's candidate
  is linked when it is recorded (`Ledger.new_candidate(calls=...)`), and a proposal
  dropped (it conflicts with a moved incumbent) or never used (the study stopped) keeps
  its calls, with no candidate: spent, and counted as wasted.
- **compute** (the candidates' rows): each job's slot time (its phases on the slot,
  `ledger.slot_seconds`) plus what its row's other jobs held (a hold-out follow-up, a
  lost or interrupted attempt: `extra_slot_s`), priced by `backend.gpu_hourly_usd` or
  `cpu_hourly_usd` into `cost_usd`.

`summary` sums them into proposer spend, compute spend and waste (calls that made no
candidate; proposals and jobs of candidates that crashed or were rejected), which
`status --json`, `show`, the report and the budget (budget.py) read.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ratchet.driver.ledger import Candidate, Ledger, slot_seconds, study_wall
from ratchet.vocab import Kind, Status

LEDGER_FILE = "ledger.db"


class Outcome(StrEnum):
    """How one proposer call ended."""

    OK = "ok"  # a reply (or an agent run that ended by itself)
    RETRIED = "retried"  # failed, and was sent again (rate limit, 5xx, dropped connection)
    FAILED = "failed"  # failed, and was not sent again (the proposal fails or the study)
    UNUSABLE = "unusable"  # a reply that cannot be used (too large, not the protocol's)
    TIMEOUT = "timeout"  # an agent killed at its timeout, a request past its deadline
    # a reply (or agent run) re-applying a proposal made on an older incumbent onto the
    # new one, where git could not merge it (cheaper than a new proposal)
    REPAIRED = "repaired"


@dataclass
class Call:
    proposer: str
    outcome: Outcome
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    detail: str | None = None
    t: float = field(default_factory=time.time)


class Meter:
    """Writes proposer calls to the ledger of `state_dir` from any thread (its own
    connection, one writer at a time); `with Meter(state_dir) as meter:`."""

    def __init__(self, state_dir: Path) -> None:
        path = Path(state_dir) / LEDGER_FILE
        Ledger(path).close()  # made and migrated if it was not (a proposer used alone)
        self.db = sqlite3.connect(str(path), timeout=30, isolation_level=None,
                                  check_same_thread=False)
        self.db.execute("PRAGMA synchronous=FULL")
        self._lock = threading.Lock()

    def record(self, call: Call) -> int:
        """Write one call now; its row id (for the proposal's `calls`)."""
        row = asdict(call)
        row["outcome"] = str(call.outcome)
        row["cost_usd"] = round(float(call.cost_usd), 9)
        row["seconds"] = round(float(call.seconds), 3)
        cols = ", ".join(row)
        with self._lock:
            cur = self.db.execute(f"INSERT INTO calls ({cols}) VALUES "
                                  f"({', '.join('?' * len(row))})", tuple(row.values()))
        return int(cur.lastrowid or 0)

    def spent_usd(self) -> float:
        with self._lock:
            return float(self.db.execute(
                "SELECT COALESCE(SUM(cost_usd), 0) FROM calls").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def usd(self) -> float:
        return self.proposer_usd + self.compute_usd

    def as_dict(self) -> dict[str, Any]:
        out = {k: (round(v, 6) if isinstance(v, float) else v)
               for k, v in asdict(self).items()}
        out.update(tokens=self.tokens, usd=round(self.usd, 6))
        return out

    def line(self) -> str:
        """One line for `status` and the end of `ratchet run`."""
        parts = [f"spent ${self.usd:.4f}: proposer ${self.proposer_usd:.4f} "
                 f"({self.calls} call{'s' * (self.calls != 1)}, {self.tokens:,} tokens "
                 f"{self.input_tokens:,} in / {self.output_tokens:,} out)",
                 f"compute ${self.compute_usd:.4f} ({self.slot_hours:.3f} slot-h over "
                 f"{self.jobs} job{'s' * (self.jobs != 1)})"]
        if self.wasted_usd or self.wasted_slot_hours or self.unused_calls:
            parts.append(f"wasted ${self.wasted_usd:.4f}, {self.wasted_slot_hours:.3f} "
                         f"slot-h ({self.unused_calls} unused call"
                         f"{'s' * (self.unused_calls != 1)})")
        parts.append(f"wall {self.wall_hours:.3f} h")
        return "; ".join(parts)


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
    """The whole study's spend, from the ledger alone."""
    rows = ledger.candidates(confirmations=True)
    by_id = {c.id: c for c in rows}
    out = Spend()
    for call in ledger.calls():
        out.calls += 1
        out.input_tokens += call["input_tokens"]
        out.output_tokens += call["output_tokens"]
        out.proposer_usd += call["cost_usd"]
        out.proposer_s += call["seconds"]
        cand = by_id.get(call["candidate"]) if call["candidate"] else None
        if cand is None:
            out.unused_calls += 1
            out.unused_usd += call["cost_usd"]
            out.wasted_usd += call["cost_usd"]
        elif cand.status in WASTED:
            out.wasted_usd += call["cost_usd"]
    for cand in rows:
        held = job_slot_seconds(cand)
        if held <= 0 and cand.cost_usd is None:
            continue
        out.jobs += 1 if (cand.job_id or held > 0) else 0
        out.slot_hours += held / 3600
        out.compute_usd += cand.cost_usd or 0.0
        if cand.status in WASTED and cand.kind == Kind.CANDIDATE:
            out.wasted_usd += cand.cost_usd or 0.0
            out.wasted_slot_hours += held / 3600
    out.wall_hours = study_wall(rows, ledger.sessions()) / 3600
    return out


def per_candidate(ledger: Ledger) -> dict[str, dict[str, float]]:
    """{id: {tokens, proposer_usd, calls, slot_s, compute_usd, usd}} of every row."""
    out: dict[str, dict[str, float]] = {}
    for cand in ledger.candidates(confirmations=True):
        held = job_slot_seconds(cand)
        out[cand.id] = {"calls": 0, "tokens": 0, "proposer_usd": 0.0,
                        "slot_s": round(held, 3), "compute_usd": cand.cost_usd or 0.0}
    for call in ledger.calls():
        entry = out.get(call["candidate"] or "")
        if entry is not None:
            entry["calls"] += 1
            entry["tokens"] += call["input_tokens"] + call["output_tokens"]
            entry["proposer_usd"] += call["cost_usd"]
    for entry in out.values():
        entry["proposer_usd"] = round(entry["proposer_usd"], 6)
        entry["usd"] = round(entry["proposer_usd"] + entry["compute_usd"], 6)
    return out


def candidate_lines(ledger: Ledger, cand_id: str) -> list[str]:
    """`ratchet show`'s spend lines for one candidate: each call, and its compute."""
    lines = []
    calls = [c for c in ledger.calls() if c["candidate"] == cand_id]
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
    if cand is not None:
        held = job_slot_seconds(cand)
        if held > 0 or cand.cost_usd:
            extra = (f" (of which {cand.extra_slot_s:.1f} s in other jobs: hold-out, lost "
                     "or interrupted attempts)") if cand.extra_slot_s else ""
            lines.append(f"compute: {held:.1f} slot-s{extra}, ${cand.cost_usd or 0.0:.4f}")
    return lines


def _count(values: Any) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return sorted(counts.items())
