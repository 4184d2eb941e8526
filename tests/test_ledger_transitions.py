"""The ledger's typed records: a row changes through named transitions with typed
arguments (place, finish, judge, reject, ...), never through free keyword writes (what
each writes is read back as a user reads it: the row, its events; no module of the study
writes a row any other way); the study's own facts are one typed record
(core.candidate.StudyRecord) over the meta table's stored keys."""

from __future__ import annotations

import ast
import json
import sqlite3

import pytest
from helpers import ROOT

from ratchet.core.verdict import Reason, Verdict
from ratchet.core.vocab import Kind, Status
from ratchet.store.ledger import Ledger


def _kinds(ledger: Ledger, cand_id: str) -> list[str]:
    return [e["kind"] for e in ledger.events(cand_id)]


def test_a_row_goes_from_placed_to_judged_through_the_transitions(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    cand = ledger.new_candidate(1, status=Status.COMMITTED, commit_sha="a" * 40)
    ledger.place(cand.id, "job-1", 100.0)
    row = ledger.row(cand.id)
    assert (row.status, row.job_id, row.submitted_at) == (Status.SUBMITTED, "job-1", 100.0)
    ledger.interrupt(cand.id, "stopped", extra_slot_s=2.5, cost_usd=0.01)
    ledger.requeue(cand.id, 1)
    row = ledger.row(cand.id)
    assert (row.status, row.attempt, row.extra_slot_s) == (Status.COMMITTED, 1, 2.5)
    ledger.place(cand.id, "job-2", 200.0)
    ledger.finish(cand.id, metric=3.0, samples=[3.0, 3.1], extra={"x": 1}, holdout=None,
                  phases=[], failed_stage=None, slot="cpu0", queue_s=0.5, run_s=4.0,
                  cost_usd=0.02, finished_at=210.0, reasons=None,
                  result={"outcome": "ok"})
    ledger.judge(cand.id, Verdict(Status.KEEP, reasons=["better", ""], gain=0.1,
                                  code=Reason.KEPT), 220.0)
    row = ledger.row(cand.id)
    assert row.status is Status.KEEP and row.status.is_verdict
    assert (row.metric, row.samples, row.extra, row.slot) == (3.0, [3.0, 3.1], {"x": 1},
                                                              "cpu0")
    assert (row.reasons, row.gain, row.code, row.judged_at) == ("better", 0.1, Reason.KEPT,
                                                               220.0)
    assert _kinds(ledger, cand.id)[-5:] == ["submitted", "interrupted", "submitted",
                                           "finished", "judged:keep"]
    # the judged event says what the verdict was, in the stored words
    judged = json.loads(list(ledger.events(cand.id))[-1]["data"])
    assert judged == {"status": "keep", "reasons": "better"}
    ledger.close()
    # another tool reading the file sees plain words
    stored = sqlite3.connect(tmp_path / "ledger.db").execute(
        "SELECT status, code FROM candidates").fetchone()
    assert stored == ("keep", Reason.KEPT.value)


def test_rejecting_and_cancelling_say_why_and_when(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    a = ledger.new_candidate(1, status=Status.FINISHED, commit_sha="b" * 40)
    b = ledger.new_candidate(1, status=Status.COMMITTED)
    c = ledger.new_candidate(1, status=Status.COMMITTED)
    ledger.reject(a.id, "tampering: moved", 5.0, commit_sha="c" * 40)
    ledger.cancel(b.id, "cancelled by the user", 6.0)
    ledger.cancel(c.id, "made on a would-be keep", 7.0, code=Reason.WITHDRAWN,
                  event="withdrawn")
    a, b, c = ledger.rows([a.id, b.id, c.id])
    assert (a.status, a.reasons, a.commit_sha, a.judged_at) == (
        Status.REJECTED, "tampering: moved", "c" * 40, 5.0)
    assert (b.status, b.code, c.status, c.code) == (Status.CANCELLED, None,
                                                    Status.CANCELLED, Reason.WITHDRAWN)
    assert [_kinds(ledger, x.id)[-1] for x in (a, b, c)] == ["judged:rejected", "cancelled",
                                                            "withdrawn"]


def test_a_write_names_only_the_rows_columns(tmp_path):
    """The column list of an UPDATE is built from names: only a row's own ever are."""
    ledger = Ledger(tmp_path / "ledger.db")
    cand = ledger.new_candidate(1, kind=Kind.BASELINE, status=Status.COMMITTED)
    with pytest.raises(ValueError, match="not columns"):
        ledger.update(cand.id, **{"status = 'keep', metric": 1})
    assert ledger.row(cand.id).status is Status.COMMITTED


def _free_writes(tree: ast.AST) -> list[int]:
    """Lines that call `<something ledger>.update(...)` or `led.update(...)`."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "update"):
            owner = ast.unparse(node.func.value)
            if owner == "led" or owner.endswith("ledger"):
                lines.append(node.lineno)
    return lines


def test_the_study_writes_rows_through_the_transitions_alone():
    src = ROOT / "src" / "ratchet"
    free = [f"{path.relative_to(ROOT)}:{line}" for path in sorted(src.rglob("*.py"))
            if path.parent.name != "store"
            for line in _free_writes(ast.parse(path.read_text()))]
    assert free == [], f"free keyword writes of a ledger row: {free}"
    # and the reading sees one
    assert _free_writes(ast.parse("self.ledger.update(c, status=s)\nled.update(c)\n")) == [1, 2]


def test_the_study_record_is_read_whole_and_typed_from_the_stored_keys(tmp_path):
    """The meta table keeps one JSON value a key, as every ledger has: a record written
    by another tool (or an older ratchet) that way reads back as the typed record."""
    Ledger(tmp_path / "ledger.db").close()
    db = sqlite3.connect(tmp_path / "ledger.db")
    stored = {"study": "s", "pinned": "a" * 40, "round": 3, "incumbent": "b" * 40,
              "incumbent_id": "c0002", "incumbent_samples": [1.0, 2.0],
              "pins": {"evaluate.py": {"digest": "d"}}, "an_older_key": 1}
    db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                   [(k, json.dumps(v)) for k, v in stored.items()])
    db.commit()
    db.close()
    ledger = Ledger(tmp_path / "ledger.db")
    record = ledger.study()
    assert (record.study, record.start, record.next_round) == ("s", "a" * 40, 3)
    assert (record.incumbent.commit, record.incumbent.id, record.incumbent.samples) == (
        "b" * 40, "c0002", [1.0, 2.0])
    assert record.pins == {"evaluate.py": {"digest": "d"}} and record.budget_stop is None
    ledger.set(round=4, budget_stop={"limit": "budget.usd"})
    assert ledger.study().round == 4 and ledger.get("round") == 4
    with pytest.raises(KeyError, match="an_older_key"):
        ledger.set(an_older_key=2)  # only the record's own keys are written by name
    with pytest.raises(KeyError, match="rounds"):
        ledger.get("rounds")
    # the guard's reading sees every key as stored, an unknown one included
    assert ledger.stored(["an_older_key", "round"]) == {"an_older_key": 1, "round": 4}


def test_a_study_not_started_says_so_when_its_start_is_asked_for(tmp_path):
    record = Ledger(tmp_path / "ledger.db").study()
    assert record.pinned is None and record.pins == {} and record.incumbent.samples == []
    with pytest.raises(LookupError, match="not pinned its start"):
        _ = record.start
