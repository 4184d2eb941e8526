"""The ledger: SQLite (WAL) under .ratchet/, the single source of truth of a study.

Every state change is committed before ratchet acts on it (write-ahead), so a driver
killed at any moment resumes without losing or repeating work. `results.tsv` and the
report are views rebuilt from it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

from ratchet.core import sanitize
from ratchet.core.candidate import (
    INCUMBENT_KEYS,
    META_KEYS,
    Candidate,
    Incumbent,
    StudyRecord,
)
from ratchet.core.verdict import Reason, Verdict
from ratchet.core.vocab import Kind, Status

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS candidates (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,
    round INTEGER NOT NULL,
    kind TEXT NOT NULL DEFAULT 'candidate',   -- baseline | candidate | incumbent | submitted
    parent TEXT,
    commit_sha TEXT,
    description TEXT NOT NULL DEFAULT '',
    proposer TEXT,
    params TEXT,
    idea TEXT,
    context_path TEXT,
    status TEXT NOT NULL,
    job_id TEXT,
    attempt INTEGER NOT NULL DEFAULT 0,
    metric REAL,
    samples TEXT,
    extra TEXT,
    holdout REAL,
    phases TEXT,
    reasons TEXT,
    failed_stage TEXT,
    slot TEXT,
    gain REAL,
    margin REAL,
    noise REAL,
    queue_s REAL,
    run_s REAL,
    cost_usd REAL,
    created_at REAL NOT NULL,
    submitted_at REAL,
    finished_at REAL,
    judged_at REAL,
    result TEXT
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    t REAL NOT NULL,
    candidate TEXT,
    kind TEXT NOT NULL,
    data TEXT
);
CREATE TABLE IF NOT EXISTS ideas (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    text TEXT NOT NULL UNIQUE,
    source TEXT NOT NULL DEFAULT 'cli',
    status TEXT NOT NULL DEFAULT 'pending',   -- pending | tried
    candidate TEXT,
    outcome TEXT,
    created_at REAL NOT NULL
);
"""

# statuses a candidate moves through; the rest are verdicts
OPEN = (Status.PROPOSED, Status.COMMITTED, Status.SUBMITTED, Status.INTERRUPTED,
        Status.FINISHED)
VERDICTS = (Status.KEEP, Status.DISCARD, Status.CRASH, Status.REJECTED, Status.CANCELLED,
            Status.REFERENCE)
JSON_COLUMNS = ("params", "samples", "extra", "phases", "result")
# a candidate row's columns: the record's fields, one for one (the only names a write
# may build its column list from)
COLUMNS = frozenset(f.name for f in fields(Candidate))
# the columns a page of candidates may be sorted by (Ledger.page)
PAGE_ORDERS = ("seq", "round", "status", "metric", "gain", "margin", "noise", "holdout",
               "run_s", "proposer", "idea", "description", "reasons", "commit_sha")
# a JSON value in `extra` that Python would call true (None, false, 0, "" are not)
_TRUTHY = ("COALESCE(json_type(extra, '{path}') NOT IN ('null', 'false') AND "
           "json_extract(extra, '{path}') NOT IN (0, ''), 0)")
# slot_seconds(row) in SQL: its phases' seconds, builds on a CPU build slot excluded; the
# run time where no phase was recorded
SLOT_S = ("CASE WHEN phases IS NULL OR NOT json_valid(phases) OR json_array_length(phases) = 0 "
          "THEN COALESCE(run_s, 0.0) ELSE (SELECT TOTAL(json_extract(p.value, '$.seconds')) "
          "FROM json_each(phases) p WHERE NOT COALESCE(json_extract(p.value, '$.off_slot'), "
          "0)) END")
# job_slot_seconds(row): with its other jobs' (hold-out follow-up, lost attempts)
JOB_SLOT_S = f"(({SLOT_S}) + COALESCE(extra_slot_s, 0.0))"
UNTRUSTED_TEXT = ("description", "reasons")  # sanitised on the way in and out

