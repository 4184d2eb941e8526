"""`python -m ratchet.job.worker JOBDIR`: the one trusted program on the job's machine.

Same for every backend. It leases a slot, materialises the candidate's snapshot,
restores the pinned protected files, runs build / smoke / run / evaluate (/ holdout) as
separate phases in fresh process groups with a scrubbed environment and one deadline,
checks that nothing protected changed, and writes the result. The candidate's own output
goes to capped log files only; the result channel is written by this process alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO

from ratchet.core.vocab import Outcome
from ratchet.job import leftovers, limits, reach, sandbox, seal
from ratchet.job.jobspec import (
    COMPILE_CACHE_VARS,
    JOB_DIR_ENV,
    RESULT_MARKER,
    STDOUT,
    UNREACHABLE_STAGE,
    JobResult,
    JobSpec,
    PhaseResult,
    Slot,
    collect_metrics,
    scrub_env,
    sha256,
    unreachable_on_channel,
)
from ratchet.job.prep import (  # data_digest: re-exported
    DataError,
    data_digest,
    ensure_intact,
    private_copy,
)
from ratchet.job.procs import (
    KILL_GRACE_S,
    PeakMemory,
    become_subreaper,
    kill_descendants,
    run_capped,
)
from ratchet.job.slots import lease_slot

_stop_requested = False


def _on_term(signum, frame) -> None:  # noqa: ARG001
    global _stop_requested
    _stop_requested = True


def _write_state(path: Path, state: str, phase: str | None = None) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"state": state, "pid": os.getpid(), "t": time.time(),
                               "phase": phase}))
    tmp.replace(path)


# ---------------------------------------------------------------------------------------
# protected files


def restore_protected(spec: JobSpec, work: Path) -> None:
    for rel, pinned in spec.protected.items():
        target = work / rel
        if target.is_symlink() or (target.exists() and target.is_dir()):
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
        content = pinned.content()
        if content is None:
            if target.exists():
                target.unlink()
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(pinned.mode)


def protected_violations(spec: JobSpec, work: Path) -> list[str]:
    problems = []
    for rel, pinned in spec.protected.items():
        target = work / rel
        if target.is_symlink():
            problems.append(f"protected file {rel} was replaced by a symlink")
        elif pinned.content_b64 is None:
            if target.exists():
                problems.append(f"protected path {rel} was created")
        elif not target.is_file():
            problems.append(f"protected file {rel} was removed")
        elif sha256(target.read_bytes()) != pinned.sha256:
            problems.append(f"protected file {rel} was modified")
    return problems


# ---------------------------------------------------------------------------------------
# the trusted metric channel (the evaluator's side is ratchet.evaluator.channel)

METRICS_FD_ENV = "RATCHET_METRICS_FD"
CHANNEL_LIMIT = 1 << 20  # bytes; an evaluator reports a few lines
# phases that run trusted (the worker's uid): evaluate, evaluate.N, holdout
TRUSTED_PHASES = ("evaluate", "holdout")
# what an evaluator's log says when its own uid could not read what it imports (a venv
# closed to others): worth a probe before the failure is put on the candidate
SHUT_OUT_WORDS = ("ModuleNotFoundError", "ImportError", "PermissionError", "Permission denied")


class MetricPipe:
    """One trusted phase's metric pipe: the phase gets the write end, we drain the other.

    Drained by a thread while the phase runs, so an evaluator never blocks on a full pipe.
    Both ends are created non-inheritable; only the phase we start receives the write end
    (`pass_fds`), never build / smoke / run.
    """

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.data = bytearray()
        self.overflow = False
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            room = CHANNEL_LIMIT - len(self.data)
            self.data += chunk[:max(room, 0)]
            self.overflow |= len(chunk) > room

    def close_writer(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def finish(self) -> bytes:
        """Call once the phase's whole process tree is gone: EOF comes at once."""
        self.close_writer()
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            # closed only once no thread reads it: a read blocked on a closed descriptor
            # can be restarted by the kernel on whatever file takes the number next
            # (egress.Proxy.close), here the next phase's pipe. A writer left alive past
            # its tree's end keeps it open; the worker's exit closes it.
            with contextlib.suppress(OSError):
                os.close(self.read_fd)
        return bytes(self.data)


# the run phase's progress (candidate code: it can only ever stop a run, never keep one)

PROGRESS_FD_ENV = "RATCHET_PROGRESS_FD"
INCUMBENT_PROGRESS_ENV = "RATCHET_INCUMBENT_PROGRESS"
PROGRESS_POINTS = 200  # the curve a result keeps: enough to compare a later run with
PROGRESS_POLL_S = 0.25


