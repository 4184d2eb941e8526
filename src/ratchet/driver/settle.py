"""The loop both policies share, and what happens after a verdict (the "tell" side):
settling a judged group (the judge's verdicts, the incumbent's pooled record, refs, the
integrity guard's snapshot) and confirming a would-be keep on fresh pairs beside the
incumbent.

Two policies drive it (driver/rounds.py, driver/rolling.py); proposals come from
driver/proposals.py.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from ratchet.core.candidate import Candidate
from ratchet.core.config import Config
from ratchet.core.errors import UserError
from ratchet.core.vocab import Kind, Status
from ratchet.driver import budget, judge, spend, views
from ratchet.driver.candidate import (
    study_ref,
)
from ratchet.driver.integrity import Guard, row_key
from ratchet.driver.jobs import Jobs
from ratchet.driver.proposals import Proposals
from ratchet.driver.spend import Spend
from ratchet.driver.views import reported_errors
from ratchet.job import gitrepo
from ratchet.job.faults import fault_point
from ratchet.job.jobspec import JobResult
from ratchet.store.ledger import Ledger

# a candidate row that still has work to do (proposed ones are never left over: a
# proposal is recorded committed or rejected in one transaction)
OPEN_STATES: tuple[str, ...] = (Status.COMMITTED, Status.SUBMITTED, Status.INTERRUPTED,
                                Status.FINISHED)


SPEND_FRESH_S = 0.5  # a summed spend is reused this long by the budget's checks


# A job this far into the run time of the would-be keep it runs beside (its pair takes
# about as long) is about to end: a look's size counts its slot free, and no candidate
# starts beside a pair this far in (driver/beside.py), where it would run alone after the
# verdict, the round waiting for it.
ENDING = 0.7


class ScheduleError(UserError):
    """The study cannot go on (e.g. the baseline failed); one line naming the cause."""


@dataclass
class StopFlag:
    """Ctrl-C once: finish judging what runs, start nothing new. Twice: cancel jobs."""

    count: int = 0

    def request(self) -> None:
        self.count += 1

    @property
    def soft(self) -> bool:
        return self.count >= 1

    @property
    def hard(self) -> bool:
        return self.count >= 2


def without_verdict(cand: Candidate) -> Candidate:
    """A candidate as it looked while it ran: no verdict, no measurement."""
    return replace(cand, status=Status.SUBMITTED, metric=None, samples=None, extra=None,
                   holdout=None, reasons=None, gain=None, margin=None, noise=None,
                   judged_at=None, finished_at=None, result=None)


# -- the loop's parts ----------------------------------------------------------------------


@dataclass
class Loop:
    """What both policies work with; made by the Study, which stays a thin front."""

    repo: Path
    config: Config
    ledger: Ledger
    jobs: Jobs
    guard: Guard
    proposals: Proposals
    stop: StopFlag
    parallel: int
    report: Callable[[int, int, list], None]
    write_views: Callable[[], None]
    log: Callable[[str], None]
    name: str = ""
    snapshot: dict = field(default_factory=dict)
    # what the last settle wrote to trusted state: (meta, verdicts by id)
    written: tuple[dict, dict] = field(default_factory=lambda: ({}, {}))
    # log lines about a judged round, held until its block is on screen (`progress`)
    held: list[str] = field(default_factory=list)
    target: int = 0  # the policy's rounds or candidates (the live view's denominator)
    # candidates whose jobs run while a would-be keep is confirmed (rolling): any of them
    # could tamper meanwhile, so a tampering check then names them all, not one
    in_flight: list[str] = field(default_factory=list)
    # told when a would-be keep goes into confirmation, before its pairs run (rolling
    # asks for proposals on it then, so they are ready if it is kept)
    on_confirm: Callable[[Candidate], None] | None = None
    # called while a confirmation waits for its pairs: the policy may take in replies,
    # ask the proposer and start candidates in the slots the pairs leave free; it returns
    # its own writes to the trusted state (Guard.expect's keywords), which the pairs'
    # check then expects, and adds the candidates it started to `in_flight`
    meanwhile: Callable[[], dict | None] | None = None
    # the trusted state when a confirmation's last pairs were checked (their rows and the
    # policy's writes meanwhile included): a policy whose jobs ran beside them checks
    # the verdict's writes against it (rounds' `beside`)
    after_pairs: dict | None = None
    # the study's spend as last summed (time.monotonic(), Spend): budget checks reuse it
    # briefly, the rolling loop asks many times a second
    _spent: tuple[float, Spend] | None = None

    # -- the budget ([budget], driver/budget.py) ---------------------------------------------

    def spent(self, fresh: bool = False) -> Spend:
        """The study's spend (summed at most SPEND_FRESH_S ago, or now when `fresh`)."""
        now = time.monotonic()
        if fresh or self._spent is None or now - self._spent[0] > SPEND_FRESH_S:
            self._spent = (now, spend.summary(self.ledger))
        return self._spent[1]

    def room(self, want: int) -> int:
        """How many of `want` new candidates budget.candidates leaves room for."""
        if self.config.budget.candidates is None:  # no count to check: no rows to read
            return want
        return budget.room(self.config.budget, self.ledger.candidates(), want)

    def over_budget(self, next_candidates: int, next_wall_h: float = 0.0,
                    stop: bool = True) -> bool:
        """Has the study reached a limit, or would `next_candidates` more cross one? With
        `stop`, the study then stops as a first Ctrl-C stops it (nothing new; what runs is
        finished and judged), and the limit is recorded and said in one line."""
        if not self.config.budget.limits:
            return False
        cands = self.ledger.candidates()
        if self.config.budget.candidates is not None and not self.room(next_candidates or 1):
            made = float(budget.made(cands))
            reached: budget.Reached | None = budget.Reached(
                "candidates", made, float(self.config.budget.candidates))
        else:
            reached = budget.check(self.config.budget, self.spent(), cands, next_candidates,
                                   next_wall_h)
        if reached is None:
            return False
        if stop and not self.stop.soft:
            self.ledger.set(budget_stop={**reached.as_dict(), "line": reached.line()})
            self.ledger.event("budget-stop", None, **reached.as_dict())
            self.stop.request()  # its line is said once, at the end (`budget_stop`)
        return True

    def affordable(self, want: int, fresh: bool = False) -> int:
        """The most of `want` new candidates that cross no limit (rolling asks for
        candidates one by one); 0 stops the study at the limit, and says it. `fresh`: on
        the spend as it is now (before a request: the last reply may be seconds old)."""
        if fresh and self.config.budget.limits:
            self.spent(fresh=True)
        want = self.room(want)
        while want > 0 and self.over_budget(want, stop=False):
            want -= 1
        if want == 0 and self.config.budget.limits:
            self.over_budget(1)  # the limit, said once; the study stops
        return want

    def progress(self, round_no: int, target: int, running: list) -> None:
        """Report progress, then the lines held back: the view prints a judged round's
        block when the next round's progress arrives, and a line about that round
        (`keep ...`) reads after it, not above it."""
        self.report(round_no, target, running)
        self.release()

    def release(self) -> None:
        held, self.held = self.held, []
        for line in held:
            self.log(line)

    def finish(self, target: int) -> None:
        """The study stops: one last progress report shows the last judged round's block
        before the lines held about it."""
        if self.held:
            with contextlib.suppress(Exception):  # already failing: the lines still count
                self.report(self.ledger.get("round"), target, [])
            self.release()

    # -- trusted state while candidates run -----------------------------------------------

    def verify(self, before: dict, ids: list[str], **writes: dict) -> dict:
        """Trusted state must be `before` plus our own `writes` (Guard.expect); anything
        else was written by a running candidate: restored, and the candidates that ran
        (`ids`) are rejected and stopped. Returns the new trusted state."""
        expected = self.guard.expect(before, **writes)
        if not self.guard.check(expected, ids):
            return expected
        rejected = [c for c in (self.ledger.row(i) for i in ids)
                    if c.status == Status.REJECTED]
        for cand in rejected:
            if cand.job_id:
                self.jobs.cancel(cand)  # rejected while it ran: stop it, free its slot
        # what they wrote until they were stopped is undone too (never taken as trusted)
        expected = self.guard.expect(expected, verdicts={c.id: (c.status, c.metric)
                                                         for c in rejected})
        self.guard.check(expected, ids)
        self.write_views()
        return self.guard.expect(expected)

    def writes_of(self, created: list[Candidate]) -> dict[str, dict]:
        """The trusted state recording `created` wrote (Guard.expect's keywords): their
        rows, their refs, and the verdicts of those judged as they were recorded."""
        return {"refs": {study_ref(self.name, c.id): c.commit_sha for c in created
                         if c.commit_sha and c.kind == Kind.CANDIDATE},
                "verdicts": {c.id: (c.status, c.metric) for c in created if c.is_judged},
                "rows": {c.id: row_key(c) for c in created}}

    # -- judging (the ledger side of the pure judge) -------------------------------------

    def settle(self, ids: list[str], on_keep: dict | None = None) -> str | None:
        """Judge the finished candidates among `ids` together; promote the best improving
        one. Verdicts and the new incumbent are one transaction, then the branch moves."""
        # confirmation rows are measured by the confirmation of their candidate, not judged
        finished = [c for c in (self.ledger.row(i) for i in ids)
                    if c.status == Status.FINISHED and c.kind != Kind.CONFIRM]
        unbound = self._reject_unbound(finished)
        finished = [c for c in finished if c.id not in unbound]
        if not finished:
            if unbound:
                self.written = ({}, unbound)
            return None
        led = self.ledger
        held = self.guard.held()  # trusted: checked just before; candidates run on
        incumbent = led.incumbent()
        by_id = {c.id: c for c in finished}
        pooled = measurements(led, exclude_confirming=set(by_id)).get(incumbent.commit or "")
        if pooled:  # every judged evaluation of the incumbent's commit, from the rows
            incumbent.samples, incumbent.metric = pooled, statistics.fmean(pooled)
        confirming = Confirming(self, by_id, incumbent.commit)
        entries = [judge.Entry(id=c.id, kind=c.kind, seq=c.seq, commit=c.commit_sha,
                               result=JobResult.from_json(json.dumps(c.result)),
                               based_on_incumbent=True if c.kind != Kind.CANDIDATE else
                               partial(_descends, self.repo, c.commit_sha, incumbent.commit))
                   for c in finished]
        try:
            decision = judge.judge_group(self.config, entries, incumbent,
                                         holdout=lambda e: self.jobs.holdout(by_id[e.id]),
                                         confirmation=confirming.confirmation())
        except Interrupted:
            return None  # nothing judged: a resume confirms on the same pairs
        if self.config.acceptance.noise == "ignore" and decision.winner is not None:
            self.held.append("warning: acceptance.noise = \"ignore\": this keep rests on one "
                             "measurement, not on a confirmation beyond the noise")
        new = decision.incumbent
        meta: dict = {}
        if new != incumbent:
            meta.update(led.incumbent_meta(new))
        if decision.winner is not None:
            meta.update(incumbent=new.commit, **(on_keep or {}))
        verdicts = dict(decision.verdicts)
        for row_id, reason in confirming.used.items():  # the pairs measured, as references
            verdicts[row_id] = judge.Verdict(Status.REFERENCE, [reason],
                                             code=judge.Reason.REFERENCE)
        now = time.time()
        with led.transaction():
            moved = self.guard.moved_since(held)  # under the write lock, before we write
            for cand_id, verdict in verdicts.items():
                if led.row(cand_id).status == Status.REJECTED:
                    continue  # rejected meanwhile (tampering while it was confirmed)
                confirmation = verdict.confirmation
                led.judge(cand_id, verdict, now)
                if confirmation is not None:
                    led.event("confirmation", cand_id, step=confirmation.step,
                              pairs=confirmation.pairs, t=confirmation.t,
                              critical=confirmation.critical, reason=confirmation.reason)
            if meta:
                led.set(**meta)
        fault_point("verdicts")
        judged = led.rows(list(verdicts))  # one read of them all
        self.written = (meta, {**unbound, **{c.id: (c.status, c.metric) for c in judged}})
        for cand in finished:
            if cand.idea:
                led.mark_idea(cand.idea, cand.id, decision.verdicts[cand.id].status)
            self.proposals.observe(led.row(cand.id))
        self.jobs.clean_up(finished)
        for cand_id, verdict in decision.verdicts.items():
            if verdict.code in (judge.Reason.NOT_CONFIRMED, judge.Reason.NO_NOISE):
                # it looked better once; the fresh pairs say the gain is inside the noise
                # (the test's numbers are `ratchet show`'s: a line fits 80 columns)
                self.held.append(f"{cand_id} not kept: its gain is inside the measured noise "
                                 f"({verdict.reasons[-1].split(': ')[0]})")
        problems = [f"study state in the ledger changed ({', '.join(moved)})"] if moved else []
        if not self.guard.move_branch(led.get("incumbent"), held):
            problems.append("the study branch was moved")
        if problems:
            self.blame(problems)
        if decision.winner is not None:
            winner = led.row(decision.winner)
            test = decision.verdicts[winner.id].confirmation
            line = views.fit(f"keep {winner.id} {winner.short}: {winner.description}",
                             views.LINE_WIDTH)
            if test is not None:  # how it was confirmed; the test's numbers: `ratchet show`
                line += f"\n  {test.reason.split(': ')[0]} (`ratchet show {winner.id}`)"
            self.held.append(line)
        self.write_views()
        return decision.winner

    def blame(self, problems: list[str]) -> None:
        """Tampering between the last check and the verdict: only the candidates running
        then could have done it (those judged now had ended, their trees killed)."""
        for cand_id in self.guard.blame(problems, self.in_flight):
            cand = self.ledger.row(cand_id)
            if cand.job_id:
                self.jobs.cancel(cand)  # rejected while it ran: stop it, free its slot

    def _reject_unbound(self, finished: list[Candidate]) -> dict[str, tuple]:
        """The judge judges the commit a candidate's ref names; a ledger row naming another
        commit was rewritten behind the driver's back (integrity.Guard.mismatched).
        Returns the verdicts written, {id: (status, metric)}."""
        written = {}
        for cand_id, named in self.guard.mismatched(finished).items():
            self.ledger.reject(cand_id, "tampering: the ledger's commit is not the one its "
                               "ref names", time.time(), commit_sha=named)
            written[cand_id] = ("rejected", self.ledger.row(cand_id).metric)
        return written

    def check_baseline(self, ids: list[str]) -> None:
        for cand in (self.ledger.row(i) for i in ids):
            if cand.kind == Kind.BASELINE and cand.status in (Status.CRASH, Status.REJECTED):
                raise ScheduleError(
                    f"the baseline (unmodified {cand.short}) failed, so nothing can be "
                    f"compared: {cand.reasons} (see `ratchet logs {cand.id}`; fix the task, "
                    f"commit, and start afresh: ratchet reset, then ratchet run; the "
                    f"old study is archived, not deleted)")

    def ensure_refs(self, cands: list[Candidate]) -> None:
        """Resumed: the driver may have died before a candidate's ref was written."""
        self.proposals.clear_planted([c.id for c in cands if c.commit_sha])
        for cand in cands:
            if cand.commit_sha and cand.kind == Kind.CANDIDATE:
                ref = study_ref(self.name, cand.id)
                if gitrepo.try_rev_parse(self.repo, ref) != cand.commit_sha:
                    gitrepo.update_ref(self.repo, ref, cand.commit_sha)

    def fixed_rows(self, incumbent: str) -> list[dict]:
        """The baseline (once per study), or a co-run reference of the incumbent."""
        if not any(c.kind == Kind.BASELINE for c in self.ledger.candidates()):
            # the baseline, and the rest of the A/A noise floor (acceptance.noise_floor)
            floor = self.config.acceptance.noise_floor
            return [dict(kind=Kind.BASELINE, parent=incumbent, commit_sha=incumbent,
                         description="baseline", status=Status.COMMITTED)] + [
                dict(kind=Kind.INCUMBENT, parent=incumbent, commit_sha=incumbent,
                     status=Status.COMMITTED,
                     description=f"baseline re-measured (noise floor {i + 2}/{floor})")
                for i in range(floor - 1)]
        if self.config.acceptance.co_run_incumbent and self.config.search.mode == "rounds":
            return [dict(kind=Kind.INCUMBENT, parent=incumbent, commit_sha=incumbent,
                         status=Status.COMMITTED, description="incumbent re-measured (reference)")]
        return []