# Schema migrations, in order: MIGRATIONS[i] takes a ledger from user_version i to i + 1.
# A ledger written by an older ratchet is brought up to date when it is opened (the
# columns it lacks are added, with their defaults); one written by a newer ratchet is
# refused with one line instead of being misread.
MIGRATIONS: tuple[str, ...] = (
    # v1: a confirmation measurement names the candidate it confirms
    "ALTER TABLE candidates ADD COLUMN confirms TEXT",
    # v2: the verdict's reason code (judge.Reason) beside its text, matched by code
    "ALTER TABLE candidates ADD COLUMN code TEXT",
    # v3: every proposer call (each HTTP request, each agent run), whatever became of it
    # (spend.py); the proposal's candidate when it became one, NULL while it did not
    """CREATE TABLE IF NOT EXISTS calls (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        t REAL NOT NULL,
        proposer TEXT NOT NULL,
        model TEXT,
        outcome TEXT NOT NULL,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cost_usd REAL NOT NULL DEFAULT 0,
        seconds REAL NOT NULL DEFAULT 0,
        candidate TEXT,
        fate TEXT,
        detail TEXT)""",
    # v4: proposals of older ledgers kept their tokens in params.llm, and each job's
    # cost_usd held them too: they become calls, and cost_usd the job's compute alone
    """INSERT INTO calls (t, proposer, model, outcome, input_tokens, output_tokens,
        cost_usd, seconds, candidate, detail)
        SELECT created_at, 'llm', json_extract(params, '$.llm.model'), 'ok',
               COALESCE(json_extract(params, '$.llm.input_tokens'), 0),
               COALESCE(json_extract(params, '$.llm.output_tokens'), 0),
               COALESCE(json_extract(params, '$.llm.cost_usd'), 0), 0, id,
               'migrated: ' || COALESCE(json_extract(params, '$.llm.calls'), 1) || ' request(s)'
        FROM candidates WHERE json_valid(params)
          AND json_type(params, '$.llm') = 'object'""",
    """UPDATE candidates SET cost_usd = MAX(0, cost_usd
        - COALESCE(json_extract(params, '$.llm.cost_usd'), 0))
        WHERE cost_usd IS NOT NULL AND json_valid(params)
          AND json_type(params, '$.llm') = 'object'""",
    # v5: slot time a row's jobs held beyond its own result: a hold-out follow-up job,
    # attempts that were lost or interrupted (spent, and counted, though they measured
    # nothing)
    "ALTER TABLE candidates ADD COLUMN extra_slot_s REAL",
    # v6: each driver session (`ratchet run`, `wait`): the study's wall time is theirs,
    # not the idle time between them
    """CREATE TABLE IF NOT EXISTS sessions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        command TEXT NOT NULL,
        started_at REAL NOT NULL,
        seen_at REAL NOT NULL,
        ended_at REAL)""",
    # v7 to v13, one statement each: each row's revision, the ledger's change counter when
    # it was last written (by the triggers below, whoever writes): a view that keeps rows
    # in memory (`ratchet serve`) reads only the rows written since it last looked
    "ALTER TABLE candidates ADD COLUMN rev INTEGER NOT NULL DEFAULT 0",
    "CREATE INDEX IF NOT EXISTS candidates_rev ON candidates (rev)",
    """CREATE TRIGGER IF NOT EXISTS candidates_rev_insert AFTER INSERT ON candidates BEGIN
        UPDATE candidates SET rev = (SELECT MAX(rev) FROM candidates) + 1
        WHERE id = NEW.id; END""",
    """CREATE TRIGGER IF NOT EXISTS candidates_rev_update AFTER UPDATE ON candidates
        WHEN NEW.rev = OLD.rev BEGIN
        UPDATE candidates SET rev = (SELECT MAX(rev) FROM candidates) + 1
        WHERE id = NEW.id; END""",
    # the rows of an older ledger, numbered once in order
    "UPDATE candidates SET rev = seq + 1 + (SELECT -MIN(seq) FROM candidates) WHERE rev = 0",
    # the common filters of the views (status, kind) and a page in order
    "CREATE INDEX IF NOT EXISTS candidates_status ON candidates (status, kind)",
)
SCHEMA_VERSION = len(MIGRATIONS)


def _known(keys: Any) -> None:
    unknown = set(keys) - META_KEYS
    if unknown:
        raise KeyError(f"not keys of the study's record (core.candidate.StudyRecord): "
                       f"{sorted(unknown)}")


class LedgerError(Exception):
    """The ledger cannot be used by this ratchet (one line naming the cause)."""




