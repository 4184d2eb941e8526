"""`progress.png`: the chart autoresearch users know, next to `results.tsv`.

Every experiment's metric in the order it was proposed, the kept ones highlighted and
labelled, and the running best as a step line. Like `results.tsv` it is a view of the
ledger, rewritten whole (atomically) and kept out of git. matplotlib is optional: with
it missing, no chart is written and the caller says how to get one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ratchet.core import stats
from ratchet.core.candidate import Candidate
from ratchet.core.vocab import Kind, Status
from ratchet.driver.results import stopped_early
from ratchet.driver.tally import Tally
from ratchet.driver.views import study_noise
from ratchet.job import gitrepo
from ratchet.store.ledger import Ledger

PROGRESS_FILE = "progress.png"
LABEL_CHARS = 28
KEEP_COLOR = "#2e7d32"
DISCARD_COLOR = "#b0b0b0"
FAILED_COLOR = "#c62828"
# room for the tick labels, the axis labels and the title of a 12 x 5.5 inch figure
MARGINS = {"left": 0.07, "right": 0.985, "bottom": 0.1, "top": 0.93}


def write_progress_png(repo: Path, ledger: Ledger, metric: str, goal: str,
                       rows: Sequence[Candidate] | None = None) -> Path | None:
    """Write `<repo>/progress.png`; None (nothing written) without matplotlib or metrics.
    `rows`: every row (Ledger.rows_since(None)) where the caller read them already."""
    fig = ledger_figure(ledger, metric, goal, rows)
    if fig is None:
        return None
    path = repo / PROGRESS_FILE
    gitrepo.exclude_locally(repo, [f"/{PROGRESS_FILE}"])  # ignored by git, as results.tsv is
    tmp = path.with_name(f".{PROGRESS_FILE}.{os.getpid()}.tmp")
    fig.savefig(tmp, format="png", dpi=120)
    tmp.replace(path)  # a viewer never sees half an image
    return path


def ledger_figure(ledger: Ledger, metric: str, goal: str,
                  rows: Sequence[Candidate] | None = None) -> Any:
    """progress.png's figure of this ledger; None without matplotlib or metrics."""
    try:
        from matplotlib.figure import Figure  # lazy: optional, and slow to import
    except ImportError:
        return None
    # the columns only (rows_since): decoding each row's whole result is what made a
    # study of 10,000 rows slow to draw, and the chart reads none of it
    everything = ledger.rows_since(None) if rows is None else rows
    cands = [c for c in everything if c.kind in (Kind.BASELINE, Kind.CANDIDATE)]
    if not any(c.metric is not None for c in cands):
        return None
    groups = ledger.evaluations()
    noise = study_noise(ledger, metric, groups)
    # every kept commit's pooled estimate (its own run, re-measures, confirmations)
    pooled = {c.id: stats.estimate(groups.get(c.commit_sha or "", []), noise)
              for c in cands if c.status == Status.KEEP}
    remeasures = [c for c in everything
                  if c.kind in (Kind.INCUMBENT, Kind.CONFIRM) and c.metric is not None]
    return progress_figure(Figure, cands, metric, goal, pooled, remeasures, Tally.of(ledger))


