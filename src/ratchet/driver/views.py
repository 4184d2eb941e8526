"""Views of the ledger: the status summary and what the CLI prints (`results.tsv` is
results.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ratchet.core import stats
from ratchet.core.vocab import Kind, Status
from ratchet.store.ledger import Ledger

LINE_WIDTH = 80  # what `ratchet run` prints fits a terminal's default width


def clean(text: str) -> str:
    return " ".join(text.replace("\t", " ").split())


def shorten(text: str, width: int) -> str:
    """`text` on one line in at most `width` characters: cut at a space (never inside a
    word or a number) and marked with an ellipsis when it had to be cut."""
    text = clean(text)
    if len(text) <= width:
        return text
    cut = text[:width - 1]
    space = cut.rfind(" ")
    if space > width // 2:  # a word boundary not too far back
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


# ---------------------------------------------------------------------------------------
# what the CLI prints: plain strings, so they are tested without a terminal


def fit(line: str, width: int) -> str:
    """A line laid out with spaces, cut at a space to `width` and marked with an ellipsis
    when it is longer (its own spacing kept, unlike `shorten`)."""
    if len(line) <= width:
        return line
    cut = line[:width - 1]
    space = cut.rfind(" ")
    if space > width // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


def fmt(value: object) -> str:
    """A number as a person reads it: 5.717, not 5.716999999999999; None as a dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return str(value)


def status_line(round_no: int, rounds: int, best: float | None, metric: str,
                counts: dict[str, int]) -> str:
    """The live view's one line: where the study is and how it is doing."""
    return (
        f"round {min(round_no, rounds)}/{rounds}   best so far {metric} {fmt(best)}   "
        f"kept {counts.get('keep', 0)}  discarded {counts.get('discard', 0)}  "
        f"crashed {counts.get('crash', 0)}  rejected {counts.get('rejected', 0)}"
    )


def rounds_done(ledger_round: int | None, cands: list) -> int:
    """Rounds run so far: the ledger's counter points at the next round to run."""
    if not ledger_round:
        return 0
    current = [c for c in cands if c.round == ledger_round]
    return ledger_round if current else ledger_round - 1


def show_lines(cand, metric: str, parent: str | None) -> list[str]:
    """`ratchet show`'s header: what a candidate is, its verdict and its numbers.

    `parent` is the commit it is compared against for a candidate, and the commit's own
    git parent for the baseline (which is the study's start, not its own parent).
    """
    lines = [f"{cand.id} {cand.kind} round {cand.round}: {cand.description}"]
    if cand.commit_sha is None:  # a proposal that never became a commit (its edit failed)
        lines.append(f"no commit: the proposal was not applied  parent {parent or '—'}")
    elif cand.kind in (Kind.BASELINE, Kind.INCUMBENT):
        start = " (the study's starting point)" if cand.kind == Kind.BASELINE else ""
        lines.append(f"commit {cand.commit_sha}{start}  git parent {parent or 'none'}")
    else:
        lines.append(f"commit {cand.commit_sha}  parent {parent or '—'}")
    lines.append(f"status {cand.status}" + (f": {cand.reasons}" if cand.reasons else ""))
    if cand.metric is not None:
        numbers = [f"{metric} {fmt(cand.metric)}"]
        if cand.samples and len(cand.samples) > 1:
            numbers.append(f"samples {fmt(cand.samples)}")
        for name in ("holdout", "gain", "margin", "noise"):
            value = getattr(cand, name)
            if value is not None:  # a number that was never measured is not printed
                numbers.append(f"{name} {fmt(value)}")
        lines.append("  ".join(numbers))
    for phase in cand.phases or []:
        code = phase["exit_code"]  # None: killed by the worker (a timeout, a stop)
        ended = f"exit {code}" if code is not None else "killed"
        lines.append(f"  phase {phase['name']:10} {ended}  "
                     f"{phase['seconds']:.2f}s" + ("  TIMED OUT" if phase["timed_out"] else ""))
    return lines


# ---------------------------------------------------------------------------------------
# headlines: pooled estimates, never one re-measure


