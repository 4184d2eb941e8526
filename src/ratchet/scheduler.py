"""Scheduling: which candidates run when, and who is asked for the next ones.

Two policies over the same parts (jobs, judge, integrity, proposals):

- **rounds**: propose K from the incumbent, run them, judge them together, promote the
  best, repeat. While a round runs, the next round's proposals are already being made.
- **rolling**: a freed slot gets a new candidate from the current incumbent at once; a
  finished candidate is judged at once (with the same noise, hold-out and integrity
  rules); the budget is a number of candidates.

Proposals ahead: the proposer works in a background thread while jobs run, so no slot
waits for an LLM, an agent or the tuner when it could have been asked earlier. A proposal
made ahead was made on the incumbent of its time; if the incumbent moves before it is
used, its change is carried onto the new incumbent by a three-way merge (re-based), and
when that conflicts it is dropped and the proposer is asked again.

In rounds mode the proposals for round R are always made from the same view of the
ledger: round R-1 in flight (verdicts hidden) on its own incumbent. Whether they were
made ahead or after a restart, a resumed study proposes exactly what an uninterrupted
one would.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from ratchet import gitrepo, judge
from ratchet.candidate import (
    Proposal,
    make_commit,
    materialise,
    rebase,
    scope_violations,
    study_ref,
)
from ratchet.config import Config
from ratchet.errors import UserError
from ratchet.faults import fault_point
from ratchet.integrity import Guard, row_key
from ratchet.jobs import Jobs
from ratchet.jobspec import JobResult
from ratchet.ledger import Candidate, Kind, Ledger, Status
from ratchet.proposers import ProposalContext, Proposer, make_proposer
from ratchet.views import reported_errors

# a candidate row that still has work to do (proposed ones are never left over: a
# proposal is recorded committed or rejected in one transaction)
OPEN_STATES: tuple[str, ...] = (Status.COMMITTED, Status.SUBMITTED, Status.INTERRUPTED,
                                Status.FINISHED)


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


# -- proposals, made ahead in a background thread ----------------------------------------


class Proposals:
    """The proposer behind one worker thread: `observe` and `propose` calls run in order
    there, never on the loop that polls jobs. Only the loop touches the ledger."""

    def __init__(self, repo: Path, state_dir: Path, config: Config, ledger: Ledger,
                 kind: str) -> None:
        self.repo, self.state_dir, self.config, self.ledger = repo, state_dir, config, ledger
        self.kind = kind
        self.name = config.task.name
        self._proposer: Proposer | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ratchet-propose")
        self._ahead: dict[object, tuple[str, Future]] = {}  # key -> (base commit, proposals)
        self._checked: dict[tuple[str, str], list[str]] = {}  # (parent, commit) -> problems
        self._trees: dict[str, str] = {}  # commit -> its tree (a commit's tree never changes)

    @property
    def proposer(self) -> Proposer:
        if self._proposer is None:
            self._proposer = make_proposer(self.kind, self.config, self.ledger.candidates())
        return self._proposer

    def warm_up(self) -> None:
        """The proposer loads its clients and shared context on its thread, first in line
        (a failure here shows again, with its cause, at the first propose)."""
        self._pool.submit(_quietly, self.proposer.warm_up)

    def close(self) -> None:
        for _, future in self._ahead.values():
            future.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def context(self, round_no: int, incumbent: str, history: list[Candidate],
                incumbent_metric: float | None,
                taken: Iterable[Proposal] = ()) -> ProposalContext:
        """What the proposer sees. `taken`: proposals made but not recorded yet; their
        ideas are still pending in the ledger, and must not be handed out twice."""
        self.import_ideas()
        busy = {p.idea for p in taken if p.idea}
        return ProposalContext(
            repo=self.repo, state_dir=self.state_dir, config=self.config, study=self.name,
            round=round_no, incumbent=incumbent, incumbent_metric=incumbent_metric,
            history=history, ideas=[row["text"] for row in self.ledger.pending_ideas()
                                    if row["text"] not in busy])

    def import_ideas(self) -> None:
        """People's ideas.md joins the ideas table (new bullets only)."""
        from ratchet.ideas import import_ideas

        import_ideas(self.repo, self.ledger)

    def ask(self, k: int, ctx: ProposalContext) -> Future:
        proposer = self.proposer  # built here: its errors belong to the caller
        return self._pool.submit(proposer.propose, k, ctx)

    def ask_ahead(self, key: object, base: str, k: int, ctx: ProposalContext | None,
                  future: Future | None = None) -> None:
        """Start proposing for `key` now (or keep `future` as that request)."""
        if key not in self._ahead:
            if future is None:
                if ctx is None:
                    raise ValueError("ask_ahead needs a context or a future")
                proposer = self.proposer
                future = self._pool.submit(self._propose_and_build, proposer, k, ctx, base)
            self._ahead[key] = (base, future)

    def _propose_and_build(self, proposer: Proposer, k: int, ctx: ProposalContext,
                           base: str) -> list[Proposal]:
        """Propose, then build the commits on `base` too (git plumbing, off the loop):
        when the incumbent has not moved, recording them costs no git work."""
        proposals = proposer.propose(k, ctx)
        built = []
        for i, proposal in enumerate(proposals):
            if not proposal.error and not proposal.commit:
                with contextlib.suppress(gitrepo.GitError):  # recording reports it
                    commit = make_commit(self.repo, base, proposal, f"ahead {ctx.round}.{i}")
                    proposal = replace(proposal, commit=commit, files={})
                    self._checked[(base, commit)] = scope_violations(
                        self.repo, self.config, base, commit)
            built.append(proposal)
        return built

    def take_ahead(self, key: object) -> tuple[str, Future] | None:
        return self._ahead.pop(key, None)

    def has_ahead(self, key: object) -> bool:
        return key in self._ahead

    def observe(self, cand: Candidate) -> None:
        if self._proposer is not None:
            self._pool.submit(_quietly, self._proposer.observe, cand)

    def on(self, base: str, incumbent: str, proposals: list[Proposal]) -> tuple[
            list[Proposal], list[Proposal]]:
        """Carry proposals made on `base` onto `incumbent`: (re-based, conflicting)."""
        if base == incumbent:
            return proposals, []
        moved = [(p, rebase(self.repo, p, base, incumbent) or self._retune(p, incumbent))
                 for p in proposals]
        return [m for _, m in moved if m is not None], [p for p, m in moved if m is None]

    def _retune(self, proposal: Proposal, incumbent: str) -> Proposal | None:
        """Settings of declared knobs (`tune.knobs`) are re-applied on the new incumbent,
        where a text merge of the same line would conflict."""
        from ratchet.proposers.knobs import KnobError, set_knob

        knobs = self.config.tune.knobs
        params = proposal.params or {}
        if proposal.error or not params or not set(params) <= set(knobs):
            return None
        files: dict[str, bytes | None] = {}
        try:
            for key, value in params.items():
                file, _, name = key.rpartition(":")
                source = files.get(file) or gitrepo.show(self.repo, incumbent, file)
                files[file] = set_knob(source, name, value, file)
        except (KnobError, gitrepo.GitError):
            return None
        return replace(proposal, files=files, commit=None)

    def record(self, round_no: int, incumbent: str, proposals: list[Proposal],
               rows: list[dict], proposer: str | None = None,
               stale: tuple[str, list[Proposal]] | None = None) -> list[Candidate]:
        """Commit every proposal on the incumbent (`stale` ones on the older commit they
        were made on), then record them and `rows` (baseline or reference) in one
        transaction: a crash between leaves no half-proposed batch."""
        base_seq = next_seq(self.ledger) + len(rows)
        items = [(incumbent, p) for p in proposals] + (
            [(stale[0], p) for p in stale[1]] if stale else [])
        with ThreadPoolExecutor(max_workers=min(4, max(1, len(items)))) as pool:
            built = list(pool.map(
                lambda item: materialise(self.repo, self.state_dir, self.config, item[1][1],
                                         item[1][0], f"c{base_seq + item[0]:04d}",
                                         proposer or self.kind, dict(self._checked)),
                enumerate(items)))
        rows = [*rows, *self._reject_repeats(built)]
        fault_point("proposed")
        created = []
        with self.ledger.transaction():
            for fields in rows:
                fields = dict(fields)
                kind = fields.pop("kind", "candidate")
                created.append(self.ledger.new_candidate(round_no, kind=kind, **fields))
        fault_point("recorded")
        self.clear_planted([c.id for c in created if c.commit_sha])
        refs = "".join(f"update {study_ref(self.name, c.id)} {c.commit_sha}\n"
                       for c in created if c.commit_sha and c.kind == "candidate")
        if refs:  # every candidate keeps a ref, kept or not (one git call for all)
            gitrepo.git(self.repo, "update-ref", "--stdin", input=refs.encode())
        for cand, fields in zip(created, rows, strict=True):
            if cand.idea:  # a proposal that failed outright is that idea's outcome
                self.ledger.mark_idea(cand.idea, cand.id,
                                      "rejected" if cand.status == "rejected" else None)
            if cand.status == "rejected":
                self.ledger.event("rejected", cand.id, reasons=fields.get("reasons"))
        return created

    def clear_planted(self, ids: list[str]) -> None:
        """Refs nested under a new candidate's ref name (refs/ratchet/<study>/c0002/x) were
        never written by ratchet and would keep its own ref from being written: removed."""
        if not ids:
            return
        prefixes = tuple(f"{study_ref(self.name, i)}/" for i in ids)
        listed = gitrepo.git(self.repo, "for-each-ref", "--format=%(refname)",
                             f"refs/ratchet/{self.name}/").splitlines()
        planted = [ref for ref in listed if ref.startswith(prefixes)]
        if planted:
            gitrepo.git(self.repo, "update-ref", "--stdin",
                        input="".join(f"delete {ref}\n" for ref in planted).encode())
            self.ledger.event("tampering", None, planted_refs=planted)

    def _reject_repeats(self, built: list[dict]) -> list[dict]:
        """No candidate repeats an earlier one (whoever proposed either): the same tree is
        the same experiment. A repeat is recorded as rejected and never run."""
        earlier = [c for c in self.ledger.candidates() if c.commit_sha]
        fresh = [f for f in built if f.get("status") == "committed" and f.get("commit_sha")]
        if not fresh:
            return built
        shas = [c.commit_sha for c in earlier] + [f["commit_sha"] for f in fresh]
        unknown = [sha for sha in dict.fromkeys(shas) if sha not in self._trees]
        if unknown:  # one git call for the tree ids not seen before
            self._trees.update(zip(unknown, gitrepo.git(
                self.repo, "rev-parse", *(f"{sha}^{{tree}}" for sha in unknown)).split(),
                strict=True))
        trees = [self._trees[sha] for sha in shas]
        seen = {tree: cand.id for tree, cand in zip(trees, earlier, strict=False)}
        position = {id(f): len(earlier) + i for i, f in enumerate(fresh)}
        out = []
        for fields in built:
            if id(fields) in position:
                tree = trees[position[id(fields)]]
                if tree in seen:
                    fields = {**fields, "status": "rejected",
                              "reasons": f"same files as {seen[tree]} (a repeat is not run)"}
                else:
                    seen[tree] = "another proposal of this batch"
            out.append(fields)
        return out