class Progress:
    """A training run's progress reports, compared with the incumbent's as they come.

    The run phase writes lines `<step> <value>` (lower is better: a loss; the step any
    measure of progress the runs share: a step number, tokens, seconds of a time budget)
    to the pipe in $RATCHET_PROGRESS_FD. When the driver passed the incumbent's curve
    ($RATCHET_INCUMBENT_PROGRESS), the run is stopped (its whole tree killed) as soon as
    stats.clearly_worse_run says it is clearly worse at the same step. A stop only ever
    discards: the reports come from candidate code, and a keep needs the evaluator's
    full measurement and its confirmation."""

    def __init__(self, incumbent: list[tuple[float, float]]) -> None:
        self.pipe = MetricPipe()
        self.incumbent = incumbent
        self.points: list[tuple[float, float]] = []
        self.stopped: tuple[float, float, float] | None = None  # (step, value, incumbent's)
        self._parsed = 0
        self._next = 0.0

    def _parse(self) -> None:
        data = bytes(self.pipe.data)
        end = data.rfind(b"\n") + 1
        for line in data[self._parsed:end].splitlines():
            fields = line.split()
            try:
                step, value = float(fields[0]), float(fields[1])
            except (IndexError, ValueError):
                continue  # not a report: ignored
            if step == step and value == value and abs(step) != float("inf"):
                self.points.append((step, value))
        self._parsed = max(self._parsed, end)

    def poll(self) -> bool:
        """Read what came; True when the run should stop now."""
        now = time.monotonic()
        if now < self._next or not self.incumbent:
            return False
        self._next = now + PROGRESS_POLL_S
        before = len(self.points)
        self._parse()
        if len(self.points) == before:
            return False
        from ratchet.core import stats  # only when there is a curve to compare: pure arithmetic

        self.stopped = stats.clearly_worse_run(self.points, self.incumbent)
        return self.stopped is not None

    def finish(self) -> list[list[float]]:
        """The curve to record, thinned to PROGRESS_POINTS (the last report kept)."""
        self.pipe.finish()
        self._parse()
        points = self.points
        if len(points) > PROGRESS_POINTS:
            stride = len(points) / PROGRESS_POINTS
            points = [points[int(i * stride)] for i in range(PROGRESS_POINTS - 1)] + [points[-1]]
        return [[s, v] for s, v in points]


def incumbent_curve(spec: JobSpec) -> list[tuple[float, float]]:
    """The incumbent's run-phase curve the driver passed with this job ([] if none)."""
    try:
        data = json.loads(spec.env_set.get(INCUMBENT_PROGRESS_ENV) or "[]")
        return [(float(s), float(v)) for s, v in data]
    except (TypeError, ValueError):
        return []


# ---------------------------------------------------------------------------------------
# the job