@dataclass(frozen=True)
class Headline:
    """Baseline -> incumbent, each the pooled estimate of every evaluation of its commit
    with a 95% interval from the study's noise. The end-of-run line, `status --json`, the
    report's cards and progress.png all read this one object."""

    metric: str
    goal: str
    baseline: stats.Estimate | None
    incumbent: stats.Estimate | None
    incumbent_id: str | None
    incumbent_commit: str | None
    noise: stats.Noise
    noise_ignored: bool = False

    @property
    def change(self) -> float | None:
        """Relative change of the incumbent vs the baseline, + = better whatever the goal."""
        if self.baseline is None or self.incumbent is None or not self.baseline.mean:
            return None
        gain = self.incumbent.mean - self.baseline.mean
        if self.goal == "minimize":
            gain = -gain
        return gain / abs(self.baseline.mean)

    def line(self) -> str | None:
        if self.baseline is None or self.incumbent is None:
            return None
        change = self.change
        better = "" if change is None else (
            ", nothing kept yet" if self.baseline == self.incumbent else
            f", {abs(change) * 100:.1f}% {'better' if change >= 0 else 'worse'}")
        return (f"{self.metric}: baseline {self.baseline.text()} -> incumbent "
                f"{self.incumbent.text()}{better}")

    def as_dict(self) -> dict:
        return {"baseline": self.baseline.as_dict() if self.baseline else None,
                "incumbent": self.incumbent.as_dict() if self.incumbent else None,
                "change": self.change,
                "noise": {"sigma": self.noise.sigma,
                          "df": None if math.isinf(self.noise.df) else self.noise.df,
                          "source": self.noise.source},
                "noise_ignored": self.noise_ignored}


def reported_errors(ledger: Ledger, metric: str) -> list[tuple[float, float]]:
    """(sem, value) of every judged evaluation that reported its own error (the
    evaluator's `<metric>_sem`, or the spread of the job's repeats)."""
    from ratchet.driver.judge import sem_of, standard_error

    # judge.reported_noise of each result, read from the two fields it looks at (SQL
    # leaves out the rows that have neither)
    out = []
    for extra, samples, value in ledger.reported_errors(metric):
        known = [x for x in (sem_of(extra, metric), standard_error(list(samples or [])))
                 if x is not None]
        if known:
            out.append((max(known), value))
    return out


def study_noise(ledger: Ledger, metric: str,
                groups: dict[str, list[float]] | None = None) -> stats.Noise:
    """The study's noise, as the judge pools it (judge.Confirmation.noise)."""
    from ratchet.driver.judge import Confirmation  # the judge's own pooling, not a copy

    groups = ledger.evaluations() if groups is None else groups
    return Confirmation(measure=lambda *_: [], groups=groups,
                        reported=reported_errors(ledger, metric)).noise()


def headline(ledger: Ledger, metric: str, goal: str, noise_ignored: bool = False,
             groups: dict[str, list[float]] | None = None) -> Headline:
    groups = ledger.evaluations() if groups is None else groups
    noise = study_noise(ledger, metric, groups)
    record = ledger.study()
    pinned, commit = record.pinned, record.incumbent.commit
    base = stats.estimate(groups.get(pinned or "", []), noise)
    inc = stats.estimate(groups.get(commit or "", []), noise)
    return Headline(metric, goal, base, inc, record.incumbent.id, commit, noise,
                    noise_ignored)


def best_so_far(ledger: Ledger, goal: str) -> float | None:
    """The best pooled estimate of any commit that was the incumbent (the start and every
    keep): it never moves the wrong way when the incumbent is re-measured."""
    groups = ledger.evaluations()
    commits = [ledger.study().pinned] + [row[0] for row in ledger.db.execute(
        "SELECT commit_sha FROM candidates WHERE status = ? AND kind != ? ORDER BY seq",
        (Status.KEEP.value, Kind.CONFIRM.value))]
    means = [sum(v) / len(v) for v in (groups.get(c or "") for c in commits) if v]
    if not means:
        return None
    return min(means) if goal == "minimize" else max(means)
