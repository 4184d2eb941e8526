"""The ledger evolves: a ledger written by the previous release opens, and is migrated.

tests/data/ledger-v0.db was written by the release before schema versions (ratchet at
commit 37751ea, `Ledger` of that release): a baseline, a keep and a discard, no
`confirms` column and PRAGMA user_version 0.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from ratchet.core.vocab import Kind, Status
from ratchet.store.ledger import SCHEMA_VERSION, Ledger, LedgerError

V0 = Path(__file__).parent / "data" / "ledger-v0.db"


def columns(path: Path) -> set[str]:
    db = sqlite3.connect(str(path))
    try:
        return {row[1] for row in db.execute("PRAGMA table_info(candidates)")}
    finally:
        db.close()


def test_a_ledger_of_the_previous_release_opens_and_is_migrated(tmp_path):
    path = tmp_path / "ledger.db"
    shutil.copy(V0, path)
    assert "confirms" not in columns(path)
    ledger = Ledger(path)
    assert ledger.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    cands = ledger.candidates()
    assert [(c.id, c.kind, c.status) for c in cands] == [
        ("c0000", Kind.BASELINE, Status.KEEP), ("c0001", Kind.CANDIDATE, Status.KEEP),
        ("c0002", Kind.CANDIDATE, Status.DISCARD)]
    assert all(c.confirms is None for c in cands)
    record = ledger.incumbent()
    assert record.commit == "b" * 40 and record.metric == 1.5 and record.samples == [1.5]
    # the migrated ledger takes the new rows: a confirmation of c0001
    row = ledger.new_confirmation(cands[1], "b" * 40, "confirm c0001: pair 1, candidate",
                                  parent="a" * 40)
    assert row.id == "r0001" and ledger.candidate("r0001").confirms == "c0001"
    assert ledger.candidates() == cands  # confirmation rows are listed only when asked
    assert [c.id for c in ledger.candidates(confirmations=True)] == ["r0001", *(c.id for c in cands)]
    ledger.close()
    again = Ledger(path)  # opening a current ledger migrates nothing
    assert again.candidate("r0001").confirms == "c0001"
    again.close()


def test_a_ledger_of_a_newer_release_is_refused_in_one_line(tmp_path):
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    db = sqlite3.connect(str(path))
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(LedgerError, match="newer ratchet"):
        Ledger(path)


def test_statuses_are_stored_as_their_plain_values(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    cand = ledger.new_candidate(1, kind=Kind.BASELINE, status=Status.COMMITTED)
    ledger.update(cand.id, status=Status.KEEP)
    raw = ledger.db.execute("SELECT kind, status, typeof(status) FROM candidates").fetchone()
    assert tuple(raw) == ("baseline", "keep", "text")
    assert ledger.status_counts() == {"keep": 1}
    ledger.close()
