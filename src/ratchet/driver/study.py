"""The study: a thin front over the rooms that do the work (after Optuna's study.py).

    Study ─► rounds | rolling (over settle.Loop) ─► Proposals (proposer, ahead, in a thread)
                         │                 ─► jobs (spec, submit, poll, retry, hold-out)
                         │                 ─► judge (pure verdicts) ─► ledger
                         └─► integrity (pins, tamper checks)

Write-ahead everywhere: a candidate is in the ledger before its job exists, a job id is
recorded before it is submitted (ids are deterministic, so submitting again after a
crash is a no-op), and verdicts and the new incumbent are committed in one transaction
before the study branch moves. A killed driver therefore resumes by reading the ledger:
it reattaches to running jobs, resubmits lost ones once, and never counts anything twice.
"""

from __future__ import annotations

import contextlib
import difflib
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from ratchet.backends import Backend
from ratchet.core.candidate import Candidate, Incumbent, Proposal
from ratchet.core.config import Config
from ratchet.core.errors import HardStop, UserError
from ratchet.core.vocab import Kind, Status
from ratchet.driver import budget as budgets
from ratchet.driver import spend, views
from ratchet.driver.candidate import study_branch
from ratchet.driver.config import load_config
from ratchet.driver.integrity import Guard, check_commands, committed_config, pin_protected
from ratchet.driver.jobs import Jobs
from ratchet.driver.lock import StudyLock
from ratchet.driver.proposals import Proposals
from ratchet.driver.results import write_results_tsv
from ratchet.driver.rolling import Rolling
from ratchet.driver.rounds import Rounds
from ratchet.driver.settle import Loop, StopFlag
from ratchet.job import gitrepo, sandbox
from ratchet.job.jobspec import JobSpec
from ratchet.proposers import Proposer
from ratchet.proposers.knobs import KnobError, knob_values
from ratchet.store.calls import Meter
from ratchet.store.ledger import Ledger, LedgerError

STATE_DIR = ".ratchet"
SESSION_BEAT_S = 2.0  # how often a running driver marks its session alive
__all__ = ["Progress", "StopFlag", "Study", "StudyError"]


class StudyError(UserError):
    """A problem the user must fix; phrased as one line naming the cause."""


@contextlib.contextmanager
def _as_study_errors() -> Iterator[None]:
    """The rooms raise their own user errors (errors.UserError); the Study API raises
    them as one-line StudyErrors. No list: whatever a room marks as a user error."""
    try:
        yield
    except StudyError:
        raise
    except UserError as exc:
        raise StudyError(str(exc)) from None


@dataclass
class Progress:
    round: int
    rounds: int
    running: list[tuple[str, str, float, str]] = field(default_factory=list)  # id, desc, s, state
    best: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    message: str = ""
    waiting: str = ""  # what the proposer is doing: "waiting for the proposer (llm: 3.2 s)"


def _noop(_: Progress) -> None:
    pass


class Watcher(Protocol):
    """What follows a study from outside the loop, handed in by the front that opens it
    (`[notify]`'s notifier, ui/notify.py): told when a run starts, after each new
    verdict, and when the run ends. What one raises is logged, never the study's."""

    name: str  # how its warnings are labelled

    def start(self, ledger: Ledger) -> None: ...

    def check(self, ledger: Ledger) -> None: ...

    def end(self, ledger: Ledger, why: str) -> None: ...


