"""The contract between the driver and the worker: what to run, and what came back.

Plain dataclasses and JSON, stdlib only, so the worker starts fast on any machine
(no pydantic, no optuna) and every backend ships the same spec.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ratchet.core.vocab import Outcome

RESULT_MARKER = "RATCHET-WORKER-RESULT: "
JOB_DIR_ENV = "RATCHET_JOB_DIR"  # set by the worker in every phase: names the job machine-wide
CONFIG_FILE = "ratchet.toml"  # pinned with the protected files at study start

# Environment variables a candidate may always see. Everything else is dropped unless
# the config names it (task.env), and secrets are dropped even then.
ENV_ALLOW = (
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "TMPDIR",
    "USER",
    "LOGNAME",
    "SHELL",
    "PYTHONHASHSEED",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "HF_HOME",
    "HF_HUB_OFFLINE",
)
ENV_ALLOW_PREFIXES = ("LC_", "RATCHET_")
# Compile caches a study shares between its jobs (set by the study in `env_set`). The
# worker binds them writable for the candidate's phases and gives trusted phases private
# ones, so an evaluator never loads a compiled artefact a candidate could have written.
# (name -> its directory under the study's .ratchet/cache/)
COMPILE_CACHE_VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton",
                      "NUMBA_CACHE_DIR": "numba"}
SECRET_SUFFIXES = ("_API_KEY", "_TOKEN", "_SECRET", "_PASSWORD", "_ACCESS_KEY", "_KEY_ID")
SECRET_NAMES = ("RATCHET_DRIVER_TOKEN",)


def is_secret(name: str) -> bool:
    upper = name.upper()
    return upper in SECRET_NAMES or any(upper.endswith(s) for s in SECRET_SUFFIXES) or (
        "PASSWORD" in upper or "SECRET" in upper
    )


def scrub_env(env: dict[str, str], extra_allowed: list[str],
              deny: set[str] | frozenset[str] = frozenset()) -> dict[str, str]:
    """Allow-list the environment a candidate sees; secrets and `deny` never pass, even
    when allow-listed by name or prefix (`RATCHET_LLM_KEY` holding an API key)."""
    allowed = set(ENV_ALLOW) | set(extra_allowed)
    return {
        key: value
        for key, value in env.items()
        if (key in allowed or key.startswith(ENV_ALLOW_PREFIXES)) and not is_secret(key)
        and key not in deny
    }


# What a worker process itself needs to start (its interpreter and `import ratchet`);
# a worker gets these and the candidate allow-list, never the driver's whole environment.
WORKER_ENV_EXTRA = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONNOUSERSITE",
                    "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")


def worker_env(env: dict[str, str]) -> dict[str, str]:
    """The environment to start a worker with: no secrets, no RATCHET_* names (the
    backend forwards the ones a candidate may see through the spec, after the config's
    declared key names are taken out), nothing the candidate allow-list lacks."""
    return {key: value for key, value in scrub_env(env, list(WORKER_ENV_EXTRA)).items()
            if not key.startswith("RATCHET_")}


@functools.lru_cache(maxsize=8)  # asked on every submit, of the same pinned file
def declared_env_names(config_toml: bytes | str | None) -> frozenset[str]:
    """Names of environment variables a ratchet.toml declares as holding keys: the value
    of every `*_env` key (`api_key_env = "RATCHET_LLM_KEY"`) at any depth."""
    import tomllib

    if not config_toml:
        return frozenset()
    try:
        text = config_toml.decode() if isinstance(config_toml, bytes) else config_toml
        data = tomllib.loads(text)
    except (ValueError, UnicodeDecodeError):
        return frozenset()
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if str(key).endswith("_env"):
                    if isinstance(value, str):
                        names.add(value)
                    elif isinstance(value, list):
                        names.update(v for v in value if isinstance(v, str))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(data)
    return frozenset(names)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class PinnedFile:
    """A protected file as pinned at study start: the worker restores exactly this."""

    sha256: str
    content_b64: str | None  # None: the path did not exist at pin time (must stay absent)
    mode: int = 0o644

    @classmethod
    def of(cls, content: bytes | None, mode: int = 0o644) -> PinnedFile:
        if content is None:
            return cls(sha256="absent", content_b64=None, mode=mode)
        return cls(sha256(content), base64.b64encode(content).decode("ascii"), mode)

    def content(self) -> bytes | None:
        return None if self.content_b64 is None else base64.b64decode(self.content_b64)


@dataclass
class Slot:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    cpus: list[int] = field(default_factory=list)


@dataclass
class JobSpec:
    job_id: str
    study: str
    candidate: str
    commit: str
    metric: str
    timeout_s: float
    # where the snapshot comes from: a local repo (git archive of commit), or already
    # unpacked in the worker's directory (ray / shell backends ship it).
    repo: str | None = None
    build: str | None = None
    # the build needs no accelerator: run it on a CPU build slot ahead of the job's own
    # slot (local backend; `build_slots` below), so the GPU never waits for a build
    build_on_cpu: bool = False
    smoke: str | None = None
    run: str | None = None
    evaluate: str = ""
    holdout: str | None = None
    run_holdout: bool = False  # evaluate the hold-out in this job (remote backends)
    holdout_only: bool = False  # a follow-up job: only the hold-out, on reuse_workdir
    reuse_workdir: str | None = None
    repeats: int = 1
    env_allow: list[str] = field(default_factory=list)
    env_set: dict[str, str] = field(default_factory=dict)
    protected: dict[str, PinnedFile] = field(default_factory=dict)
    data_dir: str | None = None
    data_digest: str | None = None
    holdout_dir: str | None = None
    log_limit_bytes: int = 16 << 20
    memory_limit_bytes: int | None = None
    file_size_limit_bytes: int | None = None  # RLIMIT_FSIZE of every phase
    pids_limit: int | None = None  # processes (threads too) of the whole job (job.limits)
    disk_bytes: int | None = None  # the job's work and tmp directories, together
    disk_reserve_bytes: int | None = None  # kept free where the job directory is; None: default
    slot_lock_dir: str | None = None
    slots: list[Slot] = field(default_factory=list)
    build_slots: list[Slot] = field(default_factory=list)  # CPU slots for build_on_cpu
    sandbox: str = "auto"  # auto | bwrap | pidns | none
    network: bool = False  # [task] network: every phase keeps the machine's network
    readonly_paths: list[str] = field(default_factory=list)
    env_deny: list[str] = field(default_factory=list)  # never passed on, whatever allows it

    def denied_env(self) -> set[str]:
        """`env_deny` and every key name the study's pinned ratchet.toml declares."""
        pinned = self.protected.get(CONFIG_FILE)
        return set(self.env_deny) | declared_env_names(pinned.content() if pinned else None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        data = json.loads(text)
        data["protected"] = {k: PinnedFile(**v) for k, v in data.get("protected", {}).items()}
        data["slots"] = [Slot(**s) for s in data.get("slots", [])]
        data["build_slots"] = [Slot(**s) for s in data.get("build_slots", [])]
        return cls(**data)

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)


