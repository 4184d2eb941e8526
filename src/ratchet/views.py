"""Views of the ledger: `results.tsv` (karpathy's columns) and the status summary."""

from __future__ import annotations

import os
from pathlib import Path

from ratchet.ledger import Ledger

TSV_STATUSES = ("keep", "discard", "crash", "rejected")


def _clean(text: str) -> str:
    return " ".join(text.replace("\t", " ").split())


def results_rows(ledger: Ledger, metric: str) -> list[list[str]]:
    rows = [["commit", metric, "memory_gb", "status", "description"]]
    for cand in ledger.candidates():
        if cand.status not in TSV_STATUSES:
            continue
        value = cand.metric if cand.metric is not None and cand.status != "crash" else 0.0
        memory = (cand.extra or {}).get("memory_gb", 0.0)
        memory = memory if isinstance(memory, int | float) else 0.0
        description = _clean(cand.description)
        if cand.status in ("crash", "rejected") and cand.reasons:
            description = f"{description} [{_clean(cand.reasons)[:160]}]"
        rows.append([cand.short or "-------", f"{value:.6f}", f"{memory:.1f}", cand.status,
                     description])
    return rows


def write_results_tsv(path: Path, ledger: Ledger, metric: str) -> None:
    """Rewritten whole and renamed into place, so a reader never sees half a file."""
    text = "".join("\t".join(row) + "\n" for row in results_rows(ledger, metric))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
