"""One candidate as its callers see it: `wait --json`'s verdict object and `show`'s audit
trail. Shared by the CLI and the MCP server (ratchet/mcp), so both say the same."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ratchet.core.candidate import Candidate
from ratchet.core.errors import UserError
from ratchet.core.vocab import Kind
from ratchet.driver import spend, views
from ratchet.job import gitrepo

if TYPE_CHECKING:
    from ratchet.driver.study import Study


def verdict(cand: Candidate, metric: str) -> dict[str, Any]:
    """`ratchet wait --json`'s object for one candidate."""
    return {
        "id": cand.id,
        "commit": cand.commit_sha,
        "status": cand.status,
        "metric": cand.metric,
        "metric_name": metric,
        "description": cand.description,
        "reasons": cand.reasons,
        "reason": cand.reasons,  # the guard's or judge's reason, under its singular name too
        "code": cand.code,  # why, as a code to match on (judge.Reason), not as text
        "metrics_source": (cand.result or {}).get("metrics_source"),
        "gain": cand.gain,
        "margin": cand.margin,
    }


def measurement_lines(result: dict) -> list[str]:
    """Where the worker took the metrics and the memory figure from (its own record)."""
    lines = []
    if result.get("sandbox"):  # the worker's own word for what confined this job
        lines.append(f"sandbox: ran under {result['sandbox']}")
    source = result.get("metrics_source")
    if source:
        lines.append("metrics from: " + ("trusted channel" if source == "channel" else
                                         "unprotected (stdout): code running in the "
                                         "evaluator's process could have printed them"))
    if result.get("memory_gb") is not None:
        lines.append(f"memory_gb {result['memory_gb']:g}: {result.get('memory_source', '')}")
    lines.extend(f"note: {note}" for note in result.get("notes") or [])
    return lines


def plain_lines(study: Study, cand: Candidate) -> list[str]:
    """The verdict in plain words, the candidate's pooled estimate (results.tsv's), and a
    ModuleNotFoundError's cause under `python -P`."""
    from ratchet.driver import results, words

    metric = study.config.metric
    out = []
    plain = words.verdict(cand, metric.goal)
    if plain:
        out.append(f"verdict: {plain}")
    groups = study.ledger.evaluations()
    est = results.estimate_of(cand, groups, views.study_noise(study.ledger, metric.name, groups))
    if est is not None and est.n > 1:
        out.append(f"estimate: {metric.name} {est.text()}, every evaluation of its commit "
                   "pooled (95% interval)")
    hint = words.module_hint(cand.reasons, study.config.task.evaluate)
    if hint:
        out.append(hint)
    return out


def row_of(study: Study, ref: str) -> Candidate:
    """The candidate a user means by REF. A commit is measured again after it is kept
    (co-runs, confirmations: rows of their own with the same commit), so a commit names
    the change that made it, not its latest re-measure: a candidate first, else the
    baseline, else the row the ledger finds."""
    found = study.ledger.find(ref)
    if found is None:
        raise UserError(f"no candidate {ref!r} in this study (ids, job ids and commits are "
                        "in `ratchet log`)")
    if found.id == ref or not found.commit_sha:
        return found
    same = [c for c in study.ledger.candidates() if c.commit_sha == found.commit_sha]
    for kind in (Kind.CANDIDATE, Kind.BASELINE):
        first = next((c for c in same if c.kind == kind), None)
        if first is not None:
            return first
    return found


def trail(study: Study, cand: Candidate) -> tuple[list[str], str]:
    """`ratchet show`: the lines of one candidate's audit trail (header, phases, verdict,
    measurement, spend, the context its proposer saw), and its diff ("" if none)."""
    if Kind(cand.kind).is_reference and cand.commit_sha:
        parent = gitrepo.try_rev_parse(study.repo, f"{cand.commit_sha}^")
    else:
        parent = cand.parent
    lines = views.show_lines(cand, study.config.metric.name, parent)
    lines[3:3] = plain_lines(study, cand)  # after the status and its recorded reasons
    lines += measurement_lines(cand.result or {})
    lines += spend.candidate_lines(study.ledger, cand.id)  # its calls and compute
    if cand.context_path:
        lines.append(f"context the proposer saw: {cand.context_path}")
    diff = ""
    if cand.commit_sha and cand.parent and cand.commit_sha != cand.parent:
        diff = gitrepo.diff_text(study.repo, cand.parent, cand.commit_sha)
    return lines, diff
