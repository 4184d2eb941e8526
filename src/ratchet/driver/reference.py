"""Which progress curve a candidate's run is stopped against: one the candidate cannot forge.

A run phase's progress curve ($RATCHET_PROGRESS_FD) is reported by candidate code. Once
the candidate is kept, its curve would be what every later run is stopped against, so a
forged curve (a loss of 1e-9 at every step) would stop every better candidate for good.
An incumbent's curve is therefore passed on ($RATCHET_INCUMBENT_PROGRESS) only when

1. it agrees with the trusted evaluator's metric: its last points lie within the noise
   of the metric the evaluator measured on the same job (checked when the study's
   baseline showed that the curve and the metric measure the same quantity);
2. it was reproduced: a re-run of the same commit (its confirmation pairs, an A/A or
   co-run re-measure) reported a curve that ends at the same level;
3. it was never shown wrong: no candidate run in full against this incumbent had a curve
   the reference would have stopped but a trusted metric better than the incumbent's.

And after AUDIT_AFTER stops in a row against one incumbent, the next candidate placed runs
in full (no curve): the check of rule 3 that a forger cannot avoid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ratchet.core import stats
from ratchet.core.candidate import Candidate
from ratchet.core.vocab import Kind, Status
from ratchet.store.ledger import Ledger

AUDIT_AFTER = 3  # stops in a row before one candidate runs in full
MARGIN = 0.02  # relative: the margin stats.clearly_worse_run stops by
TAIL = 3  # the last points compared
AUDIT_KEY = "reference_audit"  # ledger: "<incumbent id> <candidate id>"

Curve = Sequence[Sequence[float]]


@dataclass(frozen=True)
class Reference:
    curve: list[list[float]] | None  # None: no curve is passed on
    why: str  # one line for the log: what it rests on, or why there is none


def _curve(cand: Candidate | None) -> list[list[float]]:
    return list(((cand.result if cand else None) or {}).get("progress") or [])


def _close(a: float, b: float, noise: float) -> bool:
    return abs(a - b) <= max(MARGIN * max(abs(a), abs(b)), 3 * noise)


def agrees(curve: Curve, metric: float | None, noise: float = 0.0) -> bool:
    """The curve's last TAIL points are each within the noise of the trusted metric."""
    if metric is None or not curve:
        return False
    return all(_close(float(v), metric, noise) for _, v in curve[-TAIL:])


def same_end(a: Curve, b: Curve, noise: float = 0.0) -> bool:
    """Two runs' curves end at the same level (a re-run reproduced the first)."""
    return bool(a and b) and _close(float(a[-1][1]), float(b[-1][1]), noise)


def _full(cand: Candidate) -> bool:
    """Measured in full (not stopped) and judged on its metric."""
    return (cand.status in (Status.KEEP, Status.DISCARD, Status.REFERENCE)
            and cand.metric is not None and not (cand.extra or {}).get("stopped_early"))


def _better(a: float, b: float, minimize: bool) -> bool:
    return a < b if minimize else a > b


def reference(ledger: Ledger, inc_id: str | None, minimize: bool) -> Reference:
    """The curve a proposed candidate's run may be stopped against (rules 1-3)."""
    rows = ledger.candidates(confirmations=True)
    inc = next((c for c in rows if c.id == inc_id), None)
    curve = _curve(inc)
    if inc is None or not curve:
        return Reference(None, "the incumbent reported no progress curve")
    noise = inc.noise if inc.noise is not None and math.isfinite(inc.noise) else 0.0
    baseline = next((c for c in rows if c.kind == Kind.BASELINE), None)
    # the user's own code (the baseline) showed the curve measures the metric: hold every
    # curve to it
    same_quantity = baseline is not None and agrees(_curve(baseline), baseline.metric)
    if same_quantity and not agrees(curve, inc.metric, noise):
        return Reference(None, f"the incumbent's curve ends at {curve[-1][1]:.4g} "
                                   f"but the evaluator measured {inc.metric}: not a reference")
    reruns = [c for c in rows if c.id != inc.id and c.commit_sha == inc.commit_sha
              and _full(c) and _curve(c)]
    if not any(same_end(curve, _curve(c), noise) for c in reruns):
        return Reference(None, "the incumbent's curve was not yet reproduced by a re-run")
    against = [c for c in rows if c.kind == Kind.CANDIDATE and c.parent == inc.commit_sha]
    for cand in against:
        if (_full(cand) and _curve(cand) and inc.metric is not None
                and _better(cand.metric, inc.metric, minimize)  # type: ignore[arg-type]
                and stats.clearly_worse_run([(s, v) for s, v in _curve(cand)],
                                            [(s, v) for s, v in curve]) is not None):
            return Reference(None, f"{cand.id} ran in full, measured better than the "
                                   "incumbent, yet its curve was clearly worse: the "
                                   "incumbent's curve is not a reference")
    return Reference([list(p) for p in curve], "agrees with the metric and was reproduced")


def stops_in_a_row(ledger: Ledger, inc_commit: str) -> int:
    """Judged candidates on this incumbent stopped early since the last run in full."""
    count = 0
    for cand in reversed(ledger.candidates()):
        if cand.kind != Kind.CANDIDATE or cand.parent != inc_commit or not cand.is_judged:
            continue
        if not (cand.extra or {}).get("stopped_early"):
            break
        count += 1
    return count


def audited(ledger: Ledger, inc_id: str, inc_commit: str, cand_id: str) -> bool:
    """Does `cand_id` run in full to check the reference? After AUDIT_AFTER stops in a
    row, the first candidate asked for is, until it is judged (recorded, so a resumed
    study places the same job the same way)."""
    held = (ledger.get(AUDIT_KEY) or "").split()
    if held == [inc_id, cand_id]:
        return True
    if held and held[0] == inc_id:
        row = ledger.candidate(held[1])
        if row is not None and not row.is_judged:
            return False  # one audit at a time
    if stops_in_a_row(ledger, inc_commit) < AUDIT_AFTER:
        return False
    ledger.set(**{AUDIT_KEY: f"{inc_id} {cand_id}"})
    return True