class Ledger:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # durable before we act on it
        self.db.executescript(SCHEMA)
        self._migrate()

    @classmethod
    def readonly(cls, path: Path) -> Ledger:
        """The ledger opened for reading only (`ratchet serve`): SQLite's `mode=ro` and
        `query_only`, no schema, no migration, so nothing this connection does can change
        the study. An older ledger reads as is (its missing columns take their defaults);
        one from a newer ratchet is refused, as for writing."""
        if not path.is_file():
            raise LedgerError(f"{path}: no ledger here (run `ratchet run` first)")
        self = cls.__new__(cls)
        self.path = path
        self.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30,
                                  isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA query_only = ON")
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            self.db.close()
            raise LedgerError(f"{path} was written by a newer ratchet (schema {version}, this "
                              f"one reads up to {SCHEMA_VERSION}); upgrade ratchet to view it")
        return self

    def _migrate(self) -> None:
        """Bring an older ledger's schema to SCHEMA_VERSION (PRAGMA user_version).

        A fresh ledger gets SCHEMA (the v0 tables) and then every migration, so old and
        new ledgers always end up with the same columns.
        """
        with self.transaction():
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise LedgerError(
                    f"{self.path} was written by a newer ratchet (schema {version}, this one "
                    f"reads up to {SCHEMA_VERSION}); upgrade ratchet to resume this study")
            for step in MIGRATIONS[version:]:
                self.db.execute(step)
            if version != SCHEMA_VERSION:
                self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self.db.close()

    # -- meta ---------------------------------------------------------------------------

    def study(self) -> StudyRecord:
        """The study's record (core.candidate.StudyRecord): the meta table, one query."""
        return StudyRecord.from_meta({row["key"]: json.loads(row["value"]) for row in
                                      self.db.execute("SELECT key, value FROM meta")})

    def get(self, key: str, default: Any = None) -> Any:
        """One key of the study's record (META_KEYS), as stored."""
        _known([key])
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row["value"]) if row else default

    def set(self, **values: Any) -> None:
        """Write keys of the study's record (META_KEYS alone), in one transaction."""
        _known(values)
        self.put_back(values)

    def stored(self, keys: list[str]) -> dict[str, Any]:
        """{key: value} of these meta keys as the table holds them, whatever they are (a
        key planted behind the driver's back included): the integrity guard's reading."""
        found = {row["key"]: json.loads(row["value"]) for row in self.db.execute(
            f"SELECT key, value FROM meta WHERE key IN ({', '.join('?' * len(keys))})", keys)}
        return {key: found.get(key) for key in keys}

    def put_back(self, values: dict[str, Any]) -> None:
        """Write meta keys as the integrity guard took them (whatever keys the ledger
        held, an older ratchet's included): a restore, not a new fact."""
        with self.transaction():
            for key, value in values.items():
                self.db.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, json.dumps(value)),
                )

    def incumbent(self) -> Incumbent:
        return self.study().incumbent

    @staticmethod
    def incumbent_meta(record: Incumbent) -> dict[str, Any]:
        """The meta keys that store `record` (pass to `set`)."""
        return {k: getattr(record, f) for f, k in INCUMBENT_KEYS.items()}

    # -- candidates -----------------------------------------------------------------------

    def transaction(self):
        return _Transaction(self.db)

    def new_candidate(
        self, round: int, kind: Kind = Kind.CANDIDATE, status: Status = Status.PROPOSED,
        calls: list[int] | None = None, **fields: Any
    ) -> Candidate:
        """A new row; `calls`: the proposer calls (spend.py) that made it, which are
        its from now on, in the same transaction."""
        with self.transaction():
            row = self.db.execute("SELECT COALESCE(MAX(seq), -1) + 1 AS n FROM candidates")
            seq = max(0, row.fetchone()["n"])
            cand = Candidate(id=f"c{seq:04d}", seq=seq, round=round, kind=kind,
                             status=status, **fields)
            data = _to_row(cand)
            cols = ", ".join(data)
            marks = ", ".join("?" for _ in data)
            self.db.execute(f"INSERT INTO candidates ({cols}) VALUES ({marks})",
                            tuple(data.values()))
            self._event(cand.id, status, {"description": cand.description})
            if calls:
                self.link_calls(calls, cand.id)
        return cand

    # -- spend: proposer calls and driver sessions ------------------------------------------

    def link_calls(self, ids: list[int], cand_id: str | None, fate: str | None = None) -> None:
        """The calls `ids` made `cand_id` (or, with cand_id None, came to `fate`)."""
        if not ids:
            return
        marks = ", ".join("?" * len(ids))
        with self.transaction():
            self.db.execute(f"UPDATE calls SET candidate = COALESCE(?, candidate), "
                            f"fate = COALESCE(?, fate) WHERE id IN ({marks})",
                            (cand_id, fate, *ids))

    def calls(self, candidate: str | None = None) -> list[sqlite3.Row]:
        """Every proposer call, in order; those made for `candidate` only, when given."""
        if candidate is not None:
            return list(self.db.execute("SELECT * FROM calls WHERE candidate = ? ORDER BY id",
                                        (candidate,)))
        return list(self.db.execute("SELECT * FROM calls ORDER BY id"))

    def start_session(self, command: str) -> int:
        now = time.time()
        with self.transaction():
            cur = self.db.execute("INSERT INTO sessions (command, started_at, seen_at) "
                                  "VALUES (?, ?, ?)", (command, now, now))
        return int(cur.lastrowid or 0)

    def see_session(self, session: int, ended: bool = False) -> None:
        """The session is alive now (or has ended): the end of its wall time so far."""
        now = time.time()
        with self.transaction():
            self.db.execute("UPDATE sessions SET seen_at = ?, ended_at = CASE WHEN ? THEN ? "
                            "ELSE ended_at END WHERE id = ?", (now, ended, now, session))

    def sessions(self) -> list[tuple[float, float]]:
        """(start, last seen) of every driver session, in order."""
        return [(row["started_at"], row["seen_at"]) for row in self.db.execute(
            "SELECT started_at, seen_at FROM sessions ORDER BY id")]

    def new_confirmation(self, cand: Candidate, commit: str | None, description: str,
                         parent: str | None) -> Candidate:
        """One side of a confirmation pair of `cand`: a row of its own (id r0001, r0002,
        ...), outside the candidates' numbering, so ids, seeds and the tuner's asks stay
        what they would be without it (its seq counts down from -1)."""
        with self.transaction():
            row = self.db.execute("SELECT COALESCE(MIN(seq), 0) - 1 AS n FROM candidates "
                                  "WHERE seq < 0")
            seq = row.fetchone()["n"]
            made = Candidate(id=f"r{-seq:04d}", seq=seq, round=cand.round, kind=Kind.CONFIRM,
                             status=Status.COMMITTED, parent=parent, commit_sha=commit,
                             description=description, confirms=cand.id)
            data = _to_row(made)
            self.db.execute(f"INSERT INTO candidates ({', '.join(data)}) VALUES "
                            f"({', '.join('?' for _ in data)})", tuple(data.values()))
            self._event(made.id, Status.COMMITTED, {"description": description})
        return made

    # -- transitions: what may happen to a row, each with the columns it writes ---------
    # (after Optuna's storage: named steps with typed arguments; the loop, the jobs and the
    # integrity guard write a row through these alone, tests/test_ledger_transitions.py)

    def place(self, cand_id: str, job_id: str, at: float) -> None:
        """Its job's id is recorded before the job is placed (write-ahead): submitted."""
        self._write(cand_id, "submitted", status=Status.SUBMITTED, job_id=job_id,
                    submitted_at=at)

    def rename_job(self, cand_id: str, job_id: str, at: float) -> None:
        """A submitted row whose job goes again under a new id (a driver killed between
        counting a loss and recording the new id): the id, its status as it is."""
        self._write(cand_id, "submitted", job_id=job_id, submitted_at=at)

    def requeue(self, cand_id: str, attempt: int) -> None:
        """An interrupted row goes back to committed, its attempt counted, in one write (a
        driver killed before the submit must not count it twice)."""
        self._write(cand_id, None, attempt=attempt, status=Status.COMMITTED)

    def retry(self, cand_id: str, attempt: int, event: str) -> None:
        """A lost or shut-out job runs again: its attempt counted (`event` says why)."""
        self._write(cand_id, event, attempt=attempt)

    def interrupt(self, cand_id: str, reasons: str, extra_slot_s: float,
                  cost_usd: float) -> None:
        """Its job ended with no result (a stop, an unreachable machine): it runs again on
        resume; what the attempt held of its slot is counted."""
        self._write(cand_id, "interrupted", status=Status.INTERRUPTED, reasons=reasons,
                    extra_slot_s=extra_slot_s, cost_usd=cost_usd)

    def lose(self, cand_id: str, reasons: str | None, result: dict[str, Any]) -> None:
        """Its job was lost for good: finished, with the worker-less result."""
        self._write(cand_id, "lost", status=Status.FINISHED, reasons=reasons, result=result)

    def finish(self, cand_id: str, *, metric: float | None, samples: list[float] | None,
               extra: dict[str, Any] | None, holdout: float | None,
               phases: list[dict[str, Any]], failed_stage: str | None, slot: str | None,
               queue_s: float | None, run_s: float, cost_usd: float, finished_at: float,
               reasons: str | None, result: dict[str, Any]) -> None:
        """Its job reported: finished, with what it measured, awaiting the judge."""
        self._write(cand_id, "finished", status=Status.FINISHED, metric=metric,
                    samples=samples, extra=extra, holdout=holdout, phases=phases,
                    failed_stage=failed_stage, slot=slot, queue_s=queue_s, run_s=run_s,
                    cost_usd=cost_usd, finished_at=finished_at, reasons=reasons,
                    result=result)

    def record_holdout(self, cand_id: str, holdout: float | None, extra_slot_s: float,
                       cost_usd: float) -> None:
        """Its hold-out follow-up job ran: the hold-out, and the slot time it held."""
        self._write(cand_id, "holdout", holdout=holdout, extra_slot_s=extra_slot_s,
                    cost_usd=cost_usd)

    def judge(self, cand_id: str, verdict: Verdict, at: float) -> None:
        """The judge's verdict: its status, reasons, numbers and reason code."""
        self._write(cand_id, f"judged:{verdict.status}", status=verdict.status,
                    reasons="; ".join(r for r in verdict.reasons if r) or None,
                    gain=verdict.gain, margin=verdict.margin, noise=verdict.noise,
                    code=verdict.code, judged_at=at)

    def reject(self, cand_id: str, reasons: str, at: float,
               commit_sha: str | None = None) -> None:
        """Rejected for breaking a rule (tampering); `commit_sha`: the commit its row is
        put back to, where the row's own was rewritten."""
        restore = {"commit_sha": commit_sha} if commit_sha else {}
        self._write(cand_id, "judged:rejected", status=Status.REJECTED, reasons=reasons,
                    judged_at=at, **restore)

    def cancel(self, cand_id: str, reasons: str, at: float, code: Reason | None = None,
               event: str = "cancelled") -> None:
        """Cancelled: by the user, or withdrawn by the driver (`code` says which)."""
        fields: dict[str, Any] = {"code": code} if code is not None else {}
        self._write(cand_id, event, status=Status.CANCELLED, reasons=reasons,
                    **fields, judged_at=at)

    def restore(self, cand_id: str, *, kind: Kind, commit_sha: str | None,
                parent: str | None, round: int, proposer: str | None) -> None:
        """The integrity guard puts back what a row is (rewritten behind the driver)."""
        self._write(cand_id, None, kind=kind, commit_sha=commit_sha, parent=parent,
                    round=round, proposer=proposer)

    def restore_verdict(self, cand_id: str, status: Status, metric: float | None) -> None:
        """The integrity guard puts back a verdict changed behind the driver's back."""
        self._write(cand_id, None, status=status, metric=metric)

    def update(self, cand_id: str, event: str | None = None, **fields: Any) -> None:
        """Any columns, as they are given: for tests and benches that set a row up. The
        study writes through the transitions above."""
        self._write(cand_id, event, **fields)

    def _write(self, cand_id: str, event: str | None, **fields: Any) -> None:
        unknown = set(fields) - COLUMNS
        if unknown:  # a column list is built from these names: only the table's own
            raise ValueError(f"not columns of a candidate row: {sorted(unknown)}")
        data = _to_row_partial(fields)
        with self.transaction():
            sets = ", ".join(f"{k} = ?" for k in data)
            self.db.execute(f"UPDATE candidates SET {sets} WHERE id = ?",
                            (*data.values(), cand_id))
            if event:
                self._event(cand_id, event, {k: v for k, v in fields.items()
                                             if k in ("status", "job_id", "reasons", "metric")})

    def candidate(self, cand_id: str) -> Candidate | None:
        row = self.db.execute("SELECT * FROM candidates WHERE id = ?", (cand_id,)).fetchone()
        return _from_row(row) if row else None


    def row(self, cand_id: str) -> Candidate:
        """A candidate the caller knows was recorded (a missing one is a bug, not a user
        error): `candidate` without the None."""
        cand = self.candidate(cand_id)
        if cand is None:
            raise LookupError(f"{cand_id}: not in the ledger")
        return cand

    def rows(self, cand_ids: list[str]) -> list[Candidate]:
        """The rows of `cand_ids` that are recorded, in their order: one query where a
        poll of every job in flight would make one each, every tick."""
        found: dict[str, Candidate] = {}
        for r in self._of_ids("*", cand_ids):
            cand = _from_row(r)
            found[cand.id] = cand
        return [found[i] for i in cand_ids if i in found]

    def placed(self, cand_ids: list[str]) -> list[tuple[str, str, str, float | None]]:
        """(id, job id, description, submitted_at) of the rows among `cand_ids` whose job
        is placed (status submitted), in their order. A poll reads this many times a
        second: four columns, not every row decoded whole (its result above all)."""
        found: dict[str, tuple[str, str, str, float | None]] = {}
        for r in self._of_ids("id, job_id, description, submitted_at", cand_ids,
                              "status = ? AND job_id IS NOT NULL AND job_id != ''",
                              [Status.SUBMITTED.value]):
            found[r["id"]] = (r["id"], r["job_id"],
                              _clean("description", r["description"]) or "",
                              r["submitted_at"])
        return [found[i] for i in cand_ids if i in found]

    def _of_ids(self, columns: str, cand_ids: list[str], where: str = "",
                args: list[Any] | None = None) -> Iterator[sqlite3.Row]:
        """`columns` of the rows among `cand_ids` (and `where`), in any order: one query
        per 500 ids, under SQLite's bound-parameter limit."""
        for start in range(0, len(cand_ids), 500):
            chunk = cand_ids[start:start + 500]
            yield from self.db.execute(
                f"SELECT {columns} FROM candidates WHERE {where + ' AND ' if where else ''}"
                f"id IN ({', '.join('?' * len(chunk))})", [*(args or []), *chunk])

    def confirming(self, cand_id: str, status: str | None = None) -> list[Candidate]:
        """The confirmation rows (fresh pairs' re-measures) of one candidate, in order."""
        where, args = _where(confirmations=True, status=status)
        return [_from_row(r) for r in self.db.execute(
            f"SELECT * FROM candidates WHERE confirms = ? AND {where} ORDER BY seq",
            [cand_id, *args])]

    def candidates(self, round: int | None = None, status: str | None = None,
                   confirmations: bool = False) -> list[Candidate]:
        """Candidates in order; a confirmation's re-measures (kind confirm) only when asked
        for: they belong to their candidate, and views list them with it."""
        where, args = _where(confirmations=confirmations, round=round, status=status)
        return [_from_row(r) for r in self.db.execute(
            f"SELECT * FROM candidates WHERE {where} ORDER BY seq", args)]

    def revision(self) -> int:
        """The ledger's change counter: the highest row revision (0 for a ledger older
        than schema 7, which has none)."""
        try:
            return int(self.db.execute("SELECT COALESCE(MAX(rev), 0) FROM candidates"
                                       ).fetchone()[0])
        except sqlite3.OperationalError:  # no rev column: an older ledger, read-only
            return 0

    def rows_since(self, rev: int | None) -> list[Candidate]:
        """Every row (confirmations too) written after revision `rev` (all with None), by
        seq, for views that keep the study in memory. Their `result` holds only its
        machine fingerprint: the rest of it (phases, samples, extra again) is what makes
        decoding 10,000 rows slow, and the views read it from the row's own columns."""
        cols = [r[1] for r in self.db.execute("PRAGMA table_info(candidates)")
                if r[1] != "result"]
        query = (f"SELECT {', '.join(cols)}, json_extract(result, '$.fingerprint') AS "
                 "fingerprint FROM candidates")
        args: tuple[object, ...] = ()
        if rev is not None:
            query += " WHERE rev > ?"
            args = (rev,)
        out = []
        for row in self.db.execute(query + " ORDER BY seq", args):
            data = dict(row)
            fingerprint = data.pop("fingerprint")
            data["result"] = (json.dumps({"fingerprint": json.loads(fingerprint)})
                              if fingerprint else None)
            out.append(_from_row(data))
        return out

    def evaluations(self, exclude_confirming: AbstractSet[str] = frozenset()
                    ) -> dict[str, list[float]]:
        """Every judged evaluation of every commit, by commit: its own run, the baseline's
        A/A floor, co-run references, confirmation pairs. One pooled estimate per commit
        is made of these (stats.estimate). A crash, a rejection or a run stopped early
        measured nothing to trust; the pairs of candidates being judged now
        (`exclude_confirming`) join through their confirmation.

        Four columns of the rows that count, in SQL: read on every view, it must not
        decode every row's JSON."""
        out: dict[str, list[float]] = {}
        # each commit's list in the order measured: its own runs first (by seq), then its
        # confirmation pairs in the order made (their seq counts down from -1). The noise
        # pool leaves a commit's first value out (picked for looking good: judge
        # Confirmation._commit); by seq alone, a pair came first and the pick stayed in
        rows = self.db.execute(
            f"SELECT commit_sha, metric, confirms FROM candidates WHERE metric IS NOT NULL "
            f"AND commit_sha IS NOT NULL AND commit_sha != '' AND status IN (?, ?, ?) "
            f"AND NOT {_TRUTHY.format(path='$.stopped_early')} "
            f"ORDER BY kind = ?, CASE WHEN kind = ? THEN -seq ELSE seq END",
            (Status.KEEP.value, Status.DISCARD.value, Status.REFERENCE.value,
             Kind.CONFIRM.value, Kind.CONFIRM.value))
        for commit, metric, confirms in rows:
            if confirms is not None and confirms in exclude_confirming:
                continue
            out.setdefault(commit, []).append(metric)
        return out

    def reported_errors(self, metric: str) -> list[tuple[Any, Any, float]]:
        """(the result's extra, its samples, the metric) of every judged evaluation whose
        result may carry its own error (`<metric>_sem`, or two samples or more), by seq:
        what views.reported_errors reads, without decoding the rows that have neither."""
        sem = f'$.extra."{metric}_sem"'
        maybe = ("(json_type(result, ?) IN ('integer', 'real') "
                 "OR json_array_length(result, '$.samples') >= 2)")
        args: list[object] = [sem]
        if '"' in metric:  # not a path SQLite can take: every row, decoded (never seen)
            maybe, args = "1", []
        rows = self.db.execute(
            "SELECT json_extract(result, '$.extra'), json_extract(result, '$.samples'), "
            "metric FROM candidates WHERE result IS NOT NULL AND json_valid(result) AND "
            f"metric IS NOT NULL AND status IN (?, ?, ?) AND {maybe} ORDER BY seq",
            (Status.KEEP.value, Status.DISCARD.value, Status.REFERENCE.value, *args))
        return [(json.loads(extra) if isinstance(extra, str) else extra,
                 json.loads(samples) if isinstance(samples, str) else samples, value)
                for extra, samples, value in rows]

    def sandboxes(self) -> dict[str, int]:
        """{sandbox: jobs}: what each job that reported actually ran under (its worker's
        own word, in its result), which may differ from what this machine gives now."""
        rows = self.db.execute(
            "SELECT json_extract(result, '$.sandbox') AS s, COUNT(*) FROM candidates "
            "WHERE result IS NOT NULL AND json_valid(result) AND s IS NOT NULL "
            "GROUP BY s ORDER BY COUNT(*) DESC, s")
        return {str(name): int(n) for name, n in rows}

    def columns(self, names: tuple[str, ...]) -> dict[str, tuple]:
        """{id: (the row's `names` columns)} of every row but the confirmations', read as
        stored, without decoding each row (the guard takes them before and after each
        round). Only columns no sanitising touches (not description, reasons)."""
        assert not set(names) & {*UNTRUSTED_TEXT, *JSON_COLUMNS}, names
        where, args = _where()
        rows = self.db.execute(f"SELECT id, {', '.join(names)} FROM candidates WHERE "
                               f"{where} ORDER BY seq", args)
        return {row[0]: tuple(row[1:]) for row in rows}

    def verdicts(self) -> dict[str, tuple[str, float | None]]:
        """{id: (status, metric)} of every judged candidate: two columns, read without
        decoding every candidate's result (the guard takes them before and after rounds)."""
        marks = ", ".join("?" * len(VERDICTS))
        rows = self.db.execute(
            f"SELECT id, status, metric FROM candidates WHERE status IN ({marks})", VERDICTS)
        return {row["id"]: (row["status"], row["metric"]) for row in rows}

    def status_counts(self, confirmations: bool = True) -> dict[str, int]:
        """{status: rows}; without the confirmation rows when `confirmations` is False
        (the count `status` and the views show: candidates, the baseline, co-runs)."""
        where = "" if confirmations else "WHERE kind != ?"
        args = () if confirmations else (Kind.CONFIRM.value,)
        rows = self.db.execute(f"SELECT status, COUNT(*) AS n FROM candidates {where} "
                               "GROUP BY status", args)
        return {row["status"]: row["n"] for row in rows}

    def proposer_counts(self) -> dict[str, dict[str, int]]:
        """{proposer: {status: candidates}}: who proposed what and how it fared (`status`
        names an agent's MCP submissions `mcp`, a person's `submit`), in SQL."""
        rows = self.db.execute("SELECT COALESCE(proposer, '') AS proposer, status, "
                               "COUNT(*) AS n FROM candidates WHERE kind = ? "
                               "GROUP BY proposer, status ORDER BY proposer, status",
                               (Kind.CANDIDATE.value,))
        out: dict[str, dict[str, int]] = {}
        for row in rows:
            out.setdefault(row["proposer"] or "(unknown)", {})[row["status"]] = row["n"]
        return out

    def count(self, kind: str | None = None, judged: bool = False,
              confirmations: bool = False) -> int:
        """How many rows (of `kind`; with a verdict only, when `judged`)."""
        where, args = _where(confirmations=confirmations, kind=kind, judged=judged)
        return int(self.db.execute(f"SELECT COUNT(*) FROM candidates WHERE {where}",
                                   args).fetchone()[0])

    def made(self) -> int:
        """budget.made in SQL: candidates, a change withdrawn from beside a confirmation
        not counted twice."""
        return int(self.db.execute(
            "SELECT COUNT(*) FROM candidates WHERE kind = ? AND code IS NOT ?",
            (Kind.CANDIDATE.value, Reason.WITHDRAWN.value)).fetchone()[0])

    def rounds_done(self) -> int:
        """views.rounds_done in SQL: the ledger's counter points at the next round to run,
        which counts as run once a row of it exists."""
        current = self.study().round
        if not current:
            return 0
        there = self.db.execute("SELECT 1 FROM candidates WHERE round = ? AND kind != ? "
                                "LIMIT 1", (current, Kind.CONFIRM.value)).fetchone()
        return current if there else current - 1

    def ids(self, status: str | None = None) -> list[str]:
        """Ids of the rows in `status` (no confirmation rows), by seq."""
        return [r[0] for r in self.db.execute(
            "SELECT id FROM candidates WHERE kind != ? AND status = ? ORDER BY seq",
            (Kind.CONFIRM.value, status))]

    def page(self, offset: int = 0, limit: int | None = None, status: str | None = None,
             round: int | None = None, text: str | None = None, order: str = "seq",
             descending: bool = False) -> tuple[list[Candidate], int]:
        """One page of the candidates (no confirmation rows) under filters, sorted in SQL,
        and how many rows the filters let through: what a paged table or `log --last`
        reads, never the whole study. `order`: a column of PAGE_ORDERS."""
        if order not in PAGE_ORDERS:
            raise ValueError(f"cannot sort by {order!r}")
        where, args = _where(status=status, round=round, text=text)
        total = int(self.db.execute(f"SELECT COUNT(*) FROM candidates WHERE {where}",
                                    args).fetchone()[0])
        way = "DESC" if descending else "ASC"
        # a missing value sorts last either way, then by seq for a stable page
        # seq is never missing: ordered by it alone, SQLite walks its index and stops at
        # the page (`log --last 50` reads 50 rows, not 10,000 sorted)
        missing_last = "" if order == "seq" else f"{order} IS NULL, {order} {way}, "
        query = f"SELECT * FROM candidates WHERE {where} ORDER BY {missing_last}seq {way}"
        if limit is not None:
            query += " LIMIT ? OFFSET ?"
            args += [limit, offset]
        return [_from_row(r) for r in self.db.execute(query, args)], total

    def last(self, n: int, status: str | None = None, round: int | None = None
             ) -> list[Candidate]:
        """The last `n` candidates (by seq) under the filters, in order."""
        rows, _ = self.page(0, n, status=status, round=round, descending=True)
        return rows[::-1]

    def spans(self) -> list[tuple[float, float]]:
        """(placed, finished) of every job that finished (study_wall's jobs)."""
        return [(a, b) for a, b in self.db.execute(
            "SELECT submitted_at, finished_at FROM candidates WHERE submitted_at IS NOT "
            "NULL AND finished_at IS NOT NULL")]

    def ran(self) -> list[Ran]:
        """What `throughput` reads of every row that ran, in SQL (slot time summed over
        the phases' JSON by SQLite)."""
        return [Ran(a, b, s, k == Kind.CONFIRM.value) for a, b, s, k in self.db.execute(
            f"SELECT submitted_at, finished_at, {SLOT_S}, kind FROM candidates "
            "WHERE run_s IS NOT NULL AND submitted_at IS NOT NULL AND finished_at IS NOT "
            "NULL ORDER BY seq")]

    def throughput(self, slots: int) -> Throughput:
        """throughput() of the whole ledger, from SQL."""
        return throughput_of(self.ran(), slots, self.sessions())

    def find(self, ref: str) -> Candidate | None:
        """By id (c0003), job id, or commit prefix (>= 4 hex digits)."""
        cand = self.candidate(ref)
        if cand:
            return cand
        row = self.db.execute("SELECT * FROM candidates WHERE job_id = ?", (ref,)).fetchone()
        if row:
            return _from_row(row)
        if len(ref) >= 4:
            rows = self.db.execute(
                "SELECT * FROM candidates WHERE commit_sha LIKE ? ORDER BY seq DESC", (ref + "%",)
            ).fetchall()
            if rows:
                return _from_row(rows[0])
        return None

    def events(self, cand_id: str | None = None) -> Iterator[sqlite3.Row]:
        if cand_id:
            yield from self.db.execute("SELECT * FROM events WHERE candidate = ? ORDER BY id",
                                       (cand_id,))
        else:
            yield from self.db.execute("SELECT * FROM events ORDER BY id")

    def event(self, kind: str, cand_id: str | None = None, **data: Any) -> None:
        with self.transaction():
            self._event(cand_id, kind, data)

    def _event(self, cand_id: str | None, kind: str, data: dict[str, Any]) -> None:
        self.db.execute("INSERT INTO events (t, candidate, kind, data) VALUES (?, ?, ?, ?)",
                        (time.time(), cand_id, kind, json.dumps(data, default=str)))

    # -- ideas ----------------------------------------------------------------------------

    def add_idea(self, text: str, source: str = "cli") -> bool:
        text = text.strip()
        if not text:
            return False
        with self.transaction():
            cur = self.db.execute(
                "INSERT OR IGNORE INTO ideas (text, source, created_at) VALUES (?, ?, ?)",
                (text, source, time.time()),
            )
        return cur.rowcount > 0

    def pending_ideas(self) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM ideas WHERE status = 'pending' ORDER BY id"))

    def mark_idea(self, text: str, candidate: str, outcome: str | None = None) -> None:
        with self.transaction():
            self.db.execute(
                "UPDATE ideas SET status = 'tried', candidate = ?, outcome = COALESCE(?, outcome)"
                " WHERE text = ?",
                (candidate, outcome, text),
            )

    def ideas(self) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM ideas ORDER BY id"))


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.outer = False

    def __enter__(self):
        self.outer = not self.db.in_transaction
        if self.outer:
            self.db.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.outer:
            return
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def _to_row(cand: Candidate) -> dict[str, Any]:
    return _to_row_partial(dict(cand.__dict__))