class Job:
    def __init__(self, spec: JobSpec, job_dir: Path, work: Path) -> None:
        self.spec = spec
        self.job_dir = job_dir
        self.work = work
        self.logs = job_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.result = JobResult(job_id=spec.job_id, outcome=Outcome.ERROR)
        self.deadline = 0.0
        self.env: dict[str, str] = {}
        self.sandbox_kind = sandbox.Level.NONE
        self._shared_caches: list[Path] = []
        self.channel_data: dict[str, bytes] = {}  # trusted phase -> what its pipe carried
        self.data_dir = Path(spec.data_dir) if spec.data_dir else None  # $RATCHET_DATA
        self.memory_extra: dict[str, float] = {}  # the worker's measurement wins
        self.off_slot = False  # phases now run on a CPU build slot, not the job's own
        self.stopped: tuple[float, float, float] | None = None  # the run, stopped early
        self.bounds: limits.Watch | None = None  # made by start(), once the tree is laid out
        self.committed_links: dict[str, str] = {}  # the tree's own symlinks, before any phase

    def on_slot(self, slot: Slot | None, own: bool = True) -> None:
        """Run the next phases on `slot`: its devices, its cores; `own`: the job's own slot,
        named in its result (a build slot is not)."""
        self.env = build_env(self.spec, self.job_dir, self.work, slot)
        if self.data_dir is not None:
            self.env["RATCHET_DATA"] = str(self.data_dir)  # the job's own copy, if made
        if slot is not None and slot.cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, slot.cpus)  # phases inherit it
        if own:
            self.result.slot = slot.name if slot else None

    @property
    def trusted_tmp(self) -> Path:
        """TMPDIR of the trusted phases: beside the candidate's tmp, never inside it, so
        nothing a candidate phase planted there (a symlink named like a cache) is met."""
        return self.job_dir / "trusted-tmp"

    def _fresh_eval_dir(self) -> Path:
        """$RATCHET_RESULT's directory, recreated: nothing an earlier phase left counts."""
        eval_dir = self.job_dir / "eval"
        if eval_dir.is_symlink() or eval_dir.is_file():
            eval_dir.unlink()
        elif eval_dir.exists():
            shutil.rmtree(eval_dir)
        eval_dir.mkdir()
        return eval_dir

    def _compile_caches(self, env: dict[str, str], name: str, trusted: bool) -> list[Path]:
        """Shared compile caches: writable for the candidate's phases; private when trusted.

        A shared cache that a candidate can write could hand the evaluator a poisoned
        compiled kernel, so trusted phases compile into their own directory instead.
        """
        shared = []
        for var in COMPILE_CACHE_VARS:
            if var not in env:
                continue
            if trusted:
                path = self.trusted_tmp / f"{name}-cache" / var.lower()
                env[var] = str(path)
            else:
                path = Path(env[var])
                shared.append(path)
            path.mkdir(parents=True, exist_ok=True)  # bwrap binds only what exists
        return shared

    @property
    def trusted_level(self) -> sandbox.Level:
        """Where the trusted phases run. As root, wherever this machine has a PID namespace,
        in one `unshare` makes (the warden builds their view), as the evaluator's own uid:
        its candidate child then gets a PID namespace of its own inside (bubblewrap's /proc
        forbids a nested one to a process that is not root). Elsewhere, the jobs' level."""
        if os.geteuid() == 0 and self.sandbox_kind != sandbox.Level.NONE \
                and sandbox.unshare_prefix() is not None:
            return sandbox.Level.PIDNS
        return self.sandbox_kind

    def policy(self, name: str, env: dict[str, str], result_dir: Path | None, *,
               trusted: bool, keep_fds: tuple[int, ...] = ()) -> sandbox.Policy:
        """What the phase may write and see. Every phase runs under the sandbox's warden, so
        its whole tree dies with it; candidate phases also run as the job's own unprivileged
        uid (when the worker is root). Trusted phases (the evaluator) run as a uid of their
        own, neither root nor the candidate's, where the machine has a PID namespace (at
        `none` they keep the worker's uid)."""
        writable = [self.work, self.job_dir / "tmp"] + ([result_dir] if result_dir else [])
        if trusted:
            writable.append(self.trusted_tmp)
        self._shared_caches = self._compile_caches(env, name, trusted)
        writable += self._shared_caches
        # the study's state (ledger, keys, other jobs) is hidden around the job's own dirs
        state_dir = self.job_dir.parent.parent
        hidden = [state_dir] if (state_dir / "jobs") == self.job_dir.parent else []
        readonly = [*self.spec.readonly_paths, *([self.spec.data_dir] if self.spec.data_dir else [])]
        if self.data_dir is not None:
            readonly.append(str(self.data_dir))
        if self.spec.holdout_dir and not name.startswith("holdout"):
            # hold-out data is visible to the hold-out evaluator alone: the public evaluator
            # imports candidate code, which must not be able to read it
            hidden.append(Path(self.spec.holdout_dir))
        elif self.spec.holdout_dir:
            readonly.append(self.spec.holdout_dir)
        # no network unless the task asks: trusted phases too, since an evaluator may
        # import candidate code in its own process
        evaluator_uid = self.trusted_level == sandbox.Level.PIDNS
        policy = sandbox.Policy(writable=writable, hidden=hidden, readonly=readonly,
                                drop_privileges=not trusted or evaluator_uid,
                                uid=sandbox.evaluator_uid(str(state_dir)) if trusted else None,
                                seed=str(state_dir), keep_fds=keep_fds,
                                network=self.spec.network)
        if trusted:
            # a dropped uid's ~/.local could otherwise plant .pth files for the evaluator
            # (the work tree itself stays off its sys.path when evaluate runs `python -P`)
            env["PYTHONNOUSERSITE"] = "1"
            # what the evaluator writes: its result file's directory, its own temporary
            # files and compile caches, and the tree (evaluators write outputs there); the
            # candidate's phases are over in it, and what they left was checked already
            # (refuse_leftovers: lchown never follows a link)
            sandbox.grant([d for d in (self.work, result_dir, self.trusted_tmp)
                           if d is not None], policy)
            uid = policy.party_uid()
            if uid is not None and not sandbox.reachable(Path(env.get("HOME", "/")), uid):
                env["HOME"] = str(self.trusted_tmp)
        else:
            sandbox.grant([self.work, self.job_dir / "tmp"], policy)
            sandbox.share(writable[len(writable) - len(self._shared_caches):])
            uid = policy.party_uid()
            if uid is not None and not sandbox.reachable(Path(env.get("HOME", "/")), uid):
                env["HOME"] = str(self.job_dir / "tmp")  # the dropped uid cannot enter root's
        return policy

    def phase(self, name: str, command: str, *, trusted: bool = False) -> PhaseResult:
        with contextlib.suppress(OSError):  # for the live view only: never fails a job
            _write_state(self.job_dir / "state.json", "running", phase=name)
        env = dict(self.env)
        result_file = self.job_dir / "eval" / f"{name}.json"
        pipe: MetricPipe | None = None
        if trusted:
            result_file = self._fresh_eval_dir() / f"{name}.json"
            env["RATCHET_RESULT"] = str(result_file)
            pipe = MetricPipe()
            env[METRICS_FD_ENV] = str(pipe.write_fd)
            env["RATCHET_REPEAT"] = name.rpartition(".")[2] if "." in name else "1"
            if self.spec.holdout_dir and name.startswith("holdout"):
                env["RATCHET_HOLDOUT"] = self.spec.holdout_dir
            shutil.rmtree(self.trusted_tmp, ignore_errors=True)
            self.trusted_tmp.mkdir()
            for var in ("TMPDIR", "HOME"):
                if env.get(var) == str(self.job_dir / "tmp"):
                    env[var] = str(self.trusted_tmp)
        progress = Progress(incumbent_curve(self.spec)) if name == "run" else None
        if progress is not None:
            env[PROGRESS_FD_ENV] = str(progress.pipe.write_fd)
        fds = (pipe.write_fd,) if pipe else (progress.pipe.write_fd,) if progress else ()
        argv = sandbox.command(self.trusted_level if trusted else self.sandbox_kind,
                               ["/bin/sh", "-c", command],
                               self.policy(name, env, result_file.parent if trusted else None,
                                           trusted=trusted, keep_fds=fds))
        # memory_gb: the training run's peak; without a run phase, the evaluation's
        measure = name == "run" or (not self.spec.run and name.startswith("evaluate"))
        # sampling is light (~7 ms a sample) and sparser while an evaluator may be timing;
        # the kernel's per-process high-water marks keep the peaks between samples
        monitor = PeakMemory(interval_s=0.5 if name == "run" else 1.0) if measure else None
        started_at = time.time()

        def stop_asked() -> bool:
            return _stop_requested or bool(progress and progress.poll())

        bounds = self.bounds
        should_stop = stop_asked
        if bounds is not None:
            bounds.start_phase()
            should_stop = bounds.stop_when(stop_asked)
        try:
            with monitor or contextlib.nullcontext():
                code, timed_out, log, seconds = run_capped(
                argv,
                    cwd=self.work,
                    env=env,
                    log_path=self.logs / f"{name}.log",
                    deadline=self.deadline,
                    log_limit=self.spec.log_limit_bytes,
                    memory_limit_bytes=self.spec.memory_limit_bytes,
                    should_stop=should_stop,
                    file_size_limit_bytes=self.spec.file_size_limit_bytes,
                    pass_fds=fds,
                    reap_all_descendants=True,  # a subreaper: every descendant is the phase's
                    # a run stopped as clearly worse is discarded, and a bound passed is a
                    # crash: no grace needed (a disk filler would go on writing)
                    stop_grace_s=lambda: (0.2 if progress is not None or (
                        bounds is not None and bounds.breached) else KILL_GRACE_S),
                    before_exec=bounds.pids.join if bounds is not None else None,
                )
        finally:
            if pipe is not None:  # run_capped killed the phase's whole tree: EOF is due
                self.channel_data[name] = pipe.finish()
            if progress is not None:
                self.result.progress = progress.finish()
                self.stopped = progress.stopped
        if monitor is not None:
            self.record_memory(name, monitor)
        phase = PhaseResult(
            name=name,
            command=command,
            exit_code=code,
            seconds=round(seconds, 4),
            timed_out=timed_out,
            log=str(self.logs / f"{name}.log"),
            log_truncated_bytes=log.dropped,
            signal=-code if code is not None and code < 0 else None,
            off_slot=self.off_slot,
            started_at=round(started_at, 4),
        )
        self.result.phases.append(phase)
        return phase

    def record_memory(self, name: str, monitor: PeakMemory) -> None:
        if name == "run":
            rss, gpu, source = monitor.tree_rss, monitor.tree_gpu, "run phase (whole process tree)"
        elif monitor.child_seen:
            rss, gpu = monitor.child_rss, monitor.child_gpu
            source = "evaluate phase (the evaluator's child processes)"
        else:
            rss, gpu = monitor.tree_rss, monitor.tree_gpu
            source = ("evaluate phase, whole (the evaluator ran the candidate in its own "
                      "process, so its own footprint is included)")
        peak = gpu if gpu > 0 else rss
        if peak <= 0:
            return  # nothing measured: no figure rather than a dummy 0.0
        gib = round(peak / (1 << 30), 4)
        if self.result.memory_gb is None or gib > self.result.memory_gb:
            self.result.memory_gb = gib
            self.result.memory_source = source + (": GPU memory (nvidia-smi)" if gpu > 0
                                                  else ": peak RSS")
            self.memory_extra = {"memory_gb": gib, "peak_rss_gb": round(rss / (1 << 30), 4)}
            if gpu > 0:
                self.memory_extra["peak_gpu_gb"] = gib

    def fail(self, outcome: Outcome, stage: str, reason: str) -> JobResult:
        self.result.outcome = outcome
        self.result.failed_stage = stage
        self.result.reason = reason
        return self.result

    def check_phase(self, phase: PhaseResult) -> JobResult | None:
        if _stop_requested:
            return self.fail(Outcome.CANCELLED, phase.name, "cancelled")
        breach = self.bounds.breached if self.bounds is not None else None
        if breach is not None:
            # the candidate's doing (its code runs in every phase): a crash, never retried
            removed = ""
            if breach.bound != limits.Bound.PIDS:  # so the ledger's disk can record it
                limits.empty([self.work, self.job_dir / "tmp"])
                removed = "; what the job wrote was removed"
            return self.fail(Outcome.FAILED, phase.name,
                             f"{phase.name} passed the job's {breach.bound} bound: "
                             f"{breach.detail}; its processes were killed{removed}")
        if phase.timed_out:
            return self.fail(
                Outcome.TIMEOUT,
                phase.name,
                f"{phase.name} timed out (job timeout {self.spec.timeout_s:g}s); process tree killed",
            )
        if phase.exit_code != 0 and (line := self.unreachable(phase)):
            return self.fail(Outcome.ERROR, UNREACHABLE_STAGE, line)
        if phase.exit_code != 0:
            why = f"exit code {phase.exit_code}"
            if phase.signal == signal.SIGKILL:
                why += " (killed: out of memory?)"
            tail = _tail(Path(phase.log))
            if self.spec.file_size_limit_bytes and (
                    phase.signal == signal.SIGXFSZ or "File too large" in tail):
                why += (f" (file size limit: a file reached [backend] disk_limit_gb = "
                        f"{self.spec.file_size_limit_bytes / (1 << 30):g})")
            return self.fail(Outcome.FAILED, phase.name, f"{phase.name} failed: {why}{tail}")
        return None

    def unreachable(self, phase: PhaseResult) -> str | None:
        """The line saying why the sandbox could not start this phase's party, when it died
        at its start and a fresh probe as its uid confirms it (the candidate could print
        the warden's words itself: only the probe, which runs none of its code and checks
        nothing it can write, makes it the machine's fault)."""
        try:
            with open(phase.log, "rb") as fh:
                head = fh.read(4096).decode(errors="replace")
        except OSError:
            return None
        trusted = phase.name.startswith(TRUSTED_PHASES)
        if trusted and self.trusted_level != sandbox.Level.PIDNS:
            return None  # a trusted phase keeps the worker's uid: nothing to be shut out of
        # the warden could not start it, or its shell could not run `python` (126: not
        # executable, 127: not found; a closed venv looks like either); an evaluator that
        # cannot read the venv fails on its first import instead
        shut_out = reach.start_failed(head) or phase.exit_code in (126, 127) or (
            trusted and any(word in head for word in SHUT_OUT_WORDS))
        if not shut_out:
            return None
        env = dict(self.env)
        policy = self.policy(phase.name, env, None, trusted=trusted)
        data = [self.data_dir] if self.data_dir is not None else []
        if trusted and phase.name.startswith("holdout") and self.spec.holdout_dir:
            data.append(Path(self.spec.holdout_dir))  # read as the evaluator's uid now
        party = f"the evaluator's {phase.name} phase" if trusted else \
            f"the candidate's {phase.name} phase"
        return reach.probe(self.trusted_level if trusted else self.sandbox_kind, policy,
                           reach.needed(extra=data), party, env=env, cwd=self.work,
                           trees=[self.work])

    def prepare_data(self) -> JobResult | None:
        """Intact prepared data for this job, before any phase runs.

        A modified shared cache is restored from its pristine copy first: the offender
        was rejected by its own job, and this one must not pay for it. Without a read-only
        sandbox, small data is copied for this job alone, so what a candidate writes
        there reaches no other job.
        """
        spec = self.spec
        if not (spec.data_dir and spec.data_digest):
            return None
        shared = Path(spec.data_dir)
        try:
            note = ensure_intact(shared, spec.data_digest,
                                 keep_pristine=self.sandbox_kind != sandbox.BWRAP)
            if note:
                self.result.notes.append(note)
            if self.sandbox_kind != sandbox.BWRAP and private_copy(
                    shared, spec.data_digest, self.job_dir / "data"):
                self.data_dir = self.job_dir / "data"
        except (DataError, OSError) as exc:
            return self.fail(Outcome.ERROR, "checkout", f"prepared data: {exc}")
        self.env["RATCHET_DATA"] = str(self.data_dir)
        return None

    def check_integrity(self, after: str) -> JobResult | None:
        problems = protected_violations(self.spec, self.work)
        data = self.data_dir
        if data and self.spec.data_digest and data_digest(data) != self.spec.data_digest:
            problems.append("prepared data ($RATCHET_DATA) was modified")
            if data == Path(self.spec.data_dir or ""):  # the shared cache: for the next job
                with contextlib.suppress(DataError, OSError):
                    note = ensure_intact(data, self.spec.data_digest)
                    problems[-1] += f" ({note or 'restored'})"
        if problems:
            self.result.violations.extend(problems)
            return self.fail(Outcome.VIOLATION, after, f"after {after}: " + "; ".join(problems))
        return None

    def refuse_leftovers(self, before: str) -> JobResult | None:
        """Reject the candidate when its phases left in the tree what a trusted phase must
        not follow (leftovers.refused): checked before anything trusted touches the tree,
        the pinned files' restore included (it writes as root)."""
        found = leftovers.refused([self.work], self.committed_links)
        if not found:
            return None
        reason = leftovers.reason(found, before)
        self.result.violations.append(reason)
        return self.fail(Outcome.VIOLATION, before, reason)

    def evaluate(self, name: str, command: str) -> tuple[dict, JobResult | None]:
        refused = self.refuse_leftovers(before=name)
        if refused:
            return {}, refused
        restore_protected(self.spec, self.work)
        phase = self.phase(name, command, trusted=True)
        line = unreachable_on_channel(self.channel_data.get(name, b""))
        if line:  # its candidate child could not be started: the machine's fault
            return {}, self.fail(Outcome.ERROR, UNREACHABLE_STAGE, line)
        failure = self.check_phase(phase) or self.check_integrity(after=name)
        if failure:
            return {}, failure
        json_file = self.job_dir / "eval" / f"{name}.json"
        filed = None
        if json_file.is_file() and not json_file.is_symlink():
            with contextlib.suppress(ValueError, OSError):
                data = json.loads(json_file.read_text())
                filed = data if isinstance(data, dict) else None
        reading = collect_metrics(
            channel=self.channel_data.get(name, b""),
            log_text=Path(phase.log).read_text(errors="replace"),
            result_file=filed,
            critical={self.spec.metric, "correct"},
        )
        if not self.result.metrics_source or reading.source == STDOUT:
            self.result.metrics_source = reading.source  # the weakest source of the job
        if reading.tampering:
            reason = "tampering: " + "; ".join(dict.fromkeys(reading.tampering))
            self.result.violations.append(reason)
            return reading.metrics, self.fail(Outcome.VIOLATION, name, f"{name}: {reason}")
        metrics = reading.metrics
        if metrics.get("correct") is False:
            why = metrics.get("reason")
            detail = f" ({why[:300]})" if isinstance(why, str) and why else ""
            self.result.correct = False  # the judge's cue: a wrong result, not a crash
            return metrics, self.fail(
                Outcome.FAILED, name, f"{name}: evaluator reported correct: false{detail}"
            )
        value = metrics.get(self.spec.metric)
        if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
            why = (f"{name} printed no '{self.spec.metric}: <number>' line"
                   if reading.source == STDOUT else
                   f"{name} reported no number for '{self.spec.metric}' on the trusted channel")
            return metrics, self.fail(Outcome.FAILED, name, why)
        return metrics, None

    def start(self) -> JobResult | None:
        """Start the clock and lay out the tree: pinned files, scratch, prepared data."""
        self.result.started_at = time.time()
        self.deadline = time.monotonic() + self.spec.timeout_s
        restore_protected(self.spec, self.work)
        (self.job_dir / "tmp").mkdir(exist_ok=True)
        if self.bounds is None:
            spec = self.spec
            self.committed_links = self.commit_symlinks()
            disk = limits.DiskWatch([self.work, self.job_dir / "tmp"], self.job_dir,
                                    spec.disk_bytes, spec.disk_reserve_bytes)
            self.bounds = limits.Watch(limits.PidsBound(spec.job_id, spec.pids_limit), disk)
        return self.prepare_data()

    def commit_symlinks(self) -> dict[str, str]:
        """The symlinks of the tree as checked out, before any phase ran (kept in the job's
        directory, which no phase can write). A reused tree (the hold-out on the
        candidate's built tree) has had phases run in it: its first job's record counts."""
        if self.spec.reuse_workdir:
            record = Path(self.spec.reuse_workdir).parent / "symlinks.json"
            with contextlib.suppress(OSError, ValueError):
                found = json.loads(record.read_text())
                return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}
            return {}
        found = leftovers.symlinks(self.work)
        with contextlib.suppress(OSError):
            (self.job_dir / "symlinks.json").write_text(json.dumps(found))
        return found

    def build_ahead(self) -> JobResult | None:
        """The build phase alone, on a CPU build slot, before the job's own slot is leased.

        Same checks as a build in the slot: integrity after checkout and after the build.
        The build's process tree is gone when this returns, so nothing of the candidate
        runs while the job waits for its slot.
        """
        failure = self.start() or self.check_integrity(after="checkout")
        if failure:
            return failure
        self.off_slot = True
        try:
            assert self.spec.build  # build_ahead runs only for a task with a build
            return (self.check_phase(self.phase("build", self.spec.build))
                    or self.check_integrity(after="build"))
        finally:
            self.off_slot = False

    def run(self, built: bool = False) -> JobResult:
        """Every phase in order; `built`: build_ahead() already ran the build."""
        spec = self.spec
        if not built:
            failure = self.start()
            if failure:
                return failure
            if spec.holdout_only and spec.reuse_workdir:  # the candidate's built tree (local)
                return self.run_holdout()
            failure = self.check_integrity(after="checkout")
            if failure:
                return failure
        for name in ("smoke", "run") if built else ("build", "smoke", "run"):
            command = getattr(spec, name)
            if not command:
                continue
            phase = self.phase(name, command)
            if self.stopped is not None and not _stop_requested:
                return self.stop_early()
            failure = self.check_phase(phase)
            if failure:
                return failure
            failure = self.check_integrity(after=name)
            if failure:
                return failure
        if spec.holdout_only:  # a fresh tree (Ray, job queues): built above, not re-scored
            return self.run_holdout()
        samples, extra = [], {}
        for i in range(spec.repeats):
            name = "evaluate" if spec.repeats == 1 else f"evaluate.{i + 1}"
            metrics, failure = self.evaluate(name, spec.evaluate)
            if failure:
                return failure
            samples.append(float(metrics[spec.metric]))
            extra = {k: v for k, v in metrics.items() if k != spec.metric}
        self.result.samples = samples
        self.result.metric = sorted(samples)[len(samples) // 2] if samples else None
        if "memory_gb" in extra and self.memory_extra:
            self.result.notes.append(f"the evaluator's memory_gb ({extra['memory_gb']}) is "
                                     "replaced by the worker's measurement")
        self.result.extra = {**extra, **self.memory_extra}
        self.result.correct = extra.get("correct") if isinstance(extra.get("correct"), bool) else None
        if spec.run_holdout and spec.holdout:
            return self.run_holdout()
        self.result.outcome = Outcome.OK
        return self.result

    def stop_early(self) -> JobResult:
        """The run was clearly worse than the incumbent's at the same step and was stopped:
        nothing is evaluated, and the judge discards it (never a keep). The ledger keeps
        the step, so a resumed study reads the same verdict."""
        assert self.stopped is not None
        step, value, level = self.stopped
        self.result.outcome = Outcome.OK
        self.result.extra = {"stopped_early": 1, "stopped_at_step": step,
                             "stopped_value": value, "incumbent_value": level}
        # the run's own progress axis: a step, or seconds for a run on a time budget
        # (tinygpt), so it is not called a step
        self.result.reason = (f"run stopped at {step:g} on its progress axis: {value:.4g} "
                              f"against the incumbent's {level:.4g} there (clearly worse)")
        return self.result

    def run_holdout(self) -> JobResult:
        """The trusted hold-out evaluation, on the candidate's finished work directory."""
        assert self.spec.holdout  # asked for only when the task has a hold-out command
        metrics, failure = self.evaluate("holdout", self.spec.holdout)
        if failure:
            failure.reason = f"hold-out: {failure.reason}"
            return failure
        self.result.holdout = float(metrics[self.spec.metric])
        self.result.holdout_extra = {k: v for k, v in metrics.items() if k != self.spec.metric}
        self.result.outcome = Outcome.OK
        return self.result


def _tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    tail = " | ".join(line.strip()[:200] for line in text[-lines:] if line.strip())
    return f": {tail}" if tail else ""


def build_env(spec: JobSpec, job_dir: Path, work: Path, slot) -> dict[str, str]:
    denied = spec.denied_env()
    env = scrub_env(dict(os.environ), spec.env_allow, denied)
    # `python` in a command means the interpreter ratchet runs under (its venv), even if
    # that venv is not activated.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("HOME", str(job_dir / "tmp"))
    env["TMPDIR"] = str(job_dir / "tmp")
    env.update(spec.env_set)
    env["RATCHET_JOB_ID"] = spec.job_id
    # the job's directory names it on the whole machine (a job id does not: two studies of
    # tasks with the same name both have a c0001-0); the local backend's leftover kill
    # matches on it
    env[JOB_DIR_ENV] = str(job_dir.resolve())
    env["RATCHET_CANDIDATE"] = spec.candidate
    env["RATCHET_COMMIT"] = spec.commit
    env["RATCHET_WORKDIR"] = str(work)
    # the evaluator's candidate child (ratchet.evaluator.isolate) gets the network only
    # when the task gives it to every phase
    env[sandbox.NETWORK_ENV] = "1" if spec.network else "0"
    if spec.data_dir:
        env["RATCHET_DATA"] = spec.data_dir
    # names only the worker sets, for trusted phases alone: never inherited from whoever
    # started us (a worker started from inside another evaluation, say)
    for name in ("RATCHET_HOLDOUT", "RATCHET_RESULT", METRICS_FD_ENV, "RATCHET_REPEAT",
                 *denied):
        env.pop(name, None)
    if slot is not None:
        env.update(slot.env)
        if slot.cpus:
            env.setdefault("OMP_NUM_THREADS", str(len(slot.cpus)))
        env["RATCHET_SLOT"] = slot.name
    return env


_preloaded = False


def _preload() -> None:
    """What every job needs, loaded before there is a job: a standby worker's start-up
    (once: a spare forked from the spare server has it already)."""
    global _preloaded
    if _preloaded:
        return
    _preloaded = True
    import tomllib  # noqa: F401  (the spec's denied names come from the pinned config)

    import psutil  # noqa: F401  (PeakMemory samples every measured phase with it)

    import ratchet.job.gitrepo  # noqa: F401  (warm what every job needs)
    import ratchet.job.procs  # noqa: F401
    from ratchet.job.fingerprint import machine_fingerprint

    with contextlib.suppress(Exception):
        machine_fingerprint()  # cached: read while idle, not while a job waits
        # the isolation probes too, the network namespace's among them
        sandbox.network_isolated(sandbox.choose("auto"))
        # and the `unshare` the trusted phases run in (Job.trusted_level): a spare forked
        # from the server inherits the answer instead of probing it again for every job
        sandbox.unshare_prefix()


def _read_key(text: str) -> bytes | None:
    try:
        return bytes.fromhex(text.strip()) or None
    except ValueError:
        return None


def _wait_for_job() -> tuple[Path, bytes | None] | None:
    """Standby: imports are done; block until the driver names our job directory (and
    hands over the job's result key on the same private pipe)."""
    _preload()
    line = sys.stdin.readline().strip()
    if not line:
        return None
    job_text, _, key_text = line.partition("\t")
    job_dir = Path(job_text)
    os.chdir(job_dir)
    log = os.open(job_dir / "worker.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    return job_dir, _read_key(key_text)


def _build_then_run(job: Job, state_path: Path, build_lease: IO | None,
                    held: contextlib.ExitStack) -> tuple[JobResult, float]:
    """Build on the CPU build slot `build_lease` holds, let go of it, then wait in line for
    the job's own slot (its lease joins `held`) and run the other phases there. Returns
    the result and the time spent in line."""
    result = job.build_ahead()
    if build_lease is not None:
        build_lease.close()  # the next candidate's build can start
    if result is not None:
        return result, 0.0
    waited_at = time.monotonic()
    _write_state(state_path, "pending", phase="built")
    slot, lease = lease_slot(job.spec, job.spec.slots, lambda: _stop_requested)
    if lease is not None:
        held.callback(lease.close)
    waited = time.monotonic() - waited_at
    job.deadline += waited  # the job's timeout is for its work, not the queue
    _write_state(state_path, "running", phase="built")
    if _stop_requested:
        return job.fail(Outcome.CANCELLED, "queue", "cancelled waiting for a slot"), waited
    job.on_slot(slot)
    return job.run(built=True), waited


def serve_spares() -> int:
    """`--spare-server`: load once, then fork standby workers on the driver's request.

    A fork costs about a millisecond of CPU where a new interpreter costs ~85 ms here,
    spent while other candidates are being timed. The driver speaks in lines on stdin:
    `spawn` (answered on stdout with the spare's pid and start time), `assign PID JOBDIR`
    (written down the spare's own pipe; the driver has already written the job's pid.json,
    as for any standby worker). Each spare is a standby worker whose stdin is that pipe:
    when this server ends (the driver went away), every idle spare reads EOF and exits,
    while spares that have a job run on, detached, like any other worker.
    """
    _preload()
    import psutil

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the spares
    pipes: dict[int, int] = {}  # spare pid -> the write end of its stdin
    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        if command == "spawn":
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:
                _become_spare(read_end)  # never returns
            os.close(read_end)
            pipes[pid] = write_end
            try:
                created = psutil.Process(pid).create_time()
            except psutil.Error:
                created = 0.0
            sys.stdout.write(f"{pid} {created}\n")
            sys.stdout.flush()
        elif command == "assign":  # assign PID JOBDIR<TAB>KEY: the key stays on our pipes
            pid_text, _, job_dir = rest.partition(" ")
            write_end = pipes.pop(int(pid_text), -1)
            if write_end >= 0:
                with contextlib.suppress(OSError):  # a dead spare: the driver places again
                    os.write(write_end, f"{job_dir}\n".encode())
                os.close(write_end)
    return 0


def _become_spare(read_end: int) -> None:
    """In the forked child: only our own pipe as stdin, nothing else of the server's."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # phases are waited for
        os.setsid()
        os.dup2(read_end, 0)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 4096)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the server's buffer is not ours
        code = main(["--standby"])
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ratchet.job.worker", description=__doc__)
    parser.add_argument("job_dir", type=Path, nargs="?")
    parser.add_argument("--workdir", type=Path, help="snapshot already unpacked here")
    parser.add_argument("--standby", action="store_true",
                        help="start now, read the job directory from stdin later")
    parser.add_argument("--spare-server", action="store_true",
                        help="fork standby workers on request (see serve_spares)")
    parser.add_argument("--key-stdin", action="store_true",
                        help="read the job's result key (hex) from the first line of stdin")
    args = parser.parse_args(argv)

    if args.spare_server:
        return serve_spares()
    key: bytes | None = None
    if args.standby:
        handed = _wait_for_job()
        if handed is None:
            return 0  # the driver went away before handing us a job
        args.job_dir, key = handed
    elif args.job_dir is None:
        parser.error("job_dir is required (or --standby)")
    elif args.key_stdin:
        key = _read_key(sys.stdin.readline())
    job_dir = args.job_dir.resolve()
    # a shipped key (remote engines) is read and deleted before any candidate code runs
    key = seal.take_key_file(job_dir) or key
    spec = JobSpec.from_json((job_dir / "spec.json").read_text())
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    become_subreaper()
    state_path = job_dir / "state.json"
    work = args.workdir.resolve() if args.workdir else job_dir / "work"
    if spec.reuse_workdir:
        work = Path(spec.reuse_workdir)
    job = Job(spec, job_dir, work)
    # a build that needs no accelerator runs on a CPU build slot first, so the job's own
    # (GPU) slot is only held for the phases that need it
    build_first = bool(spec.build_on_cpu and spec.build and spec.build_slots
                       and not spec.holdout_only)
    held = contextlib.ExitStack()  # slot leases: let go once the job's processes are gone
    try:
        queued_at = time.monotonic()
        _write_state(state_path, "pending")
        slot, lock = lease_slot(spec, spec.build_slots if build_first else spec.slots,
                                lambda: _stop_requested)
        if lock is not None:
            held.callback(lock.close)
        queued = time.monotonic() - queued_at
        _write_state(state_path, "running")
        if _stop_requested:
            result = job.fail(Outcome.CANCELLED, "queue", "cancelled before it started")
        else:
            if not args.workdir and not spec.reuse_workdir:
                if work.exists():
                    shutil.rmtree(work)
                from ratchet.job.gitrepo import archive_to

                archive_to(Path(spec.repo or "."), spec.commit, work)
            job.sandbox_kind = sandbox.choose(spec.sandbox)
            job.result.sandbox = job.sandbox_kind
            job.on_slot(slot, own=not build_first)
            if build_first:
                result, waited = _build_then_run(job, state_path, lock, held)
                queued += waited
            else:
                result = job.run()
        job.result.queue_seconds = round(queued, 4)
    except Exception as exc:  # the worker must always report, never vanish
        result = job.fail(Outcome.ERROR, "worker", f"worker error: {type(exc).__name__}: {exc}")
    finally:
        kill_descendants()
        if job.bounds is not None:
            job.bounds.pids.close()
        held.close()  # the phases' trees are gone: the slot is free for the next job
    result.finished_at = time.time()
    try:  # after the phases, so reading the machine never delays or disturbs them
        from ratchet.job.fingerprint import machine_fingerprint

        result.fingerprint = machine_fingerprint()
    except Exception as exc:  # a fact we cannot read must not cost the result
        result.notes.append(f"machine fingerprint unavailable: {type(exc).__name__}: {exc}")
    text = result.to_json()
    if key is not None:  # sealed: the only form of result.json the driver believes
        text = seal.seal(key, spec.job_id, text)
    job_dir.mkdir(parents=True, exist_ok=True)  # the candidate may have deleted it
    tmp = job_dir / "result.tmp"
    tmp.write_text(text)
    tmp.replace(job_dir / "result.json")
    _write_state(state_path, "done")
    sys.stdout.write(RESULT_MARKER + text + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
