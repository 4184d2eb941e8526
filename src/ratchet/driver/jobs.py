"""Jobs: a candidate's job from spec to recorded result, on any backend.

Write-ahead: a job id is recorded before the job is placed (ids are deterministic, so
placing it again after a crash is a no-op), and a result is recorded before anything is
judged. Retries have one owner: a backend applies its own timeouts and raises; `call`
here retries with backoff and reports the trouble (ledger event, log line, live view).
A job lost to infrastructure is rerun up to `backend.max_attempts` times in all; a job
that failed on its own never is.
"""

from __future__ import annotations

import functools
import json
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from ratchet.backends import Backend, JobState, make_backend
from ratchet.core.candidate import Candidate
from ratchet.core.config import Config
from ratchet.core.errors import InfrastructureError
from ratchet.core.vocab import Kind, Outcome, Status
from ratchet.driver import reference
from ratchet.driver.infra import RESUME, InfraFault
from ratchet.driver.spend import compute_usd
from ratchet.job.faults import fault_point
from ratchet.job.jobspec import (
    COMPILE_CACHE_VARS,
    UNREACHABLE_STAGE,
    JobResult,
    JobSpec,
    PinnedFile,
)
from ratchet.store.ledger import Ledger

T = TypeVar("T")
POLL_S = 0.02
# Waiting on jobs: a result is looked for every FAST_POLL_S around the time a job is due
# (jobs of a study take about as long as the ones before them), and every SLOW_POLL_S
# while none is. One look costs about a millisecond of the driver's CPU, so looking fast
# all the time would take a core's share from the jobs themselves.
FAST_POLL_S = 0.005
SLOW_POLL_S = 0.05
# a backend call that raises (engine down, network, timeout) is tried this many times,
# the wait doubling from BACKEND_BACKOFF_S up to 60 s (about 5 minutes in all), before
# the study stops with everything recorded, ready to resume
BACKEND_TRIES = 12
BACKEND_BACKOFF_S = 0.5
# compile caches (jobspec.COMPILE_CACHE_VARS) are shared by the jobs of one study under
# .ratchet/cache/: the second candidate to compile the same kernel finds it built

# the ledger event of a hold-out job whose party the sandbox could not start
HOLDOUT_SHUT_OUT = "holdout-unreachable"


class BackendDown(InfrastructureError):
    """A backend call failed BACKEND_TRIES times; everything is recorded for a resume."""