def _to_row_partial(fields: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (json.dumps(v, default=str) if k in JSON_COLUMNS and v is not None
            else _clean(k, v))
        for k, v in fields.items()
    }


def _clean(key: str, value: Any) -> Any:
    """Words a proposer or a candidate wrote lose escapes and control characters on the
    way in and out (a row written behind the driver's back included): what the terminal,
    results.tsv, the report and prompts show comes from here."""
    if not isinstance(value, str) or key not in UNTRUSTED_TEXT:
        return value
    return sanitize.line(value) if key == "description" else sanitize.text(value)



SEARCHED = ("id", "description", "reasons", "idea", "commit_sha", "status")  # by page(text=)


def _where(confirmations: bool = False, kind: str | None = None, judged: bool = False,
           status: str | None = None, round: int | None = None, text: str | None = None
           ) -> tuple[str, list[object]]:
    """The WHERE clause (and its arguments) of the row filters `candidates`, `count` and
    `page` share: no confirmation rows unless asked; a kind, a verdict, a status, a round;
    `text` anywhere in the searched columns (LIKE, its wildcards taken literally)."""
    terms, args = list[str](), list[object]()
    if not confirmations:
        terms.append("kind != ?")
        args.append(Kind.CONFIRM.value)
    if kind is not None:
        terms.append("kind = ?")
        args.append(kind)
    if judged:
        terms.append(f"status IN ({', '.join('?' * len(VERDICTS))})")
        args += [v.value for v in VERDICTS]
    if status is not None:
        terms.append("status = ?")
        args.append(status)
    if round is not None:
        terms.append("round = ?")
        args.append(round)
    if text:
        like = f"%{text.replace('!', '!!').replace('%', '!%').replace('_', '!_')}%"
        terms.append("(" + " OR ".join(f"{col} LIKE ? ESCAPE '!'" for col in SEARCHED) + ")")
        args += [like] * len(SEARCHED)
    return " AND ".join(terms) or "1=1", args


