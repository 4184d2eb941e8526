"""Call candidate code in a child process: the trust boundary is a process boundary.

An evaluator that imports the candidate runs candidate code with the evaluator's powers:
it can patch the clock, the checks or the metric output, inspect the call stack, or wrap
the library the baseline calls. So the trusted side never imports candidate code. It
starts a fresh interpreter for it and talks to it through a narrow request/response
interface:

    from ratchet.evaluator.isolate import CandidateProcess

    with CandidateProcess("solution.py") as cand:
        value = cand.call("score", 3.0)              # JSON values and arrays in, out
        y = cand.call("softmax", x)                  # numpy / torch arrays via shared memory

The child (``ratchet/evaluator/isolate_child.py``, run as ``python -I -B -u``):
- runs in ratchet's sandbox (``sandbox.Jail``, `child_policy`): its own PID namespace where
  the machine gives one, an unprivileged uid when we are root, its tree read-only, the
  hold-out data and the jobs directory hidden; the sandbox's warden freezes and kills its
  whole tree, helpers that left its session included (``confine="off"``: a plain
  subprocess in its own process group, as before);
- sees a scrubbed environment: no metric channel (``RATCHET_METRICS_FD``), no hold-out
  markers (``RATCHET_HOLDOUT*``), no result file, no secrets (``jobspec.is_secret``);
- runs in the candidate's directory; its stdout and stderr go to their own capped log file,
  never to the evaluator's stdout, so it cannot print metric lines.

Nothing the child answers enters the verdict's arithmetic: the round trip subtracted from
timed requests is measured on a clean twin (`twin`, holding `isolate_clean.py`).

Control messages are JSON both ways; the parent never unpickles anything from the child.
Arrays stay out of messages: the parent allocates buffers it owns (`share`, `empty`),
numpy arrays and torch CPU tensors in `multiprocessing.shared_memory`, CUDA tensors by
CUDA IPC handle as torch.multiprocessing does (parent to child only), and requests name
them by id. The segment names are unlinked as soon as the child has mapped them.

The kernel harness (`ratchet.evaluator.kernels`) uses the buffer fast path (`run`, `capture_graph`,
`replay`) to time, check and poison outputs from the parent.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import gc
import io
import itertools
import json
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any, cast

from ratchet.evaluator import (
    channel,  # noqa: F401 - takes the metric channel (and goes non-dumpable) before any child starts
)
from ratchet.evaluator.isolate_child import fix_malloc
from ratchet.job import reach, sandbox, warden
from ratchet.job.jobspec import COMPILE_CACHE_VARS, UNREACHABLE_KEY, is_secret

CHILD_SCRIPT = Path(__file__).with_name("isolate_child.py")
# How long a freeze of a child outside any sandbox waits for every thread to stop. A
# thread takes SIGSTOP only once it is scheduled, which on a loaded machine took longer
# than the 50 ms this used to wait: the harness then went on filling inputs while a
# thread of the child still ran (seen under the test suite's load). An honest child
# stops in microseconds; the bound is only for a thread that never can.
STOP_WAIT_S = 2.0
_NOT_RUNNING = ("T", "t", "Z", "X")  # stopped, traced, or a thread already gone
_imports_frozen = False  # gc.freeze() done (CandidateProcess.__enter__)
CLEAN_MODULE = Path(__file__).with_name("isolate_clean.py")  # what a clean twin holds
_HEADER = struct.Struct(">I")
MAX_REPLY = 1 << 20  # replies are small JSON; anything bigger is the child misbehaving
LOG_LIMIT = 1 << 20
# Numeric dtypes a child may name for an array it returns through a plain `call`.
_SAFE_KINDS = "biufc"

# Captured at import: the parent's clock. Candidate code never runs in this process, so
# this is belt and braces, not the defence.
clock = time.perf_counter

# Environment names a candidate child never sees (besides secrets).
_DROPPED = ("RATCHET_METRICS_FD", "RATCHET_RESULT")
_DROPPED_PREFIXES = ("RATCHET_HOLDOUT",)


# How the child is confined: `auto` (the best sandbox level this machine has), `bwrap`,
# `pidns`, `none` (the warden alone: whole-tree freeze and kill, fds closed, uid dropped
# when root) or `off` (a plain subprocess in its own process group, as before the sandbox).
SANDBOX_ENV = "RATCHET_CHILD_SANDBOX"


def child_policy(cwd: Path, env: Mapping[str, str], scratch: Path, keep_fds: Sequence[int]) -> sandbox.Policy:
    """What a candidate child may see and write, in every phase.

    - writable: its own scratch directory only (TMPDIR, HOME when ours is private, compile
      caches): nothing the evaluator imports or reads later;
    - read-only: its directory (the work tree), the interpreter;
    - hidden: the hold-out data (`RATCHET_HOLDOUT`, set for the hold-out evaluator only)
      and the jobs directory around the work tree (this job's results and logs, the other
      jobs' result files);
    - no network (a network namespace with only loopback) unless the worker says the
      task has it (`RATCHET_NETWORK=1`, `[task] network = true`);
    - its own PID namespace where the machine gives one (it cannot see, signal or open
      the evaluator, its descriptors or its environment), an unprivileged uid when we are
      root, and the caller's /dev/shm (the buffers the harness shares live there).
    """
    hidden: list[str] = []
    holdout = env.get("RATCHET_HOLDOUT", "")
    if holdout and Path(holdout).is_dir():
        hidden.append(str(Path(holdout).resolve()))
    job_dir = _job_dir(env)
    if job_dir is not None:
        jobs = job_dir.parent if job_dir.name == env.get("RATCHET_JOB_ID") else job_dir
        hidden.append(str(jobs))
    return sandbox.Policy(
        writable=[scratch], readonly=[cwd], hidden=hidden, drop_privileges=True,
        seed=f"{env.get('RATCHET_JOB_ID', 'ratchet')}:candidate-child", keep_fds=tuple(keep_fds), shared_shm=True,
        network=env.get(sandbox.NETWORK_ENV) == "1",
    )


def _job_dir(env: Mapping[str, str]) -> Path | None:
    """The job's directory: the worker names the evaluator's result file `<job>/eval/<phase>.json`."""
    result = env.get("RATCHET_RESULT", "")
    if not result:
        return None
    job_dir = Path(result).resolve().parent.parent
    return job_dir if job_dir.is_dir() and job_dir != Path("/") else None


def _check_readable(module: Path, uid: int) -> None:
    """The child runs as `uid`: its module must be readable to others (its directories
    searchable). Private ancestors such as /root are covered by the sandbox; the module's
    own directory and file are not."""
    problems = [p for p in (module.parent, module) if not p.stat().st_mode & (0o001 if p.is_dir() else 0o004)]
    if problems:
        raise CandidateError(
            f"the candidate child runs as the unprivileged uid {uid} and cannot read {problems[0]}: "
            f"make it readable to others (chmod o+rX), or set {SANDBOX_ENV}=off to run it as yourself, unconfined"
        )


def _scratch_env(env: dict[str, str], scratch: Path, uid: int | None) -> dict[str, str]:
    """The child's temporary files and compile caches go to its scratch directory."""
    env = dict(env)
    env["TMPDIR"] = str(scratch)
    for name, sub in COMPILE_CACHE_VARS.items():
        if name in env:
            env[name] = str(scratch / sub)
    if uid is not None and not sandbox.reachable(Path(env.get("HOME", "/")), uid):
        env["HOME"] = str(scratch)
    return env


@dataclass
class RequestUsage:
    """A request made while frozen: the seconds from its wake-up until its CPU time was read
    (right after its answer), and the CPU time its whole tree used meanwhile (every thread
    of every process, helpers included)."""

    awake_s: float
    cpu_s: float

    def cores(self) -> float:
        return self.cpu_s / self.awake_s if self.awake_s > 0 else 0.0


def _tree(root: int) -> list[int]:
    """`root` and every process below it (Linux: /proc/<pid>/task/<tid>/children)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += warden.children(pid)
    return found


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu_s(root: int) -> float:
    """CPU seconds every thread of `root`'s process tree has run (scheduler ns), plus what
    children it already reaped had used (clock ticks); 0 where /proc does not tell."""
    total = 0
    reaped = 0
    for pid in _tree(root):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            reaped += int(fields[13]) + int(fields[14])  # cutime + cstime
        except (OSError, ValueError, IndexError):
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fh:
                    total += int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9 + reaped / _TICK


class CandidateError(RuntimeError):
    """The candidate failed: raised in a call, failed to import, crashed or timed out."""


class SandboxUnreachable(RuntimeError):
    """The sandbox could not start the candidate child: its uid cannot reach the
    interpreter or the candidate's tree. The machine's fault, not the candidate's (so not
    a CandidateError: an evaluator that reports those as `correct: false` lets it pass)."""


class CandidateTimeout(CandidateError):
    """A request ran past its deadline; the child's process group was killed."""


