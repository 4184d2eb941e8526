"""The rounds policy: propose K from the incumbent, run them, judge them together, promote
the best, repeat.

A round is proposed from the previous round's verdicts, as the practice defines a round:
round R+1 is asked for once round R is settled, on the incumbent R made; only the K within
a round are independent. The proposer's latency is then paid once per round (the study's
start-up hides the first round's).

`search.ahead = true` speculates instead: round R+1 is asked for while round R runs, from
round R in flight (its verdicts hidden) on its own incumbent, always the same view, so a
resumed study proposes what an uninterrupted one would. When R moves the incumbent, a
speculative proposal is re-based onto it; one that conflicts is repaired (the proposer
re-applies its change on the new incumbent, one cheap call) and, if that fails, dropped
(its calls stay billed, marked dropped) and the proposer is asked again.

Before a round is proposed, the budget (`[budget]`, driver/budget.py) is checked: a round
that would cross a limit is not started, and `budget.candidates` cuts the last round to
what is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import replace
from typing import TypeVar

from ratchet.core.candidate import Candidate, Proposal
from ratchet.core.vocab import Kind, Status
from ratchet.driver.beside import Beside
from ratchet.driver.candidate import study_ref
from ratchet.driver.integrity import row_key
from ratchet.driver.proposals import Repairs
from ratchet.driver.settle import OPEN_STATES, Loop, without_verdict
from ratchet.job.faults import fault_point
from ratchet.proposers import ProposalContext

# the next round's proposals are asked for once every job of the round is in a phase, or
# this long after the round started (a backend that does not tell phases)
AHEAD_AFTER_S = 0.5
WAIT_REPORT_S = 0.25  # how often the live view hears while a round waits for its proposals
T = TypeVar("T")


def started_all(running: list[tuple[str, str, float, str]]) -> bool:
    """Every job still running is in a named phase (past its queue and checkout)."""
    return all(": " in state for *_, state in running)


class Rounds:
    def __init__(self, loop: Loop, target: int) -> None:
        self.loop, self.target = loop, target
        loop.target = target
        self.ahead = loop.config.search.ahead  # speculation: asked before the verdicts
        self.trusted: dict | None = None  # set while a round's baseline runs before it
        # the proposer had nothing new for a round (a tuner's knobs all tried): the study
        # ends after that round, and says so, instead of re-measuring the incumbent alone
        self.exhausted = False
        # the next round beside a confirmation (driver/beside.py), when it can be
        self.beside: Beside | None = Beside(self) if Beside.wanted(self) else None
        if self.beside is not None:
            self.beside.install()

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.loop.finish(self.target)

    def _run(self) -> None:
        loop, led = self.loop, self.loop.ledger
        while not loop.stop.soft:
            round_no = led.get("round")
            open_now = any(not c.is_judged for c in led.candidates(round=round_no))
            if round_no > self.target and not open_now:
                break
            cands = led.candidates(round=round_no)
            if cands and self.awaiting_proposals(cands):
                cands = self.propose(round_no)
            elif not cands:
                if round_no > self.target:
                    break
                if self.over_budget(round_no):
                    break  # the limit is said, and what ran is judged
                cands = self.propose(round_no)
                if not cands:
                    self.say_exhausted(round_no)
                    break
            else:
                loop.ensure_refs(cands)
            self.run_group(cands, round_no)
            if loop.stop.hard:
                break
            loop.check_baseline([c.id for c in cands])
            fault_point("judged")
            if all(led.row(c.id).status not in OPEN_STATES for c in cands):
                led.set(round=round_no + 1)
                if self.trusted is not None:  # the next round started beside: ours too
                    self.trusted = loop.guard.expect(self.trusted,
                                                     meta={"round": round_no + 1})
            if self.exhausted:  # its re-measures, started before the proposer said, ran
                self.say_exhausted(round_no)
                break
        loop.proposals.finish_ahead(wait=not loop.stop.hard)  # a speculation left is billed

    def say_exhausted(self, round_no: int) -> None:
        self.loop.log(f"round {round_no} of {self.target}: the proposer has nothing new to "
                      "try (its search space is exhausted); the study ends here")

    def over_budget(self, round_no: int, stop: bool = True) -> bool:
        """Would round `round_no` cross a limit (a mean round's wall time, and K more
        candidates at what each has cost so far)?"""
        loop = self.loop
        done = max(1, round_no - 1)
        wall = loop.spent(fresh=True).wall_hours / done if round_no > 1 else 0.0
        return loop.over_budget(self.slots_for_proposals(), wall, stop=stop)

    def view(self, round_no: int) -> tuple[str, ProposalContext]:
        """Round R's proposer input: every verdict so far on the incumbent; speculating
        (`search.ahead`), round R-1 in flight on its own incumbent."""
        led = self.loop.ledger
        history = led.candidates()
        if not self.ahead:
            incumbent = led.get("incumbent")
            return incumbent, self.loop.proposals.context(
                round_no, incumbent, history, led.get("incumbent_metric"))
        previous = [c for c in history if c.round == round_no - 1]
        base = previous[0].parent if previous and previous[0].parent else led.get("incumbent")
        shown = [c for c in history if c.round < round_no - 1] + [without_verdict(c) for c in previous]
        metric = next((c.metric for c in reversed(shown)
                       if c.status == Status.KEEP and c.commit_sha == base), None)
        return base, self.loop.proposals.context(round_no, base, shown, metric)

    def slots_for_proposals(self, round_no: int | None = None, after_keep: bool = False
                            ) -> int:
        """Round `round_no`'s candidates (the current round's by default): K, less the
        baseline's slot in the study's first round, less the two slots of the pair
        beside which it runs when the round before kept a change confirmed on fresh
        pairs (driver/beside.py; `after_keep`: as if it did), within the room
        budget.candidates leaves."""
        baseline = any(c.kind == Kind.BASELINE for c in self.loop.ledger.candidates())
        return self.loop.room(self.loop.parallel - (0 if baseline else 1)
                              - self.pair_slots(round_no, after_keep))

    def pair_slots(self, round_no: int | None = None, after_keep: bool = False) -> int:
        """The slots of round `round_no` a confirmation's pair holds: two when the
        round runs beside a keep's first look (driver/beside.py), i.e. when the round
        before kept a change confirmed on fresh pairs (`after_keep`: as if it did). A
        rule on the ledger, not on timing: a resumed study makes the same rounds."""
        if self.beside is None:
            return 0
        led = self.loop.ledger
        previous = (led.get("round") if round_no is None else round_no) - 1
        if after_keep:
            return 2
        keeps = {c.id for c in led.candidates(round=previous)
                 if c.kind == Kind.CANDIDATE and c.status == Status.KEEP}
        confirmed = bool(keeps) and any(r.confirms in keeps for r in led.candidates(
            confirmations=True) if r.kind == Kind.CONFIRM)
        return 2 if confirmed else 0

    def ask_ahead(self, round_no: int) -> None:
        """Round `round_no`'s proposals are asked for now, on the proposer's thread: the
        next round while this one runs (speculating, `search.ahead`), or the round about
        to start while the study starts (its previous round is judged: the same view as
        asked later)."""
        loop = self.loop
        if round_no > self.target or loop.stop.soft or loop.ledger.candidates(round=round_no):
            return
        if not loop.proposals.proposer.contained:
            return  # it could tamper: it proposes between rounds, in a window of its own
        if self.over_budget(round_no, stop=False):
            return  # said when the round would start
        k = self.slots_for_proposals()
        if k > 0:
            base, ctx = self.view(round_no)
            loop.proposals.ask_ahead(("round", round_no, k), base, k, ctx)

    def start_early(self) -> None:
        """Before start-up work (workers, prep): the first proposals are asked for now."""
        self.ask_ahead(self.loop.ledger.get("round"))

    def ask(self, k: int, ctx: ProposalContext) -> Future:
        """Ask now (nothing of this round was asked ahead). A proposer that could tamper
        runs here, on this thread, with no job running and nothing asked ahead; each of
        its untrusted steps runs `alone`, in a window of its own, so what changes meanwhile
        is that step's doing and only its proposal is rejected for it."""
        loop = self.loop
        proposer = loop.proposals.proposer
        if proposer.contained:
            return loop.proposals.ask(k, ctx)
        done: Future = Future()
        done.set_result(proposer.propose(k, replace(ctx, alone=self.alone)))
        return done

    def alone(self, step: Callable[[], object]) -> tuple[object, bool]:
        guard = self.loop.guard
        before = guard.snapshot()
        result = step()
        return result, guard.check(before, [])

    def awaiting_proposals(self, cands: list[Candidate]) -> bool:
        """A round whose baseline (and A/A re-measures) was recorded and started before its
        proposals, and whose driver stopped before they were recorded: they are asked for
        now, as an uninterrupted study would have."""
        return (not any(c.kind == Kind.CANDIDATE for c in cands)
                and any(not c.is_judged for c in cands)
                and self.loop.room(self.loop.parallel - sum(
                    1 for c in cands if c.kind == Kind.BASELINE)) > 0)

    def start_fixed(self, round_no: int, rows: list[dict]) -> tuple[list[Candidate], dict]:
        """The baseline needs no proposal: it is recorded and runs at once, while the
        proposer is asked. (A proposer that could tamper is asked with nothing running.)
        Returns its rows, and the trusted state to check when the round runs: the
        state before it started plus the driver's own writes since (`self.trusted`)."""
        loop = self.loop
        before = loop.guard.snapshot()  # before the baseline can run
        early = loop.proposals.record(round_no, self.loop.ledger.get("incumbent"), [], rows)
        loop.write_views()
        trusted = loop.guard.expect(before, rows={c.id: row_key(c) for c in early})
        loop.jobs.start(early, lambda: loop.stop.hard)
        return early, trusted

    def propose(self, round_no: int) -> list[Candidate]:
        loop, led = self.loop, self.loop.ledger
        incumbent = led.get("incumbent")
        # a resumed round may have its baseline recorded already
        early = led.candidates(round=round_no)
        rows = [] if early else loop.fixed_rows(incumbent)
        k = loop.room(loop.parallel - sum(1 for r in rows if r["kind"] == Kind.BASELINE)
                      - sum(1 for c in early if c.kind == Kind.BASELINE)
                      - self.pair_slots(round_no))
        if rows and k and loop.proposals.proposer.contained:
            early, self.trusted = self.start_fixed(round_no, rows)
            rows = []
        proposals: list[Proposal] = []
        stale = None
        if k:
            ahead = loop.proposals.take_ahead(("round", round_no, k))
            if ahead is None:
                base, ctx = self.view(round_no)
                ahead = (base, self.ask(k, ctx))
            base, future = ahead
            proposals, conflicting = loop.proposals.on(base, incumbent,
                                                       self.wait_for(future, round_no))
            if conflicting:  # they conflict with the new incumbent: repaired, or asked again
                ctx = loop.proposals.context(round_no, incumbent, led.candidates(),
                                             led.get("incumbent_metric"), taken=proposals)
                repairs: Repairs = self.wait_for(
                    loop.proposals.repair(base, incumbent, conflicting, ctx), round_no)
                loop.proposals.drop_failed(repairs, base, incumbent)
                proposals += repairs.repaired
                missing = len(conflicting) - len(repairs.repaired)
                if missing:
                    ctx = loop.proposals.context(round_no, incumbent, led.candidates(),
                                                 led.get("incumbent_metric"),
                                                 taken=proposals)
                    proposals += self.wait_for(self.ask(missing, ctx), round_no)
                # a proposer with nothing else to offer: run them as made, on their base
                left = repairs.unrepaired
                stale = (base, left[:max(0, k - len(proposals))])
                loop.proposals.drop(left[len(stale[1]):], f"dropped: made ahead on "
                                    f"{base[:7]}, conflicts with the incumbent "
                                    f"{incumbent[:7]}")
        if k and not proposals and not (stale and stale[1]) and not any(
                r["kind"] == Kind.BASELINE for r in rows) and not any(
                c.kind == Kind.BASELINE for c in early):
            # nothing new: no re-measure of the incumbent with nothing to compare it to
            # (one started while the proposer was asked runs, and the study ends)
            self.exhausted = True
            return early
        created = loop.proposals.record(round_no, incumbent, proposals, rows,
                                        stale=stale)
        loop.write_views()
        if self.trusted is not None:  # the baseline ran meanwhile: these are our writes
            self.trusted = loop.guard.expect(
                self.trusted, rows={c.id: row_key(c) for c in created},
                refs={study_ref(loop.name, c.id): c.commit_sha for c in created
                      if c.commit_sha and c.kind == Kind.CANDIDATE},
                verdicts={c.id: (c.status, c.metric) for c in created if c.is_judged})
        return early + created

    def wait_for(self, future: Future[T], round_no: int) -> T:
        """The proposer's answer; meanwhile the live view says what it waits for."""
        while not future.done():
            self.loop.progress(round_no, self.target, [])
            wait([future], timeout=WAIT_REPORT_S)
        return future.result()

    def run_group(self, cands: list[Candidate], round_no: int) -> None:
        loop = self.loop
        # before any of them can run (or, when the baseline started first, what was
        # trusted then plus our own writes since)
        trusted, self.trusted = self.trusted or loop.guard.snapshot(), None
        loop.jobs.start(cands, lambda: loop.stop.hard)
        started = time.monotonic()
        asked = False

        def report(running: list) -> None:
            # speculating, the proposer works while the round runs, once its jobs are in
            # their phases: asked at once, its git work would compete with the jobs' own
            # start-up
            nonlocal asked
            if self.ahead and not asked and (started_all(running)
                              or time.monotonic() - started >= AHEAD_AFTER_S):
                asked = True
                self.ask_ahead(round_no + 1)
            loop.progress(round_no, self.target, running)

        ids = [c.id for c in cands]
        loop.jobs.wait(ids, report, lambda: loop.stop.hard)
        if self.ahead and not asked:  # a round over before it was asked: the same view
            self.ask_ahead(round_no + 1)
        if loop.guard.check(trusted, ids):
            loop.write_views()
        if not loop.stop.hard:
            winner = loop.settle(ids)
            if self.beside is not None:  # round R+1 may have started beside its pairs
                self.trusted = self.beside.after(winner)


# -- rolling -------------------------------------------------------------------------------