class Confirming:
    """Fresh pairs for the confirmation of a would-be keep: the candidate and the incumbent
    measured side by side (two jobs placed together, on the same backend and slot kind),
    one pair at a time as the sequential test asks.

    Write-ahead like every job: a pair's two rows (kind confirm, `confirms` = the
    candidate) are in the ledger before their jobs exist, so a resumed study measures the
    pairs it had and only those it still needs: the same test on the same numbers.
    """

    def __init__(self, loop: Loop, group: dict[str, Candidate], incumbent: str | None) -> None:
        self.loop, self.group, self.incumbent = loop, group, incumbent
        self.used: dict[str, str] = {}  # confirmation row id -> its reference reason
        self.told: set[str] = set()  # would-be keeps `loop.on_confirm` was told of

    def confirmation(self) -> judge.Confirmation:
        led, name = self.loop.ledger, self.loop.config.metric.name
        # the noise pool: every judged evaluation of every commit; the pairs of the
        # candidates judged now join it through the confirmation itself
        groups = measurements(led, exclude_confirming=set(self.group))
        # the pairs of every earlier confirmation: (candidate, incumbent) in the order made
        earlier: dict[str, list[Candidate]] = {}
        for row in led.candidates(confirmations=True):
            if row.confirms and row.confirms not in self.group \
                    and row.status == Status.REFERENCE:
                earlier.setdefault(row.confirms, []).append(row)
        pairs = []
        for rows in earlier.values():
            rows.sort(key=lambda r: -r.seq)
            got = [(c.metric, i.metric) for c, i in zip(rows[::2], rows[1::2], strict=False)
                   if c.metric is not None and i.metric is not None]
            if got:
                pairs.append(got)
        return judge.Confirmation(measure=self.measure, groups=groups,
                                  reported=reported_errors(led, name), pairs=pairs,
                                  next_look=self.next_look)

    def next_look(self, cand_id: str, measured: int) -> int:
        """How many pairs the next look adds: the pairs already recorded beyond the
        `measured` ones (a resumed confirmation looks where it looked before), else as
        many as the slots left free by other jobs hold, at most K/2 and at least one. The
        free slots depend on other jobs, never on the pairs' values: the looks' spending
        (stats.Design.bound_at) holds the rate for any such schedule."""
        recorded = len(self.rows(cand_id)) // 2 - measured
        if recorded > 0:
            return recorded
        loop = self.loop
        # a job beside the pairs this far into the would-be keep's own run time ends
        # about when this look starts: its slot is the look's (else it idles the look)
        typical = self.group[cand_id].run_s if cand_id in self.group else None
        running = loop.jobs.poll(loop.in_flight) if loop.in_flight else []
        busy = sum(1 for *_, seconds, _ in running
                   if not typical or seconds < ENDING * typical)
        return max(1, min(loop.parallel // 2, (loop.parallel - busy) // 2))

    def rows(self, cand_id: str) -> list[Candidate]:
        # in the order made
        return sorted(self.loop.ledger.confirming(cand_id), key=lambda c: -c.seq)

    def measure(self, entry: judge.Entry, need: int) -> list[tuple[float, float]] | str:
        loop, led = self.loop, self.loop.ledger
        cand = self.group[entry.id]
        if loop.on_confirm is not None and cand.id not in self.told:
            self.told.add(cand.id)
            loop.on_confirm(cand)
        rows = self.rows(cand.id)
        while len(rows) < 2 * need:
            pair = len(rows) // 2 + 1
            with led.transaction():  # both sides of a pair, or neither
                rows += [led.new_confirmation(cand, commit, f"confirm {cand.id}: pair {pair}, "
                                              f"{side}", parent=self.incumbent)
                         for side, commit in (("candidate", cand.commit_sha),
                                              ("incumbent", self.incumbent))]
            fault_point("confirm-recorded")
        rows = rows[:2 * need]
        ids = [r.id for r in rows]
        waiting = [r for r in rows if r.status not in (Status.FINISHED, Status.REFERENCE)]
        if waiting:
            loop.after_pairs = None  # set again once these pairs are checked
            trusted = loop.guard.snapshot()  # the candidate's code runs again
            loop.jobs.start(waiting, lambda: loop.stop.hard)
            def report(running: list) -> None:
                nonlocal trusted
                loop.report(led.get("round"), loop.target or led.get("round"), running)
                if loop.meanwhile is not None:
                    writes = loop.meanwhile()
                    if writes:  # the policy's own: anything else is tampering
                        trusted = loop.guard.expect(trusted, **writes)

            loop.jobs.wait(ids, report, lambda: loop.stop.hard)
            if loop.guard.check(trusted, [cand.id, *loop.in_flight]):
                return "tampering while it was re-measured"
            loop.after_pairs = trusted  # where the policy's check after the verdict starts
            if loop.stop.hard:
                raise Interrupted("interrupted while confirming " + cand.id)
            fault_point("confirm-measured")
        pairs: list[tuple[float, float]] = []
        for i in range(0, len(ids), 2):
            c, inc = led.row(ids[i]), led.row(ids[i + 1])
            for row in (c, inc):
                self.used[row.id] = row.description
            failed = [r for r in (c, inc) if r.metric is None or judge.outcome_status(
                JobResult.from_json(json.dumps(r.result))) is not None]
            if failed:
                return f"confirmation run {failed[0].id} failed ({failed[0].reasons or 'no metric'})"
            if c.metric is not None and inc.metric is not None:  # else in `failed` above
                pairs.append((c.metric, inc.metric))
        return pairs


class Interrupted(Exception):
    """Ctrl-C twice during a confirmation: nothing is judged; a resume measures on."""


def measurements(ledger: Ledger, exclude_confirming: AbstractSet[str] = frozenset()
                 ) -> dict[str, list[float]]:
    return ledger.evaluations(exclude_confirming)


def _descends(repo: Path, commit: str | None, ancestor: str | None) -> bool:
    if not commit or not ancestor:
        return False
    proc = subprocess.run(gitrepo.git_argv(repo, "merge-base", "--is-ancestor", ancestor,
                                           commit), capture_output=True, env=gitrepo.git_env())
    return proc.returncode == 0