class Study:
    def __init__(
        self,
        repo: Path,
        config: Config | None = None,
        *,
        backend: str | None = None,
        proposer: str | None = None,
        parallel: int | None = None,
        progress: Callable[[Progress], None] = _noop,
        log: Callable[[str], None] = lambda _: None,
        watch: Sequence[Callable[[Study], Watcher]] = (),
    ) -> None:
        top = gitrepo.work_tree(repo)
        if top is None:
            raise StudyError(f"{repo}: not a git repository (run `git init` and commit first)")
        self.repo = top
        self.config = config or load_config(self.repo)
        self.name = self.config.task.name
        self.state_dir = self.repo / STATE_DIR
        self.state_dir.mkdir(exist_ok=True)
        try:
            self.ledger = Ledger(self.state_dir / "ledger.db")
        except LedgerError as exc:
            raise StudyError(str(exc)) from None
        self.backend_kind = backend or self.config.backend.kind
        self.proposer_kind = proposer or self.config.search.proposer
        self.parallel = parallel or self.config.search.parallel
        self.branch = study_branch(self.name)
        self.progress = progress
        self.log = log
        self.stop = StopFlag()
        self._last_progress: Progress | None = None
        self._session: int | None = None  # this driver's row in the ledger's sessions
        self._seen = 0.0  # when the session was last marked alive
        self._start_checked: set[str] = set()  # start commits whose input was checked
        self._best: tuple[tuple, float | None] = ((), None)  # (status counts, best so far)
        self.lock = StudyLock(self.state_dir / "lock")
        self.jobs = Jobs(self.repo, self.state_dir, self.config, self.ledger, self.backend_kind,
                         log=log, on_trouble=self._show_trouble)
        self.guard = Guard(self.repo, self.ledger, self.name, self.branch, log, self.config)
        self.proposals = Proposals(self.repo, self.state_dir, self.config, self.ledger,
                                   self.proposer_kind)
        # one submission at a time across processes (lock.SubmitLock), the lock recording
        # takes: a submission holds it from its budget check to its record
        self.submitting = self.proposals.submitting
        # what follows the study from outside the loop, as the front hands it in (the
        # CLI's and `ratchet mcp`'s: [notify]'s notifier, ui/notify.py)
        self.watchers = [make(self) for make in watch]

    @property
    def backend(self) -> Backend:
        return self.jobs.backend

    @property
    def proposer(self) -> Proposer:
        return self.proposals.proposer

    def __enter__(self) -> Study:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._end_session()
        self.proposals.close()
        self.jobs.close()
        self.ledger.close()
        self.lock.release()

    # -- start-up (pinning, validation) -----------------------------------------------------

    @property
    def busy_slots(self) -> int:
        """Jobs that can hold a slot at once: the duty cycle's denominator. Fewer than
        `parallel` when candidates beyond the slots wait built (`task.build_on = "cpu"`)."""
        slots = self.config.backend.slots
        return min(self.parallel, slots) if slots else self.parallel

    @property
    def started(self) -> bool:
        return self.ledger.study().pinned is not None

    def ensure_started(self, start: str = "HEAD") -> None:
        """Pin the study's starting point (once): commit, protected files, branch."""
        with _as_study_errors():
            if self.started:
                self.guard.verify_state()
                self.guard.repair_branch()
                return
            head = gitrepo.try_rev_parse(self.repo, start)
            if head is None:
                if start != "HEAD":
                    raise StudyError(f"cannot start the study from {start!r}: not a commit")
                raise StudyError(f"{self.repo}: the repository has no commits; commit your "
                                 "files first")
            committed = committed_config(self.repo, head)
            self._check_start_commit(head)
            if gitrepo.is_dirty(self.repo):
                self.log("warning: uncommitted changes are ignored; the study starts from "
                         f"HEAD {head[:7]}")
            if gitrepo.try_rev_parse(self.repo, self.branch) not in (None, head):
                raise StudyError(
                    f"branch ratchet/{self.name} already exists but .ratchet/ledger.db has no "
                    f"study; delete the branch (git branch -D ratchet/{self.name}) or rename "
                    "task.name")
            pins = pin_protected(self.repo, self.config, head)
            gitrepo.exclude_locally(self.repo, [f"/{STATE_DIR}/", "/results.tsv"])
            gitrepo.update_ref(self.repo, self.branch, head, reason="ratchet: study start")
            self.ledger.set(study=self.name, pinned=head, pins=pins, round=1,
                            config=committed, created=time.time(),
                            **Ledger.incumbent_meta(Incumbent(commit=head)))
            self.ledger.event("study-started", None, commit=head)

    # -- sessions: the study's wall time is theirs, not the idle time between them ---------

    def _start_session(self, command: str) -> None:
        if self._session is None:
            self._session = self.ledger.start_session(command)
            self._seen = time.monotonic()

    def _see_session(self) -> None:
        """Marked alive every few seconds (a killed driver's wall time ends there)."""
        if self._session is not None and time.monotonic() - self._seen >= SESSION_BEAT_S:
            self._seen = time.monotonic()
            self.ledger.see_session(self._session)

    def _end_session(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):  # closing after a failure: best effort
                self.ledger.see_session(self._session, ended=True)
            self._session = None

    def _preview(self) -> None:
        """Before the first round: what a round is expected to cost, against the budget."""
        if self.ledger.candidates():
            return
        from ratchet.driver.budget import preview

        with contextlib.suppress(UserError, gitrepo.GitError):  # an estimate, never a stop
            estimate = preview(self.config, self.repo, self.ledger.study().incumbent_commit,
                               self.parallel, self.proposer_kind)
            if estimate.usd > 0 or self.config.budget.limits:
                self.log(estimate.line(self.config.budget))

    def _check_start_commit(self, head: str) -> None:
        """The task's commands and editable globs against the commit a study starts from:
        bad input, told before the machine is probed and before anything is recorded
        (once per commit: a warning is said once)."""
        if head in self._start_checked:
            return
        check_commands(self.repo, self.config, head)
        check_editable(self.repo, self.config, head, self.log)
        self._start_checked.add(head)

    def _check_reach(self, *, proposer: bool) -> None:
        """Can the sandbox start the parties that will run (the candidate's phases and
        its evaluator's child here, an agent), as their own uid? If not, one line names
        the path out of reach, the uid and the fixes, before the first job (and, at the
        first start, before anything is recorded): never a crash on every candidate."""
        commit = self.ledger.study().pinned or gitrepo.try_rev_parse(self.repo, "HEAD")
        if commit is None:
            return  # no commits: ensure_started says so
        # the agent's probe beside the jobs' (the ledger is read on this thread only)
        agent = self.proposer if proposer else None
        with _as_study_errors(), ThreadPoolExecutor(1) as pool:
            asked = agent and pool.submit(agent.unreachable, self.repo, self.state_dir)
            line = self.jobs.unreachable(commit) or (asked.result() if asked else None)
        if line:
            raise StudyError(line)

    def _check_ideas_file(self) -> None:
        from ratchet.driver.ideas import IDEAS_FILE, read_ideas_file

        with _as_study_errors():
            read_ideas_file(self.repo / IDEAS_FILE)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, rounds: int | None = None, candidates: int | None = None) -> None:
        """Run (or resume) the study: `rounds` of K, or in rolling mode `candidates`."""
        with _as_study_errors():
            self.lock.acquire()
        target = rounds or self.config.search.rounds
        self._check_ideas_file()  # bad input fails before anything is recorded
        # built first: its config errors come before any record; then it loads its
        # clients on its own thread while the workers start and the start is pinned
        self.proposals.warm_up()
        # workers start next: their interpreters load while this process pins the start
        # and makes the first proposals (nothing is recorded by it)
        self.jobs.warm_up()
        self._check_reach(proposer=True)  # a party the sandbox cannot start: not a verdict
        head = None if self.started else gitrepo.try_rev_parse(self.repo, "HEAD")
        if head is not None:  # the knobs must be in the start commit before it is pinned
            try:  # (checked here, not at every start: `submit` never uses them)
                knob_values(self.repo, head, self.config.tune.knobs)
            except KnobError as exc:
                raise StudyError(str(exc)) from None
        self.ensure_started()
        self._start_session("run")
        if self.ledger.study().budget_stop is not None:
            self.ledger.set(budget_stop=None)  # this run checks the limits anew
        self._preview()
        with _as_study_errors():
            if self.config.search.mode == "rolling":
                # the budget is a number of candidates (search.candidates, else rounds x K)
                budget = (candidates or self.config.search.candidates
                          or target * self.parallel)
                policy: Rolling | Rounds = Rolling(self._loop(), budget)
            else:
                policy = Rounds(self._loop(), target)
            policy.start_early()  # the proposer thinks while workers start and prep runs
        self._tell(lambda w: w.start(self.ledger))
        why = "failed"
        try:
            if self.config.prep:
                self.prepare()
                self._check_reach(proposer=False)  # the data is there now, no job yet
            with _as_study_errors():
                try:
                    policy.run()
                except HardStop:  # Ctrl-C twice: the proposer's reply is not waited for
                    if not self.stop.hard:
                        raise
                self.guard.verify_state()  # the branch at the end, too: nothing planted late
            why = "stopped by the user" if self.stop.soft else "finished"
        except BaseException as exc:
            why = f"failed: {views.shorten(str(exc) or type(exc).__name__, 160)}"
            raise
        finally:
            if self.stop.hard:  # a call still in flight is billed before the driver ends
                self.interrupt()
            self._tell(lambda w: w.end(self.ledger, why))
        self._write_views()  # a driver killed after the last verdict left them stale

    def interrupt(self) -> list[int]:
        """Stopped at once (Ctrl-C twice): every proposer call in flight is billed now as
        interrupted, with its time and what is known of its tokens, and ended (an agent's
        sandbox); the proposer gives up on it (HardStop) and nothing waits for its reply.
        From any thread; the ids of the calls billed."""
        return Meter.interrupt_all(self.state_dir)

    def _tell(self, step: Callable[[Watcher], None]) -> None:
        """A step of each watcher; whatever goes wrong in one is logged, never raised."""
        for watcher in self.watchers:
            try:
                step(watcher)
            except Exception as exc:  # noqa: BLE001 - notices never break the study
                self.log(f"warning: {watcher.name}: {type(exc).__name__}: {exc} "
                         "(the study goes on)")

    def _loop(self) -> Loop:
        return Loop(repo=self.repo, config=self.config, ledger=self.ledger, jobs=self.jobs,
                    guard=self.guard, proposals=self.proposals, stop=self.stop,
                    parallel=self.parallel, report=self._report,
                    write_views=self._write_views, log=self.log, name=self.name)

    # thin entry points kept for callers that drive single steps (tests, tools)
    def _propose_round(self, round_no: int) -> list[Candidate]:
        return Rounds(self._loop(), round_no).propose(round_no)

    def job_spec(self, cand: Candidate) -> JobSpec:
        return self.jobs.spec(cand)

    def submit(self, cand: Candidate) -> str:
        return self.jobs.submit(cand)

    # -- agent-driven mode (`ratchet submit` / `ratchet wait`) --------------------------------

    def submit_rev(self, rev: str, message: str | None = None,
                   base: str | None = None) -> list[Candidate]:
        """`ratchet submit REV`: record REV as a candidate and start its job at once.

        The first submission starts the study from `base`; by default the checked-out
        commit, or REV's parent when REV is what is checked out (the agent committed on
        the current branch).
        """
        commit = gitrepo.try_rev_parse(self.repo, rev)
        if commit is None:
            raise StudyError(f"{rev!r} is not a commit in {self.repo}")
        if base is None and gitrepo.try_rev_parse(self.repo, "HEAD") == commit:
            # the agent committed on the current branch: start from its parent, or from
            # the commit itself when it has none (a repository's first commit)
            base = gitrepo.try_rev_parse(self.repo, f"{commit}^") or commit
        if not self.started and (head := gitrepo.try_rev_parse(self.repo, base or "HEAD")):
            with _as_study_errors():
                self._check_start_commit(head)
        self._check_reach(proposer=False)
        self.ensure_started(base or "HEAD")
        subject = gitrepo.git(self.repo, "log", "-1", "--format=%s", commit)
        return self.submit_commit(commit, message or subject, proposer="submit")

    def over_budget(self) -> budgets.Reached | None:
        """The `[budget]` limit one more submitted candidate would reach or cross, if any:
        agent-driven submissions count against the study's limits as a run's do."""
        if not self.config.budget.limits:
            return None
        cands = self.ledger.candidates()
        if not budgets.room(self.config.budget, cands, 1):
            made = float(sum(1 for c in cands if c.kind == Kind.CANDIDATE))
            return budgets.Reached("candidates", made, float(self.config.budget.candidates or 0))
        return budgets.check(self.config.budget, spend.summary(self.ledger), cands, 1)

    def _refuse_over_budget(self) -> None:
        reached = self.over_budget()
        if reached is not None:
            raise StudyError(f"{reached.field} reached, nothing was submitted: "
                             f"{reached.line().removeprefix(f'stopped at {reached.field}: ')}"
                             .replace("run `ratchet run` to resume", "submit again"))

    def submit_commit(self, commit: str, description: str,
                      proposer: str = "submit") -> list[Candidate]:
        """Record `commit` (on a started study) as a candidate by `proposer` and start its
        job at once, with the study's baseline first when it has none yet."""
        self._refuse_over_budget()  # before a long prep
        if self.config.prep:
            self.prepare()
            self._check_reach(proposer=False)
        with self.submitting:  # the budget checked and the row recorded as one step
            self._refuse_over_budget()
            record = self.ledger.study()
            incumbent, round_no = record.incumbent_commit, record.next_round
            rows = self._loop().fixed_rows(incumbent)[:1]
            rows = [r for r in rows if r["kind"] == Kind.BASELINE]
            # submitting the start commit itself before anything ran makes it the baseline
            proposals = [] if rows and commit == incumbent else [
                Proposal(description=description, commit=commit)]
            made = self.proposals.record(round_no, incumbent, proposals, rows,
                                         proposer=proposer)
        for cand in made:
            if cand.status == Status.COMMITTED:
                with _as_study_errors():
                    self.jobs.submit(cand)
        self._write_views()
        return [self.ledger.row(c.id) for c in made]

    def wait_ids(self, ids: list[str], timeout: float | None = None) -> list[Candidate]:
        """`ratchet wait ID...`: wait, judge as a group (baseline first), promote the best.

        Judging writes the study's verdicts and incumbent: it takes the study lock, so a
        `ratchet run` going on meanwhile is waited for, never raced (its guard would take
        our writes for tampering). With `timeout` (seconds of waiting for the jobs), a
        group still running then is returned unjudged, as it is (`submitted`); a later
        wait judges it."""
        self.lock.acquire(on_wait=lambda holder: self.log(
            f"the study is held by {holder} (a ratchet run); waiting for it to end"))
        self.ensure_started()
        self._start_session("wait")
        cands = []
        for ref in ids:
            cand = self.ledger.find(ref)
            if cand is None:
                raise StudyError(f"no candidate {ref!r} in this study (see `ratchet status`)")
            cands.append(cand)
        # the baseline must be judged before anything is compared with it
        baseline = [c for c in self.ledger.candidates() if c.kind == Kind.BASELINE
                    and not c.is_judged and c.id not in ids]
        group = [c.id for c in baseline + cands]
        round_no = self.ledger.study().next_round
        with _as_study_errors():
            trusted = self.guard.snapshot_checked()  # its candidates run since `submit`
            done = self.jobs.wait(group, lambda running: self._report(round_no, round_no,
                                                                      running),
                                  lambda: self.stop.hard,
                                  None if timeout is None else time.monotonic() + timeout)
            if self.guard.check(trusted, group):
                self._write_views()
            if done and any(self.ledger.row(i).status == Status.FINISHED for i in group):
                loop = self._loop()
                loop.settle(group)
                self.ledger.set(round=round_no + 1)
                loop.release()
        return [self.ledger.row(c.id) for c in cands]

    def cancel(self, ref: str) -> Candidate:
        cand = self.ledger.find(ref)
        if cand is None:
            raise StudyError(f"no candidate {ref!r} in this study")
        if cand.is_judged:
            raise StudyError(f"{cand.id} is already judged ({cand.status})")
        self.jobs.cancel(cand)
        self.ledger.cancel(cand.id, "cancelled by the user", time.time())
        self._write_views()
        return self.ledger.row(cand.id)

    # -- prep -------------------------------------------------------------------------------

    def prepare(self, force: bool = False) -> Path:
        from ratchet.job.prep import prep_key, prepare

        self.ensure_started()
        if self.config.prep is None:
            raise StudyError("ratchet.toml has no [prep] section "
                             "(add `[prep] run = \"python prepare.py\"`)")
        command = self.config.prep.run
        record = self.ledger.study()
        with _as_study_errors():
            # a backend whose nodes do not see this machine prepares once where they all
            # see it (a prep job on the engine); None: the local cache below
            shared = self.backend.prepare(
                study=self.name, repo=self.repo, command=command,
                pinned_commit=record.start, key=prep_key(command, record.pins),
                env_allow=list(self.config.task.env), timeout_s=self.config.task.timeout)
            data: str | Path
            if shared is not None:
                data, digest = shared
            else:
                data, digest = prepare(self.repo, self.state_dir, command,
                                       record.start, record.pins,
                                       list(self.config.task.env), self.config.task.timeout,
                                       force=force)
        if record.data_digest != digest or record.data_dir != str(data):
            self.ledger.set(data_dir=str(data), data_digest=digest)
        return Path(data)

    # -- views ------------------------------------------------------------------------------

    def _write_views(self) -> None:
        write_results_tsv(self.repo / "results.tsv", self.ledger, self.config.metric.name)

    def _report(self, round_no: int, target: int, running: list) -> None:
        self._see_session()
        counts = self.ledger.status_counts()  # polled every few ms: one cheap query
        key = tuple(sorted(counts.items()))
        if self._best[0] != key:  # the pooled best changes only with a verdict
            self._best = (key, views.best_so_far(self.ledger, self.config.metric.goal))
            self._tell(lambda w: w.check(self.ledger))
        self._last_progress = Progress(round=round_no, rounds=target, running=running,
                                       best=self._best[1], counts=counts,
                                       message=self.jobs.trouble,
                                       waiting=self.proposals.waiting(bool(running)))
        self.progress(self._last_progress)

    def _show_trouble(self, message: str) -> None:
        round_no = self.ledger.study().round or 1
        last = self._last_progress or Progress(round=round_no, rounds=round_no)
        self.progress(replace(last, message=message))

    def sandbox_status(self) -> str:
        return sandbox.describe(self.config.backend.sandbox)

    def network_status(self) -> str:
        """What network candidates' code has (`[task] network`, and what this machine gives)."""
        return sandbox.describe_network(self.config.task.network, self.config.backend.sandbox)

    def agent_sandbox_status(self) -> str | None:
        """What confines the proposer's untrusted party (coding agents), when it has one
        (else None): its kind's own hook."""
        from ratchet.proposers import sandbox_status

        return sandbox_status(self.proposer_kind, self.config)

def check_editable(repo: Path, config: Config, head: str, log: Callable[[str], None]) -> None:
    """`task.editable` must name files of the start commit: a misspelt glob would leave a
    proposer nothing to change (an error when no glob matches a file; a warning for
    each glob that matches none, since a glob may be meant for files a proposer adds)."""
    from ratchet.core.config import CONFIG_FILE, matches_any

    listing = gitrepo.git(repo, "ls-tree", "-r", "--name-only", "-z", head)
    paths = [p for p in listing.split("\0") if p]
    unmatched = [g for g in config.task.editable if not any(matches_any(p, [g]) for p in paths)]
    if not unmatched:
        return

    def hint(glob: str) -> str:
        close = difflib.get_close_matches(glob, paths, n=1, cutoff=0.6)
        return f" (did you mean {close[0]!r}?)" if close else ""

    if len(unmatched) == len(config.task.editable):
        glob = unmatched[0]
        raise StudyError(f"task.editable: {glob!r} matches no file in commit {head[:7]}"
                         f"{hint(glob)}; fix the glob in {CONFIG_FILE} or commit the file")
    for glob in unmatched:
        log(f"warning: task.editable: {glob!r} matches no file in commit {head[:7]}"
            f"{hint(glob)}; a proposer may only add files there")
