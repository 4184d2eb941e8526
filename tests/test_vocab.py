"""The typed vocabulary: the strings a study stores are the enum members, unchanged."""

from __future__ import annotations

import sqlite3

import pytest

from ratchet.core import vocab
from ratchet.core.vocab import JobState, Kind, Outcome, Status
from ratchet.store.ledger import Ledger


def test_a_status_and_kind_written_as_members_read_back_as_the_same_text(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    cand = ledger.new_candidate(1, kind=Kind.BASELINE, status=Status.COMMITTED)
    ledger.update(cand.id, "judged:keep", status=Status.KEEP)
    ledger.close()
    # what another tool (sqlite3, a notebook) sees in the file: plain words
    row = sqlite3.connect(tmp_path / "ledger.db").execute(
        "SELECT kind, status FROM candidates").fetchone()
    assert row == ("baseline", "keep")
    again = Ledger(tmp_path / "ledger.db").candidate(cand.id)
    assert again is not None
    assert again.status == Status.KEEP and again.kind == Kind.BASELINE
    assert Status(again.status).is_verdict and Kind(again.kind).is_reference


def test_open_and_verdicts_split_every_status_once():
    assert set(Status) == vocab.OPEN | vocab.VERDICTS
    assert not vocab.OPEN & vocab.VERDICTS
    # what a resumed driver picks up: in flight with a commit (proposed is proposed again)
    assert {s for s in Status if s.has_commit} == {"committed", "submitted", "interrupted",
                                                   "finished"}
    assert all(s.is_open != s.is_terminal for s in Status)


def test_the_ledgers_lists_are_the_vocabularys():
    from ratchet.store import ledger

    assert set(ledger.OPEN) == vocab.OPEN
    assert set(ledger.VERDICTS) == vocab.VERDICTS


def test_only_the_candidate_kind_is_a_hypothesis():
    assert [k for k in Kind if not k.is_reference] == [Kind.CANDIDATE, Kind.CONFIRM]


def test_job_states_end_in_done_or_lost():
    assert {s for s in JobState if s.is_terminal} == {"done", "lost"}


def test_an_unknown_stored_status_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown candidate status 'kept' \(known: proposed"):
        vocab.status_of("kept")


def test_no_status_kind_or_outcome_is_compared_or_set_as_a_bare_string():
    """`c.status == "keep"`, `kind in ("baseline",)`, `result.outcome != "ok"`,
    `update(..., status="keep")`, `{"status": "rejected"}` or `r.outcome = "ok"` in the
    code are the strings-for-types the vocabulary replaced: one typo is a silent bug."""
    import ast

    from helpers import ROOT

    fields = ("status", "kind", "outcome", "stop_outcome")

    def named(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            return str(node.slice.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and node.args \
                and isinstance(node.args[0], ast.Constant):
            return str(node.args[0].value)  # row.get("status")
        return None

    # a candidate's and a job's words (others, such as Ray's job states or git's change
    # letters, are other vocabularies)
    words = {s.value for s in Status} | {k.value for k in Kind} | {o.value for o in Outcome}

    def bare(node: ast.AST | None) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in words
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(bare(e) for e in node.elts)
        if isinstance(node, ast.IfExp):
            return bare(node.body) or bare(node.orelse)
        return False

    found = []
    src = ROOT / "src" / "ratchet"
    for path in sorted(src.rglob("*.py")):
        if path.name == "vocab.py" or "templates" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(src)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(named(a) in fields for a in sides) and any(bare(b) for b in sides):
                    found.append(where)
            elif isinstance(node, ast.Call):
                found += [where for kw in node.keywords
                          if kw.arg in fields and bare(kw.value)]
            elif isinstance(node, ast.Dict):
                found += [where for k, v in zip(node.keys, node.values, strict=True)
                          if isinstance(k, ast.Constant) and k.value in fields and bare(v)]
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                # a record's field (`r.outcome = "ok"`, `row["status"] = ...`); a local
                # name is some other text (an evaluator's own "ok" line)
                if any(named(t) in fields for t in targets
                       if isinstance(t, ast.Attribute | ast.Subscript)) and bare(node.value):
                    found.append(where)
    assert found == [], found


def test_a_job_outcome_is_a_member_and_its_json_the_same_word():
    from ratchet.job.jobspec import JobResult

    result = JobResult(job_id="j", outcome="timeout")  # type: ignore[arg-type]
    assert result.outcome is Outcome.TIMEOUT
    text = result.to_json()
    assert '"outcome": "timeout"' in text
    assert JobResult.from_json(text).outcome is Outcome.TIMEOUT
    with pytest.raises(ValueError, match="'timed out'"):
        JobResult(job_id="j", outcome="timed out")  # type: ignore[arg-type]


def test_a_candidate_read_back_holds_members(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    cand = ledger.new_candidate(1, kind=Kind.BASELINE, status=Status.COMMITTED)
    again = ledger.candidate(cand.id)
    assert again is not None
    assert again.status is Status.COMMITTED and again.kind is Kind.BASELINE


def test_every_infrastructure_fault_is_the_one_infrastructure_error():
    """A machine's fault, a backend that does not answer, a lost job's backend: one base
    (core.errors.InfrastructureError), never blamed on a candidate, shown as one line."""
    from ratchet.backends.base import BackendError
    from ratchet.core.errors import InfrastructureError, UserError
    from ratchet.driver.infra import InfraFault
    from ratchet.driver.jobs import BackendDown

    for fault in (InfraFault, BackendError, BackendDown):
        assert issubclass(fault, InfrastructureError) and issubclass(fault, UserError), fault
