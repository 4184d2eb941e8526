"""`results.tsv`: karpathy's columns, each row a candidate's own estimate.

karpathy's columns keep their meaning: `commit`, the metric, `memory_gb`, `status`
(`keep`, `discard`, `crash`, plus `rejected`) and `description`; a crash row reads
0.000000 and 0.0, as in autoresearch. The metric is the candidate's pooled estimate:
every evaluation of its commit (its own run, its confirmation pairs, re-measures) in one
mean, so a kept commit measured five times does not read as its first, luckiest number.

Columns are only ever added at the end (an interface: notebooks read them by name):
the spend of each candidate (spend.py), then `evals` (how many evaluations the metric
pools, 0 where nothing was measured) and `ci95_low`/`ci95_high` (its 95% interval from the
study's noise, blank where there is no noise estimate). A run stopped early measured
nothing: its metric and interval are blank and its description says it was stopped, so it
never reads as a measured 0 (for a minimised metric, the best value there is).
"""

from __future__ import annotations

import os
from pathlib import Path

from ratchet.core import stats
from ratchet.core.candidate import Candidate
from ratchet.core.vocab import Status
from ratchet.driver import words
from ratchet.driver.views import study_noise
from ratchet.store.ledger import Ledger

TSV_STATUSES = ("keep", "discard", "crash", "rejected")
COLUMNS = ["commit", "{metric}", "memory_gb", "status", "description", "tokens", "cost_usd",
           "proposer_usd", "compute_usd", "evals", "ci95_low", "ci95_high"]


def _clean(text: str) -> str:
    return " ".join(text.replace("\t", " ").split())


def stopped_early(cand: Candidate) -> bool:
    """A run the worker stopped as clearly worse: judged `discard`, nothing evaluated."""
    return bool((cand.extra or {}).get("stopped_early"))


def estimate_of(cand: Candidate, groups: dict[str, list[float]],
                noise: stats.Noise) -> stats.Estimate | None:
    """The candidate's own estimate: its commit's evaluations pooled, or its one measured
    value where the study does not pool it (refused after measuring: a hold-out overfit,
    a constraint); None for a crash and a stopped run."""
    if cand.status == Status.CRASH or stopped_early(cand):
        return None
    values = groups.get(cand.commit_sha or "")
    if values:
        return stats.estimate(values, noise)
    if cand.metric is None:
        return None
    return stats.estimate([cand.metric], noise)


def results_rows(ledger: Ledger, metric: str) -> list[list[str]]:
    from ratchet.driver.spend import per_candidate

    rows = [[c.format(metric=metric) for c in COLUMNS]]
    spent = per_candidate(ledger)
    groups = ledger.evaluations()
    noise = study_noise(ledger, metric, groups)
    for cand in ledger.candidates():
        if cand.status not in TSV_STATUSES:
            continue
        est = estimate_of(cand, groups, noise)
        stopped = stopped_early(cand)
        # a stopped run measured nothing: blank, never a number a reader takes as measured
        value = "" if stopped else f"{est.mean if est is not None else 0.0:.6f}"
        memory = (cand.extra or {}).get("memory_gb")
        mem = f"{memory:.1f}" if isinstance(memory, int | float) else "" if stopped else "0.0"
        description = _clean(cand.description)
        if stopped:
            description = f"{description} [stopped early: {words.stopped(cand)}]"
        elif cand.status in (Status.CRASH, Status.REJECTED) and cand.reasons:
            description = f"{description} [{words.gist(cand.reasons, 160)}]"
        mine = spent.get(cand.id)
        low = high = ""
        if est is not None and est.low is not None and est.high is not None:
            low, high = f"{est.low:.6f}", f"{est.high:.6f}"
        rows.append([cand.short or "-------", value, mem, cand.status,
                     description, str(mine.tokens if mine else 0),
                     f"{mine.usd if mine else 0.0:.6f}",
                     f"{mine.proposer_usd if mine else 0.0:.6f}",
                     f"{mine.compute_usd if mine else 0.0:.6f}",
                     str(est.n if est is not None else 0), low, high])
    return rows


def write_results_tsv(path: Path, ledger: Ledger, metric: str) -> None:
    """Rewritten whole and renamed into place, so a reader never sees half a file."""
    text = "".join("\t".join(row) + "\n" for row in results_rows(ledger, metric))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
