"""The rolling policy: a freed slot gets a new candidate from the current incumbent at once;
a finished candidate is judged at once (with the same noise, hold-out and integrity rules);
the budget is a number of candidates that run (a proposal that cannot run is recorded on top).

It is the mode for never waiting: one request to the proposer is always in flight while
jobs run, so a slot never waits for a reply it could have had. When the incumbent moves,
the reply must not be asked for then:
- a would-be keep going into confirmation is proposed on at once (`speculate`), and the
  slots its pairs leave free take those proposals alone (`fill_beside`; nothing on it
  ready, they wait for one), their writes expected by the pairs' tamper check and their
  jobs blamed with the others; if it is kept, what was made on it is on the incumbent;
  if not, what ran on it is stale;
- a candidate that ran while the incumbent moved (stale) is judged on its own files: a
  winner is confirmed on fresh pairs against the current incumbent and kept as its own
  files (judge.judge_group), not discarded and re-proposed;
- what is ready, made on the old incumbent, is re-based onto the new one at once
  (`carry`), and what conflicts is repaired by the proposer (it re-applies its change on
  the new incumbent, cheaper than a new proposal) while the slots take the rest; a
  failed repair is dropped, its calls billed; a change no proposer can repair (a queued
  patch) is recorded as conflicting.
A candidate is always a commit on the incumbent of its time, or on the would-be keep
being confirmed then.

Before each new candidate (and each new request) the `[budget]` limits are checked
(driver/budget.py); at one, the study stops as a first Ctrl-C stops it, and the requests
still in flight are waited for and billed.
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import Future
from dataclasses import replace

from ratchet.core.candidate import Candidate, Proposal
from ratchet.core.vocab import Kind, Status
from ratchet.driver import judge
from ratchet.driver.integrity import row_key
from ratchet.driver.proposals import next_seq, settled
from ratchet.driver.settle import (
    OPEN_STATES,
    Loop,
    ScheduleError,
)
from ratchet.job.faults import fault_point
from ratchet.proposers import ProposalContext

REPLIES_SEEN = 4  # the replies whose share of runnable proposals sizes the next request
WIDEST = 3  # a request asks at most this many times the proposals it needs


class Rolling:
    """Every slot busy: a freed slot gets a new candidate from the current incumbent."""

    KEY = "rolling"

    def __init__(self, loop: Loop, budget: int) -> None:
        self.loop, self.budget = loop, budget
        loop.target = budget
        self.ready: list[tuple[str, Proposal]] = []  # (base commit, proposal) made ahead
        # requests in flight, {key: proposals asked}: one on the incumbent (KEY, n), and
        # one on the would-be keep in confirmation ("on", its id, n)
        self.asked: dict[tuple, int] = {}
        self.ideas: dict[tuple, list[str]] = {}  # handed to those in flight
        # repairs in flight: (made on, repaired onto, how many, future of a Repairs)
        self.repairing: list[tuple[str, str, int, Future]] = []
        self.conflicted: list[tuple[str, Proposal]] = []  # no repair: recorded as such
        # ids of proposals that go first (repaired ones, changes going again), and of
        # those repaired once (not repaired twice)
        self.first: list[Proposal] = []
        self.repaired: list[Proposal] = []
        self.asks = -1  # the last ask number used
        self.exhausted = False
        self.open_ids: list[str] = []  # recorded, not judged yet
        loop.on_confirm = self.speculate
        loop.meanwhile = self.meanwhile
        self.confirming: Candidate | None = None  # the would-be keep being confirmed
        self.unrunnable: list[Proposal] = []  # in, never to run: recorded at the next fill
        # refs and verdicts of candidates recorded while a confirmation ran (fill_beside):
        # the check after its settle expects them
        self.beside: dict[str, dict] = {"refs": {}, "verdicts": {}}
        # slot-seconds a free slot waited for a reply (a request or a repair in flight,
        # nothing ready to run): what the proposer's latency cost, whatever the path
        self.waited = 0.0
        # the part of it before the first reply was in (`replies` still empty): only the
        # baseline can overlap that one (a start-up cost, the same whatever the length)
        self.waited_first = 0.0
        # the part of it spent on requests asked only because a verdict came in: the
        # proposer's last reply on that code had nothing runnable, so asking sooner would
        # have got nothing (a proposer short of new changes, not a late request)
        self.waited_gated = 0.0
        # (base, verdicts judged) of each reply that had nothing runnable: the same
        # question is not asked again while a verdict that changes what the proposer is
        # shown is coming
        self.barren: set[tuple[str, int]] = set()
        # commits whose last reply had nothing runnable, and the requests in flight asked
        # on one of them (after a verdict changed the question)
        self.dry: set[str] = set()
        self.gated: set[tuple] = set()
        # (asked, runnable) of the last replies: a proposer whose replies are partly
        # repeats or failures is asked for more at once, not once more after a wait
        self.replies: list[tuple[int, int]] = []
        # the seq the next candidate would have had when the request that made a
        # proposal was asked, by the proposer call that made it: a repeat of a candidate
        # recorded since could not have been in what the proposer was shown
        self.asked_seq: dict[tuple, int] = {}  # by request key
        self.call_seq: dict[int, int] = {}  # by proposer call
        self._free_waiting, self._tick = 0, time.monotonic()
        self._gated_waiting = False  # the slots waiting now wait on gated requests only
        self._started = self._tick

    def made(self) -> int:
        """Candidates that take the budget: those that ran or will run. One rejected
        unrun (a repeat of a tried change, a failed or conflicting proposal) does not:
        the budget buys evaluations, and a repeat is only recorded."""
        return sum(1 for c in self.loop.ledger.candidates()
                   if c.kind == Kind.CANDIDATE and not _unrun(c))

    def unrun(self) -> int:
        return sum(1 for c in self.loop.ledger.candidates()
                   if c.kind == Kind.CANDIDATE and _unrun(c))

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.tally(None)
            self.report_waits()
            self.loop.finish(self.budget)

    def tally(self, busy: int | None) -> None:
        """Count the slot-seconds since the last tally that waited for the proposer, then
        note how many slots wait now (`busy`: jobs placed; None: the state holds)."""
        now = time.monotonic()
        waited = self._free_waiting * (now - self._tick)
        self.waited += waited
        if not self.replies:
            self.waited_first += waited
        elif self._gated_waiting:
            self.waited_gated += waited
        self._tick = now
        if busy is None:
            return
        free = self.loop.parallel - busy
        waiting = (free > 0 and self.waiting_for() > 0 and not self.loop.stop.soft
                   and self.made() < self.budget)
        self._free_waiting = free if waiting else 0
        # a repair in flight, or a request asked before the proposer ran dry, could
        # have filled the slot sooner: those waits are not gated
        self._gated_waiting = bool(waiting and self.asked and not self.repairing
                                   and set(self.asked) <= self.gated)

    def report_waits(self) -> None:
        """The study's end: how long free slots waited for replies, in the ledger's events
        (`ratchet show`'s timeline) and one log line when it was any."""
        span = (time.monotonic() - self._started) * self.loop.parallel
        share, first, gated = ((self.waited / span, self.waited_first / span,
                                self.waited_gated / span) if span > 0 else (0.0, 0.0, 0.0))
        self.loop.ledger.event("proposer-wait", None, slot_s=round(self.waited, 3),
                               share=round(share, 5), slots=self.loop.parallel,
                               first_slot_s=round(self.waited_first, 3),
                               first_share=round(first, 5),
                               gated_slot_s=round(self.waited_gated, 3),
                               gated_share=round(gated, 5))
        if self.waited >= 0.05:
            self.loop.log(f"slots waited {self.waited:.1f} slot-s for the proposer's replies "
                          f"({share:.1%} of the slots' time; {self.waited_first:.1f} slot-s "
                          f"of it for the first reply, {self.waited_gated:.1f} for replies "
                          "asked after one with nothing new, when a verdict came in)")

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
            self.tally(len(running))
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
            elif not self.open_ids and (loop.stop.soft or self.made() >= self.budget or (
                    self.exhausted and not self.ready and not self.conflicted
                    and not self.unrunnable
                    and not self.waiting_for())):
                break
            time.sleep(0.02)
        # what was asked for and never used is billed as unused (a request in flight is
        # waited for unless the user cancelled: its calls are recorded as they end)
        self.finish_repairs(wait=not loop.stop.hard)
        unused = [p for _, p in self.ready + self.conflicted] + self.unrunnable
        loop.proposals.drop(unused, "unused: the study stopped before it was needed")
        self.ready, self.conflicted, self.unrunnable = [], [], []
        loop.proposals.finish_ahead(wait=not loop.stop.hard)

    def finish_repairs(self, wait: bool) -> None:
        """Repairs still asked at the end: waited for (so their calls are recorded) and
        billed as unused, or cancelled when the user cancelled."""
        for base, incumbent, _, future in self.repairing:
            repairs = settled(future, wait)
            if repairs is None:
                continue
            self.loop.proposals.drop_failed(repairs, base, incumbent)
            self.ready += [(incumbent, p) for p in repairs.repaired + repairs.unrepaired]
        self.repairing = []

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
        loop.in_flight, self.confirming = [], None
        meta, verdicts = loop.written
        branch = {loop.guard.branch: meta["incumbent"]} if winner else {}
        # rows the judging made (confirmation measurements, candidates started beside
        # them) are ours too
        made = {c.id: row_key(c) for c in led.candidates() if c.id not in known}
        beside, self.beside = self.beside, {"refs": {}, "verdicts": {}}
        # the others ran on while we judged: anything but our own writes is theirs
        self.verify(before, self.open_ids, meta=meta, refs={**beside["refs"], **branch},
                    verdicts={**beside["verdicts"], **verdicts}, rows=made)
        loop.check_baseline(finished)
        fault_point("judged")
        for cand in (led.row(i) for i in finished):
            # (noise = "ignore" only: with a confirmation a stale winner is confirmed as
            # its own files) it beat the incumbent but started from an older one: its
            # change goes again, carried onto the current incumbent, before anything new
            if (cand.status == Status.DISCARD and cand.code == judge.Reason.STALE
                    and cand.parent is not None):
                again = Proposal(
                    description=f"{cand.description} (again, on the new incumbent)"[:200],
                    commit=cand.commit_sha, params=cand.params)
                self.ready.insert(0, (cand.parent, again))
                self.first.append(again)
        if winner:
            self.carry()  # what is ready moves onto the new incumbent, or is repaired

    def verify(self, before: dict, ids: list[str], **writes) -> None:
        """Loop.verify; the new trusted state is the loop's snapshot."""
        self.loop.snapshot = self.loop.verify(before, ids, **writes)

    def add(self, rows: list[dict], proposals: list[Proposal]) -> list[str]:
        """Record and start new candidates; the trusted snapshot follows our own writes."""
        loop, led = self.loop, self.loop.ledger
        before = loop.snapshot or loop.guard.snapshot()  # the last trusted state
        created = loop.proposals.record(led.get("round"), led.get("incumbent"), proposals,
                                        rows)
        loop.write_views()
        # others run meanwhile: check against before + our own new refs and verdicts
        self.verify(before, self.open_ids, **self.loop.writes_of(created))
        loop.jobs.start(created, lambda: loop.stop.hard)  # after the trusted state is set
        return [c.id for c in created if c.status in OPEN_STATES]

    def fill(self, busy: int) -> list[str]:
        """New candidates for the free slots, from the current incumbent."""
        loop = self.loop
        self.collect()  # first: what it records unrun takes room in the budget
        want = min(loop.parallel - busy, self.budget - self.made())
        if want <= 0:
            return []
        want = loop.affordable(want)  # 0: a limit is reached, and the study stops
        if want <= 0:
            return []
        take = self.choose(want)
        return self.add([], take) if take else []

    def choose(self, want: int) -> list[Proposal]:
        """Up to `want` proposals from `ready`, each on the current incumbent (re-based
        onto it, or sent to the proposer for repair)."""
        loop = self.loop
        incumbent = loop.ledger.get("incumbent")
        tried = {json.dumps(c.params, sort_keys=True) for c in loop.ledger.candidates()
                 if c.params and c.kind == Kind.CANDIDATE and c.parent == incumbent}
        take: list[Proposal] = []
        knobs = set(loop.config.tune.knobs)
        # repaired ones and changes going again first (asked first, and a stale winner
        # is the strongest lead), then those made on the incumbent, then the others
        self.ready.sort(key=lambda item: (not _among(item[1], self.first),
                                          item[0] != incumbent))
        conflicts: dict[str, list[Proposal]] = {}  # by the commit they were made on
        while len(take) < want and self.ready:
            base, proposal = self.ready.pop(0)
            self.first = [p for p in self.first if p is not proposal]
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
            take += moved
            # the proposer re-applies it meanwhile; the slot takes the next one
            conflicts.setdefault(base, []).extend(self.once(conflicting, base, incumbent))
            if key is not None:
                tried.add(key)
        for base, conflicting in conflicts.items():
            if conflicting:
                self.repair(base, incumbent, conflicting)
        return take

    def fill_beside(self) -> dict | None:
        """While a would-be keep is confirmed, the slots its pairs leave free take new
        candidates (they would idle for the whole confirmation) proposed on the would-be
        keep (`speculate`): on the incumbent if it is kept, as most would-be keeps that
        reach the pairs are. One started on the incumbent of the time instead would run
        stale then, measured against a better incumbent than the one it was made for.
        Refused, the would-be keep leaves them stale: judged as any stale candidate, on
        their own files against the incumbent's (judge.judge_group). Nothing is verified
        here: the writes are returned for the pairs' check to expect, and the new
        candidates join `loop.in_flight`, blamed with the others if anything else
        changes."""
        loop, led = self.loop, self.loop.ledger
        self.tally(None)
        if loop.stop.soft or self.confirming is None:
            return None
        pairs = len(led.confirming(self.confirming.id, Status.SUBMITTED))
        if not pairs:
            return None  # its pairs are measured: the verdict (or the next pair) is next
        # every other job placed runs in_flight; one that finished frees its slot
        busy = pairs + len(loop.jobs.poll(loop.in_flight))
        want = self.room_for(min(loop.parallel - busy, self.budget - self.made()))
        hold = self.confirming.commit_sha
        # (one that will never run waits for the verdict, as the rest of them: kept, it
        # is recorded as any on the incumbent is, within `record_unrunnable`'s limit)
        ahead = [item for item in self.ready if item[0] == hold and not item[1].error
                 and not self.loop.proposals.repeats(item[1])][:max(want, 0)]
        self.ready = [item for item in self.ready if not any(item is a for a in ahead)]
        spec = [p for _, p in ahead]
        if not spec or not hold:
            self.tally(busy)
            return None  # `ask_on` keeps a request on it in flight (`meanwhile`)
        created = loop.proposals.record(led.get("round"), led.get("incumbent"), [], [],
                                        stale=(hold, spec))
        loop.write_views()
        writes = self.loop.writes_of(created)
        for key in ("refs", "verdicts"):  # the judge's check after the settle expects them
            self.beside[key].update(writes[key])
        started = [c for c in created if c.status in OPEN_STATES]
        loop.in_flight += [c.id for c in started]
        self.open_ids += [c.id for c in started]
        loop.jobs.start(started, lambda: loop.stop.hard)
        self.tally(busy + len(started))
        return writes

    def carry(self) -> None:
        """The incumbent moved: what is ready is re-based onto it now, and a repair of
        what conflicts is asked for at once (ready before a slot needs it)."""
        incumbent = self.loop.ledger.get("incumbent")
        by_base: dict[str, list[Proposal]] = {}
        for base, proposal in self.ready:
            by_base.setdefault(base, []).append(proposal)
        self.ready = []
        for base, proposals in by_base.items():
            first = [p for p in proposals if _among(p, self.first)]
            rest = [p for p in proposals if not _among(p, self.first)]
            moved, conflicting = self.loop.proposals.on(base, incumbent, first)
            self.first += moved  # re-based, they keep their place
            self.ready += [(incumbent, p) for p in moved]
            more, conflicts = self.loop.proposals.on(base, incumbent, rest)
            self.ready += [(incumbent, p) for p in more]
            conflicting = self.once(conflicting + conflicts, base, incumbent)
            if conflicting:
                self.repair(base, incumbent, conflicting)

    def once(self, conflicting: list[Proposal], base: str, incumbent: str) -> list[Proposal]:
        """A proposal is repaired once: one that conflicts again (the incumbent moved
        again before a slot took it) is dropped, billed, rather than repaired again."""
        again = [p for p in conflicting if _among(p, self.repaired)]
        self.loop.proposals.drop(again, f"dropped: repaired once, and it conflicts again "
                                        f"(made on {base[:7]}, the incumbent is now "
                                        f"{incumbent[:7]})")
        return [p for p in conflicting if not _among(p, self.repaired)]

    def repair(self, base: str, incumbent: str, conflicting: list[Proposal]) -> None:
        """Ask the proposer to re-apply these on `incumbent` (on its thread; `collect`
        takes the answer). Before a proposal is dropped, it is repaired."""
        led = self.loop.ledger
        if self.room_for(len(conflicting)) < len(conflicting):
            self.loop.proposals.drop(conflicting, f"dropped: made on {base[:7]}, conflicts "
                                     f"with the incumbent {incumbent[:7]}, and a repair "
                                     "would cross the budget")
            return
        ctx = self.loop.proposals.context(self.ask_no(), incumbent, led.candidates(),
                                          led.get("incumbent_metric"))
        self.repairing.append((base, incumbent, len(conflicting),
                               self.loop.proposals.repair(base, incumbent, conflicting, ctx)))

    def meanwhile(self) -> dict | None:
        """While a confirmation waits for its pairs: replies are taken in and what will
        never run set aside, so a request for runnable ones goes out now, not when the
        confirmation ends; free slots take new candidates (`fill_beside`). Returns the
        trusted writes made (recording what will never run waits for the verdict)."""
        self.collect(record=False)
        if self.confirming is not None:
            self.ask_on(self.confirming)
        else:
            self.request(stop=False)
        return self.fill_beside()

    def collect(self, record: bool = True) -> None:
        """Answers that are in (proposals, repairs) join `ready`; never waits."""
        proposals = self.loop.proposals
        replies: list[tuple[str, int, list[Proposal]]] = []
        for key in list(self.asked):
            ahead = proposals.take_done(key)
            if ahead is None:
                continue
            asked = self.asked.pop(key)
            self.gated.discard(key)
            self.ideas.pop(key, None)  # its proposals carry them now (`taken`)
            base, future = ahead
            got = future.result()
            if not got:
                self.exhausted = True  # the proposer has nothing new: no more requests
            replies.append((base, asked, got))
            self.seen_at(got, self.asked_seq.pop(key, None))
            self.ready += [(base, p) for p in got]
        for item in [r for r in self.repairing if r[3].done()]:
            self.repairing.remove(item)
            base, incumbent, _, future = item
            repairs = future.result()
            proposals.drop_failed(repairs, base, incumbent)
            # first in line: asked before what is ready now (and a change that beat the
            # incumbent from an older one goes again before anything new)
            self.ready[:0] = [(incumbent, p) for p in repairs.repaired]
            self.repaired += repairs.repaired
            self.first += repairs.repaired
            self.conflicted += [(base, p) for p in repairs.unrepaired]
        self.set_aside()
        for base, asked, got in replies:
            self.tell_reply(base, asked, got)
        if record:
            self.record_unrunnable()

    def tell_reply(self, base: str, asked: int, got: list[Proposal]) -> None:
        """How much of a reply can run (what `set_aside` left in `ready`, no repeat of a
        candidate): it sizes the next requests (`widen`), and a reply with nothing
        runnable is not asked again while a verdict is coming (`barren`); the commit is
        `dry` until a reply on it has something runnable."""
        ready = [p for _, p in self.ready]
        runnable = sum(1 for p in got if _among(p, ready) and not p.error
                       and not self.loop.proposals.repeats(p))
        self.replies = [*self.replies, (asked, runnable)][-REPLIES_SEEN:]
        if not runnable:
            self.barren.add(self.asked_on(base))
            self.dry.add(base)
        else:
            self.dry.discard(base)

    def set_aside(self) -> None:
        """Proposals that will never run leave `ready` as they arrive, not when a slot
        needs one: they need no slot, and the request for the ones that will run goes
        out at once. They are a failed proposal, a duplicate, the files of an earlier
        candidate, or a change no proposer could re-apply on the incumbent (recorded, not
        dropped unseen: a queued patch would vanish)."""
        incumbent = self.loop.ledger.get("incumbent")
        # requests made side by side (a reply's K, or two replies in flight together)
        # may say the same thing twice: the copy is billed, not recorded (its twin is),
        # and is no sign that the proposer has run out of new changes
        # (`record_unrunnable`'s limit)
        twins = [p for _, p in self.ready if p.duplicate_of is not None] + self.twins()
        if twins:
            self.ready = [item for item in self.ready if not _among(item[1], twins)]
            self.loop.proposals.drop(twins, "dropped: the same change as another proposal "
                                     "in hand (made side by side)")
        # (those made on the would-be keep being confirmed, which run beside it, are
        # recorded where they run; a twin of theirs is dropped here too)
        hold = self.confirming.commit_sha if self.confirming else None
        out = [p for b, p in self.ready if (b == incumbent and (
            p.error or self.loop.proposals.repeats(p))) or (
            b == hold and self.loop.proposals.repeats(p) and self.repeats_unseen(p))]
        if out:
            self.ready = [item for item in self.ready if not _among(item[1], out)]
            late = [p for p in out if not p.error and self.repeats_unseen(p)]
            self.loop.proposals.drop(late, "dropped: the same files as a candidate recorded "
                                     "after it was asked for (made side by side)")
            self.unrunnable += [p for p in out if not _among(p, late)]
        self.unrunnable += [replace(proposal, files={}, commit=None, error=(
            f"conflicts with the incumbent {incumbent[:7]} it would run on (made on "
            f"{base[:7]})")) for base, proposal in self.conflicted]
        self.conflicted = []

    def seen_at(self, proposals: list[Proposal], seq: int | None) -> None:
        """Note what the proposer had been shown when it made `proposals`: the candidates
        before `seq` (when the request was asked)."""
        if seq is None:
            return
        for proposal in proposals:
            for call in proposal.calls:
                self.call_seq[call] = max(seq, self.call_seq.get(call, seq))

    def repeats_unseen(self, proposal: Proposal) -> bool:
        """Does it repeat only candidates the proposer was never shown: recorded after the
        request that made it was asked, or any for a repair (whose prompt shows the change
        and the incumbent's files, no other candidate)? Then it is the twin of a proposal
        made side by side, billed and not recorded (as `twins`), rather than a repeat of a
        tried change, which is recorded rejected (and is in the history the proposer is
        shown next)."""
        asked = [self.call_seq[c] for c in proposal.calls if c in self.call_seq]
        if _among(proposal, self.repaired):
            asked = [-1]
        if not asked or not proposal.commit:
            return False
        tried = [c for c in self.loop.proposals.tried() if c.commit_sha]
        trees = self.loop.proposals.trees([*(c.commit_sha or "" for c in tried),
                                           proposal.commit])
        mine = trees.get(proposal.commit)
        same = [c for c in tried if trees.get(c.commit_sha or "") == mine]
        return mine is not None and bool(same) and all(c.seq >= max(asked) for c in same)

    def twins(self) -> list[Proposal]:
        """Ready proposals with the same files as one ahead of them in `ready`."""
        built = [p for _, p in self.ready if p.commit and not p.error]
        trees = self.loop.proposals.trees([p.commit for p in built if p.commit])
        seen: set[str] = set()
        twins = []
        for proposal in built:
            tree = trees.get(proposal.commit or "")
            if tree is None:
                continue
            if tree in seen:
                twins.append(proposal)
            seen.add(tree)
        return twins

    def room_for(self, want: int) -> int:
        """How many of `want` more proposals the budget allows, counting those on their
        way (never stops the study: a request or a repair is only not sent)."""
        loop = self.loop
        if want <= 0 or not loop.config.budget.limits:
            return max(want, 0)
        loop.spent(fresh=True)
        coming = len(self.ready) + self.waiting_for()
        while want > 0 and loop.over_budget(want + coming, stop=False):
            want -= 1
        return want

    def asked_ideas(self) -> list[str]:
        return [idea for ideas in self.ideas.values() for idea in ideas]

    def record_unrunnable(self) -> None:
        """Recorded (rejected, with why). They take no room in the budget, but a study
        records at most `budget` of them: past that the proposer has little new to offer,
        no more is asked, and the rest are billed as unused."""
        if not self.unrunnable:
            return
        room = max(0, self.budget - self.unrun())
        take, rest = self.unrunnable[:room], self.unrunnable[room:]
        self.unrunnable = []
        if take:
            self.open_ids += self.add([], take)
        if rest:
            self.loop.proposals.drop(rest, "unused: as many proposals as the budget's "
                                     "candidates were repeats or failed")
            if not self.exhausted:
                self.exhausted = True
                self.loop.log(f"warning: {self.budget} proposals could not run (repeats of "
                              "tried changes, failed or conflicting proposals): no more "
                              "are asked for; the study ends with what is running")

    def asked_on(self, base: str) -> tuple[str, int]:
        """What a request on `base` is asked: the commit and the verdicts on runs it is
        shown (a repeat recorded unrun tells it nothing new)."""
        return base, sum(1 for c in self.loop.ledger.candidates()
                         if c.is_judged and not _unrun(c))

    def waiting_for(self) -> int:
        """Proposals on their way: asked for, or being repaired."""
        return sum(self.asked.values()) + sum(r[2] for r in self.repairing)

    def ask_no(self) -> int:
        """A number never asked before (the tuner seeds each ask with it; an agent's
        directory is named by it)."""
        self.asks = max(self.asks + 1, next_seq(self.loop.ledger) + len(self.ready))
        return self.asks

    def request(self, stop: bool = True) -> None:
        """Keep one request in flight, for as many slots as will need a candidate. With
        `stop`, a budget limit reached stops the study (else the request is only not
        sent)."""
        loop, led = self.loop, self.loop.ledger
        if self.exhausted or loop.stop.soft or any(k[0] == self.KEY for k in self.asked):
            return
        if self.open_ids and self.asked_on(led.get("incumbent")) in self.barren:
            return  # its last answer to this question had nothing runnable: a verdict first
        queued = len(self.ready) + len(self.conflicted) + self.waiting_for()
        want = min(loop.parallel, self.budget - self.made()) - queued
        if want <= 0:
            return
        want = (loop.affordable(want + queued, fresh=True) - queued if stop
                else self.room_for(want))
        if want <= 0:
            return  # what is ready is all the budget allows
        incumbent = led.get("incumbent")
        ctx = loop.proposals.context(self.ask_no(), incumbent, led.candidates(),
                                     led.get("incumbent_metric"),
                                     taken=[p for _, p in self.ready], asked=self.asked_ideas())
        self.ask((self.KEY, ctx.round), incumbent, want, ctx)

    def ask(self, key: tuple, base: str, want: int,
            ctx: ProposalContext) -> None:
        """One request for `want` runnable proposals: as many more as the last replies'
        share of runnable ones says it takes (within what the budget allows)."""
        asked = self.widen(want)
        if asked > want and self.loop.config.budget.limits:
            asked = max(want, self.room_for(asked))
        self.loop.proposals.ask_ahead(key, base, asked, ctx)
        self.asked[key] = asked
        self.asked_seq[key] = next_seq(self.loop.ledger)
        if base in self.dry:  # asked again only because a verdict came in
            self.gated.add(key)
        self.ideas[key] = ctx.ideas[:asked]  # the first `asked` go to this request

    def widen(self, want: int) -> int:
        """`want` over the runnable share of the last replies (a repeat, a failed
        proposal or a twin is not runnable), at most WIDEST times `want` and never more
        than twice the slots."""
        asked = sum(a for a, _ in self.replies)
        if not asked:
            return want
        share = max(sum(r for _, r in self.replies) / asked, 1 / WIDEST)
        return max(want, min(math.ceil(want / share), 2 * self.loop.parallel))

    def speculate(self, cand: Candidate) -> None:
        """A would-be keep goes into confirmation (the loop waits for its pairs): the
        next proposals are asked for on it now: the slots its pairs leave free run them
        (`fill_beside`), and if it is kept the rest are ready, made on the incumbent they
        will run on. If it is not, those that ran are stale (judged on their own files)
        and the rest were made on a commit that is not the incumbent: re-based onto it,
        repaired, or dropped (billed)."""
        self.confirming = cand
        self.ask_on(cand)

    def ask_on(self, cand: Candidate) -> None:
        """Keep one request in flight on the would-be keep `cand`, for the slots that
        will need a candidate if it is kept (what is ready on it, or on its way, counts)."""
        loop, led = self.loop, self.loop.ledger
        if self.exhausted or loop.stop.soft or not cand.commit_sha or any(
                key[0] == "on" and key[1] == cand.id for key in self.asked) or (
                self.asked_on(cand.commit_sha) in self.barren):
            return  # (a barren reply on it: its verdict first)
        queued = sum(1 for base, _ in self.ready if base == cand.commit_sha)
        want = self.room_for(min(loop.parallel, self.budget - self.made()) - queued)
        if want <= 0:
            return
        ctx = loop.proposals.context(self.ask_no(), cand.commit_sha, led.candidates(),
                                     cand.metric, taken=[p for _, p in self.ready],
                                     asked=self.asked_ideas())
        self.ask(("on", cand.id, ctx.round), cand.commit_sha, want, ctx)


def _unrun(cand: Candidate) -> bool:
    """Rejected before any job was placed for it."""
    return cand.status == Status.REJECTED and cand.job_id is None


def _among(proposal: Proposal, those: list[Proposal]) -> bool:
    """Is it one of `those` (the very object: equal proposals are distinct requests)?"""
    return any(proposal is p for p in those)
