"""Proposals, made ahead in a background thread: the proposer behind one worker thread,
recording what it made (committed or rejected in one transaction), re-basing a proposal made
on an older incumbent by a three-way merge, and dropping repeats.

Proposals ahead: the proposer works while jobs run, so no slot waits for an LLM, an agent or
the tuner when it could have been asked earlier. A proposal made ahead was made on the
incumbent of its time; if the incumbent moves before it is used, its change is carried onto
the new incumbent (re-based), and when that conflicts it is dropped and the proposer is asked
again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from ratchet.core.candidate import Candidate, Proposal
from ratchet.core.config import Config
from ratchet.core.verdict import Reason
from ratchet.core.vocab import Kind, Status
from ratchet.driver.candidate import make_commit, materialise, rebase, scope_violations, study_ref
from ratchet.driver.lock import SubmitLock
from ratchet.job import gitrepo
from ratchet.job.faults import fault_point
from ratchet.proposers import ProposalContext, Proposer, make_proposer
from ratchet.store.ledger import Ledger

# -- proposals, made ahead in a background thread ----------------------------------------


def _duration(seconds: float) -> str:
    """3.2 s, 6 min, 1 h 5 min: as precise as a glance at the live view needs."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


T = TypeVar("T")


def settled(future: Future[T], wait: bool) -> T | None:
    """What a proposer request asked at the end of a study made: waited for with `wait`
    (its calls are recorded as they end), else cancelled if not done; None when it was
    cancelled or failed (a failed request is billed as it failed)."""
    if not wait and not future.done():
        future.cancel()
        return None
    try:
        return future.result()
    except Exception:  # noqa: BLE001 - billed as it failed, nothing to use
        return None


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
        # repairs run beside proposals (only `llm` and `agent` repair, and both may be
        # asked from two threads): a repair never waits behind a new proposal's request
        self._repair_pool = ThreadPoolExecutor(max_workers=1,
                                               thread_name_prefix="ratchet-repair")
        # recording takes the study's submission lock: the ids predicted below are the ids
        # recorded, whatever `ratchet submit` or `ratchet mcp` records at the same moment
        self.submitting = SubmitLock(state_dir / "submit.lock")
        self._ahead: dict[object, tuple[str, Future]] = {}  # key -> (base commit, proposals)
        self._checked: dict[tuple[str, str], list[str]] = {}  # (parent, commit) -> problems
        self._trees: dict[str, str] = {}  # commit -> its tree (a commit's tree never changes)
        # when the proposer call now running on the thread began (None: none is); written
        # there, read by the loop for the live view (one float: no lock needed)
        self._since: float | None = None

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
        self._repair_pool.shutdown(wait=False, cancel_futures=True)

    def context(self, round_no: int, incumbent: str, history: list[Candidate],
                incumbent_metric: float | None,
                taken: Iterable[Proposal] = (), asked: Iterable[str] = ()) -> ProposalContext:
        """What the proposer sees. `taken`: proposals made but not recorded yet; their
        ideas are still pending in the ledger, and must not be handed out twice; nor
        those `asked` of a request still in flight."""
        self.import_ideas()
        busy = {p.idea for p in taken if p.idea} | set(asked)
        return ProposalContext(
            repo=self.repo, state_dir=self.state_dir, config=self.config, study=self.name,
            round=round_no, incumbent=incumbent, incumbent_metric=incumbent_metric,
            history=history, ideas=[row["text"] for row in self.ledger.pending_ideas()
                                    if row["text"] not in busy])

    def import_ideas(self) -> None:
        """People's ideas.md joins the ideas table (new bullets only)."""
        from ratchet.driver.ideas import import_ideas

        import_ideas(self.repo, self.ledger)

    def ask(self, k: int, ctx: ProposalContext) -> Future:
        proposer = self.proposer  # built here: its errors belong to the caller
        return self._pool.submit(self._timed, proposer.propose, k, ctx)

    def _timed(self, call: Callable, *args: object) -> object:
        self._since = time.monotonic()
        try:
            return call(*args)
        finally:
            self._since = None

    def waiting(self, jobs_running: bool) -> str:
        """The live view's line about the proposer: "waiting for the proposer (llm:
        3.2 s)", "agent 2 of 4 running (6 min)"; "" while no proposer call runs."""
        since = self._since
        if since is None:
            return ""
        took = _duration(time.monotonic() - since)
        detail = self._proposer.activity() if self._proposer is not None else None
        if detail:
            return f"{detail} ({took})"
        if jobs_running:  # asked ahead: nothing waits for it yet
            return f"the proposer is at work ({self.kind}: {took})"
        return f"waiting for the proposer ({self.kind}: {took})"

    def ask_ahead(self, key: object, base: str, k: int, ctx: ProposalContext | None,
                  future: Future | None = None) -> None:
        """Start proposing for `key` now (or keep `future` as that request)."""
        if key not in self._ahead:
            if future is None:
                if ctx is None:
                    raise ValueError("ask_ahead needs a context or a future")
                proposer = self.proposer
                future = self._pool.submit(self._timed, self._propose_and_build, proposer,
                                           k, ctx, base)
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

    def take_done(self, key: object) -> tuple[str, Future] | None:
        """`take_ahead`, only once its request is answered (else it stays asked)."""
        ahead = self._ahead.get(key)
        if ahead is None or not ahead[1].done():
            return None
        return self._ahead.pop(key)

    def drop(self, proposals: list[Proposal], why: str) -> None:
        """Proposals that will never be candidates: their calls stay billed (spend.py),
        marked with why they made nothing."""
        self.ledger.link_calls([i for p in proposals for i in p.calls], None, fate=why)

    def finish_ahead(self, wait: bool) -> None:
        """The study ends with proposals asked for and never used: with `wait`, a request
        still in flight is waited for, so what it spends is recorded (its calls are written
        as they end); what they made is marked unused."""
        for key in list(self._ahead):
            _, future = self._ahead.pop(key)
            made = settled(future, wait)
            if made is not None:
                self.drop(list(made), "unused: the study stopped before it was needed")

    def observe(self, cand: Candidate) -> None:
        if self._proposer is not None:
            self._pool.submit(_quietly, self._proposer.observe, cand)

    def on(self, base: str, incumbent: str, proposals: list[Proposal]) -> tuple[
            list[Proposal], list[Proposal]]:
        """Carry proposals made on `base` onto `incumbent`: (re-based, conflicting). One
        whose change the incumbent already has is dropped (its calls billed as such)."""
        if base == incumbent:
            return proposals, []
        moved = [(p, rebase(self.repo, p, base, incumbent) or self._retune(p, incumbent))
                 for p in proposals]
        # a change the incumbent already has (it moved the same way) is no experiment
        done = [m for _, m in moved if m is not None and self._changes_nothing(m, incumbent)]
        self.drop(done, f"dropped: made on {base[:7]}, its change is already in the "
                        f"incumbent {incumbent[:7]}")
        return ([m for _, m in moved if m is not None and all(m is not d for d in done)],
                [p for p, m in moved if m is None])

    def _changes_nothing(self, proposal: Proposal, incumbent: str) -> bool:
        if proposal.error:
            return False
        try:
            commit = make_commit(self.repo, incumbent, proposal, "ahead")
            trees = gitrepo.git(self.repo, "rev-parse", f"{commit}^{{tree}}",
                                f"{incumbent}^{{tree}}").split()
        except gitrepo.GitError:
            return False
        return len(trees) == 2 and trees[0] == trees[1]

    def repair(self, base: str, incumbent: str, proposals: list[Proposal],
               ctx: ProposalContext) -> Future:
        """Ask the proposer to re-apply each of `proposals` (made on `base`, conflicting
        with `incumbent`) on `incumbent`, on its thread; `ctx` is a context on
        `incumbent` made by the loop. The future's result is a `Repairs`."""
        proposer = self.proposer
        return self._repair_pool.submit(self._repair_all, proposer, base, proposals, ctx)

    def _repair_all(self, proposer: Proposer, base: str, proposals: list[Proposal],
                    ctx: ProposalContext) -> Repairs:
        def one(proposal: Proposal) -> Proposal | None:
            try:
                mine = make_commit(self.repo, base, proposal, "ahead")
                diff = gitrepo.diff_text(self.repo, base, mine)
            except gitrepo.GitError:
                return None  # its base is gone: nothing to re-apply
            try:
                return proposer.repair(proposal, diff, ctx)
            except Exception as exc:  # noqa: BLE001 - a failed repair drops one proposal
                return replace(proposal, files={}, commit=None,
                               error=f"the repair failed: {type(exc).__name__}: {exc}")

        with ThreadPoolExecutor(max_workers=min(4, max(1, len(proposals)))) as pool:
            results = list(pool.map(one, proposals))
        out = Repairs()
        for proposal, got in zip(proposals, results, strict=True):
            if got is None:
                out.unrepaired.append(proposal)
            elif got.error:
                out.failed.append(got)
            else:
                out.repaired.append(got)
        return out

    def drop_failed(self, repairs: Repairs, base: str, incumbent: str) -> None:
        """Repairs that failed: dropped, their calls (the repair's too) billed as such."""
        for proposal in repairs.failed:
            self.drop([proposal], f"dropped: made on {base[:7]}, conflicts with the "
                                  f"incumbent {incumbent[:7]}, and {proposal.error}")

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
        with self.submitting:
            return self._record(round_no, incumbent, proposals, rows, proposer, stale)

    def _record(self, round_no: int, incumbent: str, proposals: list[Proposal],
                rows: list[dict], proposer: str | None,
                stale: tuple[str, list[Proposal]] | None) -> list[Candidate]:
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
                       for c in created if c.commit_sha and c.kind == Kind.CANDIDATE)
        if refs:  # every candidate keeps a ref, kept or not (one git call for all)
            gitrepo.git(self.repo, "update-ref", "--stdin", input=refs.encode())
        for cand, fields in zip(created, rows, strict=True):
            if cand.idea:  # a proposal that failed outright is that idea's outcome
                self.ledger.mark_idea(cand.idea, cand.id,
                                      "rejected" if cand.status == Status.REJECTED else None)
            if cand.status == Status.REJECTED:
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

    def tried(self) -> list[Candidate]:
        """The rows a new proposal must not repeat: every candidate but one withdrawn from
        beside a refused keep (driver/beside.py), whose change runs again on the incumbent."""
        return [c for c in self.ledger.candidates() if c.code != Reason.WITHDRAWN]

    def repeats(self, proposal: Proposal) -> bool:
        """Are its files (its commit, built ahead) those of an earlier candidate? It
        would be recorded rejected and never run."""
        if proposal.error or not proposal.commit:
            return False
        earlier = [c.commit_sha for c in self.tried() if c.commit_sha]
        trees = self.trees([*earlier, proposal.commit])
        return proposal.commit in trees and trees[proposal.commit] in {
            trees[sha] for sha in earlier if sha in trees}

    def trees(self, commits: list[str]) -> dict[str, str]:
        """The tree of each commit (the files it holds, whatever its parent), cached;
        {} where git cannot say."""
        unknown = [sha for sha in dict.fromkeys(commits) if sha not in self._trees]
        if unknown:
            try:
                self._trees.update(zip(unknown, gitrepo.git(
                    self.repo, "rev-parse", *(f"{sha}^{{tree}}" for sha in unknown)).split(),
                    strict=True))
            except gitrepo.GitError:
                return {}
        return {sha: self._trees[sha] for sha in commits}

    def _reject_repeats(self, built: list[dict]) -> list[dict]:
        """No candidate repeats an earlier one (whoever proposed either): the same tree is
        the same experiment. A repeat is recorded as rejected and never run."""
        earlier = [c for c in self.tried() if c.commit_sha]
        fresh = [f for f in built if f.get("status") == Status.COMMITTED and f.get("commit_sha")]
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
                    fields = {**fields, "status": Status.REJECTED,
                              "reasons": f"same files as {seen[tree]} (a repeat is not run)"}
                else:
                    seen[tree] = "another proposal of this batch"
            out.append(fields)
        return out


@dataclass
class Repairs:
    """What asking the proposer to re-apply conflicting proposals came to."""

    repaired: list[Proposal] = field(default_factory=list)  # files on the new incumbent
    failed: list[Proposal] = field(default_factory=list)  # tried and failed (`error`)
    unrepaired: list[Proposal] = field(default_factory=list)  # the kind does not repair


def _quietly(call: Callable, *args) -> None:
    with contextlib.suppress(Exception):  # a proposer's bookkeeping never stops the study
        call(*args)


def next_seq(ledger: Ledger) -> int:
    row = ledger.db.execute("SELECT COALESCE(MAX(seq), -1) + 1 AS n FROM candidates")
    return row.fetchone()["n"]
