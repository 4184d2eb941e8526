"""Budgets: `[budget]` limits that stop a study cleanly, and what a round will cost.

A limit is checked before anything new is asked for (a round's proposals in rounds mode,
each fill of free slots in rolling mode), against the whole study's spend as the ledger
records it (spend.py), so a resumed study goes on from what it spent. The study stops at
the first limit it has reached, or that the next step would cross on what the study's
candidates have cost so far; what runs then is finished and judged, nothing new starts,
and one line names the limit. A higher limit in ratchet.toml resumes it.

`preview` is the estimate printed before the first round: the proposer's cost from the
configured models' prices and the prompt's size, the compute's from the slot prices and
the task's timeout (an upper bound: every job runs to its timeout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratchet.core.candidate import Candidate
from ratchet.core.config import Budget, Config
from ratchet.core.verdict import Reason
from ratchet.core.vocab import Kind
from ratchet.driver.spend import Spend, duration
from ratchet.store.ledger import Ledger

# how each limit is shown: (label, format)
UNITS = {"usd": ("$", "{:.4f}"), "tokens": ("", "{:,.0f}"), "hours": ("", "{:.3f} slot-h"),
         "wall": ("", "{:.3f} h"), "candidates": ("", "{:.0f} candidates")}


def show(limit: str, value: float) -> str:
    if limit == "wall":  # `wall = "20s"` reads back as 20 s, not 0.006 h
        return duration(value)
    prefix, form = UNITS[limit]
    return prefix + form.format(value) + (" tokens" if limit == "tokens" else "")


@dataclass(frozen=True)
class Reached:
    """The limit that stops the study."""

    limit: str  # usd | tokens | hours | wall | candidates
    spent: float
    allowed: float
    step: float = 0.0  # what the next step was expected to spend (0: reached as it is)

    @property
    def field(self) -> str:
        return f"budget.{self.limit}"

    def line(self) -> str:
        """One line: which limit, spent of allowed, and how to go on."""
        verb = "made" if self.limit == "candidates" else "spent"
        where = f"{show(self.limit, self.spent)} {verb} of {show(self.limit, self.allowed)}"
        if self.step and self.spent < self.allowed:
            where += f", and the next step would take about {show(self.limit, self.step)}"
        return (f"stopped at {self.field}: {where}; raise {self.field} in ratchet.toml and "
                "run `ratchet run` to resume")

    def as_dict(self) -> dict[str, Any]:
        return {"limit": self.field, "spent": self.spent, "allowed": self.allowed,
                "step": self.step}


def made(cands: list[Candidate]) -> int:
    """The study's candidates: a change withdrawn from beside a confirmation (made on a
    would-be keep that was not kept, driver/beside.py) runs again as another row and is
    not counted twice."""
    return sum(1 for c in cands if c.kind == Kind.CANDIDATE and c.code != Reason.WITHDRAWN)


def used(spent: Spend, cands: list[Candidate] | int) -> dict[str, float]:
    """What each limit counts, so far; `cands`: the rows, or how many `made` counts of
    them (Ledger.made, where the rows are not read)."""
    return {"usd": spent.usd, "tokens": float(spent.tokens), "hours": spent.slot_hours,
            "wall": spent.wall_hours,
            "candidates": float(cands if isinstance(cands, int) else made(cands))}


def per_candidate(spent: Spend, cands: list[Candidate]) -> dict[str, float]:
    """What one more candidate is expected to take: the study's spend so far over its
    candidates (the baseline's share included, so it errs high)."""
    made_now = made(cands)
    if made_now == 0:
        return {}
    now = used(spent, cands)
    return {"usd": now["usd"] / made_now, "tokens": now["tokens"] / made_now,
            "hours": now["hours"] / made_now, "candidates": 1.0}


def check(budget: Budget, spent: Spend, cands: list[Candidate], next_candidates: int = 0,
          next_wall_h: float = 0.0) -> Reached | None:
    """The first limit reached, or crossed by the next step (`next_candidates` more
    candidates, `next_wall_h` more wall hours); None: go on."""
    limits = budget.limits
    if not limits:
        return None
    now = used(spent, cands)
    each = per_candidate(spent, cands)
    for limit, allowed in limits.items():
        if now[limit] >= allowed:
            return Reached(limit, now[limit], allowed)
        step = next_wall_h if limit == "wall" else each.get(limit, 0.0) * next_candidates
        if limit == "candidates":
            continue  # never crossed: the next step is cut to what is left (`room`)
        if step and now[limit] + step > allowed:
            return Reached(limit, now[limit], allowed, step)
    return None


def room(budget: Budget, cands: list[Candidate], want: int) -> int:
    """How many of `want` new candidates budget.candidates leaves room for."""
    if budget.candidates is None:
        return want
    return max(0, min(want, budget.candidates - made(cands)))


def status(budget: Budget, spent: Spend, cands: list[Candidate] | int, ledger: Ledger
           ) -> dict[str, Any]:
    """For `status --json`: each limit with what is used of it, and what stopped the
    study last, if a limit did."""
    now = used(spent, cands)
    return {"limits": {k: {"allowed": v, "used": round(now[k], 6)}
                       for k, v in budget.limits.items()},
            "stopped": ledger.study().budget_stop}


def lines(info: dict[str, Any]) -> list[str]:
    """For `status`: the limits and their use, in one line; the last budget stop."""
    out = []
    if info["limits"]:
        out.append("budget: " + ", ".join(
            f"{k} {show(k, v['used'])} of {show(k, v['allowed'])}"
            for k, v in info["limits"].items()))
    if info.get("stopped"):
        out.append(f"last stop: {info['stopped']['line']}")
    return out


# -- the estimate before the first round ---------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    k: int
    proposer_usd: float  # per round
    proposer_note: str
    compute_usd: float  # per round, at most
    compute_note: str

    @property
    def usd(self) -> float:
        return self.proposer_usd + self.compute_usd

    def line(self, budget: Budget) -> str:
        text = (f"estimate per round of {self.k}: proposer about ${self.proposer_usd:.4f} "
                f"({self.proposer_note}), compute at most ${self.compute_usd:.4f} "
                f"({self.compute_note})")
        if budget.usd is not None and self.usd > 0:
            text += (f"; budget.usd ${budget.usd:g} covers about "
                     f"{math.floor(budget.usd / self.usd)} round(s)")
        return text


def preview(config: Config, repo: Path, commit: str, k: int, proposer: str) -> Estimate:
    """What one round of `k` is expected to cost, before anything ran."""
    backend = config.backend
    rate = backend.gpu_hourly_usd or backend.cpu_hourly_usd
    which = "gpu_hourly_usd" if backend.gpu_hourly_usd else "cpu_hourly_usd"
    compute = k * config.task.timeout * rate / 3600
    compute_note = (f"{k} jobs x timeout {config.task.timeout:g} s at ${rate:g}/h "
                    f"backend.{which}")
    from ratchet.proposers import proposer_class

    spend = proposer_class(proposer).estimate(config, repo, commit, k)
    if spend is not None:
        return Estimate(k, spend.usd, spend.note, compute, compute_note)
    return Estimate(k, 0.0, f"the {proposer} proposer costs nothing per call", compute,
                    compute_note)