class Jobs:
    def __init__(self, repo: Path, state_dir: Path, config: Config, ledger: Ledger,
                 backend_kind: str, *, log: Callable[[str], None],
                 on_trouble: Callable[[str], None]) -> None:
        self.repo, self.state_dir, self.config, self.ledger = repo, state_dir, config, ledger
        self.name = config.task.name
        self.backend_kind = backend_kind
        self.log = log
        self.on_trouble = on_trouble  # the live view shows backend trouble while we wait
        self.trouble = ""
        # job ids this driver placed: only a previous driver's jobs are placed again on
        # resume (a baseline started while its round is proposed is not placed twice)
        self._placed_here: set[str] = set()
        self._born = time.time()  # results of jobs started before this are a past machine's
        self._backend: Backend | None = None
        self._cleaner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ratchet-clean")
        self._took: deque[float] = deque(maxlen=8)  # recent jobs' own run times (s)
        # (incumbent id, its extra metrics as JSON)
        self._incumbent_extra: tuple[str | None, str] = ("", "")

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = make_backend(self.backend_kind, self.state_dir, self.config.backend)
        return self._backend

    def warm_up(self) -> None:
        """Start the backend's workers, and decide the sandbox off the main thread (on
        this machine that probes bubblewrap: milliseconds the first round would wait)."""
        self.backend.warm_up()
        self._cleaner.submit(self._sandbox_mode)  # an error is raised again at spec()

    def _sandbox_mode(self) -> str:
        return self.backend.sandbox_mode(self.config.backend.sandbox)

    def close(self) -> None:
        self._cleaner.shutdown(wait=True)
        if self._backend is not None:
            self._backend.close()

    # -- spec and placement ---------------------------------------------------------------

    def spec(self, cand: Candidate) -> JobSpec:
        if cand.commit_sha is None:
            raise LookupError(f"{cand.id}: no commit to run")
        task, backend = self.config.task, self.config.backend
        record = self.ledger.study()
        pins = {k: PinnedFile(**v) for k, v in record.pins.items()}
        holdout_dir = Path(task.holdout_data) if task.holdout_data else None
        if holdout_dir is not None and not holdout_dir.is_absolute():
            holdout_dir = self.repo / holdout_dir
        sandbox = self._sandbox_mode()
        return JobSpec(
            job_id=f"{self.name}-{cand.id}-{cand.attempt}",
            study=self.name,
            candidate=cand.id,
            commit=cand.commit_sha,
            metric=self.config.metric.name,
            timeout_s=task.timeout,
            repo=str(self.repo),
            build=task.build,
            build_on_cpu=task.build_on == "cpu",
            smoke=task.smoke,
            run=task.run,
            evaluate=task.evaluate,
            holdout=task.holdout,
            run_holdout=bool(task.holdout) and self.backend.holdout_in_job,
            repeats=self.config.acceptance.repeats,
            env_allow=list(task.env),
            env_set={**self.cache_env(), **self.incumbent_env(cand)},
            protected=pins,
            data_dir=record.data_dir,
            data_digest=record.data_digest,
            holdout_dir=str(holdout_dir) if holdout_dir else None,
            log_limit_bytes=int(backend.log_limit_mb * (1 << 20)),
            memory_limit_bytes=(int(backend.memory_limit_gb * (1 << 30))
                                if backend.memory_limit_gb else None),
            file_size_limit_bytes=(int(backend.disk_limit_gb * (1 << 30))
                                   if backend.disk_limit_gb else None),
            pids_limit=backend.job_pids,
            disk_bytes=int(backend.job_disk_gb * (1 << 30)) if backend.job_disk_gb else None,
            disk_reserve_bytes=(int(backend.disk_reserve_gb * (1 << 30))
                                if backend.disk_reserve_gb is not None else None),
            # the ledger needs no entry: the worker hides the whole state directory but
            # the job's own parts
            readonly_paths=[str(self.repo / ".git")],
            sandbox=sandbox,
            network=task.network,
        )

    def unreachable(self, commit: str) -> str | None:
        """Why the sandbox could not start this study's jobs' parties here, or None
        (asked before the first job; a stand-in candidate, nothing recorded)."""
        stand_in = Candidate(id="reach", seq=0, round=0, status=Status.COMMITTED,
                             commit_sha=commit)
        return self.backend.unreachable(self.spec(stand_in))

    def incumbent_env(self, cand: Candidate) -> dict[str, str]:
        """$RATCHET_INCUMBENT_EXTRA for a proposed candidate: the incumbent's extra metrics
        as JSON (e.g. its per-shape times), so an evaluator may stop a clearly worse
        candidate early (docs/statistics.md). Only ever a candidate's own run: a
        confirmation re-measure is always measured in full. And the incumbent's progress
        curve, when driver.reference trusts it as a reference for stopping a run."""
        if cand.kind != Kind.CANDIDATE:
            return {}
        inc_id = self.ledger.study().incumbent.id
        if self._incumbent_extra[0] != inc_id:
            row = self.ledger.candidate(inc_id) if inc_id else None
            extra = {k: v for k, v in ((row.extra if row else None) or {}).items()
                     if isinstance(v, int | float) and not isinstance(v, bool)}
            self._incumbent_extra = (inc_id, json.dumps(extra, sort_keys=True) if extra else "")
        _, text = self._incumbent_extra
        return {**({"RATCHET_INCUMBENT_EXTRA": text} if text else {}),
                **self.progress_env(cand, inc_id)}

    def progress_env(self, cand: Candidate, inc_id: str | None) -> dict[str, str]:
        """$RATCHET_INCUMBENT_PROGRESS: the curve the worker stops a clearly worse run
        against (ratchet.job.worker.Progress), when one may be trusted; none for a
        candidate chosen to run in full and check it (reference.audited)."""
        inc_commit = self.ledger.study().incumbent.commit
        if not inc_id or not inc_commit:
            return {}
        ref = reference.reference(self.ledger, inc_id,
                                  minimize=self.config.metric.goal == "minimize")
        if ref.curve is None:
            return {}
        if reference.audited(self.ledger, inc_id, inc_commit, cand.id):
            self.log(f"{cand.id} runs in full: {reference.AUDIT_AFTER} runs in a row were "
                     "stopped against the incumbent's curve, and one checks it")
            return {}
        return {"RATCHET_INCUMBENT_PROGRESS": json.dumps(ref.curve)}

    def cache_env(self) -> dict[str, str]:
        """Compile caches shared by the study's jobs, on by default. The worker binds them
        writable for the candidate's phases and gives trusted phases private ones (an
        evaluator never loads a compiled artefact a candidate could have written)."""
        env = {}
        for var, sub in COMPILE_CACHE_VARS.items():
            path = self.state_dir / "cache" / sub
            path.mkdir(parents=True, exist_ok=True)  # a sandbox can only bind what exists
            env[var] = str(path)
        return env

    def submit(self, cand: Candidate) -> str:
        """Record the job id, then place the job (idempotent under the same id)."""
        spec = self.spec(cand)
        self.ledger.place(cand.id, spec.job_id, time.time())
        fault_point("submit-recorded")
        job_id = self.call("submit", lambda: self.backend.submit(spec), cand.id)
        self._placed_here.add(spec.job_id)
        fault_point("submitted")
        return job_id

    def reattach(self, cand: Candidate) -> None:
        """On resume: place a recorded job again under its id, a no-op if it was placed.

        Covers a driver killed between recording a job id and placing the job, which
        would otherwise look like a lost job and cost the candidate an attempt.
        """
        spec = self.spec(cand)
        if spec.job_id != cand.job_id:  # killed between counting a loss and the new id
            self.ledger.rename_job(cand.id, spec.job_id, time.time())
        self.call("submit", lambda: self.backend.submit(spec), cand.id)
        self._placed_here.add(spec.job_id)

    def start(self, cands: list[Candidate], stop_hard: Callable[[], bool]) -> None:
        """Resume or place the jobs of these candidates (committed ones are placed).

        The job ids of all new placements are recorded in one transaction (one fsync
        for a round, not one per job), then the jobs are placed.
        """
        fresh = []
        for cand in (self.ledger.row(c.id) for c in cands):
            if cand.status == Status.INTERRUPTED:
                # one write: a driver killed before the submit must not count it twice
                self.ledger.requeue(cand.id, cand.attempt + 1)
                fresh.append(self.ledger.row(cand.id))
            elif cand.status == Status.SUBMITTED and cand.job_id not in self._placed_here:
                self.reattach(cand)
            elif cand.status == Status.COMMITTED:
                fresh.append(cand)
        if not fresh or stop_hard():
            return
        specs = [self.spec(cand) for cand in fresh]
        now = time.time()
        with self.ledger.transaction():
            for cand, spec in zip(fresh, specs, strict=True):
                self.ledger.place(cand.id, spec.job_id, now)
        fault_point("submit-recorded")
        for cand, spec in zip(fresh, specs, strict=True):  # all of them: each is recorded
            self.call("submit", functools.partial(self.backend.submit, spec), cand.id)
            self._placed_here.add(spec.job_id)
            fault_point("submitted")

    # -- the one retry loop ---------------------------------------------------------------

    def call(self, what: str, call: Callable[[], T], cand_id: str | None = None) -> T:
        """A backend call; one that raises is retried with backoff and surfaced, never fatal
        to a candidate: after BACKEND_TRIES the study stops with the candidate still
        recorded as submitted, so a resume picks it up."""
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
                    raise BackendDown(f"{problem} ({attempt} tries); nothing is lost: fix the "
                                      "backend, then `ratchet run` resumes the study") from None
                self.trouble = f"{problem}; retry {attempt}/{BACKEND_TRIES - 1} in {delay:g}s"
                self.log(f"warning: {self.trouble}")
                self.on_trouble(self.trouble)
                time.sleep(delay)
                delay = min(delay * 2, 60.0)
            else:
                if self.trouble:
                    self.trouble = ""
                    self.ledger.event("backend-recovered", cand_id, call=what)
                return value
        raise AssertionError("unreachable")

    # -- polling --------------------------------------------------------------------------

    def poll(self, ids: list[str]) -> list[tuple[str, str, float, str]]:
        """One look at the submitted jobs among `ids`: record what finished, rerun what was
        lost, and return what still runs as (id, description, seconds, state)."""
        # the placed jobs' few columns each look; a whole row (decoded) only for a job
        # that ended, which is recorded or rerun from it
        placed = self.ledger.placed(ids)
        if not placed:
            return []
        states: dict[str, JobState] = self.call(
            "status", lambda: self.backend.poll([job_id for _, job_id, _, _ in placed]))
        running: list[tuple[str, str, float, str]] = []
        ended: dict[str, JobResult | None] = {}  # id -> its result (None: lost)
        job_ids = {cand_id: job_id for cand_id, job_id, _, _ in placed}
        now = time.time()
        for cand_id, job_id, description, submitted_at in placed:
            state = states.get(job_id, JobState.LOST)
            if state == JobState.DONE:
                ended[cand_id] = self.call(
                    "result", functools.partial(self.backend.result, job_id), cand_id)
            elif state == JobState.LOST:
                ended[cand_id] = None
            else:
                phase = self.backend.phase(job_id) if state == JobState.RUNNING else None
                running.append((cand_id, description, now - (submitted_at or now),
                                f"{state}: {phase}" if phase else state))
        done: list[tuple[Candidate, JobResult]] = []
        lost: list[Candidate] = []
        for cand in self.ledger.rows(list(ended)) if ended else []:
            if cand.status != Status.SUBMITTED or cand.job_id != job_ids[cand.id]:
                continue  # not the row read a moment ago: the next look sees it as it is
            result = ended[cand.id]
            if result is not None:
                done.append((cand, result))
            else:
                lost.append(cand)
        shut_out = [(c, r) for c, r in done if unreachable(r)]
        done = [(c, r) for c, r in done if not unreachable(r)]
        if done:  # the results of one look in one transaction (one fsync)
            with self.ledger.transaction():
                for cand, result in done:
                    self._record(cand, result)
            fault_point("result-recorded")
        for cand in lost:  # outside it: a rerun is recorded before it is placed
            self.handle_lost(cand)
        for cand, result in shut_out:
            self.handle_shut_out(cand, result)
        return running

    def handle_shut_out(self, cand: Candidate, result: JobResult) -> None:
        """The sandbox could not start one of the job's parties (its uid cannot reach the
        interpreter, the venv or the job's tree): the machine's fault, never a verdict.
        Run again while attempts are left (the machine may have been mended meanwhile);
        then the candidate is left pending and the study stops with the worker's line."""
        self.ledger.event("sandbox-unreachable", cand.id, job_id=result.job_id,
                          reason=result.reason)
        # a job that started before this driver did speaks of the machine as it was then
        # (the user may have mended it since): always run again
        stale = (result.started_at or 0.0) < self._born
        if stale or cand.attempt + 1 < self.backend.max_attempts:
            self.log(f"{cand.id}: {result.reason} (run again)")
            self.ledger.retry(cand.id, cand.attempt + 1, "unreachable-resubmitted")
            self.submit(self.ledger.row(cand.id))
            return
        self.ledger.interrupt(cand.id, f"{result.reason} (left pending)",
                              *self._held_meanwhile(cand))
        raise InfraFault(f"{result.reason}; {RESUME}")

    def wait(self, ids: list[str], report: Callable[[list], None],
             stop_hard: Callable[[], bool], deadline: float | None = None) -> bool:
        """Until none of `ids` runs (True); a second Ctrl-C interrupts what still runs.
        False: some still ran at `deadline` (time.monotonic()), and were left running."""
        cancelled = False
        while True:
            running = self.poll(ids)
            report(running)
            if not running:
                return True
            if stop_hard() and not cancelled:
                cancelled = True
                for cand_id, *_ in running:
                    self.interrupt(self.ledger.row(cand_id))
                continue
            pause = self.pause(running)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                pause = min(pause, left)
            time.sleep(pause)

    def pause(self, running: list[tuple[str, str, float, str]]) -> float:
        """How long to wait before the next look at `running` (id, desc, seconds since
        placed, state). A job is looked for fast from shortly before it can be done (no
        job is done before the shortest recent run time) until a while after the longest
        (a job also waits to be picked up); otherwise rarely, or at the usual pace once
        every job is past that (a slow one)."""
        if not self._took or not running:
            return POLL_S
        start = min(self._took) - 2 * SLOW_POLL_S
        end = max(self._took) + max(0.25, 0.1 * max(self._took))
        elapsed = [e for _, _, e, _ in running]
        if any(start <= e <= end for e in elapsed):
            return FAST_POLL_S
        early = [e for e in elapsed if e < start]
        if early:  # until the first of them is in its window
            return min(SLOW_POLL_S, max(FAST_POLL_S, start - max(early)))
        return POLL_S

    def interrupt(self, cand: Candidate) -> None:
        job_id = _placed(cand)
        # through call() like every other backend call: retried and surfaced, one owner
        self.call("cancel", lambda: self.backend.cancel(job_id), cand.id)
        if self.call("status", lambda: self.backend.status(job_id), cand.id) == JobState.DONE:
            result = self.call("result", lambda: self.backend.result(job_id), cand.id)
            if result is not None and result.outcome != Outcome.CANCELLED:
                self.record_result(cand, result)  # it finished before the cancel landed
                return
        self.ledger.interrupt(cand.id, "interrupted (Ctrl-C); rerun on resume",
                              *self._held_meanwhile(cand))

    def _held_meanwhile(self, cand: Candidate) -> tuple[float, float]:
        """An attempt that ends with no result (interrupted, lost) still held its slot
        from its placing until now: spent, and counted (`extra_slot_s`, `cost_usd`)."""
        held = max(0.0, time.time() - (cand.submitted_at or time.time()))
        return (round((cand.extra_slot_s or 0.0) + held, 3),
                round((cand.cost_usd or 0.0) + compute_usd(self.config, held), 6))

    def handle_lost(self, cand: Candidate) -> None:
        max_attempts = self.backend.max_attempts
        if cand.attempt + 1 >= max_attempts:
            lost = JobResult(job_id=_placed(cand), outcome=Outcome.ERROR,
                             failed_stage="infrastructure",
                             reason=f"job lost {max_attempts} times (worker vanished)")
            self.ledger.lose(cand.id, lost.reason, json.loads(lost.to_json()))
            return
        self.ledger.retry(cand.id, cand.attempt + 1, "lost-resubmitted")
        self.submit(self.ledger.row(cand.id))

    def record_result(self, cand: Candidate, result: JobResult | None) -> None:
        if result is None:
            self.handle_lost(cand)
            return
        self._record(cand, result)
        fault_point("result-recorded")

    def _record(self, cand: Candidate, result: JobResult) -> None:
        run_s = sum(p.seconds for p in result.phases)
        if result.outcome == Outcome.OK and result.started_at and result.finished_at:
            # the worker's own clock: the job's time without the wait to be picked up
            self._took.append(max(0.0, result.finished_at - result.started_at))
        self.ledger.finish(
            cand.id,
            metric=result.metric,
            samples=result.samples,
            extra=result.extra,
            holdout=result.holdout,
            phases=[p.__dict__ for p in result.phases],
            failed_stage=result.failed_stage,
            slot=result.slot,
            queue_s=result.queue_seconds,
            run_s=run_s,
            # compute alone: the proposal's calls are priced in the ledger's calls
            # (spend.py); what earlier attempts held is added, not overwritten
            cost_usd=round(compute_usd(self.config, slot_seconds_of(result))
                           + (cand.cost_usd or 0.0), 6),
            finished_at=time.time(),
            reasons=result.reason or None,
            result=json.loads(result.to_json()),
        )

    # -- hold-out follow-up jobs ----------------------------------------------------------

    def holdout(self, cand: Candidate) -> JobResult:
        """The hold-out of a finished candidate: recorded, measured in its own job, or run
        now as a follow-up job (only ever for a would-be keep or a baseline)."""
        if cand.holdout is not None:
            return JobResult(job_id=_placed(cand), outcome=Outcome.OK, holdout=cand.holdout)
        result = JobResult.from_json(json.dumps(cand.result))
        if result.holdout is not None or self.backend.holdout_in_job:
            return result
        spec = self.spec(cand)
        # after a hold-out job the sandbox could not start, the next one has an id of its
        # own (placing the same id again would only read the old result)
        shut_out = sum(e["kind"] == HOLDOUT_SHUT_OUT for e in self.ledger.events(cand.id))
        spec.job_id = f"{spec.job_id}-holdout" + (f".{shut_out + 1}" if shut_out else "")
        spec.holdout_only = True
        spec.reuse_workdir = self.backend.holdout_workdir(_placed(cand))
        self.ledger.event("holdout-submitted", cand.id, job_id=spec.job_id)
        # through call() like every other backend call: a flaky backend is retried and
        # surfaced, not mistaken for a candidate that overfit
        self.call("submit", lambda: self.backend.submit(spec), cand.id)
        while self.call("status", lambda: self.backend.status(spec.job_id),
                        cand.id) in (JobState.PENDING, JobState.RUNNING):
            time.sleep(POLL_S)
        held = self.call("result", lambda: self.backend.result(spec.job_id), cand.id) or \
            JobResult(job_id=spec.job_id, outcome=Outcome.ERROR, reason="hold-out job lost")
        if unreachable(held):  # the machine's fault, never `overfit`: stop, judge it later
            self.ledger.event(HOLDOUT_SHUT_OUT, cand.id, job_id=spec.job_id, reason=held.reason)
            raise InfraFault(f"{held.reason}; {RESUME}")
        # the follow-up job held a slot too: its time and price join the row's
        spent = slot_seconds_of(held)
        cand = self.ledger.row(cand.id)
        self.ledger.record_holdout(cand.id, held.holdout if held.outcome == Outcome.OK
                                   else cand.holdout,
                                   extra_slot_s=round((cand.extra_slot_s or 0.0) + spent, 3),
                                   cost_usd=round((cand.cost_usd or 0.0)
                                                  + compute_usd(self.config, spent), 6))
        return held

    # -- after judging --------------------------------------------------------------------

    def clean_up(self, cands: list[Candidate]) -> None:
        """An overnight study must not fill the disk with checkpoints of discarded runs."""
        policy = self.config.backend.keep_workdirs
        if policy == "all":
            return
        for cand in cands:
            cand = self.ledger.row(cand.id)
            if not cand.job_id or (policy == "kept" and cand.status == Status.KEEP):
                continue
            # off the loop: deleting a checkpoint must not delay the next round
            self._cleaner.submit(self.backend.clean_up, cand.job_id)

    def cancel(self, cand: Candidate) -> None:
        if cand.job_id:
            job_id = cand.job_id
            self.call("cancel", lambda: self.backend.cancel(job_id), cand.id)


def _placed(cand: Candidate) -> str:
    """The job id of a candidate whose job was placed (recorded before placing)."""
    if cand.job_id is None:
        raise LookupError(f"{cand.id}: no job was placed")
    return cand.job_id


def unreachable(result: JobResult) -> bool:
    """Did the job fail because the sandbox could not start one of its parties?"""
    return result.outcome == Outcome.ERROR and result.failed_stage == UNREACHABLE_STAGE


def slot_seconds_of(result: JobResult) -> float:
    """What a job's phases held of its slot (a build on a CPU build slot excluded)."""
    return sum(p.seconds for p in result.phases if not getattr(p, "off_slot", False))