def _quietly(call: Callable, *args) -> None:
    with contextlib.suppress(Exception):  # a proposer's bookkeeping never stops the study
        call(*args)


def next_seq(ledger: Ledger) -> int:
    row = ledger.db.execute("SELECT COALESCE(MAX(seq), -1) + 1 AS n FROM candidates")
    return row.fetchone()["n"]


def _hidden(cand: Candidate) -> Candidate:
    """A candidate as it looked while it ran: no verdict, no measurement."""
    return replace(cand, status="submitted", metric=None, samples=None, extra=None,
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
        incumbent = led.incumbent()
        by_id = {c.id: c for c in finished}
        pooled = measurements(led, exclude_confirming=set(by_id)).get(incumbent.commit or "")
        if pooled:  # every judged evaluation of the incumbent's commit, from the rows
            incumbent.samples, incumbent.metric = pooled, statistics.fmean(pooled)
        confirming = Confirming(self, by_id, incumbent.commit)
        entries = [judge.Entry(id=c.id, kind=c.kind, seq=c.seq, commit=c.commit_sha,
                               result=JobResult.from_json(json.dumps(c.result)),
                               based_on_incumbent=True if c.kind != "candidate" else
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
            for cand_id, verdict in verdicts.items():
                if led.row(cand_id).status == Status.REJECTED:
                    continue  # rejected meanwhile (tampering while it was confirmed)
                confirmation = verdict.confirmation
                led.update(cand_id, f"judged:{verdict.status}", status=verdict.status,
                           reasons="; ".join(r for r in verdict.reasons if r) or None,
                           gain=verdict.gain, margin=verdict.margin, noise=verdict.noise,
                           code=verdict.code, judged_at=now)
                if confirmation is not None:
                    led.event("confirmation", cand_id, step=confirmation.step,
                              pairs=confirmation.pairs, t=confirmation.t,
                              critical=confirmation.critical, reason=confirmation.reason)
            if meta:
                led.set(**meta)
        fault_point("verdicts")
        self.written = (meta, {**unbound, **{i: (led.row(i).status, led.row(i).metric)
                                             for i in verdicts}})
        for cand in finished:
            if cand.idea:
                led.mark_idea(cand.idea, cand.id, decision.verdicts[cand.id].status)
            self.proposals.observe(led.row(cand.id))
        self.jobs.clean_up(finished)
        for cand_id, verdict in decision.verdicts.items():
            if verdict.code in (judge.Reason.NOT_CONFIRMED, judge.Reason.NO_NOISE):
                # it looked better once; the fresh pairs say the gain is inside the noise
                self.held.append(f"{cand_id} not kept: its gain is inside the measured noise "
                                 f"({verdict.reasons[-1]})")
        if decision.winner is not None:
            self.guard.repair_branch()  # moves the branch to the new incumbent
            winner = led.row(decision.winner)
            test = decision.verdicts[winner.id].confirmation
            why = f" ({test.reason})" if test is not None else ""
            self.held.append(f"keep {winner.id} {winner.short}: {winner.description}{why}")
        self.write_views()
        return decision.winner

    def _reject_unbound(self, finished: list[Candidate]) -> dict[str, tuple]:
        """The judge judges the commit a candidate's ref names; a ledger row naming another
        commit was rewritten behind the driver's back (integrity.Guard.mismatched).
        Returns the verdicts written, {id: (status, metric)}."""
        written = {}
        for cand_id, named in self.guard.mismatched(finished).items():
            restore = {"commit_sha": named} if named else {}
            self.ledger.update(cand_id, "judged:rejected", status="rejected",
                               reasons="tampering: the ledger's commit is not the one its "
                                       "ref names", judged_at=time.time(), **restore)
            written[cand_id] = ("rejected", self.ledger.row(cand_id).metric)
        return written

    def check_baseline(self, ids: list[str]) -> None:
        for cand in (self.ledger.row(i) for i in ids):
            if cand.kind == "baseline" and cand.status in ("crash", "rejected"):
                raise ScheduleError(
                    f"the baseline (unmodified {cand.short}) failed, so nothing can be "
                    f"compared: {cand.reasons} (see `ratchet logs {cand.id}`; fix the task, "
                    f"commit, and start afresh: rm -rf .ratchet && git branch -D "
                    f"ratchet/{self.name})")

    def ensure_refs(self, cands: list[Candidate]) -> None:
        """Resumed: the driver may have died before a candidate's ref was written."""
        self.proposals.clear_planted([c.id for c in cands if c.commit_sha])
        for cand in cands:
            if cand.commit_sha and cand.kind == "candidate":
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
            return [dict(kind="incumbent", parent=incumbent, commit_sha=incumbent,
                         status="committed", description="incumbent re-measured (reference)")]
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
                                  reported=reported_errors(led, name), pairs=pairs)

    def rows(self, cand_id: str) -> list[Candidate]:
        rows = [c for c in self.loop.ledger.candidates(confirmations=True)
                if c.confirms == cand_id]
        return sorted(rows, key=lambda c: -c.seq)  # in the order made

    def measure(self, entry: judge.Entry, need: int) -> list[tuple[float, float]] | str:
        loop, led = self.loop, self.loop.ledger
        cand = self.group[entry.id]
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
            trusted = loop.guard.snapshot()  # the candidate's code runs again
            loop.jobs.start(waiting, lambda: loop.stop.hard)
            loop.jobs.wait(ids, lambda running: loop.report(
                led.get("round"), loop.target or led.get("round"), running),
                lambda: loop.stop.hard)
            if loop.guard.check(trusted, [cand.id, *loop.in_flight]):
                return "tampering while it was re-measured"
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


# -- rounds --------------------------------------------------------------------------------

# the next round's proposals are asked for once every job of the round is in a phase, or
# this long after the round started (a backend that does not tell phases)
AHEAD_AFTER_S = 0.5


def started_all(running: list[tuple[str, str, float, str]]) -> bool:
    """Every job still running is in a named phase (past its queue and checkout)."""
    return all(": " in state for *_, state in running)


class Rounds:
    def __init__(self, loop: Loop, target: int) -> None:
        self.loop, self.target = loop, target
        loop.target = target

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
            if not cands:
                if round_no > self.target:
                    break
                cands = self.propose(round_no)
                if not cands:
                    loop.log(f"round {round_no}: the proposer has nothing new to try; stopping")
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

    def view(self, round_no: int) -> tuple[str, ProposalContext]:
        """Round R's proposer input: round R-1 in flight on its own incumbent."""
        led = self.loop.ledger
        history = led.candidates()
        previous = [c for c in history if c.round == round_no - 1]
        base = previous[0].parent if previous and previous[0].parent else led.get("incumbent")
        shown = [c for c in history if c.round < round_no - 1] + [_hidden(c) for c in previous]
        metric = next((c.metric for c in reversed(shown)
                       if c.status == "keep" and c.commit_sha == base), None)
        return base, self.loop.proposals.context(round_no, base, shown, metric)

    def slots_for_proposals(self) -> int:
        """K, less the baseline's slot in the study's first round."""
        baseline = any(c.kind == "baseline" for c in self.loop.ledger.candidates())
        return self.loop.parallel - (0 if baseline else 1)

    def ask_ahead(self, round_no: int) -> None:
        """While round R runs, round R+1's proposals are made (same view as after R)."""
        loop = self.loop
        if round_no > self.target or loop.stop.soft or loop.ledger.candidates(round=round_no):
            return
        if not loop.proposals.proposer.contained:
            return  # it could tamper: it proposes between rounds, in a window of its own
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

    def propose(self, round_no: int) -> list[Candidate]:
        loop, led = self.loop, self.loop.ledger
        incumbent = led.get("incumbent")
        rows = loop.fixed_rows(incumbent)
        k = loop.parallel - sum(1 for r in rows if r["kind"] == "baseline")
        proposals: list[Proposal] = []
        stale = None
        if k:
            ahead = loop.proposals.take_ahead(("round", round_no, k))
            if ahead is None:
                base, ctx = self.view(round_no)
                ahead = (base, self.ask(k, ctx))
            base, future = ahead
            proposals, conflicting = loop.proposals.on(base, incumbent, future.result())
            if conflicting:  # they conflict with the new incumbent: ask again, on it
                ctx = loop.proposals.context(round_no, incumbent, led.candidates(),
                                             led.get("incumbent_metric"), taken=proposals)
                proposals += self.ask(len(conflicting), ctx).result()
                # a proposer with nothing else to offer: run them as made, on their base
                stale = (base, conflicting[:max(0, k - len(proposals))])
        created = loop.proposals.record(round_no, incumbent, proposals, rows,
                                        stale=stale)
        loop.write_views()
        return created

    def run_group(self, cands: list[Candidate], round_no: int) -> None:
        loop = self.loop
        trusted = loop.guard.snapshot()  # before any of them can run
        loop.jobs.start(cands, lambda: loop.stop.hard)
        started = time.monotonic()
        asked = False

        def report(running: list) -> None:
            # the proposer works while the round runs, once its jobs are in their phases:
            # asked at once, its git work would compete with the jobs' own start-up
            nonlocal asked
            if not asked and (started_all(running)
                              or time.monotonic() - started >= AHEAD_AFTER_S):
                asked = True
                self.ask_ahead(round_no + 1)
            loop.progress(round_no, self.target, running)

        ids = [c.id for c in cands]
        loop.jobs.wait(ids, report, lambda: loop.stop.hard)
        if not asked:  # a round over before it was asked: the same view
            self.ask_ahead(round_no + 1)
        if loop.guard.check(trusted, ids):
            loop.write_views()
        if not loop.stop.hard:
            loop.settle(ids)


# -- rolling -------------------------------------------------------------------------------


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
        return sum(1 for c in self.loop.ledger.candidates() if c.kind == "candidate")

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
        if not any(c.kind == "baseline" for c in led.candidates()):
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
                if not any(led.row(i).status == "submitted" for i in self.open_ids):
                    break
            elif not self.open_ids and (loop.stop.soft or self.exhausted
                                        or self.made() >= self.budget):
                break
            time.sleep(0.02)
        loop.proposals.take_ahead(self.KEY)

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
        return any(c.status == "finished" for c in cands) and not any(
            c.kind == "baseline" and c.status != "finished" for c in cands)

    def judge(self, open_ids: list[str]) -> None:
        loop, led = self.loop, self.loop.ledger
        self.verify(loop.snapshot, open_ids)
        before = loop.snapshot
        finished = [i for i in open_ids if led.row(i).status == "finished"]
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
                    if c.status == "rejected"]
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
                if c.commit_sha and c.kind == "candidate"}
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
        incumbent = loop.ledger.get("incumbent")
        tried = {json.dumps(c.params, sort_keys=True) for c in loop.ledger.candidates()
                 if c.params and c.kind == "candidate" and c.parent == incumbent}
        take: list[Proposal] = []
        while len(take) < want and (self.ready or self.collect()):
            base, proposal = self.ready.pop(0)
            key = json.dumps(proposal.params, sort_keys=True) if proposal.params else None
            if key is not None and key in tried:
                continue  # asked twice ahead of time: the same settings on the same code
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
        if want <= 0 or self.exhausted or loop.proposals.has_ahead(self.KEY):
            return
        incumbent = led.get("incumbent")
        # a number never asked before (the tuner seeds each ask with it)
        ask_no = next_seq(led) + len(self.ready)
        ctx = loop.proposals.context(ask_no, incumbent, led.candidates(),
                                     led.get("incumbent_metric"),
                                     taken=[p for _, p in self.ready])
        loop.proposals.ask_ahead(self.KEY, incumbent, want, ctx)