def _known(cls, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class PhaseResult:
    name: str
    command: str
    exit_code: int | None
    seconds: float
    timed_out: bool = False
    log: str = ""
    log_truncated_bytes: int = 0
    signal: int | None = None
    # ran on a CPU build slot, not the job's own (GPU) slot: not accelerator time
    off_slot: bool = False
    started_at: float | None = None  # wall clock, for duty over time


# A job that failed because the sandbox could not start one of its parties (its uid
# cannot reach the interpreter, the venv or the job's tree): `failed_stage` of an
# `Outcome.ERROR` result. The machine's fault, never the candidate's: the driver reruns
# the job, or stops with the result's reason and leaves the candidate pending.
UNREACHABLE_STAGE = "sandbox-start"
# The evaluator's side says so on its trusted channel (`isolate`: the candidate child
# could not be started): a value under this name is that one line.
UNREACHABLE_KEY = "ratchet_sandbox_fault"


def unreachable_on_channel(data: bytes) -> str | None:
    """The line an evaluator sent when the sandbox could not start its candidate child."""
    found, _ = read_channel(data)
    return next((str(v) for k, v in found if k == UNREACHABLE_KEY and isinstance(v, str)),
                None)


@dataclass
class JobResult:
    """What the worker reports. `outcome` is the worker's view; the judge decides status."""

    job_id: str
    outcome: Outcome
    reason: str = ""
    failed_stage: str | None = None
    metric: float | None = None
    samples: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    holdout: float | None = None
    holdout_extra: dict[str, Any] = field(default_factory=dict)
    correct: bool | None = None
    phases: list[PhaseResult] = field(default_factory=list)
    slot: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    queue_seconds: float = 0.0
    sandbox: str = "none"
    violations: list[str] = field(default_factory=list)
    # where the metrics came from: "channel" (the pipe only the trusted evaluator holds)
    # or "stdout" (printed lines: unprotected from code running in the evaluator's process)
    metrics_source: str = ""
    notes: list[str] = field(default_factory=list)  # what the worker repaired or measured how
    # peak memory measured by the worker (GiB): the `run` phase's process tree, else the
    # candidate's part of the evaluate phase; GPU memory where nvidia-smi sees it
    memory_gb: float | None = None
    memory_source: str = ""
    fingerprint: dict[str, str] = field(default_factory=dict)  # the machine (no hostname)
    # the run phase's own progress reports [[step, value], ...] (thinned): candidate code
    # wrote them, so they only ever stop a later run early, never decide a keep
    progress: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # a plug-in backend, or a result read back from JSON, may hand over the word:
        # the member, or a ValueError naming it
        self.outcome = Outcome(self.outcome)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobResult:
        """Old results (fewer fields) and newer workers' (more fields) load alike."""
        data = _known(cls, json.loads(text))
        data["phases"] = [PhaseResult(**_known(PhaseResult, p)) for p in data.get("phases", [])]
        return cls(**data)

    @classmethod
    def from_sealed(cls, text: str, key: bytes, job_id: str) -> JobResult:
        """The result inside a worker's sealed envelope (`seal.Forged` if it is not one)."""
        from ratchet.job import seal

        return cls.from_json(seal.unseal(key, job_id, text))

    @classmethod
    def from_output(cls, text: str, key: bytes | None = None,
                    job_id: str = "") -> JobResult | None:
        """Recover the worker's result from its stdout: the last marker line that is a
        result (with `key`: the last one sealed with this job's key; forged lines are not)."""
        from ratchet.job import seal

        for line in reversed(text.splitlines()):
            if line.startswith(RESULT_MARKER):
                body = line[len(RESULT_MARKER):]
                if key is None:
                    return cls.from_json(body)
                try:
                    return cls.from_sealed(body, key, job_id)
                except (seal.Forged, ValueError, TypeError):
                    continue
        return None


def _parse_line(line: str) -> tuple[str, Any] | None:
    name, sep, raw = line.partition(":")
    name, raw = name.strip(), raw.strip()
    if not sep or not name or " " in name or not raw or len(name) > 64:
        return None
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return name, lowered == "true"
    try:
        return name, float(raw.split()[0])
    except ValueError:
        return None


def metric_lines(text: str) -> list[tuple[str, Any]]:
    """Every `name: value` line, in order (a name may appear more than once)."""
    return [found for line in text.splitlines() if (found := _parse_line(line))]


# ---------------------------------------------------------------------------------------
# reading an evaluation: the trusted channel first, the log and $RATCHET_RESULT after it

CHANNEL = "channel"  # the metrics came through the pipe only the evaluator holds
STDOUT = "stdout"  # printed lines (and $RATCHET_RESULT): anything in the process can print


def _as_logged(value: Any) -> Any:
    """A value as it reads once printed (`name: value`), so echoes compare equal."""
    if isinstance(value, bool | int | float):
        return value
    found = _parse_line(f"x: {value}")
    return found[1] if found else value


def same_value(a: Any, b: Any) -> bool:
    a, b = _as_logged(a), _as_logged(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


@dataclass
class MetricsReading:
    metrics: dict[str, Any]
    source: str  # CHANNEL | STDOUT
    tampering: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # ambiguous extras left out


def _scalar(value: Any) -> bool:
    return isinstance(value, bool | int | float | str)


# --- the metric channel's own checks (kernel issue 21; ratchet.evaluator.channel writes the lines) ---
CHANNEL_LIMIT = 1 << 20  # bytes the worker keeps of a phase's channel; an evaluator reports a few lines
SEQ_KEY = "ratchet:seq"  # as ratchet.evaluator.channel.SEQ_KEY (not imported: importing it takes the channel)
ECHO_KEY = "ratchet:echo"
DROPPED_MARK = "bytes of output dropped]"  # procs.CappedLog's marker for a log's dropped middle


def read_channel(data: bytes) -> tuple[list[tuple[str, Any]], list[str]]:
    """The channel's JSON lines -> ((name, value) in order, problems).

    Problems: an unreadable line; a channel that reached the limit (overflowed) or does
    not end with a whole line (cut off); lines that carry `ratchet:seq` but do not number
    1..n, or a line without it beside ones with it: a line the evaluator did not write.
    """
    found: list[tuple[str, Any]] = []
    problems: list[str] = []
    if len(data) >= CHANNEL_LIMIT:
        problems.append("the trusted metric channel overflowed (a line the evaluator did not write)")
    elif data.strip() and not data.endswith(b"\n"):
        problems.append("the trusted metric channel ends in a cut-off line")
    seqs: list[Any] = []
    for raw in data.splitlines():
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            problems.append("an unreadable line reached the trusted metric channel")
            continue
        seqs.append(obj.get(SEQ_KEY))
        found.extend((str(k), v) for k, v in obj.items() if _scalar(v) and ":" not in str(k))
    if any(s is not None for s in seqs) and seqs != list(range(1, len(seqs) + 1)):
        problems.append("the trusted metric channel holds a line the evaluator did not write "
                        f"(lines numbered {seqs[:8]})")
    return found, problems


def _echo_problems(data: bytes, printed: list[tuple[str, Any]], log_text: str) -> list[str]:
    """Metrics a channel line says were printed that the log does not show."""
    shown: dict[str, list[Any]] = {}
    for name, value in printed:
        shown.setdefault(name, []).append(value)
    missing = []
    for raw in data.splitlines():
        with contextlib.suppress(ValueError):
            obj = json.loads(raw)
            if not isinstance(obj, dict) or obj.get(ECHO_KEY) is not True:
                continue
            for name, value in obj.items():
                if ":" in str(name) or not isinstance(_as_logged(value), bool | int | float):
                    continue  # control keys; text values do not print as metric lines
                if not any(same_value(value, v) for v in shown.get(str(name), [])):
                    missing.append(str(name))
    if not missing:
        return []
    why = " (the log dropped part of its output: flooded)" if DROPPED_MARK in log_text else ""
    return [f"the evaluator's printed echo of {', '.join(dict.fromkeys(missing))} is missing "
            f"from its output{why}"]


def collect_metrics(
    *,
    channel: bytes,
    log_text: str,
    result_file: dict[str, Any] | None,
    critical: set[str],
) -> MetricsReading:
    """Merge what an evaluation reported, and say where it disagrees with itself.

    With the channel used, it alone gives the metrics; a printed line or a
    `$RATCHET_RESULT` key that disagrees with it is tampering. Without it (an evaluator
    that only prints, the documented interface), the printed lines give the metrics and
    `$RATCHET_RESULT` may add names but never change one; a critical name (the metric,
    `correct`) reported twice with different values is tampering, any other such name is
    left out as ambiguous.
    """
    from_channel, problems = read_channel(channel)
    printed = metric_lines(log_text)
    filed = [(k, v) for k, v in (result_file or {}).items()
             if isinstance(k, str) and isinstance(v, int | float | bool)]
    reading = MetricsReading(metrics={}, source=CHANNEL if from_channel or problems else STDOUT,
                             tampering=list(problems))
    if reading.source == CHANNEL:
        reading.tampering += _echo_problems(channel, printed, log_text)
        for name, value in from_channel:
            if name not in reading.metrics:
                reading.metrics[name] = value
            elif not same_value(reading.metrics[name], value):
                reading.tampering.append(
                    f"{name} reported twice on the trusted channel "
                    f"({reading.metrics[name]!r} then {value!r})")
        for where, pairs in (("printed", printed), ("$RATCHET_RESULT", filed)):
            for name, value in pairs:
                if name in reading.metrics and not same_value(reading.metrics[name], value):
                    reading.tampering.append(
                        f"{where} {name} = {value!r} disagrees with the trusted channel "
                        f"({reading.metrics[name]!r})")
        return reading
    seen: dict[str, list[Any]] = {}
    for name, value in printed:
        seen.setdefault(name, []).append(value)
    for name, value in filed:
        seen.setdefault(name, []).append(value)
    for name, values in seen.items():
        if all(same_value(values[0], v) for v in values[1:]):
            reading.metrics[name] = values[0]
        elif name in critical:
            shown = ", ".join(repr(v) for v in dict.fromkeys(values))
            reading.tampering.append(f"{name} reported more than once with different "
                                     f"values ({shown})")
        else:
            reading.dropped.append(name)
    return reading
