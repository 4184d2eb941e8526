"""The study owns the loop: propose K from the incumbent, run them, judge, promote, repeat.

Write-ahead everywhere: a candidate is in the ledger before its job exists, a job id is
recorded before it is submitted (ids are deterministic, so submitting again after a
crash is a no-op), and a round's verdicts and the new incumbent are committed in one
transaction before the study branch moves. A killed driver therefore resumes by
reading the ledger: it reattaches to running jobs, resubmits lost ones once, and never
counts anything twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from ratchet import gitrepo, judge, sandbox
from ratchet.backends import Backend, make_backend
from ratchet.candidate import (
    Proposal,
    make_commit,
    scope_violations,
    study_branch,
    study_ref,
)
from ratchet.config import CONFIG_FILE, Config, load_config, matches_any
from ratchet.faults import fault_point
from ratchet.jobspec import JobResult, JobSpec, PinnedFile
from ratchet.ledger import Candidate, Ledger
from ratchet.proposers import ProposalContext, Proposer, make_proposer
from ratchet.views import write_results_tsv

STATE_DIR = ".ratchet"
POLL_S = 0.02
MAX_ATTEMPTS = 2  # a job lost to infrastructure is rerun once, never one that failed
# a backend call that raises (engine down, network, timeout) is retried this many times,
# the wait doubling from BACKEND_BACKOFF_S up to 60 s (about 10 minutes in all), before
# the study stops with everything recorded, ready to resume
BACKEND_TRIES = 8
BACKEND_BACKOFF_S = 5.0


class StudyError(Exception):
    """A problem the user must fix; phrased as one line naming the cause."""


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


@dataclass
class Progress:
    round: int
    rounds: int
    running: list[tuple[str, str, float, str]] = field(default_factory=list)  # id, desc, s, state
    best: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    message: str = ""


def _noop(_: Progress) -> None:
    pass


class StudyLock:
    """One driver per study. The lock is an flock, so a dead holder never blocks us."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise StudyError(
                f"study is locked by {holder}; wait for it to finish or stop it (Ctrl-C)"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {os.uname().nodename} since {time.ctime()}\n")
        fh.flush()
        self.fh = fh

    def release(self) -> None:
        if self.fh:
            self.fh.close()
            self.fh = None


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
    ) -> None:
        if not gitrepo.is_repo(repo):
            raise StudyError(f"{repo}: not a git repository (run `git init` and commit first)")
        self.repo = gitrepo.toplevel(repo)
        self.config = config or load_config(self.repo)
        self.name = self.config.task.name
        self.state_dir = self.repo / STATE_DIR
        self.state_dir.mkdir(exist_ok=True)
        self.ledger = Ledger(self.state_dir / "ledger.db")
        self.backend_kind = backend or self.config.backend.kind
        self.proposer_kind = proposer or self.config.search.proposer
        self.parallel = parallel or self.config.search.parallel
        self.branch = study_branch(self.name)
        self.progress = progress
        self.log = log
        self.stop = StopFlag()
        self.trouble = ""  # the latest infrastructure fault, shown in the live view
        self._last_progress: Progress | None = None
        self._backend: Backend | None = None
        self._proposer: Proposer | None = None
        self.lock = StudyLock(self.state_dir / "lock")

    # -- parts made on first use ----------------------------------------------------------

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = make_backend(self.backend_kind, self.state_dir, self.config)
        return self._backend

    @property
    def proposer(self) -> Proposer:
        if self._proposer is None:
            self._proposer = make_proposer(
                self.proposer_kind, self.config, self.ledger.candidates()
            )
        return self._proposer

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
        self.ledger.close()
        self.lock.release()

    # -- set-up ---------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self.ledger.get("pinned") is not None

    def ensure_started(self, start: str = "HEAD") -> None:
        """Pin the study's starting point (once): commit, protected files, branch."""
        if self.started:
            self._verify_state()
            self._repair_branch()
            return
        head = gitrepo.try_rev_parse(self.repo, start)
        if head is None:
            if start != "HEAD":
                raise StudyError(f"cannot start the study from {start!r}: not a commit")
            raise StudyError(f"{self.repo}: the repository has no commits; commit your files first")
        committed = self._committed_config(head)
        self._check_commands(head)
        if gitrepo.is_dirty(self.repo):
            self.log("warning: uncommitted changes are ignored; the study starts from HEAD "
                     f"{head[:7]}")
        if gitrepo.try_rev_parse(self.repo, self.branch) not in (None, head):
            raise StudyError(
                f"branch ratchet/{self.name} already exists but .ratchet/ledger.db has no study; "
                f"delete the branch (git branch -D ratchet/{self.name}) or rename task.name"
            )
        pins = self._pin_protected(head)
        gitrepo.exclude_locally(self.repo, [f"/{STATE_DIR}/", "/results.tsv"])
        gitrepo.update_ref(self.repo, self.branch, head, reason="ratchet: study start")
        self.ledger.set(
            study=self.name,
            pinned=head,
            pins=pins,
            incumbent=head,
            incumbent_id=None,
            incumbent_metric=None,
            incumbent_samples=[],
            incumbent_holdout=None,
            round=1,
            config=committed,
            created=time.time(),
        )
        self.ledger.event("study-started", None, commit=head)

    def _check_commands(self, head: str) -> None:
        """The evaluator scripts must be committed: fail before anything is pinned."""
        task = self.config.task
        for key in ("evaluate", "holdout"):  # build/run may use files made on the fly
            command = getattr(task, key) or ""
            try:
                words = [] if "cd " in command else shlex.split(command)  # cd: paths move
            except ValueError:
                continue
            for word in words:
                if (word.endswith((".py", ".sh")) and not word.startswith(("-", "/", "$", "~"))
                        and not any(ch in word for ch in "*?[")
                        and "=" not in word
                        and not gitrepo.path_exists(self.repo, head, word)):
                    raise StudyError(
                        f"task.{key} runs {word}, which is not in commit {head[:7]}; "
                        f"commit it (git add {word} && git commit) or fix task.{key} "
                        f"in {CONFIG_FILE}")

    def _committed_config(self, head: str) -> str:
        try:
            return gitrepo.show(self.repo, head, CONFIG_FILE).decode()
        except gitrepo.GitError:
            raise StudyError(
                f"{CONFIG_FILE} is not committed; `git add {CONFIG_FILE} && git commit` first "
                "(it is pinned with the protected files)"
            ) from None

    def _pin_protected(self, commit: str) -> dict[str, dict]:
        tracked = gitrepo.git(self.repo, "ls-tree", "-r", "--name-only", "-z", commit).split("\0")
        globs = [*self.config.task.protected, CONFIG_FILE]
        pins: dict[str, dict] = {}
        for path in tracked:
            if path and matches_any(path, globs):
                entry = gitrepo.git(self.repo, "ls-tree", commit, "--", path).split()
                mode = 0o755 if entry and entry[0] == "100755" else 0o644
                pins[path] = PinnedFile.of(gitrepo.show(self.repo, commit, path), mode).__dict__
        for glob in self.config.task.protected:
            if not any(ch in glob for ch in "*?[") and glob not in pins:
                pins[glob] = PinnedFile.of(None).__dict__  # must stay absent
        return pins

    def _verify_state(self) -> None:
        """The incumbent and the branch must be a commit judged `keep` (or the start).

        Anything else was written by someone other than ratchet, typically a candidate
        running without a sandbox: restore the last real keep and reject the candidate
        whose commit was planted.
        """
        keeps = sorted(self.ledger.candidates(status="keep"), key=lambda c: c.judged_at or 0)
        legit = {c.commit_sha for c in keeps} | {self.ledger.get("pinned")}
        planted = []
        incumbent = self.ledger.get("incumbent")
        if incumbent not in legit:
            planted.append(incumbent)
            last = keeps[-1] if keeps else None
            self.ledger.set(
                incumbent=last.commit_sha if last else self.ledger.get("pinned"),
                incumbent_id=last.id if last else None,
                incumbent_metric=last.metric if last else None,
                incumbent_samples=(last.samples or []) if last else [],
                incumbent_holdout=last.holdout if last else None,
            )
        branch = gitrepo.try_rev_parse(self.repo, self.branch)
        if branch not in legit:
            planted.append(branch)
        if not planted:
            return
        reason = "tampering: planted itself as the incumbent (ledger or study branch)"
        self.ledger.event("tampering", None, planted=planted)
        self.log(f"warning: {reason}; restored the last kept commit")
        for cand in self.ledger.candidates():
            if cand.commit_sha in planted and cand.kind == "candidate":
                self.ledger.update(cand.id, "judged:rejected", status="rejected",
                                   reasons=reason, judged_at=time.time())
        gitrepo.update_ref(self.repo, self.branch, self.ledger.get("incumbent"),
                           reason="ratchet: undo tampering")

    def _repair_branch(self) -> None:
        """After a crash between the verdict commit and the ref update, finish the move."""
        incumbent = self.ledger.get("incumbent")
        current = gitrepo.try_rev_parse(self.repo, self.branch)
        if current != incumbent:
            # Only ever move the branch to a commit that was judged `keep` (or the start).
            kept = {c.commit_sha for c in self.ledger.candidates(status="keep")}
            if incumbent not in kept | {self.ledger.get("pinned")}:
                raise StudyError(
                    f"the ledger's incumbent {str(incumbent)[:7]} was never judged keep and "
                    f"branch ratchet/{self.name} is at {str(current)[:7]}: the state was "
                    "tampered with; inspect .ratchet/ledger.db before resuming"
                )
            gitrepo.update_ref(self.repo, self.branch, incumbent, reason="ratchet: repair")
            self.ledger.event("branch-repaired", None, commit=incumbent, was=current)

    # -- the loop -------------------------------------------------------------------------

    def run(self, rounds: int | None = None) -> None:
        self.lock.acquire()
        target = rounds or self.config.search.rounds
        self._check_ideas_file()  # bad input fails before anything is recorded
        self.ensure_started()
        self.proposer  # noqa: B018  (built now: its config errors come before any job)
        warm_up = getattr(self.backend, "warm_up", None)
        if warm_up is not None:
            warm_up()  # workers start their interpreters while the first round is proposed
        if self.config.prep:
            self.prepare()
        while not self.stop.soft:
            round_no = self.ledger.get("round")
            if round_no > target and not self._open(round_no):
                break
            cands = self.ledger.candidates(round=round_no)
            if not cands:
                if round_no > target:
                    break
                cands = self._propose_round(round_no)
                if not cands:
                    self.log(f"round {round_no}: the proposer has nothing new to try; stopping")
                    break
            else:
                self._ensure_refs(cands)  # resumed: the driver may have died before the refs
            self._run_group(cands, round_no, target)
            if self.stop.hard:
                break
            self._check_baseline(cands)
            fault_point("judged")
            if all(self.ledger.candidate(c.id).status not in ("submitted", "committed",
                   "interrupted", "finished") for c in cands):
                self.ledger.set(round=round_no + 1)
        self._write_views()  # a driver killed after the last verdict left them stale

    def _ensure_refs(self, cands: list[Candidate]) -> None:
        for cand in cands:
            if cand.commit_sha and cand.kind == "candidate":
                ref = study_ref(self.name, cand.id)
                if gitrepo.try_rev_parse(self.repo, ref) != cand.commit_sha:
                    gitrepo.update_ref(self.repo, ref, cand.commit_sha)

    def _check_baseline(self, cands: list[Candidate]) -> None:
        for cand in cands:
            cand = self.ledger.candidate(cand.id)
            if cand.kind == "baseline" and cand.status in ("crash", "rejected"):
                raise StudyError(
                    f"the baseline (unmodified {cand.short}) failed, so nothing can be compared: "
                    f"{cand.reasons} (see `ratchet logs {cand.id}`; fix the task, commit, and "
                    f"start afresh: rm -rf .ratchet && git branch -D ratchet/{self.name})"
                )

    def _open(self, round_no: int) -> bool:
        return any(not c.is_judged for c in self.ledger.candidates(round=round_no))

    def _propose_round(self, round_no: int) -> list[Candidate]:
        incumbent = self.ledger.get("incumbent")
        k = self.parallel
        baseline_needed = not any(c.kind == "baseline" for c in self.ledger.candidates())
        rows: list[tuple[str, dict]] = []
        if baseline_needed:
            rows.append(("baseline", dict(kind="baseline", parent=incumbent, commit_sha=incumbent,
                                          description="baseline", status="committed")))
            k = max(k - 1, 0)
        elif self.config.acceptance.co_run_incumbent:
            rows.append(("incumbent", dict(kind="incumbent", parent=incumbent,
                                           commit_sha=incumbent, status="committed",
                                           description="incumbent re-measured (reference)")))
        proposals: list[Proposal] = []
        if k:
            self._import_ideas()
            ctx = ProposalContext(
                repo=self.repo,
                state_dir=self.state_dir,
                config=self.config,
                study=self.name,
                round=round_no,
                incumbent=incumbent,
                incumbent_metric=self.ledger.get("incumbent_metric"),
                history=self.ledger.candidates(),
                ideas=[row["text"] for row in self.ledger.pending_ideas()],
            )
            proposals = self.proposer.propose(k, ctx)
        # Build every commit first, then record the whole round in one transaction: a
        # crash in between leaves no half-proposed round behind.
        base_seq = self._next_seq() + len(rows)
        # Commits are independent git plumbing (content-addressed): build them side by side.
        with ThreadPoolExecutor(max_workers=min(4, max(1, len(proposals)))) as pool:
            built = list(pool.map(
                lambda item: self._materialise(item[1], incumbent, f"c{base_seq + item[0]:04d}"),
                enumerate(proposals)))
        rows.extend(("candidate", fields) for fields in built)
        created = []
        fault_point("proposed")
        with self.ledger.transaction():
            for _, fields in rows:
                kind = fields.pop("kind", "candidate")
                created.append(self.ledger.new_candidate(round_no, kind=kind, **fields))
        fault_point("recorded")
        for cand, (_, fields) in zip(created, rows, strict=True):
            if cand.commit_sha and cand.kind == "candidate":
                gitrepo.update_ref(self.repo, study_ref(self.name, cand.id), cand.commit_sha)
            if cand.idea:  # a proposal that failed outright is that idea's outcome
                self.ledger.mark_idea(cand.idea, cand.id,
                                      "rejected" if cand.status == "rejected" else None)
            if cand.status == "rejected":
                self.ledger.event("rejected", cand.id, reasons=fields.get("reasons"))
        self._write_views()
        return self.ledger.candidates(round=round_no)

    def _import_ideas(self) -> None:
        """People's ideas.md joins the ideas table each round (new bullets only)."""
        from ratchet.ideas import IdeasError, import_ideas

        try:
            import_ideas(self.repo, self.ledger)
        except IdeasError as exc:
            raise StudyError(str(exc)) from None

    def _check_ideas_file(self) -> None:
        from ratchet.ideas import IDEAS_FILE, IdeasError, read_ideas_file

        try:
            read_ideas_file(self.repo / IDEAS_FILE)
        except IdeasError as exc:
            raise StudyError(str(exc)) from None

    def _next_seq(self) -> int:
        row = self.ledger.db.execute("SELECT COALESCE(MAX(seq), -1) + 1 AS n FROM candidates")
        return row.fetchone()["n"]

    def _materialise(self, proposal: Proposal, incumbent: str, cand_id: str) -> dict:
        fields = dict(parent=incumbent, description=proposal.description[:200],
                      proposer=self.proposer_kind, params=proposal.params, idea=proposal.idea)
        if proposal.context is not None:
            ctx_dir = self.state_dir / "contexts"
            ctx_dir.mkdir(exist_ok=True)
            path = ctx_dir / f"{cand_id}.md"
            path.write_text(proposal.context)
            fields["context_path"] = str(path)
        if proposal.error:
            return {**fields, "status": "rejected", "reasons": proposal.error}
        try:
            commit = make_commit(self.repo, incumbent, proposal, cand_id)
        except gitrepo.GitError as exc:
            return {**fields, "status": "rejected", "reasons": f"could not commit: {exc}"}
        problems = scope_violations(self.repo, self.config, incumbent, commit)
        if problems:
            return {**fields, "commit_sha": commit, "status": "rejected",
                    "reasons": "; ".join(problems)}
        return {**fields, "commit_sha": commit, "status": "committed"}

    # -- running a group of candidates (a round, or `ratchet wait`) -------------------------

    def job_spec(self, cand: Candidate) -> JobSpec:
        task = self.config.task
        pins = {k: PinnedFile(**v) for k, v in self.ledger.get("pins", {}).items()}
        data_dir, data_digest = self.ledger.get("data_dir"), self.ledger.get("data_digest")
        holdout_dir = Path(task.holdout_data) if task.holdout_data else None
        if holdout_dir is not None and not holdout_dir.is_absolute():
            holdout_dir = self.repo / holdout_dir
        spec = JobSpec(
            job_id=f"{self.name}-{cand.id}-{cand.attempt}",
            study=self.name,
            candidate=cand.id,
            commit=cand.commit_sha,
            metric=self.config.metric.name,
            timeout_s=task.timeout,
            repo=str(self.repo),
            build=task.build,
            smoke=task.smoke,
            run=task.run,
            evaluate=task.evaluate,
            holdout=task.holdout,
            # local jobs keep their work directory, so the hold-out runs later and only
            # for a candidate about to be kept; remote jobs evaluate it in the same job
            run_holdout=bool(task.holdout) and self.backend_kind != "local",
            repeats=self.config.acceptance.repeats,
            env_allow=list(task.env),
            protected=pins,
            data_dir=data_dir,
            data_digest=data_digest,
            holdout_dir=str(holdout_dir) if holdout_dir else None,
            log_limit_bytes=int(self.config.backend.log_limit_mb * (1 << 20)),
            memory_limit_bytes=(int(self.config.backend.memory_limit_gb * (1 << 30))
                                if self.config.backend.memory_limit_gb else None),
            file_size_limit_bytes=(int(self.config.backend.disk_limit_gb * (1 << 30))
                                   if self.config.backend.disk_limit_gb else None),
            readonly_paths=[str(self.repo / ".git"), str(self.state_dir / "ledger.db")],
            # decided once here rather than probed by every worker
            sandbox=(sandbox.choose(self.config.backend.sandbox)
                     if self.backend_kind == "local" else self.config.backend.sandbox),
        )
        return spec

    def submit(self, cand: Candidate) -> str:
        """Record the job id, then place the job (idempotent under the same id)."""
        spec = self.job_spec(cand)
        self.ledger.update(cand.id, "submitted", status="submitted", job_id=spec.job_id,
                           submitted_at=time.time())
        fault_point("submit-recorded")
        job_id = self._call("submit", lambda: self.backend.submit(spec), cand.id)
        fault_point("submitted")
        return job_id

    def _reattach(self, cand: Candidate) -> None:
        """On resume: place a recorded job again under its id, a no-op if it was placed.

        Covers a driver killed between recording a job id and placing the job, which
        would otherwise look like a lost job and cost the candidate an attempt.
        """
        spec = self.job_spec(cand)
        if spec.job_id != cand.job_id:  # killed between counting a loss and the new id
            self.ledger.update(cand.id, "submitted", job_id=spec.job_id,
                               submitted_at=time.time())
        self._call("submit", lambda: self.backend.submit(spec), cand.id)

    def _call(self, what: str, call: Callable, cand_id: str | None = None):
        """A backend call; one that raises is retried with backoff and surfaced (ledger
        event, log line, live view), never fatal to a candidate: after BACKEND_TRIES the
        study stops with the candidate still recorded as submitted, so a resume picks it up.
        """
        delay = BACKEND_BACKOFF_S
        for attempt in range(1, BACKEND_TRIES + 1):
            try:
                value = call()
            except Exception as exc:  # any engine failure is infrastructure, not the candidate's
                problem = f"backend {self.backend_kind}: {what} failed: {type(exc).__name__}: " \
                          f"{str(exc)[:300]}"
                self.ledger.event("backend-error", cand_id, call=what, error=problem,
                                  attempt=attempt)
                if attempt == BACKEND_TRIES:
                    raise StudyError(f"{problem} ({attempt} tries); nothing is lost: fix the "
                                     "backend, then `ratchet run` resumes the study") from None
                self.trouble = f"{problem}; retry {attempt}/{BACKEND_TRIES - 1} in {delay:g}s"
                self.log(f"warning: {self.trouble}")
                # the live view shows it while we wait
                last = self._last_progress or Progress(round=self.ledger.get("round") or 1,
                                                       rounds=self.ledger.get("round") or 1)
                self.progress(replace(last, message=self.trouble))
                time.sleep(delay)
                delay = min(delay * 2, 60.0)
            else:
                if self.trouble:
                    self.trouble = ""
                    self.ledger.event("backend-recovered", cand_id, call=what)
                return value
        raise AssertionError("unreachable")

    def _run_group(self, cands: list[Candidate], round_no: int, target: int) -> None:
        pending = {c.id for c in cands if c.status in ("committed", "interrupted")}
        for cand in self.ledger.candidates(round=round_no):
            if cand.id in pending and cand.status == "interrupted":
                # one write: a driver killed before the submit must not count it twice
                self.ledger.update(cand.id, attempt=cand.attempt + 1, status="committed")
            elif cand.status == "submitted" and cand.id in {c.id for c in cands}:
                self._reattach(cand)
        # A proposed round is submitted whole even after one Ctrl-C: that stops *new*
        # rounds; a second Ctrl-C cancels what runs.
        for cand_id in sorted(pending):
            if self.stop.hard:
                break
            self.submit(self.ledger.candidate(cand_id))
        trusted = self._trust_snapshot()
        self.wait_for([c.id for c in cands], round_no, target)
        self._check_tampering(trusted, [c.id for c in cands])
        if not self.stop.hard:
            self.judge_group([c.id for c in cands])

    # Without a sandbox a candidate could write to the ledger, move refs or rewrite
    # results.tsv while it runs. What the driver trusts is snapshotted before the jobs run
    # and compared after; anything changed is restored, and the candidates that ran in
    # that window are rejected (ratchet cannot tell which one did it).
    _TRUSTED_META = ("incumbent", "incumbent_id", "incumbent_metric", "incumbent_samples",
                     "incumbent_holdout", "pinned", "pins", "round", "data_digest")

    def _trust_snapshot(self) -> dict:
        refs = gitrepo.git(self.repo, "for-each-ref", "--format=%(refname) %(objectname)",
                           f"refs/ratchet/{self.name}/", self.branch)
        tsv = self.repo / "results.tsv"
        return {
            "meta": {key: self.ledger.get(key) for key in self._TRUSTED_META},
            "refs": refs,
            "tsv": tsv.read_bytes() if tsv.exists() else None,
            "verdicts": {c.id: (c.status, c.metric) for c in self.ledger.candidates()
                         if c.is_judged},
        }

    def _check_tampering(self, before: dict, ids: list[str]) -> None:
        after = self._trust_snapshot()
        problems = []
        if after["meta"] != before["meta"]:
            changed = [k for k in self._TRUSTED_META if after["meta"][k] != before["meta"][k]]
            problems.append(f"study state in the ledger changed ({', '.join(changed)})")
            self.ledger.set(**before["meta"])
        if after["refs"] != before["refs"]:
            problems.append("git refs of the study were moved")
            for line in before["refs"].splitlines():
                ref, sha = line.split()
                gitrepo.update_ref(self.repo, ref, sha, reason="ratchet: undo tampering")
            for line in after["refs"].splitlines():
                ref = line.split()[0]
                if ref not in before["refs"]:
                    gitrepo.git(self.repo, "update-ref", "-d", ref)
        if after["verdicts"] != before["verdicts"]:
            problems.append("earlier verdicts in the ledger were changed")
            for cand_id, (status, metric) in before["verdicts"].items():
                self.ledger.update(cand_id, status=status, metric=metric)
        if after["tsv"] != before["tsv"]:
            problems.append("results.tsv was modified")
        if not problems:
            return
        reason = "tampering while this round ran: " + "; ".join(problems)
        self.ledger.event("tampering", None, problems=problems)
        self.log(f"warning: {reason}; restored, and this round's candidates are rejected")
        for cand_id in ids:
            cand = self.ledger.candidate(cand_id)
            if cand.kind == "candidate" and not cand.is_judged:
                self.ledger.update(cand_id, "judged:rejected", status="rejected",
                                   reasons=reason, judged_at=time.time())
        self._write_views()

    def wait_for(self, ids: list[str], round_no: int = 0, target: int = 0) -> None:
        cancelled_on_stop = False
        while True:
            running = []
            for cand in (self.ledger.candidate(i) for i in ids):
                if cand.status != "submitted":
                    continue
                state = self._call("status", lambda c=cand: self.backend.status(c.job_id),
                                   cand.id)
                if state == "done":
                    self._record_result(cand, self._call(
                        "result", lambda c=cand: self.backend.result(c.job_id), cand.id))
                elif state == "lost":
                    self._handle_lost(cand)
                else:
                    elapsed = time.time() - (cand.submitted_at or time.time())
                    running.append((cand.id, cand.description, elapsed, state))
            self._report(round_no, target, running)
            if not running:
                return
            if self.stop.hard and not cancelled_on_stop:
                cancelled_on_stop = True
                for cand_id, *_ in running:
                    self._interrupt(self.ledger.candidate(cand_id))
                continue
            time.sleep(POLL_S)

    def _interrupt(self, cand: Candidate) -> None:
        self.backend.cancel(cand.job_id)
        if self.backend.status(cand.job_id) == "done":
            result = self.backend.result(cand.job_id)
            if result is not None and result.outcome != "cancelled":
                self._record_result(cand, result)  # it finished before the cancel landed
                return
        self.ledger.update(cand.id, "interrupted", status="interrupted",
                           reasons="interrupted (Ctrl-C); rerun on resume")

    def _handle_lost(self, cand: Candidate) -> None:
        # engines may allow more reruns ([backend.ray] retries); never for a job that failed
        max_attempts = getattr(self.backend, "max_attempts", MAX_ATTEMPTS)
        if cand.attempt + 1 >= max_attempts:
            lost = JobResult(job_id=cand.job_id, outcome="error", failed_stage="infrastructure",
                             reason=f"job lost {max_attempts} times (worker vanished)")
            self.ledger.update(cand.id, "lost", status="finished", reasons=lost.reason,
                               result=json.loads(lost.to_json()))
            return
        self.ledger.update(cand.id, "lost-resubmitted", attempt=cand.attempt + 1)
        self.submit(self.ledger.candidate(cand.id))

    def _record_result(self, cand: Candidate, result: JobResult | None) -> None:
        if result is None:
            self._handle_lost(cand)
            return
        run_s = sum(p.seconds for p in result.phases)
        self.ledger.update(
            cand.id,
            "finished",
            status="finished",
            metric=result.metric,
            samples=result.samples,
            extra=result.extra,
            holdout=result.holdout,
            phases=[p.__dict__ for p in result.phases],
            failed_stage=result.failed_stage,
            slot=result.slot,
            queue_s=result.queue_seconds,
            run_s=run_s,
            cost_usd=self._cost(run_s) + self._proposal_cost(cand),
            finished_at=time.time(),
            reasons=result.reason or None,
            result=json.loads(result.to_json()),
        )
        fault_point("result-recorded")

    @staticmethod
    def _proposal_cost(cand: Candidate) -> float:
        """What proposing it cost (an LLM's tokens), so `cost_usd` is the whole bill."""
        usage = (cand.params or {}).get("llm") if isinstance(cand.params, dict) else None
        cost = usage.get("cost_usd") if isinstance(usage, dict) else None
        return float(cost) if isinstance(cost, int | float) else 0.0

    def _cost(self, run_s: float) -> float:
        backend = self.config.backend
        rate = backend.gpu_hourly_usd or backend.cpu_hourly_usd
        return round(rate * run_s / 3600.0, 6)

    # -- hold-out -------------------------------------------------------------------------

    def holdout(self, cand: Candidate) -> JobResult:
        """Run (or reuse) the hold-out evaluation of a finished local candidate."""
        if cand.holdout is not None:
            return JobResult(job_id=cand.job_id, outcome="ok", holdout=cand.holdout)
        result = JobResult.from_json(json.dumps(cand.result))
        if result.holdout is not None or self.backend_kind != "local":
            return result
        spec = self.job_spec(cand)
        spec.job_id = f"{spec.job_id}-holdout"
        spec.holdout_only = True
        spec.reuse_workdir = str(self.backend.job_dir(cand.job_id) / "work")
        self.ledger.event("holdout-submitted", cand.id, job_id=spec.job_id)
        # through _call like every other backend call: a flaky backend is retried and
        # surfaced, not mistaken for a candidate that overfit
        self._call("submit", lambda: self.backend.submit(spec), cand.id)
        while self._call("status", lambda: self.backend.status(spec.job_id),
                         cand.id) in ("pending", "running"):
            time.sleep(POLL_S)
        held = self._call("result", lambda: self.backend.result(spec.job_id), cand.id) or \
            JobResult(job_id=spec.job_id, outcome="error", reason="hold-out job lost")
        if held.outcome == "ok":
            self.ledger.update(cand.id, "holdout", holdout=held.holdout)
        return held

    # -- judging --------------------------------------------------------------------------

    def judge_group(self, ids: list[str]) -> Candidate | None:
        """Judge finished candidates together; promote the best improving one."""
        cands = [self.ledger.candidate(i) for i in ids]
        finished = [c for c in cands if c.status == "finished"]
        if not finished:
            return None
        verdicts: dict[str, judge.Verdict] = {}
        incumbent_metric = self.ledger.get("incumbent_metric")
        incumbent_samples = self.ledger.get("incumbent_samples") or []
        incumbent_holdout = self.ledger.get("incumbent_holdout")
        meta_updates: dict = {}
        for cand in finished:
            if cand.kind not in ("baseline", "incumbent"):
                continue
            result = JobResult.from_json(json.dumps(cand.result))
            forced = judge.outcome_status(result)
            if forced is not None:
                verdicts[cand.id] = judge.Verdict(
                    "crash", [f"{cand.kind} failed: {'; '.join(forced.reasons)}"]
                )
                continue
            verdicts[cand.id] = judge.Verdict(
                "keep" if cand.kind == "baseline" else "reference",
                [f"{cand.kind}: {self.config.metric.name} {result.metric:.6g}"],
            )
            incumbent_metric = result.metric
            incumbent_samples = result.samples
            if self.config.task.holdout:
                held = self.holdout(cand)
                if held.outcome == "ok":
                    incumbent_holdout = held.holdout
            meta_updates.update(incumbent_metric=incumbent_metric,
                                incumbent_samples=incumbent_samples,
                                incumbent_holdout=incumbent_holdout)
            if cand.kind == "baseline":
                meta_updates["incumbent_id"] = cand.id
        paired = any(c.kind == "incumbent" for c in finished)
        contenders: list[tuple[float, Candidate, JobResult]] = []
        for cand in finished:
            if cand.id in verdicts:
                continue
            result = JobResult.from_json(json.dumps(cand.result))
            forced = judge.outcome_status(result)
            if forced is not None:
                verdicts[cand.id] = forced
                continue
            if incumbent_metric is None:
                verdicts[cand.id] = judge.Verdict(
                    "discard", ["no incumbent measurement to compare with (baseline failed)"])
                continue
            verdict = judge.compare(self.config, result, incumbent_metric, incumbent_samples,
                                    paired=paired)
            verdicts[cand.id] = verdict
            if verdict.status == "keep":
                contenders.append((verdict.gain, cand, result))
        winner = None
        for _, cand, result in sorted(contenders, key=lambda t: (-t[0], t[1].seq)):
            if winner is not None:
                verdicts[cand.id].status = "discard"
                verdicts[cand.id].reasons.append(f"beaten by {winner.id} this round")
                continue
            if self.config.task.holdout:
                held = self.holdout(cand)
                result.holdout = held.holdout
                if held.outcome != "ok":
                    verdicts[cand.id].status = "rejected"
                    verdicts[cand.id].reasons.append(f"overfit: {held.reason}")
                    continue
            overfit = judge.check_holdout(self.config, result, incumbent_holdout)
            if overfit:
                verdicts[cand.id].status = "rejected"
                verdicts[cand.id].reasons.append(overfit)
                continue
            if not self._descends(cand.commit_sha, self.ledger.get("incumbent")):
                verdicts[cand.id].status = "discard"
                verdicts[cand.id].reasons.append("not based on the current incumbent")
                continue
            winner = cand
            meta_updates.update(incumbent=cand.commit_sha, incumbent_id=cand.id,
                                incumbent_metric=result.metric,
                                incumbent_samples=result.samples,
                                incumbent_holdout=result.holdout)
        now = time.time()
        with self.ledger.transaction():
            for cand_id, verdict in verdicts.items():
                self.ledger.update(cand_id, f"judged:{verdict.status}", status=verdict.status,
                                   reasons="; ".join(r for r in verdict.reasons if r) or None,
                                   gain=verdict.gain, margin=verdict.margin,
                                   noise=verdict.noise, judged_at=now)
            if meta_updates:
                self.ledger.set(**meta_updates)
        fault_point("verdicts")
        for cand in finished:
            if cand.idea:
                self.ledger.mark_idea(cand.idea, cand.id, verdicts[cand.id].status)
            with contextlib.suppress(Exception):
                self.proposer_observe(self.ledger.candidate(cand.id))
        self._clean_workdirs(finished)
        if winner is not None:
            self._repair_branch()  # moves the branch to the new incumbent
            self.log(f"keep {winner.id} {winner.short}: {winner.description}")
        self._write_views()
        return winner

    def _clean_workdirs(self, cands: list[Candidate]) -> None:
        """An overnight study must not fill the disk with checkpoints of discarded runs."""
        policy = self.config.backend.keep_workdirs
        if policy == "all" or self.backend_kind != "local":
            return
        for cand in cands:
            cand = self.ledger.candidate(cand.id)
            if not cand.job_id or (policy == "kept" and cand.status == "keep"):
                continue
            job_dir = self.backend.job_dir(cand.job_id)
            for sub in ("work", "tmp"):
                path = job_dir / sub
                if path.is_dir():
                    shutil.rmtree(path, onerror=_force_remove)

    def proposer_observe(self, cand: Candidate) -> None:
        if self._proposer is not None:
            self._proposer.observe(cand)

    def _descends(self, commit: str, ancestor: str) -> bool:
        proc = subprocess.run(
            ["git", "-C", str(self.repo), "merge-base", "--is-ancestor", ancestor, commit],
            capture_output=True,
        )
        return proc.returncode == 0

    # -- agent-driven mode ------------------------------------------------------------------

    def submit_rev(
        self, rev: str, message: str | None = None, base: str | None = None
    ) -> list[Candidate]:
        """`ratchet submit REV`: record REV as a candidate and start its job at once.

        The first submission starts the study from `base`; by default the checked-out
        commit, or REV's parent when REV is what is checked out (the agent committed on
        the current branch).
        """
        commit = gitrepo.try_rev_parse(self.repo, rev)
        if commit is None:
            raise StudyError(f"{rev!r} is not a commit in {self.repo}")
        if base is None:
            base = f"{commit}^" if gitrepo.try_rev_parse(self.repo, "HEAD") == commit else "HEAD"
        self.ensure_started(base)
        if self.config.prep:
            self.prepare()
        incumbent = self.ledger.get("incumbent")
        round_no = self.ledger.get("round")
        made = []
        if not any(c.kind == "baseline" for c in self.ledger.candidates()):
            made.append(self.ledger.new_candidate(
                round_no, kind="baseline", parent=incumbent, commit_sha=incumbent,
                description="baseline", status="committed"))
        subject = gitrepo.git(self.repo, "log", "-1", "--format=%s", commit)
        proposal = Proposal(description=message or subject, commit=commit)
        fields = self._materialise(proposal, incumbent, f"c{self._next_seq():04d}")
        fields["proposer"] = "submit"
        cand = self.ledger.new_candidate(round_no, kind="candidate", **fields)
        if cand.commit_sha:
            gitrepo.update_ref(self.repo, study_ref(self.name, cand.id), cand.commit_sha)
        made.append(cand)
        for item in made:
            if item.status == "committed":
                self.submit(item)
        self._write_views()
        return [self.ledger.candidate(c.id) for c in made]

    def wait_ids(self, ids: list[str]) -> list[Candidate]:
        """`ratchet wait ID...`: wait, judge as a group (baseline first), promote the best."""
        self.ensure_started()
        cands = []
        for ref in ids:
            cand = self.ledger.find(ref)
            if cand is None:
                raise StudyError(f"no candidate {ref!r} in this study (see `ratchet status`)")
            cands.append(cand)
        # the baseline must be judged before anything is compared with it
        baseline = [c for c in self.ledger.candidates() if c.kind == "baseline"
                    and not c.is_judged and c.id not in ids]
        group = [c.id for c in baseline + cands]
        trusted = self._trust_snapshot()
        self.wait_for(group, self.ledger.get("round"), self.ledger.get("round"))
        self._check_tampering(trusted, group)
        unjudged = [i for i in group if self.ledger.candidate(i).status == "finished"]
        if unjudged:
            self.judge_group(unjudged)
            self.ledger.set(round=self.ledger.get("round") + 1)
        return [self.ledger.candidate(c.id) for c in cands]

    def cancel(self, ref: str) -> Candidate:
        cand = self.ledger.find(ref)
        if cand is None:
            raise StudyError(f"no candidate {ref!r} in this study")
        if cand.is_judged:
            raise StudyError(f"{cand.id} is already judged ({cand.status})")
        if cand.job_id:
            self.backend.cancel(cand.job_id)
        self.ledger.update(cand.id, "cancelled", status="cancelled",
                           reasons="cancelled by the user", judged_at=time.time())
        self._write_views()
        return self.ledger.candidate(cand.id)

    # -- prep -----------------------------------------------------------------------------

    def prepare(self, force: bool = False) -> Path:
        from ratchet.prep import PrepError, prep_key, prepare

        self.ensure_started()
        # Ray / shell: prepare once into a location every node sees (a prep job on the
        # engine, or here when it is a shared filesystem); None = the local cache below.
        backend_prepare = getattr(self.backend, "prepare", None)
        if backend_prepare is not None:
            try:
                shared = backend_prepare(
                    study=self.name, repo=self.repo, command=self.config.prep.run,
                    pinned_commit=self.ledger.get("pinned"),
                    key=prep_key(self.config.prep.run, self.ledger.get("pins", {})),
                    env_allow=list(self.config.task.env), timeout_s=self.config.task.timeout,
                )
            except PrepError as exc:
                raise StudyError(str(exc)) from None
            if shared is not None:
                data_dir, digest = shared
                if (self.ledger.get("data_digest") != digest
                        or self.ledger.get("data_dir") != data_dir):
                    self.ledger.set(data_dir=data_dir, data_digest=digest)
                return Path(data_dir)
        try:
            data, digest = prepare(
                self.repo,
                self.state_dir,
                self.config.prep.run,
                self.ledger.get("pinned"),
                self.ledger.get("pins", {}),
                list(self.config.task.env),
                self.config.task.timeout,
                force=force,
            )
        except PrepError as exc:
            raise StudyError(str(exc)) from None
        if self.ledger.get("data_digest") != digest or self.ledger.get("data_dir") != str(data):
            self.ledger.set(data_dir=str(data), data_digest=digest)
        return data

    # -- views ----------------------------------------------------------------------------

    def _write_views(self) -> None:
        write_results_tsv(self.repo / "results.tsv", self.ledger, self.config.metric.name)

    def _report(self, round_no: int, target: int, running: list) -> None:
        counts = self.ledger.status_counts()  # polled every few ms: one cheap query
        self._last_progress = Progress(round=round_no, rounds=target, running=running,
                                       best=self.ledger.get("incumbent_metric"),
                                       counts=counts, message=self.trouble)
        self.progress(self._last_progress)

    def sandbox_status(self) -> str:
        return sandbox.describe()


def _force_remove(func, path, exc_info) -> None:  # noqa: ARG001
    """rmtree helper: a candidate may leave read-only files and directories behind."""
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), 0o755)
        os.chmod(path, 0o755)
        func(path)
