"""Proposer calls, recorded in the ledger's `calls` table as they happen (the Meter).

Each HTTP request an LLM proposer sends, retries included (the SDK's own and ours), and
each agent run, with its tokens, cost, seconds and outcome. A call is written by the
`Meter` the moment it ends, from the proposer's own thread, whatever becomes of its
proposal: the proposal's candidate is linked when it is recorded
(`Ledger.new_candidate(calls=...)`), and a proposal dropped (it conflicts with a moved
incumbent) or never used (the study stopped) keeps its calls, with no candidate: spent,
and counted as wasted (driver/spend.py sums them). A call under way is a `Flight`: when
a second Ctrl-C stops the study at once, nobody waits for its reply, and it is billed
`interrupted` with its time so far and what is known of its tokens.

A proposer (a plug-in) writes here and nowhere else of the ledger: this module stands on
core and the ledger alone, never on the driver.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from ratchet.core.candidate import Proposal
from ratchet.core.errors import HardStop
from ratchet.core.vocab import CallOutcome
from ratchet.store.ledger import Ledger

LEDGER_FILE = "ledger.db"


@dataclass
class Call:
    proposer: str
    outcome: CallOutcome
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    detail: str | None = None
    fate: str | None = None  # what became of it, when that is known as it is recorded
    t: float = field(default_factory=time.time)


INTERRUPTED_FATE = "interrupted: the study was stopped at once (Ctrl-C twice)"


@dataclass(eq=False)  # one flight is itself, whatever its figures
class Flight:
    """A proposer call under way (an HTTP request, an agent run): what it would be billed
    if the study stopped now. `bill(seconds)` gives its calls, `seconds` after it began;
    `cancel` ends it (an agent's sandbox), called once it is billed."""

    bill: Callable[[float], list[Call]]
    cancel: Callable[[], None] | None = None
    began: float = field(default_factory=time.monotonic)
    interrupted: bool = False


class Meter:
    """Writes proposer calls to the ledger of `state_dir` from any thread (its own
    connection, one writer at a time); `with Meter(state_dir) as meter:`.

    A call is recorded when it ends. One that may not end before the study does (a
    second Ctrl-C stops it at once, and nobody waits for a reply) is flown: `begin` it,
    `land` it when it ends; `interrupt_all` bills every flight still under way as
    interrupted, from whichever thread sees the stop, and later landings are not
    billed again."""

    _open: ClassVar[set[Meter]] = set()  # meters in use in this process
    _open_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, state_dir: Path) -> None:
        path = Path(state_dir) / LEDGER_FILE
        Ledger(path).close()  # made and migrated if it was not (a proposer used alone)
        self.path = path.resolve()
        self.db = sqlite3.connect(str(path), timeout=30, isolation_level=None,
                                  check_same_thread=False)
        self.db.execute("PRAGMA synchronous=FULL")
        self._lock = threading.Lock()
        self._flights: list[Flight] = []
        self.interrupted = False  # a hard stop was seen: no new flight may begin
        with Meter._open_lock:
            Meter._open.add(self)

    # -- calls in flight --------------------------------------------------------------------

    def begin(self, bill: Callable[[float], list[Call]],
              cancel: Callable[[], None] | None = None) -> Flight:
        """A call starts; HardStop if the study was stopped at once (it is not sent)."""
        flight = Flight(bill, cancel)
        with self._lock:
            if self.interrupted:
                raise HardStop("the study was stopped at once; no new proposer call")
            self._flights.append(flight)
        return flight

    def land(self, flight: Flight) -> bool:
        """The call ended: True if the caller records it now; False if it was billed as
        interrupted already (the caller records nothing, and gives up: HardStop)."""
        with self._lock:
            if flight in self._flights:
                self._flights.remove(flight)
            return not flight.interrupted

    def interrupt(self) -> list[int]:
        """Bill every flight as interrupted, now, and end them; no new one may begin."""
        with self._lock:  # a landing after this sees its flight interrupted: one bill each
            self.interrupted = True
            flights, self._flights = self._flights, []
            for flight in flights:
                flight.interrupted = True
        ids = []
        for flight in flights:
            for call in flight.bill(time.monotonic() - flight.began):
                ids.append(self.record(replace(call, fate=INTERRUPTED_FATE)))
            if flight.cancel is not None:
                with contextlib.suppress(Exception):  # ending it is best effort
                    flight.cancel()
        return ids

    def mark(self, ids: list[int], fate: str) -> None:
        """What became of calls that made no proposal (their proposal was given up)."""
        if ids:
            with self._lock:
                self.db.execute(f"UPDATE calls SET fate = COALESCE(fate, ?) WHERE id IN "
                                f"({', '.join('?' * len(ids))})", (fate, *ids))

    @classmethod
    def interrupt_all(cls, state_dir: Path) -> list[int]:
        """A hard stop: every meter of this study's ledger bills its flights (above)."""
        path = (Path(state_dir) / LEDGER_FILE).resolve()
        with cls._open_lock:
            meters = [m for m in cls._open if m.path == path]
        return [i for meter in meters for i in meter.interrupt()]

    def record(self, call: Call) -> int:
        """Write one call now; its row id (for the proposal's `calls`)."""
        row = asdict(call)
        row["outcome"] = str(call.outcome)
        row["cost_usd"] = round(float(call.cost_usd), 9)
        row["seconds"] = round(float(call.seconds), 3)
        cols = ", ".join(row)
        with self._lock:
            cur = self.db.execute(f"INSERT INTO calls ({cols}) VALUES "
                                  f"({', '.join('?' * len(row))})", tuple(row.values()))
        return int(cur.lastrowid or 0)

    def spent_usd(self) -> float:
        with self._lock:
            return float(self.db.execute(
                "SELECT COALESCE(SUM(cost_usd), 0) FROM calls").fetchone()[0])

    def close(self) -> None:
        with Meter._open_lock:
            Meter._open.discard(self)
        if self.interrupted:
            return  # a call abandoned at the stop may still write what ended before it
        with self._lock:
            self.db.close()

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gather(futures: list[Future[Proposal]], meter: Meter,
           poll_s: float = 0.1) -> list[Proposal]:
    """The futures' results in order (the first error re-raised), as a proposer waits for
    its parallel calls; HardStop once `meter` is interrupted: the calls in flight are
    billed as interrupted, and their replies are not waited for."""
    while True:
        _, pending = wait(futures, timeout=poll_s)
        if not pending:
            return [f.result() for f in futures]
        if meter.interrupted:
            # the calls of the proposals made already are billed; they are not used
            done = [f.result() for f in futures if f.done() and not f.cancelled()
                    and f.exception() is None]
            meter.mark([i for made in done for i in made.calls], INTERRUPTED_FATE)
            raise HardStop("the study was stopped at once; replies in flight not waited for")