def progress_figure(Figure: Any, cands: list[Candidate], metric: str, goal: str,
                    pooled: dict[str, stats.Estimate | None] | None = None,
                    remeasures: Sequence[Candidate] = (), tally: Tally | None = None) -> Any:
    """The figure: x = candidate number (0 = baseline), y = the metric. The running best
    is each kept commit's pooled estimate with its 95% interval; re-measures (co-runs,
    the noise floor, confirmation pairs) are drawn as such, at the candidate they
    measured again. Title and legend count as tally.py does (the end line's words)."""
    # fixed margins, not layout="constrained": its solve drew the whole figure once more
    # before savefig drew it (half of the chart's cost, paid at the end of every run)
    fig = Figure(figsize=(12, 5.5))
    fig.subplots_adjust(**MARGINS)
    ax = fig.add_subplot()
    number = {c.id: i for i, c in enumerate(cands)}
    kept_ids = {c.id for c in cands if c.status == Status.KEEP}
    pooled = pooled or {}
    at_commit: dict[str, int] = {}
    for c in cands:
        if c.commit_sha:
            at_commit.setdefault(c.commit_sha, number[c.id])
    # a re-measure is drawn at the experiment that first measured its commit
    again = [(at_commit[r.commit_sha], r.metric) for r in remeasures
             if r.commit_sha in at_commit]
    if again:
        ax.scatter([x for x, _ in again], [y for _, y in again], s=26, marker="D",
                   facecolors="none", edgecolors="#6d6d6d", linewidths=0.8, zorder=2,
                   label=f"re-measured (co-run, noise floor, confirmation) ({len(again)})")

    discarded = [c for c in cands if c.status == Status.DISCARD and c.kind == Kind.CANDIDATE]
    others = [c for c in discarded if c.metric is not None and not stopped_early(c)]
    ax.scatter([number[c.id] for c in others], [c.metric for c in others], s=22,
               color=DISCARD_COLOR, label=f"discarded ({len(discarded)})", zorder=2)
    stopped = [c for c in discarded if stopped_early(c)]
    if stopped:  # nothing measured: marks along the bottom edge, never a value of 0
        ax.scatter([number[c.id] for c in stopped], [0.02] * len(stopped), s=30, marker="v",
                   color=DISCARD_COLOR, transform=ax.get_xaxis_transform(), zorder=2,
                   label=f"of them stopped early, not measured ({len(stopped)})")
    # A measured candidate can still be refused (hold-out overfit, constraint, tampering):
    # drawn apart, so a point better than the running best never reads as "discarded".
    refused = [c for c in cands if c.id not in kept_ids and c.status != Status.DISCARD
               and c.metric is not None]
    if refused:
        ax.scatter([number[c.id] for c in refused], [c.metric for c in refused], s=34,
                   marker="x", color=FAILED_COLOR, zorder=2,
                   label=f"rejected or crashed after measuring ({len(refused)})")
    failed = [c for c in cands if c.metric is None and c.status in (Status.CRASH, Status.REJECTED)]
    if failed:  # no metric to place: marks along the bottom edge
        ax.scatter([number[c.id] for c in failed], [0.02] * len(failed), s=30, marker="x",
                   color=FAILED_COLOR, transform=ax.get_xaxis_transform(), zorder=2,
                   label=f"crashed or rejected, no {metric} ({len(failed)})")

    kept = [c for c in cands if c.id in kept_ids and c.metric is not None]
    changes = [c for c in kept if c.kind == Kind.CANDIDATE]
    start = [c for c in kept if c.kind != Kind.CANDIDATE]
    ax.scatter([number[c.id] for c in changes], [c.metric for c in changes], s=70,
               color=KEEP_COLOR, edgecolors="black", linewidths=0.6,
               label=f"kept ({len(changes)})", zorder=4)
    if start:
        ax.scatter([number[c.id] for c in start], [c.metric for c in start], s=70, marker="s",
                   color=KEEP_COLOR, edgecolors="black", linewidths=0.6, label="baseline",
                   zorder=4)  # the start: where the running best begins, not a keep
    if kept:
        def value(c: Candidate) -> float | None:
            est = pooled.get(c.id)
            return est.mean if est is not None else c.metric

        xs = [number[c.id] for c in kept] + [len(cands) - 1]
        ys = [value(c) for c in kept] + [value(kept[-1])]
        ax.step(xs, ys, where="post", color=KEEP_COLOR, linewidth=1.8, alpha=0.85,
                label="running best (pooled estimate, 95% interval)", zorder=3)
        bars = [(number[c.id], e.mean, e.low, e.high) for c in kept
                if (e := pooled.get(c.id)) is not None and e.low is not None
                and e.high is not None]
        if bars:
            ax.errorbar([b[0] for b in bars], [b[1] for b in bars],
                        yerr=[[b[1] - b[2] for b in bars], [b[3] - b[1] for b in bars]],
                        fmt="none", ecolor=KEEP_COLOR, elinewidth=1.2, capsize=4, zorder=4)
    for c in kept:
        label = "baseline" if c.kind == Kind.BASELINE else short_label(c.description)
        ax.annotate(label, (number[c.id], c.metric), xytext=(6, 8 if goal == "minimize" else -14),
                    textcoords="offset points", fontsize=8, rotation=20, color="#1b5e20",
                    zorder=5)

    tally = tally or Tally(candidates=sum(1 for c in cands if c.kind == Kind.CANDIDATE),
                           kept=len(changes))
    # y given: the title sits on the axes' top edge (no ticks are drawn there), and
    # matplotlib skips measuring every tick label to place it (a tenth of a second)
    ax.set_title(f"{tally.candidates} candidate{'s' * (tally.candidates != 1)}, "
                 f"{tally.kept} kept", y=1.0)
    ax.set_xlabel("candidate # (0 = baseline)")
    ax.set_ylabel(f"{metric} ({'lower' if goal == 'minimize' else 'higher'} is better)")
    values = [c.metric for c in cands if c.metric is not None]
    if min(values) > 0 and max(values) / min(values) > 20:
        ax.set_yscale("log")  # one terrible candidate must not flatten the kept ones
    ax.set_xlim(-0.8, max(len(cands) - 1, 1) + 0.8)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=9, framealpha=0.9)
    return fig


def short_label(text: str | None) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= LABEL_CHARS else line[: LABEL_CHARS - 1] + "…"