def _from_row(row: sqlite3.Row | dict[str, Any]) -> Candidate:
    data = {k: _clean(k, v) for k, v in dict(row).items()}
    for key in JSON_COLUMNS:
        if data.get(key) is not None:
            data[key] = json.loads(data[key])
    return Candidate(**data)


@dataclass
class Throughput:
    """How busy the slots were, and the most a study of these jobs could do."""

    slots: int
    jobs: int  # candidates that ran (have a run time)
    wall_s: float  # first job placed -> last job finished
    busy_s: float  # sum of the jobs' phase times (what held a slot / the accelerator)
    duty: float | None  # busy_s / (slots x wall_s): 1.0 = never an idle slot
    mean_run_s: float | None
    limit_per_hour: float | None  # slots x 3600 / mean run time: candidates/hour at duty 1
    per_hour: float | None  # what was achieved: jobs x 3600 / wall_s
    # the part of busy_s spent on confirmation pairs (kind confirm rows, when given)
    confirming_s: float = 0.0

    @property
    def confirming_share(self) -> float | None:
        """The share of the slots' time that confirmed would-be keeps."""
        if not self.wall_s or self.slots < 1:
            return None
        return round(self.confirming_s / (self.slots * self.wall_s), 4)

    @property
    def idle_share(self) -> float | None:
        """The share of the slots' time no job held them (1 - duty, never below 0)."""
        return None if self.duty is None else round(max(0.0, 1.0 - self.duty), 4)

    def shares_line(self) -> str:
        """Where the slots' time went, in one line (status, the end of a run)."""
        if self.duty is None:
            return ""
        return (f"slot time ({self.slots} slot{'s' * (self.slots != 1)}): "
                f"{self.duty - (self.confirming_share or 0.0):.0%} candidates, "
                f"{self.confirming_share or 0.0:.0%} confirming keeps, "
                f"{self.idle_share or 0.0:.0%} idle")


