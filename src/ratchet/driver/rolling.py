"""The rolling policy: a freed slot gets a new candidate from the current incumbent at once;
a finished candidate is judged at once (with the same noise, hold-out and integrity rules);
the budget is a number of candidates.

It is the mode for never waiting: one request to the proposer is always in flight while
jobs run, so a slot never waits for a reply it could have had. Before each new candidate
(and each new request) the `[budget]` limits are checked (driver/budget.py); at one, the
study stops as a first Ctrl-C stops it, and the request still in flight is waited for and
billed.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

from ratchet.driver import judge
from ratchet.driver.candidate import (
    Proposal,
    study_ref,
)
from ratchet.driver.integrity import row_key
from ratchet.driver.ledger import Status
from ratchet.driver.proposals import next_seq
from ratchet.driver.settle import (
    OPEN_STATES,
    Loop,
    ScheduleError,
)
from ratchet.job.faults import fault_point
from ratchet.vocab import Kind


class Rolling:
    """Every slot busy: a freed slot gets a new candidate from the current incumbent."""

    KEY = "rolling"

    def __init__(self, loop: Loop, budget: int) -> None:
        self.loop, self.budget = loop, budget
        loop.target = budget
        self.ready: list[tuple[str, Proposal]] = []  # (base commit, proposal) made ahead
        self.exhausted = False
        self.open_ids: list[str] = []  # recorded, not judged yet

    def made(self) -> int:
        return sum(1 for c in self.loop.ledger.candidates() if c.kind == Kind.CANDIDATE)

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.loop.finish(self.budget)

    def _run(self) -> None:
        loop, led = self.loop, self.loop.ledger
        self.refuse_uncontained()
        # (confirmation rows are measured again by their candidate's confirmation)
        resumed = [c for c in led.candidates() if c.status in OPEN_STATES]
        loop.ensure_refs(resumed)
        loop.snapshot = loop.guard.snapshot()
        loop.jobs.start(resumed, lambda: loop.stop.hard)
        self.open_ids = [c.id for c in resumed]
        if not any(c.kind == Kind.BASELINE for c in led.candidates()):
            self.open_ids += self.add(loop.fixed_rows(led.get("incumbent")), [])
        cancelled = False
        while True:
            if not loop.stop.soft:
                self.open_ids += self.fill(len(self.open_ids))
                self.request()  # the proposer works on the next ones while these run
            running = loop.jobs.poll(self.open_ids)
            loop.progress(led.get("round"), self.budget, running)
            if self.judgeable(self.open_ids):
                self.judge(self.open_ids)
            self.open_ids = [i for i in self.open_ids
                             if led.row(i).status in OPEN_STATES]
            if loop.stop.hard:
                if not cancelled:
                    cancelled = True
                    for cand_id, *_ in running:
                        loop.jobs.interrupt(led.row(cand_id))
                if not any(led.row(i).status == Status.SUBMITTED for i in self.open_ids):
                    break
            elif not self.open_ids and (loop.stop.soft or self.exhausted
                                        or self.made() >= self.budget):
                break
            time.sleep(0.02)
        # what was asked for and never used is billed as unused (a request in flight is
        # waited for unless the user cancelled: its calls are recorded as they end)
        loop.proposals.drop([p for _, p in self.ready], "unused: the study stopped before "
                            "it was needed")
        self.ready = []
        loop.proposals.finish_ahead(wait=not loop.stop.hard)

    def start_early(self) -> None:
        """Before start-up work (workers, prep): the first proposals are asked for now."""
        self.refuse_uncontained()
        if not self.loop.stop.soft:
            self.request()

    def refuse_uncontained(self) -> None:
        """Rolling asks while candidates run: a proposer that could write the study's
        state would share their tamper window, and an honest candidate could be blamed
        for what it did. Rounds keep the two apart."""
        if not self.loop.proposals.proposer.contained:
            raise ScheduleError(
                "search.mode = \"rolling\" makes proposals while candidates run, and this "
                f"{self.loop.proposals.kind} proposer has no filesystem sandbox here; use "
                "mode = \"rounds\", or install bubblewrap")

    def judgeable(self, open_ids: list[str]) -> bool:
        """Something finished, and the baseline is measured: nothing is compared before."""
        cands = [self.loop.ledger.row(i) for i in open_ids]
        return any(c.status == Status.FINISHED for c in cands) and not any(
            c.kind == Kind.BASELINE and c.status != Status.FINISHED for c in cands)

    def judge(self, open_ids: list[str]) -> None:
        loop, led = self.loop, self.loop.ledger
        self.verify(loop.snapshot, open_ids)
        before = loop.snapshot
        finished = [i for i in open_ids if led.row(i).status == Status.FINISHED]
        loop.in_flight = [i for i in open_ids if i not in finished]
        known = {c.id for c in led.candidates()}
        winner = loop.settle(finished, on_keep={"round": led.get("round") + 1})
        loop.in_flight = []
        meta, verdicts = loop.written
        branch = {loop.guard.branch: meta["incumbent"]} if winner else {}
        # rows the judging made (confirmation measurements) are ours too
        made = {c.id: row_key(c) for c in led.candidates() if c.id not in known}
        # the others ran on while we judged: anything but our own writes is theirs
        self.verify(before, open_ids, meta=meta, refs=branch, verdicts=verdicts, rows=made)
        loop.check_baseline(finished)
        fault_point("judged")
        for cand in (led.row(i) for i in finished):
            # it beat the incumbent but started from an older one: its change goes again,
            # carried onto the current incumbent, before anything new
            if (cand.status == Status.DISCARD and cand.code == judge.Reason.STALE
                    and cand.parent is not None):
                self.ready.insert(0, (cand.parent, Proposal(
                    description=f"{cand.description} (again, on the new incumbent)"[:200],
                    commit=cand.commit_sha, params=cand.params)))

    def verify(self, before: dict, ids: list[str], **writes) -> None:
        """Trusted state must be `before` plus our own `writes` (Guard.expect); anything
        else was written by a running candidate: restored, and the candidates that ran
        (`ids`) are rejected and stopped. The result is the new trusted state."""
        loop = self.loop
        expected = loop.guard.expect(before, **writes)
        if not loop.guard.check(expected, ids):
            loop.snapshot = expected
            return
        rejected = [c for c in (loop.ledger.row(i) for i in ids)
                    if c.status == Status.REJECTED]
        for cand in rejected:
            if cand.job_id:
                loop.jobs.cancel(cand)  # rejected while it ran: stop it, free its slot
        # what they wrote until they were stopped is undone too (never taken as trusted)
        expected = loop.guard.expect(expected, verdicts={c.id: (c.status, c.metric)
                                                         for c in rejected})
        loop.guard.check(expected, ids)
        loop.write_views()
        loop.snapshot = loop.guard.expect(expected)

    def add(self, rows: list[dict], proposals: list[Proposal]) -> list[str]:
        """Record and start new candidates; the trusted snapshot follows our own writes."""
        loop, led = self.loop, self.loop.ledger
        before = loop.snapshot or loop.guard.snapshot()  # the last trusted state
        created = loop.proposals.record(led.get("round"), led.get("incumbent"), proposals,
                                        rows)
        loop.write_views()
        # others run meanwhile: check against before + our own new refs and verdicts
        refs = {study_ref(self.loop.name, c.id): c.commit_sha for c in created
                if c.commit_sha and c.kind == Kind.CANDIDATE}
        judged = {c.id: (c.status, c.metric) for c in created if c.is_judged}
        self.verify(before, self.open_ids, refs=refs, verdicts=judged,
                    rows={c.id: row_key(c) for c in created})
        loop.jobs.start(created, lambda: loop.stop.hard)  # after the trusted state is set
        return [c.id for c in created if c.status in OPEN_STATES]

    def fill(self, busy: int) -> list[str]:
        """New candidates for the free slots, from the current incumbent."""
        loop = self.loop
        want = min(loop.parallel - busy, self.budget - self.made())
        if want <= 0 or self.exhausted:
            return []
        want = loop.affordable(want)  # 0: a limit is reached, and the study stops
        if want <= 0:
            return []
        incumbent = loop.ledger.get("incumbent")
        tried = {json.dumps(c.params, sort_keys=True) for c in loop.ledger.candidates()
                 if c.params and c.kind == Kind.CANDIDATE and c.parent == incumbent}
        take: list[Proposal] = []
        knobs = set(loop.config.tune.knobs)
        while len(take) < want and (self.ready or self.collect()):
            base, proposal = self.ready.pop(0)
            # settings of declared knobs (the tuner's params) name the experiment; an LLM's
            # or an agent's params describe the call (model, tokens), not the change
            key = json.dumps(proposal.params, sort_keys=True) if (
                proposal.params and set(proposal.params) <= knobs) else None
            if key is not None and key in tried:
                # asked twice ahead of time: the same settings on the same code
                loop.proposals.drop([proposal], "dropped: the same settings were already "
                                    "tried on this incumbent")
                continue
            moved, conflicting = loop.proposals.on(base, incumbent, [proposal])
            # a conflicting one is recorded, not dropped unseen (a queued patch would
            # vanish); it takes a slot of the budget but no job, and the proposer is
            # asked for another
            take += moved + [replace(
                p, files={}, commit=None,
                error=f"conflicts with the incumbent {incumbent[:7]} it would run on "
                      f"(made on {base[:7]})") for p in conflicting]
            if key is not None:
                tried.add(key)
        return self.add([], take) if take else []

    def collect(self) -> bool:
        """Proposals that are ready join `ready` (never waits for the proposer)."""
        ahead = self.loop.proposals.take_ahead(self.KEY)
        if ahead is None:
            self.request()
            return False
        base, future = ahead
        if not future.done():
            self.loop.proposals.ask_ahead(self.KEY, base, 0, None, future=future)
            return False
        got = future.result()
        if not got:
            self.exhausted = True
            return False
        self.ready += [(base, p) for p in got]
        return True

    def request(self) -> None:
        """Keep one request in flight, for as many slots as will need a candidate."""
        loop, led = self.loop, self.loop.ledger
        want = min(loop.parallel, self.budget - self.made()) - len(self.ready)
        if want <= 0 or self.exhausted or loop.stop.soft or loop.proposals.has_ahead(self.KEY):
            return
        want = loop.affordable(want + len(self.ready), fresh=True) - len(self.ready)
        if want <= 0:
            return  # what is ready is all the budget allows
        incumbent = led.get("incumbent")
        # a number never asked before (the tuner seeds each ask with it)
        ask_no = next_seq(led) + len(self.ready)
        ctx = loop.proposals.context(ask_no, incumbent, led.candidates(),
                                     led.get("incumbent_metric"),
                                     taken=[p for _, p in self.ready])
        loop.proposals.ask_ahead(self.KEY, incumbent, want, ctx)
