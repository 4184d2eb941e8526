"""The next round beside a confirmation (rounds mode, `search.beside`, on by default).

While a would-be keep of round R is confirmed, its pairs hold two slots (a look of one
pair) and the others would idle for the whole confirmation. Instead, round R+1 is asked
for at once, proposed on the would-be keep (the incumbent it will run on if it is kept),
and as many of its candidates as the free slots hold start beside the pairs. When the
verdict comes:
- kept: they run on as round R+1, and the round is topped up to K with the rest of the
  reply (asked for more if the reply was short), so a study makes rounds x K candidates
  whatever the confirmations;
- not kept: they were made on a commit that is not the incumbent. They are withdrawn
  (status cancelled, reason code `withdrawn`: never blamed, their calls and compute
  billed), and their changes are re-based onto the incumbent and recorded again with the
  rest, so round R+1 still has K candidates; one that conflicts there is dropped, billed.

Every write made while the pairs run is the driver's own and is expected by the pairs'
tamper check (`meanwhile` returns it), and the candidates started join `loop.in_flight`,
so a change to trusted state while they run is blamed on all who ran. After the verdict,
the check goes on from the state the pairs left (`loop.after_pairs`) plus the verdict's
writes and the round's new rows: what the next round trusts.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from ratchet.driver import judge
from ratchet.driver.candidate import Proposal
from ratchet.driver.ledger import Candidate
from ratchet.driver.settle import OPEN_STATES
from ratchet.job.jobspec import JobResult
from ratchet.vocab import Kind, Status

if TYPE_CHECKING:
    from ratchet.driver.rounds import Rounds


class Beside:
    """Round R+1 started beside round R's confirmation (see the module's docstring)."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds, self.loop = rounds, rounds.loop
        self.confirming: Candidate | None = None  # the would-be keep whose pairs run
        self.round_no = 0  # the round started beside it
        self.key: tuple | None = None  # its request (rounds.propose takes it if unused)
        self.held: list[Proposal] = []  # the reply's proposals no slot took yet
        self.base = ""  # the commit they were made on (the would-be keep's)

    @staticmethod
    def wanted(rounds: Rounds) -> bool:
        """On for rounds whose proposer may work while jobs run, not speculating (ahead
        already asks round R+1 while R runs), with slots beside a pair (K >= 3)."""
        loop = rounds.loop
        return (loop.config.search.beside and not rounds.ahead and loop.parallel >= 3
                and loop.proposals.proposer.contained)

    def install(self) -> None:
        self.loop.on_confirm = self.speculate
        self.loop.meanwhile = self.meanwhile

    def speculate(self, cand: Candidate) -> None:
        """A would-be keep goes into confirmation: round R+1 is asked for on it now."""
        loop, led = self.loop, self.loop.ledger
        self.confirming, self.held, self.key = cand, [], None
        self.round_no = led.get("round") + 1
        self.base = cand.commit_sha or ""
        if (self.round_no > self.rounds.target or loop.stop.soft or not self.base
                or led.candidates(round=self.round_no)
                or self.rounds.over_budget(self.round_no, stop=False)):
            return  # nothing to start (or, resumed, started already)
        k = self.rounds.slots_for_proposals()
        if k <= 0:
            return
        # the view round R+1 would have after the keep: round R with its verdicts as
        # they will be then, so it is proposed as it would be after the verdict
        history = [self.as_if_kept(c, cand) if c.round == cand.round and not c.is_judged
                   else c for c in led.candidates()]
        ctx = loop.proposals.context(self.round_no, self.base, history, cand.metric)
        self.key = ("round", self.round_no, k)
        loop.proposals.ask_ahead(self.key, self.base, k, ctx)

    def as_if_kept(self, row: Candidate, keep: Candidate) -> Candidate:
        """A finished row of the round being judged, with the verdict it gets when `keep`
        is kept: keep for it; for a reference, reference; a result that forces one (a
        crash, a rule broken, no metric) that one; else discard (screened out, or beaten)."""
        if row.id == keep.id:
            return replace(row, status=Status.KEEP)
        if row.result is None:
            return replace(row, status=Status.CRASH)
        result = JobResult.from_json(json.dumps(row.result))
        if Kind(row.kind).is_reference:  # as judge.judge_group judges them
            status = Status.CRASH if judge.outcome_status(result) is not None else (
                Status.KEEP if row.kind == Kind.BASELINE else Status.REFERENCE)
        else:
            forced = judge.outcome_status(result) or judge.not_measured(self.loop.config,
                                                                        result)
            status = Status(forced.status) if forced is not None else Status.DISCARD
        return replace(row, status=status)

    def meanwhile(self) -> dict | None:
        """While the pairs run: once the reply is in, the free slots take its first
        proposals as round R+1's candidates. Returns the trusted writes made."""
        loop, led = self.loop, self.loop.ledger
        if self.confirming is None or self.key is None or loop.stop.soft:
            return None
        pairs = sum(1 for c in led.candidates(confirmations=True)
                    if c.confirms == self.confirming.id and c.status == Status.SUBMITTED)
        free = loop.parallel - pairs - len(loop.jobs.poll(loop.in_flight))
        if free <= 0 or not pairs:
            return None
        ahead = loop.proposals.take_done(self.key)
        if ahead is None:
            return None
        base, future = ahead
        if future.exception() is not None:  # raised where the round is proposed
            loop.proposals.ask_ahead(self.key, base, 0, None, future=future)
            self.key = None
            return None
        self.key = None
        got = list(future.result())
        take, self.held = got[:free], got[free:]
        created = loop.proposals.record(self.round_no, base, take, [])
        loop.write_views()
        started = [c for c in created if c.status == Status.COMMITTED]
        loop.in_flight += [c.id for c in started]
        loop.jobs.start(started, lambda: loop.stop.hard)
        return loop.writes_of(created)

    def after(self, winner: str | None) -> dict | None:
        """The verdict is in: round R+1 keeps its candidates (kept) or has them withdrawn
        and carried onto the incumbent (refused), and is topped up to K. Returns the
        trusted state the next round starts from; None when nothing ran beside."""
        loop, led = self.loop, self.loop.ledger
        cand, self.confirming = self.confirming, None
        loop.in_flight = []
        if cand is None:
            return None
        if self.key is not None:  # never taken: rounds.propose uses (or re-bases) it
            self.key = None
            return None
        beside = [c for c in led.candidates(round=self.round_no) if c.kind == Kind.CANDIDATE]
        if not beside:
            return None
        before = loop.after_pairs or loop.guard.snapshot()
        loop.after_pairs = None
        meta, verdicts = loop.written
        incumbent = led.get("incumbent")
        branch = {loop.guard.branch: incumbent} if winner else {}
        stopped = loop.stop.soft
        # open, finished too: a measurement of code with the would-be keep's change in it
        # says nothing of the change on the incumbent
        withdrawn = self.withdraw([c for c in beside if (stopped or c.parent != incumbent)
                                   and c.status in OPEN_STATES], cand, stopped)
        if loop.stop.hard:
            return None  # nothing is judged now; a resume checks afresh
        created: list[Candidate] = []
        if not stopped:
            created = self.top_up(beside, withdrawn, self.carry(withdrawn, incumbent),
                                  incumbent)
        gone = {c.id: (Status.CANCELLED, c.metric) for c in withdrawn}  # finished: measured
        writes = loop.writes_of(created)
        out = {c.id for c in withdrawn}
        running = [c.id for c in beside if c.id not in out]
        return loop.verify(before, running, meta=meta, refs={**branch, **writes["refs"]},
                           verdicts={**verdicts, **gone, **writes["verdicts"]},
                           rows=writes["rows"])

    def withdraw(self, rows: list[Candidate], cand: Candidate, stopped: bool
                 ) -> list[Candidate]:
        """Stop and mark withdrawn the candidates made on a would-be keep that was not
        kept (or all of them, the study stopping): cancelled, never blamed."""
        led = self.loop.ledger
        why = ("withdrawn: the study stopped while it ran beside a confirmation" if stopped
               else f"withdrawn: proposed on {cand.id} {cand.short}, which was not kept; "
                    "its change runs again on the incumbent")
        for row in rows:
            if row.job_id and row.status == Status.SUBMITTED:
                self.loop.jobs.cancel(row)
            led.update(row.id, "withdrawn", status=Status.CANCELLED, reasons=why,
                       code=judge.Reason.WITHDRAWN, judged_at=time.time())
        return rows

    def carry(self, withdrawn: list[Candidate], incumbent: str) -> list[Proposal]:
        """The withdrawn changes and the reply's rest, re-based onto the incumbent; what
        conflicts there is dropped (billed)."""
        proposals = self.loop.proposals
        again = [Proposal(description=c.description or "", commit=c.commit_sha,
                          params=c.params) for c in withdrawn if c.commit_sha]
        moved, conflicting = proposals.on(self.base, incumbent, again + self.held)
        self.held = []
        proposals.drop(conflicting, f"dropped: made on the would-be keep {self.base[:7]}, "
                                    f"conflicts with the incumbent {incumbent[:7]}")
        return moved

    def top_up(self, beside: list[Candidate], withdrawn: list[Candidate],
               carried: list[Proposal], incumbent: str) -> list[Candidate]:
        """Round R+1 up to K candidates on the incumbent: those carried first, then the
        proposer is asked for what is still missing; with the round's co-run reference."""
        loop, rounds, led = self.loop, self.rounds, self.loop.ledger
        # budget.candidates counts those staying (not the withdrawn) as made already
        want = loop.room(loop.parallel - (len(beside) - len(withdrawn)))
        take, extra = carried[:want], carried[want:]
        loop.proposals.drop(extra, "unused: round already full")
        missing = want - len(take)
        if missing > 0:
            ctx = loop.proposals.context(self.round_no, incumbent, led.candidates(),
                                         led.get("incumbent_metric"), taken=take)
            take += rounds.wait_for(rounds.ask(missing, ctx), self.round_no)
        created = loop.proposals.record(self.round_no, incumbent, take,
                                        loop.fixed_rows(incumbent))
        loop.write_views()
        return created

