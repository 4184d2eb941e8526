"""The next round beside a confirmation (rounds mode, `search.beside`, on by default).

While a would-be keep of round R is confirmed, its pairs hold two slots (a look of one
pair) and the others would idle for the whole confirmation. Instead, round R+1 is asked
for at once, proposed on the would-be keep (the incumbent it will run on if it is kept),
and as many of its candidates as the free slots hold start beside the pairs. When the
verdict comes:
- kept: they are round R+1, whole: K - 2 candidates (the reply's proposals no slot took
  run after the verdict). The first look's pair held the round's other two slots (a
  round of K jobs, the confirmation included): topping it up to K candidates would run
  the top-up as a wave of its own with two slots idle, since round R+2 waits for R+1's
  verdicts. The size is a rule on the ledger, not on timing (`Rounds.slots_for_proposals`:
  the round after a keep confirmed on fresh pairs has K - 2), so a study stopped and
  resumed between the rounds, or a reply too late to run beside, makes the same rounds. A study of `rounds` rounds then makes fewer than
  rounds x K candidates, each round filling its slots; `budget.candidates` bounds the
  candidates when that is what should be bounded;
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
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING

from ratchet.core.candidate import Candidate, Proposal
from ratchet.core.vocab import Kind, Status
from ratchet.driver import judge
from ratchet.driver.settle import ENDING, OPEN_STATES
from ratchet.job.jobspec import JobResult

if TYPE_CHECKING:
    from ratchet.driver.rounds import Rounds


class Beside:
    """Round R+1 started beside round R's confirmation (see the module's docstring)."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds, self.loop = rounds, rounds.loop
        self.confirming: Candidate | None = None  # the would-be keep whose pairs run
        self.round_no = 0  # the round started beside it
        self.asking = False  # whether more of it may be asked for (target, budget)
        self.asked = 0  # requests made beside confirmations (each its own key)
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
        """A would-be keep goes into confirmation: round R+1 is asked for on it now, as
        many candidates as the first look's pair leaves slots free."""
        loop, led = self.loop, self.loop.ledger
        self.confirming = cand
        if self.key is not None or self.held:
            return  # a reply made on an earlier would-be keep of this round: after()
            # re-bases it; it does not run beside this one (meanwhile)
        self.round_no = led.get("round") + 1
        self.base = cand.commit_sha or ""
        self.asking = not (self.round_no > self.rounds.target or loop.stop.soft
                           or not self.base or led.candidates(round=self.round_no)
                           or self.rounds.over_budget(self.round_no, stop=False))
        # (resumed, round R+1 may have started already: after() judges what it holds)
        if self.asking:  # the size round R+1 has if the keep is kept
            self.ask(self.rounds.slots_for_proposals(self.round_no, after_keep=True))

    def ask(self, k: int) -> None:
        """Ask for `k` of round R+1 on the would-be keep, with the view round R+1 would
        have after the keep: round R with its verdicts as they will be then (so it is
        proposed as it would be after the verdict), and what already runs beside."""
        if k <= 0 or self.confirming is None or not self.asking:
            return
        led, cand = self.loop.ledger, self.confirming
        history = [self.as_if_kept(c, cand) if c.round == cand.round and not c.is_judged
                   else c for c in led.candidates()]
        ctx = self.loop.proposals.context(self.round_no, self.base, history, cand.metric)
        self.asked += 1
        self.key = ("beside", self.round_no, self.asked)
        self.loop.proposals.ask_ahead(self.key, self.base, k, ctx)

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
        """While the pairs run: once the reply is in, the free slots take its proposals
        as round R+1's candidates. Returns the trusted writes made."""
        loop, led = self.loop, self.loop.ledger
        if (self.confirming is None or loop.stop.soft or not self.round_no
                or self.confirming.commit_sha != self.base):
            return None
        # the pairs' jobs as the backend sees them now (a row stays submitted until the
        # wait collects it: a pair that just ended must not count as running)
        pairs = loop.jobs.poll([c.id for c in led.confirming(self.confirming.id,
                                                              Status.SUBMITTED)])
        if not pairs:
            return None
        # a candidate started as the pairs end would run as a wave of its own after the
        # verdict, the round waiting for it with the other slots idle: the would-be
        # keep's own run time tells how long its pair takes
        typical = self.confirming.run_s
        if typical and max(seconds for _, _, seconds, _ in pairs) >= ENDING * typical:
            return None
        free = loop.parallel - len(pairs) - len(loop.jobs.poll(loop.in_flight))
        if free <= 0:
            return None
        if self.key is not None:
            ahead = loop.proposals.take_done(self.key)
            if ahead is None:
                return None  # still proposing
            self.key = None
            base, future = ahead
            if future.exception() is not None:
                self.failed(self.round_no, base, future)
                return None
            self.held += list(future.result())
        take, self.held = self.held[:free], self.held[free:]
        if not take:
            return None
        created = loop.proposals.record(self.round_no, self.base, take, [])
        loop.write_views()
        started = [c for c in created if c.status == Status.COMMITTED]
        loop.in_flight += [c.id for c in started]
        loop.jobs.start(started, lambda: loop.stop.hard)
        return loop.writes_of(created)

    def failed(self, round_no: int, base: str, future: Future) -> None:
        """The proposer raised: the error belongs where the round is proposed, so the
        request is left for rounds.propose to take (and raise) as its own."""
        key = ("round", round_no, self.rounds.slots_for_proposals())
        self.loop.proposals.ask_ahead(key, base, 0, None, future=future)

    def after(self, winner: str | None) -> dict | None:
        """The verdict is in: round R+1 keeps its candidates (kept) or has them withdrawn
        and carried onto the incumbent (refused), and is topped up to K. Returns the
        trusted state the next round starts from; None when nothing ran beside."""
        loop, led = self.loop, self.loop.ledger
        cand, self.confirming = self.confirming, None
        held, self.held = self.held, []  # the replies' proposals no slot took
        round_no, self.round_no = self.round_no, 0
        loop.in_flight = []
        if cand is None or not round_no:
            return None
        if self.key is not None:  # a reply no slot took: round R+1 starts from it
            ahead = loop.proposals.take_ahead(self.key)
            self.key = None
            if ahead is not None:
                base, future = ahead
                try:
                    held += self.rounds.wait_for(future, round_no)
                except Exception:  # noqa: BLE001 - any proposer error, raised by propose
                    self.failed(round_no, base, future)
                    return None
        beside = [c for c in led.candidates(round=round_no) if c.kind == Kind.CANDIDATE]
        if not beside and not held:
            return None  # nothing was asked: rounds.propose asks (its size, slots_for_proposals)
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
        if stopped:
            loop.proposals.drop(held, "unused: the study stopped")
        elif winner == cand.id and not withdrawn and self.base == cand.commit_sha:
            # kept, and the reply was made on it: round R+1 is the reply, what no slot took
            # too (K - 2, Rounds.pair_slots)
            created = loop.proposals.record(round_no, incumbent, held,
                                            loop.fixed_rows(incumbent))
            loop.write_views()
        else:  # refused (or made on an earlier would-be keep): re-based onto the incumbent
            created = self.top_up(round_no, beside, withdrawn,
                                  self.carry(withdrawn, held, incumbent), incumbent)
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
            led.cancel(row.id, why, time.time(), code=judge.Reason.WITHDRAWN, event="withdrawn")
        return rows

    def carry(self, withdrawn: list[Candidate], held: list[Proposal], incumbent: str
              ) -> list[Proposal]:
        """The withdrawn changes and the reply's rest, re-based onto the incumbent; what
        conflicts there is dropped (billed)."""
        proposals = self.loop.proposals
        again = [Proposal(description=c.description or "", commit=c.commit_sha,
                          params=c.params) for c in withdrawn if c.commit_sha]
        moved, conflicting = proposals.on(self.base, incumbent, again + held)
        proposals.drop(conflicting, f"dropped: made on the would-be keep {self.base[:7]}, "
                                    f"conflicts with the incumbent {incumbent[:7]}")
        return moved

    def top_up(self, round_no: int, beside: list[Candidate], withdrawn: list[Candidate],
               carried: list[Proposal], incumbent: str) -> list[Candidate]:
        """Round R+1 up to its size on the incumbent (K; K - 2 after a keep): those
        carried first, then the proposer is asked for what is still missing; with the
        round's co-run reference."""
        loop, rounds, led = self.loop, self.rounds, self.loop.ledger
        # budget.candidates counts those staying (not the withdrawn) as made already; a
        # keep's pair held two of the round's slots (Rounds.pair_slots), a refusal none
        want = loop.room(loop.parallel - rounds.pair_slots(round_no)
                         - (len(beside) - len(withdrawn)))
        take, extra = carried[:want], carried[want:]
        loop.proposals.drop(extra, "unused: round already full")
        missing = want - len(take)
        if missing > 0:
            ctx = loop.proposals.context(round_no, incumbent, led.candidates(),
                                         led.get("incumbent_metric"), taken=take)
            take += rounds.wait_for(rounds.ask(missing, ctx), round_no)
        created = loop.proposals.record(round_no, incumbent, take,
                                        loop.fixed_rows(incumbent))
        loop.write_views()
        return created

