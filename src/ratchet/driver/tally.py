"""How many candidates a study tried and what became of them: one count, one wording.

The end of `ratchet run`, `ratchet status` (and `--json`), progress.png's title and
legend, and the report all say this, so they never disagree. A *candidate* is a proposed
change (kind `candidate`): the baseline is the study's start, not a candidate, and the
re-measures (the baseline's noise floor, co-run incumbents, the confirmation pairs of a
would-be keep) are evaluations of code already counted, said apart. A change withdrawn
from beside a confirmation that failed runs again as a new candidate, so it is not
counted twice (as `budget.made`). `results.tsv` has a row per candidate with a verdict
among karpathy's four words, plus the baseline's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ratchet.core.vocab import Kind, Status
from ratchet.store.ledger import _TRUTHY, Ledger


@dataclass(frozen=True)
class Tally:
    candidates: int = 0  # proposed changes, judged or not
    kept: int = 0
    discarded: int = 0  # stopped early included
    stopped: int = 0  # of the discarded: runs stopped early as clearly worse
    crashed: int = 0
    rejected: int = 0
    cancelled: int = 0
    running: int = 0  # not judged yet
    remeasures: int = 0  # evaluations of the baseline and the incumbent, confirmation pairs
    baseline: bool = False  # the study's start was measured

    @classmethod
    def of(cls, ledger: Ledger) -> Tally:
        """Counted in SQL: read on every status, it must not decode every row."""
        from ratchet.core.verdict import Reason  # the code's spelling, not a copy of it

        by: dict[str, int] = {}
        for status, n in ledger.db.execute(
                "SELECT status, COUNT(*) FROM candidates WHERE kind = ? AND code IS NOT ? "
                "GROUP BY status", (Kind.CANDIDATE.value, Reason.WITHDRAWN.value)):
            by[status] = n
        stopped = ledger.db.execute(
            f"SELECT COUNT(*) FROM candidates WHERE kind = ? AND status = ? AND "
            f"{_TRUTHY.format(path='$.stopped_early')}",
            (Kind.CANDIDATE.value, Status.DISCARD.value)).fetchone()[0]
        others, baselines = ledger.db.execute(
            "SELECT COUNT(*), TOTAL(kind = ?) FROM candidates WHERE kind != ?",
            (Kind.BASELINE.value, Kind.CANDIDATE.value)).fetchone()
        again = int(others) - min(int(baselines), 1)  # the start's first measurement is not
        return cls(candidates=sum(by.values()), kept=by.get(Status.KEEP, 0),
                   discarded=by.get(Status.DISCARD, 0), stopped=int(stopped),
                   crashed=by.get(Status.CRASH, 0), rejected=by.get(Status.REJECTED, 0),
                   cancelled=by.get(Status.CANCELLED, 0),
                   running=sum(n for s, n in by.items() if Status(s).is_open),
                   remeasures=int(again), baseline=bool(baselines))

    def text(self) -> str:
        """'6 candidates: 2 kept, 3 discarded (1 stopped early), 1 crashed, 0 rejected'"""
        parts = [f"{self.kept} kept",
                 f"{self.discarded} discarded"
                 + (f" ({self.stopped} stopped early)" if self.stopped else ""),
                 f"{self.crashed} crashed", f"{self.rejected} rejected"]
        if self.cancelled:
            parts.append(f"{self.cancelled} cancelled")
        if self.running:
            parts.append(f"{self.running} running")
        noun = "candidate" if self.candidates == 1 else "candidates"
        return f"{self.candidates} {noun}: " + ", ".join(parts)

    def apart(self) -> str | None:
        """What was measured besides the candidates: '+ the baseline and 6 re-measures'."""
        apart = ["the baseline"] if self.baseline else []
        if self.remeasures:
            apart.append(f"{self.remeasures} re-measure{'s' * (self.remeasures != 1)}")
        return f"+ {' and '.join(apart)}" if apart else None

    def line(self) -> str:
        """The text, the baseline and the re-measures said apart (they are not candidates)."""
        apart = self.apart()
        return f"{self.text()} ({apart})" if apart else self.text()

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def sandboxes_text(ran: dict[str, int]) -> str | None:
    """'bwrap (12 jobs)', or 'pidns (3 jobs), bwrap (1 job)': what the jobs ran under."""
    if not ran:
        return None
    return ", ".join(f"{name} ({n} job{'s' * (n != 1)})" for name, n in ran.items())