def slot_seconds(cand: Candidate) -> float:
    """The time a candidate's phases held its slot: builds on a CPU build slot excluded."""
    if not cand.phases:
        return cand.run_s or 0.0
    return sum(p.get("seconds") or 0.0 for p in cand.phases if not p.get("off_slot"))


def active_seconds(spans: list[tuple[float, float]]) -> float:
    """The time covered by the union of `spans` ((start, end) pairs): overlaps count
    once, the gaps between them not at all."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def study_wall(cands: list[Candidate], sessions: list[tuple[float, float]]) -> float:
    """The study's wall time: while a driver session ran or a job ran (a job placed by
    `ratchet submit` runs with no session), never the idle time between invocations."""
    jobs = [(c.submitted_at, c.finished_at) for c in cands
            if c.submitted_at is not None and c.finished_at is not None]
    return active_seconds([*jobs, *sessions])


class Ran(NamedTuple):
    """What throughput reads of one row that ran."""

    submitted_at: float
    finished_at: float
    slot_s: float  # slot_seconds of the row
    confirm: bool  # a confirmation pair's row


def throughput(cands: list[Candidate], slots: int,
               sessions: list[tuple[float, float]] | None = None) -> Throughput:
    """Duty cycle and the limit, from the ledger alone (no clock of the driver's).

    The wall time runs from the first job placed to the last finished, less the time no
    driver session and no job ran (a study resumed the next morning does not count the
    night); `sessions`: Ledger.sessions(). Without any (a ledger of an older ratchet),
    the whole span counts, as it did then. Ledger.throughput reads the same from SQL."""
    ran = [Ran(c.submitted_at, c.finished_at, slot_seconds(c), c.kind == Kind.CONFIRM)
           for c in cands if c.run_s is not None and c.submitted_at is not None
           and c.finished_at is not None]
    return throughput_of(ran, slots, sessions)


def throughput_of(ran: list[Ran], slots: int,
                  sessions: list[tuple[float, float]] | None = None) -> Throughput:
    if not ran or slots < 1:
        return Throughput(slots, 0, 0.0, 0.0, None, None, None, None)
    first = min(r.submitted_at for r in ran)
    last = max(r.finished_at for r in ran)
    jobs = [(r.submitted_at, r.finished_at) for r in ran]
    if sessions:
        wall = active_seconds([*jobs, *[(max(a, first), min(b, last)) for a, b in sessions
                                        if b > first and a < last]])
    else:
        wall = last - first
    busy = sum(r.slot_s for r in ran)
    confirming = sum(r.slot_s for r in ran if r.confirm)
    # candidates per hour and their mean time count the rows that are experiments (and
    # references), not the pairs that re-measure them
    own = [r for r in ran if not r.confirm] or ran
    mean = sum(r.slot_s for r in own) / len(own)
    return Throughput(
        slots=slots, jobs=len(own), wall_s=round(wall, 3), busy_s=round(busy, 3),
        duty=round(busy / (slots * wall), 4) if wall > 0 else None,
        mean_run_s=round(mean, 3),
        limit_per_hour=round(slots * 3600 / mean, 1) if mean > 0 else None,
        per_hour=round(len(own) * 3600 / wall, 1) if wall > 0 else None,
        confirming_s=round(confirming, 3))