class CandidateCrashed(CandidateError):
    """The child exited or broke the protocol."""


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a candidate child gets: ours minus the channel, hold-out and secrets."""
    env = os.environ if env is None else env
    return {
        k: v
        for k, v in env.items()
        if k not in _DROPPED and not k.startswith(_DROPPED_PREFIXES) and not is_secret(k)
    }


# torch is optional and never imported by the harness itself: it is there when the
# evaluator imported it (the kernel harness's arrays module uses these same three)


def torch_module() -> Any | None:
    """torch if the process already imported it, else None (never imports it)."""
    return sys.modules.get("torch")


def loaded_torch() -> Any:
    """torch, where a tensor is already in hand (so this process has imported it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        raise CandidateError("a torch tensor is in play, but torch is not loaded here")
    return torch


def is_torch(x: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def _b64(value: Any) -> Any:
    return base64.b64encode(value).decode() if isinstance(value, bytes | bytearray) else value


@dataclass
class SharedArray:
    """A buffer the parent owns and the child can see: `.array` is the parent's view."""

    id: int
    array: Any
    desc: dict[str, Any]
    shm: shared_memory.SharedMemory | None = None

    @property
    def ref(self) -> dict[str, int]:
        """How a request names this buffer."""
        return {"buf": self.id}


@dataclass
class Call:
    """One call in a `run` request: args are SharedArrays or JSON values."""

    args: Sequence[Any]
    out: Sequence[SharedArray] = ()
    mode: str = "return"  # "return": copy the result into `out`; "out": fn(*args, out=...)
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def message(self) -> dict[str, Any]:
        return {
            "args": [_arg(a) for a in self.args],
            "kwargs": {k: _arg(v) for k, v in self.kwargs.items()},
            "out": [o.id for o in self.out],
            "mode": self.mode,
        }


def _arg(value: Any) -> dict[str, Any]:
    if isinstance(value, SharedArray):
        return value.ref
    json.dumps(value)  # only JSON values travel; anything else is a caller bug
    return {"value": value}


class CandidateProcess:
    """A candidate module loaded in a child process, and the requests that reach it.

    The child starts at construction (its start-up overlaps the caller's own set-up) and
    the first request waits for it to finish importing the module. `hold=True`: the child
    starts but runs none of the candidate's code until the first request (or `start()`);
    it imports the `preload` modules meanwhile (from the interpreter's own path, e.g.
    `preload=["numpy"]`). So an evaluator can start it before its own imports, and the
    child's start-up overlaps them, yet every import comes before any candidate code runs
    (docs/kernels.md, "Writing an evaluator"). Every request has a
    deadline (`timeout` seconds by default); past it the whole sandbox is killed and
    `CandidateTimeout` raised. `confine`: the sandbox level (`auto`, `bwrap`, `pidns`,
    `none`, `off`; default `$RATCHET_CHILD_SANDBOX` or `auto`). Use as a context manager, or call `close()`. On Linux
    the child is killed when the thread that started it exits (so a killed evaluator
    leaves nothing behind): start it from a thread that outlives it, e.g. the main one.
    """

    def __init__(
        self,
        module: str | os.PathLike[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = 300.0,
        start_timeout: float = 300.0,
        log: str | os.PathLike[str] | None = None,
        log_limit: int = LOG_LIMIT,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        confine: str | None = None,
        hold: bool = False,
        preload: Sequence[str] = (),
    ) -> None:
        self.module = Path(module).resolve()
        if not self.module.is_file():
            raise FileNotFoundError(f"candidate module {self.module} does not exist")
        self.cwd = Path(cwd) if cwd else self.module.parent
        self.timeout = timeout
        self.start_timeout = start_timeout
        # a log we made is ours to remove once the child is gone (its tail kept for
        # log_tail): one per evaluation would otherwise pile up in the temp dir
        self._own_log = log is None
        self._log_kept: bytes | None = None
        if log is None:
            fd, log = tempfile.mkstemp(prefix="ratchet-candidate-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log)
        self.log_limit = log_limit
        self._python = python
        self._env = env
        bad = [name for name in preload if not all(part.isidentifier() for part in name.split("."))]
        if bad:
            raise ValueError(f"preload names modules (dotted names), not {bad[0]!r}")
        # the child's argv tail: held or not, and what it imports before the candidate's module
        self._hold = ["hold" if hold else "now", ",".join(preload)]
        self._held = hold  # no candidate code loaded yet: `load` goes with the first request
        self._ids = itertools.count(1)
        self._buffers: dict[int, SharedArray] = {}
        self._pending: list[SharedArray] = []
        self._ready = False
        self._closed = False
        self._frozen = 0  # freeze() depth: > 0 while the harness keeps the whole child stopped
        self._twin: CandidateProcess | None = None
        self.round_trips = 0
        self.last_request: RequestUsage | None = None  # the last request made while frozen
        # (from, to) on `clock` of each time a frozen child was let run (requests and
        # untimed exchanges): outside them it could not run at all
        self.awake: collections.deque[tuple[float, float]] = collections.deque(maxlen=100_000)
        self._confine = confine or os.environ.get(SANDBOX_ENV, "auto")
        self._jail: sandbox.Jail | None = None
        self._stopped: list[int] = []  # host pids the last freeze stopped
        self._clean = False  # a clean twin (no candidate code): its stops need not be waited for
        self._stop_owed = False  # a stop asked of the warden whose answer is still to come
        self._uid: int | None = None  # the child's uid when it is not ours (shared buffers are chowned to it)
        self._scratch: Path | None = None
        self.level: sandbox.Level | None = None  # None: a plain subprocess
        parent_sock, child_sock = socket.socketpair()
        self._sock = parent_sock
        try:
            self._start(child_sock)
        finally:
            child_sock.close()
        self._drain = threading.Thread(target=self._drain_output, name="candidate-log", daemon=True)
        self._drain.start()

    # -- process --------------------------------------------------------------------------

    def _start(self, child_sock: socket.socket) -> None:
        fix_malloc()  # the baseline is timed here: the child's allocator settings, by its code
        fd = child_sock.fileno()
        env = child_env(self._env)
        popen: dict[str, Any] = {"cwd": self.cwd, "stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
        if self._confine == "off" or not sys.platform.startswith("linux"):  # the warden is Linux-only
            argv = [self._python or sys.executable, "-I", "-B", "-u", str(CHILD_SCRIPT), str(fd), str(self.module), str(os.getpid()), *self._hold]
            # own process group: a timeout kills all of it (a setsid'd helper escapes it)
            self.proc = subprocess.Popen(argv, env=env, pass_fds=(fd,), start_new_session=True, **popen)
            return
        try:
            self.level = sandbox.choose(self._confine)
        except (RuntimeError, ValueError) as exc:
            raise CandidateError(f"{SANDBOX_ENV}={self._confine}: {exc}") from None
        job_dir = _job_dir(os.environ if self._env is None else self._env)
        # the job's tmp is the candidate's uid's: an evaluator running as a uid of its own
        # keeps the child's scratch in its own TMPDIR (hidden from the child with the jobs)
        tmp_root = job_dir / "tmp" if job_dir is not None and (job_dir / "tmp").is_dir() \
            and os.access(job_dir / "tmp", os.W_OK) else None
        self._scratch = Path(tempfile.mkdtemp(prefix="ratchet-child-", dir=tmp_root))
        policy = child_policy(self.cwd, os.environ if self._env is None else self._env, self._scratch, (fd,))
        self._uid = policy.party_uid()
        if self._uid is not None:
            _check_readable(self.module, self._uid)
        sandbox.grant([self._scratch], policy)
        # parent pid 0: the child's parent is the sandbox's warden, which ends it with us
        argv = [self._python or sys.executable, "-I", "-B", "-u", str(CHILD_SCRIPT), str(fd), str(self.module), "0", *self._hold]
        self._jail = sandbox.Jail(argv, policy, level=self.level, env=_scratch_env(env, self._scratch, self._uid), **popen)
        self.proc = self._jail.proc

    def _drain_output(self) -> None:
        """Copy the child's output to its log, up to `log_limit` bytes; discard the rest."""
        written = 0
        assert self.proc.stdout is not None
        with open(self.log_path, "ab") as log:
            stdout = cast(io.BufferedReader, self.proc.stdout)  # Popen's pipe, unbuffered=False
            while chunk := stdout.read1(1 << 16):
                if written < self.log_limit:
                    part = chunk[: self.log_limit - written]
                    log.write(part)
                    written += len(part)
                    if written >= self.log_limit:
                        log.write(b"\n[ratchet: candidate log truncated]\n")
                    log.flush()

    def kill(self) -> None:
        """Kill the child's whole process group (idempotent).

        Also after the child itself has exited: whatever it started in its group (a
        background process left running) goes with it.
        """
        if self._jail is not None and self.level != sandbox.Level.NONE:
            # the sandbox's own PID namespace: ending its first process ends every process in it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self._jail is not None:
            self._jail.kill(grace_s=5.0)  # the warden kills what is left (all of it, with no namespace)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def freeze(self, wait_s: float = STOP_WAIT_S) -> None:
        """Stop the whole child (SIGSTOP) and wait until its threads are stopped; nests.

        The harness keeps the child frozen whenever it is not answering one of the
        harness's requests while timed: while the outputs are read back (a thread left
        running after the answer cannot finish the work meanwhile), while its inputs are
        filled (nothing can start on them before the clock does), and while the trusted
        baseline runs. A request made while frozen runs the child for that request only
        (see `request`).
        """
        self._frozen += 1
        if self._frozen == 1:
            self._stop(wait_s)

    def thaw(self) -> None:
        """Undo one `freeze`; the child runs again when the last one is undone (SIGCONT)."""
        if self._frozen == 0:
            return
        self._frozen -= 1
        if self._frozen == 0:
            self._cont()

    @property
    def frozen(self) -> bool:
        return self._frozen > 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """`with cand.paused():` the whole child stays stopped inside the block."""
        self.freeze()
        try:
            yield
        finally:
            self.thaw()

    def _stop(self, wait_s: float = STOP_WAIT_S) -> None:
        if self.proc.poll() is not None:
            return
        if self._jail is not None:
            if self._clean:
                # nothing to stop before we go on: only the state it is in at its next
                # request matters (frozen, like the candidate), so the answer is collected
                # then (`settle`), while this process does its own work meanwhile
                self._stop_owed = self._jail.freeze(wait=False)
                return
            self._jail.freeze()  # every process of the sandbox, setsid'd helpers included
            # what is stopped now cannot fork: the thaw (inside the clock, for a timed
            # request) signals exactly these, directly, rather than a round trip to the warden
            self._stopped = _tree(self.proc.pid)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + wait_s
        task_dir = Path(f"/proc/{self.proc.pid}/task")
        while time.monotonic() < deadline:
            try:
                states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in task_dir.iterdir()]
            except (OSError, IndexError):
                return  # not Linux, or the child is gone
            if all(state in _NOT_RUNNING for state in states):
                return
            # between looks, leave the CPU to the thread that must be scheduled to stop (a
            # bare spin, bounded at 50 ms before, would compete with it for up to 2 s)
            time.sleep(0.0002)

    def settle(self) -> None:
        """Wait until no stop of ours or of the clean twin is still under way (called before
        anything is timed: a warden at work would share the CPUs with it)."""
        if self._stop_owed and self._jail is not None:  # owed only by a jailed child
            self._stop_owed = False
            self._jail.settle()
            self._stopped = _tree(self.proc.pid)
        if self._twin is not None:
            self._twin.settle()

    def _cont(self) -> None:
        self.settle()
        if self._jail is not None:
            stopped, self._stopped = self._stopped, []
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGCONT)
            if not stopped:
                self._jail.thaw()
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGCONT)

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """Let a frozen child run for one untimed exchange (registering buffers, releasing)."""
        if not self._frozen:
            yield
            return
        start = clock()
        self._cont()
        try:
            yield
        finally:
            self._stop()
            self.awake.append((start, clock()))

    def log_tail(self, limit: int = 2000) -> str:
        """The end of the child's log (for error messages)."""
        if self._log_kept is not None:
            data = self._log_kept
        else:
            self._drain.join(timeout=0.2) if self.proc.poll() is not None else None
            try:
                data = self.log_path.read_bytes()
            except OSError:
                return ""
        return data[-limit:].decode(errors="replace")

    def close(self) -> None:
        if self._closed:
            return
        twin, self._twin = self._twin, None
        asked = self._ask_exit()
        if twin is not None:  # the clean twin ends meanwhile: no candidate code to let finish
            twin._closed = True
            twin.kill()
            twin._release()
        if asked:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=2)
        self.kill()
        self._release()

    def _ask_exit(self) -> bool:
        """Mark closed, let a frozen child run again and ask it to exit; False if it could not be asked."""
        self._closed = True
        if self._frozen:
            self._frozen = 0
            self._cont()
        if self.proc.poll() is not None:
            return False
        try:
            self._send({"op": "exit"})
        except OSError:
            return False
        return True

    def _release(self) -> None:
        """What is left once the child is gone: the socket, the log thread, buffers, scratch."""
        self._sock.close()
        self._drain.join(timeout=2)
        for buf in list(self._buffers.values()):
            self._free(buf)
        self._buffers.clear()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if self._own_log and self._log_kept is None:
            try:
                with open(self.log_path, "rb") as log:
                    log.seek(0, os.SEEK_END)
                    log.seek(max(0, log.tell() - (1 << 16)))
                    self._log_kept = log.read()
            except OSError:
                self._log_kept = b""
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def __enter__(self) -> CandidateProcess:
        # The evaluator's imports are done by now (docs/kernels.md: every import before any
        # candidate code). Everything they built is moved out of the garbage collector's
        # sight (`gc.freeze`), so its collections no longer walk torch's modules again and
        # again: a quarter of a torch evaluator's CPU in a profile of the test suite, and
        # a pause that could land in a timed request. What is built later is collected.
        # Once per process: a long-lived one entering many would otherwise freeze each
        # time whatever garbage was waiting for its next collection.
        global _imports_frozen
        if not _imports_frozen:
            _imports_frozen = True
            gc.freeze()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- wire -----------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        self._sock.sendall(_HEADER.pack(len(data)) + data)

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        chunks = []
        while n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(min(n, 1 << 16))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _recv(self, deadline: float) -> dict[str, Any]:
        (size,) = _HEADER.unpack(self._recv_exact(_HEADER.size, deadline))
        if size > MAX_REPLY:
            raise CandidateCrashed(f"candidate process sent a {size}-byte reply (limit {MAX_REPLY}): protocol broken")
        reply = json.loads(self._recv_exact(size, deadline))  # JSON only: nothing is unpickled
        if not isinstance(reply, dict):
            raise CandidateCrashed("candidate process sent a malformed reply")
        return reply

    def _exchange(self, message: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        if self._closed:
            raise CandidateCrashed("candidate process is closed")
        deadline = time.monotonic() + timeout
        try:
            if message is not None:
                self._send(message)
            return self._recv(deadline)
        except TimeoutError:
            self.kill()
            what = message.get("op", "request") if message else "start-up"
            raise CandidateTimeout(f"candidate {what} exceeded {timeout:g} s; its process group was killed") from None
        except (EOFError, ConnectionError, OSError, ValueError) as exc:
            self.kill()
            if not self._ready:
                self._blame_the_machine()
            raise CandidateCrashed(
                f"candidate process died ({type(exc).__name__}, exit {self.proc.returncode}); log tail:\n{self.log_tail()}"
            ) from None

    def _blame_the_machine(self) -> None:
        """The child died before its first answer: when the warden could not start it and
        a fresh probe as its uid confirms why (its interpreter or tree out of the uid's
        reach), that is the machine's fault. Raise SandboxUnreachable with the one line,
        and send it on the trusted channel, so the worker never puts it on the candidate
        whatever the evaluator does with the exception."""
        if self._jail is None or self.level is None:
            return
        if not reach.start_failed(self.log_tail()):
            return
        env = _scratch_env(child_env(self._env), self._scratch or self.cwd, self._uid)
        line = reach.probe(self.level, self._jail.policy, reach.needed(self._python),
                           "the evaluator's candidate child", env=env, cwd=self.cwd,
                           trees=[self.cwd])
        if line is None:
            return
        if channel.available():
            channel.report({UNREACHABLE_KEY: line}, echo=False)
        raise SandboxUnreachable(line)

    def _ensure_ready(self) -> None:
        if self._ready:
            return
        with self._running():
            # a held child imports the candidate's module only now, after the caller's imports
            hello = self._exchange({"op": "load"} if self._held else None, self.start_timeout)
            self._held = False
        if not hello.get("ok"):
            self.kill()
            raise CandidateError(str(hello.get("error", "candidate failed to start")))
        self.pid = int(hello["pid"])
        self._ready = True

    def twin(self) -> CandidateProcess:
        """A clean child started like this one (interpreter, environment, sandbox) that
        holds no candidate code (`isolate_clean.py`); started on first use, closed with us."""
        if self._twin is None:
            self._twin = CandidateProcess(
                CLEAN_MODULE, timeout=self.timeout, start_timeout=self.start_timeout, log_limit=1 << 16,
                python=self._python, env=self._env, confine=self._confine,
            )
            self._twin._clean = True
        return self._twin

    def empty_request_s(self, *, cuda: bool = False) -> float:
        """Seconds one empty request takes on the parent's clock, measured on the clean twin.

        The candidate answers nothing that corrects its own timing: a child that slowed
        down its empty requests would otherwise have that time subtracted from its real
        ones. The twin is in the same state as the candidate (frozen when it is, so the
        wake-up inside the clock is counted alike; with a CUDA buffer when the candidate
        has one, so its replies carry the same device synchronize).
        """
        twin = self.twin().start()
        if cuda and not getattr(twin, "_has_cuda", False):
            twin.empty((1,), "float32", like="cuda")
            twin._has_cuda = True  # type: ignore[attr-defined]
        if self.frozen and not twin.frozen:
            twin.freeze()
        elif not self.frozen and twin.frozen:
            twin.thaw()
        _, elapsed = twin.request({"op": "call", "fn": "noop", "calls": []})
        return elapsed

    def start(self) -> CandidateProcess:
        """Wait until the candidate module is imported (raises CandidateError if it failed)."""
        self._ensure_ready()
        return self

    def request(self, message: dict[str, Any], timeout: float | None = None) -> tuple[dict[str, Any], float]:
        """Send one request; return (reply, seconds on the parent's clock from send to reply).

        Buffers shared since the last request are registered first, outside the timing.
        """
        self._ensure_ready()
        self._flush()
        if not self._frozen:
            t0 = clock()
            reply = self._exchange(message, timeout or self.timeout)
            elapsed = clock() - t0
        else:
            # A frozen child wakes inside the clock: whatever it (or a thread or helper of
            # it) does from the moment it can run again counts against this request, so
            # nothing can be computed from the inputs before the clock starts.
            self.settle()
            cpu0 = tree_cpu_s(self.proc.pid)
            t0 = clock()
            self._cont()
            try:
                reply = self._exchange(message, timeout or self.timeout)
                elapsed = clock() - t0
                # CPU the whole child used from its wake-up to its answer: more than its
                # CPUs allow in that time means it ran on CPUs the evaluator was not given
                # (a widened affinity, a helper moved elsewhere)
                # (the window ends when the count is read: threads still running meanwhile
                # are in both, so an honest child never exceeds its CPUs)
                cpu = tree_cpu_s(self.proc.pid) - cpu0
                self.last_request = RequestUsage(awake_s=clock() - t0, cpu_s=cpu)
            finally:
                self._stop()
                self.awake.append((t0, clock()))
        self.round_trips += 1
        return reply, elapsed

    def _checked(self, message: dict[str, Any], timeout: float | None = None) -> tuple[dict[str, Any], float]:
        reply, elapsed = self.request(message, timeout)
        if not reply.get("ok"):
            raise CandidateError(str(reply.get("error", "candidate request failed")))
        return reply, elapsed

    # -- buffers --------------------------------------------------------------------------

    def flush(self) -> None:
        """Register the buffers shared since the last request now (the child runs for it,
        untimed), rather than at the next request: a caller about to fill them while the
        child is frozen calls this first, so the child never runs while it can see the data."""
        self._ensure_ready()
        self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        with self._running():
            reply = self._exchange({"op": "register", "buffers": {str(b.id): b.desc for b in pending}}, self.timeout)
        if not reply.get("ok"):
            raise CandidateError(f"candidate could not map shared buffers: {reply.get('error')}")
        for buf in pending:
            if buf.shm is not None:
                buf.shm.unlink()  # mapped on both sides: the name is no longer needed by anyone

    def empty(self, shape: Sequence[int], dtype: str, *, like: str = "numpy", device: Any = None) -> SharedArray:
        """A new buffer both sides see. like: 'numpy', 'torch' (CPU shm) or 'cuda' (IPC)."""
        import numpy as np  # noqa: PLC0415 - lazy: an evaluator can start the child before numpy loads

        shape = tuple(int(d) for d in shape)
        ident = next(self._ids)
        if like == "cuda":
            buf = self._cuda_buffer(ident, shape, dtype, device)
        else:
            count = math.prod(shape)
            if like == "numpy":
                itemsize = np.dtype(dtype).itemsize
            else:
                torch = loaded_torch()
                itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
            shm = shared_memory.SharedMemory(create=True, size=max(1, count * itemsize))
            if self._uid is not None:  # the child runs as an unprivileged uid: the segment is its to map
                os.fchown(shm._fd, self._uid, -1)  # type: ignore[attr-defined]  # CPython's POSIX SharedMemory keeps its fd
            desc = {"kind": like, "shm": shm.name, "shape": list(shape), "dtype": dtype, "offset": 0}
            if like == "numpy":
                array: Any = np.ndarray(shape, dtype=np.dtype(dtype), buffer=shm.buf)
            else:
                torch = loaded_torch()
                tdtype = getattr(torch, dtype)
                array = torch.frombuffer(shm.buf, dtype=tdtype, count=count).view(shape) if count else torch.empty(shape, dtype=tdtype)
            buf = SharedArray(ident, array, desc, shm)
        self._buffers[ident] = buf
        self._pending.append(buf)
        return buf

    def _cuda_buffer(self, ident: int, shape: tuple[int, ...], dtype: str, device: Any) -> SharedArray:
        """A CUDA tensor shared by IPC handle (what torch.multiprocessing sends for one)."""
        torch = loaded_torch()
        tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=device or "cuda")
        storage = tensor.untyped_storage()
        (dev, handle, size_bytes, offset_bytes, rc_handle, rc_offset, ev_handle, ev_sync) = storage._share_cuda_()
        desc = {
            "kind": "cuda",
            "shape": list(shape),
            "stride": list(tensor.stride()),
            "storage_offset": tensor.storage_offset(),
            "dtype": dtype,
            "ipc": {
                "device": dev,
                "handle": _b64(handle),
                "storage_size_bytes": size_bytes,
                "storage_offset_bytes": offset_bytes,
                "ref_counter_handle": _b64(rc_handle),
                "ref_counter_offset": rc_offset,
                "event_handle": _b64(ev_handle),
                "event_sync_required": ev_sync,
            },
        }
        return SharedArray(ident, tensor, desc)

    def empty_like(self, x: Any) -> SharedArray:
        """A shared buffer with x's shape and dtype, on x's kind of memory (not filled)."""
        import numpy as np  # noqa: PLC0415

        if is_torch(x):
            kind = "cuda" if x.is_cuda else "torch"
            return self.empty(tuple(x.shape), str(x.dtype).removeprefix("torch."), like=kind, device=x.device if x.is_cuda else None)
        x = np.asarray(x)
        return self.empty(x.shape, x.dtype.name)

    def share(self, x: Any) -> SharedArray:
        """A shared copy of x (numpy array or torch tensor)."""
        import numpy as np  # noqa: PLC0415

        buf = self.empty_like(x)
        if is_torch(x):
            buf.array.copy_(x)
        else:
            np.copyto(buf.array, np.asarray(x))
        return buf

    def release(self, buffers: Sequence[SharedArray]) -> None:
        """Forget buffers on both sides and free the parent's memory."""
        ids = [b.id for b in buffers if b.id in self._buffers]
        if not ids:
            return
        self._pending = [b for b in self._pending if b.id not in ids]
        if self._ready and self.proc.poll() is None:
            with self._running():
                self._exchange({"op": "release", "ids": ids}, self.timeout)
        for ident in ids:
            self._free(self._buffers.pop(ident))

    def _free(self, buf: SharedArray) -> None:
        buf.array = None
        if buf.shm is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a view: freed at exit
                buf.shm.close()
            with contextlib.suppress(FileNotFoundError):
                buf.shm.unlink()

    # -- calls ----------------------------------------------------------------------------

    def run(self, target: str, calls: Sequence[Call], timeout: float | None = None) -> float:
        """Run `calls` of `target` back to back in one request; seconds on the parent's clock.

        Raises CandidateError when any call failed. Outputs land in the calls' `out`
        buffers; the caller checks them.
        """
        _, elapsed = self._checked({"op": "call", "fn": target, "calls": [c.message() for c in calls]}, timeout)
        return elapsed

    def capture_graph(self, target: str, calls: Sequence[Call], warmup: int = 2, timeout: float | None = None) -> int:
        """CUDA only: the child captures all `calls` in one CUDA graph; returns its id."""
        reply, _ = self._checked({"op": "graph", "fn": target, "calls": [c.message() for c in calls], "warmup": warmup}, timeout)
        return int(reply["graph"])

    def replay(self, graph: int, timeout: float | None = None) -> float:
        """Replay a captured graph (the child synchronizes the device); parent-clock seconds."""
        _, elapsed = self._checked({"op": "replay", "graph": graph}, timeout)
        return elapsed

    def construct(self, factory: str, *args: Any, **kwargs: Any) -> RemoteFunction:
        """Build an object in the child (e.g. a model whose construction depends on the shape).

        Arguments are JSON values. The returned handle calls the object (or `.method`).
        """
        reply, _ = self._checked({"op": "construct", "factory": factory, "args": [_arg(a) for a in args], "kwargs": {k: _arg(v) for k, v in kwargs.items()}})
        return RemoteFunction(self, f"obj:{reply['object']}", name=factory)

    def function(self, name: str) -> RemoteFunction:
        """A handle on the module's function `name` (dotted names reach attributes)."""
        return RemoteFunction(self, name, name=name)

    def call(self, name: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """Call `name(*args, **kwargs)` in the child and return its result.

        Arguments: JSON values, numpy arrays, torch tensors (copied into shared memory;
        changes the candidate makes to them are not copied back). The result: a JSON
        value, or an array (returned as a numpy array; torch results arrive as numpy).
        """
        shared: list[SharedArray] = []

        np = sys.modules.get("numpy")  # no numpy loaded: no array can be among the arguments

        def wrap(v: Any) -> Any:
            if (np is not None and isinstance(v, np.ndarray)) or is_torch(v):
                buf = self.share(v)
                shared.append(buf)
                return buf
            return v

        try:
            wrapped = Call([wrap(a) for a in args], mode="value", kwargs={k: wrap(v) for k, v in kwargs.items()})
            reply, _ = self._checked({"op": "call", "fn": name, "calls": [wrapped.message()]}, timeout)
        finally:
            if not self._closed and self.proc.poll() is None:
                self.release(shared)
        return _decode(reply.get("values", [None])[0])


def _decode(item: Any) -> Any:
    """A child's returned value: JSON, or a numpy array read (copied) from its segment."""
    if not isinstance(item, dict):
        raise CandidateCrashed("candidate process returned a malformed value")
    if "value" in item:
        return item["value"]
    import numpy as np  # noqa: PLC0415
    spec = item.get("array")
    if not isinstance(spec, dict):
        raise CandidateCrashed("candidate process returned a malformed value")
    dtype = np.dtype(str(spec["dtype"]))
    if dtype.kind not in _SAFE_KINDS or dtype.hasobject:
        raise CandidateError(f"candidate returned an array of dtype {dtype}, not a plain numeric one")
    name = str(spec["shm"])
    if not name.startswith("rkout_") or "/" in name:
        raise CandidateCrashed("candidate process named an unexpected shared-memory segment")
    shape = tuple(int(d) for d in spec["shape"])
    shm = shared_memory.SharedMemory(name=name)
    try:
        if shm.size < math.prod(shape) * dtype.itemsize:
            raise CandidateCrashed("candidate process returned a segment smaller than its array")
        view = np.ndarray(shape, dtype=dtype, buffer=shm.buf)
        value = view.copy()
        del view
    finally:
        shm.close()
        shm.unlink()
    return value


@dataclass
class RemoteFunction:
    """A function (or object) living in a candidate process; calling it goes through `call`."""

    process: CandidateProcess
    target: str
    name: str = ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.process.call(self.target, *args, **kwargs)

    def run(self, calls: Sequence[Call], timeout: float | None = None) -> float:
        return self.process.run(self.target, calls, timeout)

    @property
    def __name__(self) -> str:  # noqa: PLW3201 - labels in reports, like a function's
        return self.name or self.target
