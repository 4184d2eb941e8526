"""`ratchet.toml`'s schema: parsed once, validated strictly, then read-only for the whole
study.

Every error names the key and what was expected, in one line, because a typo in an
overnight study's config should cost seconds, not a night.

The schema knows the plug-ins (`[backend] kind`, `search.proposer`, their own tables)
only through a `Catalogue` handed to validation as its context: the registries
(ratchet.backends, ratchet.proposers) import this schema, never the other way round.
The loader that reads a file and hands the registries' catalogue over is
ratchet.driver.config; validated without one, the plug-ins are known by their entry
points' names alone (core.plugins, nothing imported) and no plug-in table is accepted.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ratchet.core import paths, plugins
from ratchet.core.errors import UserError

CONFIG_FILE = "ratchet.toml"
M = TypeVar("M", bound=BaseModel)


class Catalogue(Protocol):
    """What the schema asks of the plug-in registries, handed to validation as its
    context (`{"plugins": catalogue}`) by the loader (ratchet.driver.config)."""

    def backend_names(self) -> list[str]:
        """Every backend's name, none imported (entry points and in-process ones)."""
        ...

    def backends(self) -> Mapping[str, type[BaseModel]]:
        """Every backend loaded: its name -> the model of its `[backend.<name>]` table."""
        ...

    def proposer_kinds(self) -> list[str]:
        """Every proposer kind's name, none imported."""
        ...


class EntryPointNames:
    """The catalogue without a loader: the entry points' names (nothing imported) and no
    plug-in's table (a schema validated outside `ratchet.driver.config`)."""

    def backend_names(self) -> list[str]:
        return list(plugins.entry_points(plugins.Group.BACKENDS))

    def backends(self) -> Mapping[str, type[BaseModel]]:
        return {}

    def proposer_kinds(self) -> list[str]:
        return list(plugins.entry_points(plugins.Group.PROPOSERS))


def catalogue_of(info: ValidationInfo | None) -> Catalogue:
    context = info.context if info is not None else None
    found = context.get("plugins") if isinstance(context, dict) else None
    return found if found is not None else EntryPointNames()


class ConfigError(UserError):
    """A problem with ratchet.toml, phrased for the user (one line, names the key)."""


# ---------------------------------------------------------------------------------------
# value types


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """'90s', '10m', '1.5h', '250ms' or a bare number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '90s' or '10m'")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"expected a duration such as '90s' or '10m', got {value!r}")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


class Improvement(BaseModel):
    """A margin: absolute (0.001) or relative to the incumbent ("0.5%")."""

    model_config = ConfigDict(frozen=True)
    value: float = 0.0
    relative: bool = False

    def margin(self, incumbent: float) -> float:
        return abs(incumbent) * self.value if self.relative else self.value

    def __str__(self) -> str:
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g}"


def parse_improvement(value: Any) -> Improvement:
    if isinstance(value, Improvement):
        return value
    if isinstance(value, bool):
        raise ValueError("expected a number (0.001) or a percentage ('0.5%')")
    if isinstance(value, int | float):
        amount, relative = float(value), False
    else:
        text = str(value).strip()
        relative = text.endswith("%")
        try:
            amount = float(text.rstrip("%")) / (100.0 if relative else 1.0)
        except ValueError:
            raise ValueError(
                f"expected a number (0.001) or a percentage ('0.5%'), got {value!r}"
            ) from None
    if amount < 0:
        raise ValueError("must not be negative")
    return Improvement(value=amount, relative=relative)


ImprovementField = Annotated[Improvement, BeforeValidator(parse_improvement)]


# ---------------------------------------------------------------------------------------
# sections


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Metric(Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")  # the evaluator reports it
    goal: Literal["minimize", "maximize"] = "minimize"  # which way is better

    def gain(self, candidate: float, incumbent: float) -> float:
        """How much better candidate is than incumbent (positive = better)."""
        return incumbent - candidate if self.goal == "minimize" else candidate - incumbent


class Task(Strict):
    # the study's name: its branch `ratchet/<name>`, its refs `refs/ratchet/<name>/<id>`
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    editable: list[str] = Field(min_length=1)  # globs a proposer may change
    protected: list[str] = []  # globs pinned at the start, restored before evaluating
    build: str | None = None  # optional candidate phases, in this order: build, smoke, run
    # where the build runs: "slot" (the job's own slot, before its other phases) or "cpu"
    # (a CPU build slot, ahead of the job's slot: local backend, see backend.build_slots)
    build_on: Literal["slot", "cpu"] = "slot"
    smoke: str | None = None  # a cheap early filter: a candidate failing it never runs
    run: str | None = None  # e.g. the training run; a metric it prints is ignored
    # the trusted evaluator: reports through ratchet.channel.report, or prints
    # `name: value` lines (accepted, shown as unprotected)
    evaluate: str
    holdout: str | None = None  # the hold-out evaluator, run only for a would-be keep
    timeout: Duration = 600.0  # one deadline for a whole job
    metric: Metric
    env: list[str] = []  # extra environment variables candidates may see
    forbid: list[str] = []  # regexes over the lines a candidate's diff adds
    constraints: list[str] = []  # e.g. "memory_gb <= 60", over the evaluator's extra metrics
    holdout_tolerance: ImprovementField = Improvement()  # allowed hold-out regression
    holdout_data: str | None = None  # a directory only the hold-out evaluator may read
    network: bool = Field(default=False, description=(
        "Let candidates' code reach the network. Off by default: every phase (build, smoke, "
        "run, evaluate, hold-out) and the evaluator's candidate child run in a network "
        "namespace of their own with only loopback. On, they reach this machine's loopback "
        "services (a Ray head's job server, `ratchet serve`) and the internet: set it only "
        "for a task that must download (docs/security-network.md)."))

    @field_validator("editable", "protected")
    @classmethod
    def _globs_are_relative(cls, globs: list[str]) -> list[str]:
        for glob in globs:
            if not glob or glob.startswith("/") or ".." in Path(glob).parts:
                raise ValueError(f"{glob!r} must be a path relative to the repository root")
            if glob.count("[") != glob.count("]"):
                raise ValueError(f"{glob!r} is not a valid glob (unbalanced brackets)")
            if Path(glob).parts[:1] == (".git",):
                raise ValueError(f"{glob!r} points into .git")
        return globs

    @field_validator("forbid")
    @classmethod
    def _regexes_compile(cls, rules: list[str]) -> list[str]:
        for rule in rules:
            try:
                re.compile(rule)
            except re.error as exc:
                raise ValueError(f"{rule!r} is not a valid regex: {exc}") from None
        return rules

    @field_validator("constraints")
    @classmethod
    def _constraints_parse(cls, rules: list[str]) -> list[str]:
        for rule in rules:
            if not re.match(r"^\s*[A-Za-z_][\w.\-]*\s*(<=|>=|<|>|==|!=)\s*-?[\d.eE+\-]+\s*$", rule):
                raise ValueError(f"{rule!r} must look like 'memory_gb <= 60'")
        return rules

    @field_validator("evaluate", "build", "smoke", "run", "holdout")
    @classmethod
    def _command_not_blank(cls, command: str | None) -> str | None:
        if command is not None and not command.strip():
            raise ValueError("must be a shell command, not blank")
        return command


def parse_rate(value: Any) -> float:
    """A probability: 0.01 or "1%"."""
    if isinstance(value, bool):
        raise ValueError("expected a rate such as \"1%\" or 0.01")
    text = str(value).strip()
    try:
        rate = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    except ValueError:
        raise ValueError(f"expected a rate such as \"1%\" or 0.01, got {value!r}") from None
    if not 0.0 < rate < 0.5:
        raise ValueError("must be between 0 and 50%")
    return rate


Rate = Annotated[float, BeforeValidator(parse_rate)]


class Acceptance(Strict):
    """When a change is kept (docs/statistics.md): beyond min_improvement and beyond the
    measured noise, confirmed on fresh paired measurements at a false-keep rate."""

    min_improvement: ImprovementField = Improvement()  # the margin a keep must clear
    repeats: int = Field(default=1, ge=1, le=100)  # evaluations per candidate
    co_run_incumbent: bool = False  # re-measure the incumbent beside each round
    # the chance that a change with no real effect is kept (or give `confidence`)
    false_keep_rate: Rate = 0.01
    confidence: float | None = Field(default=None, gt=0.5, lt=1.0)  # 1 - false_keep_rate
    # "measure": no keep without a noise estimate; "ignore": keep on one measurement
    # beyond min_improvement (warned in `status` and the report)
    noise: Literal["measure", "ignore"] = "measure"
    # the baseline measured this many times at the start (an A/A noise floor); 1: none
    noise_floor: int = Field(default=1, ge=1, le=100)
    # most fresh pairs (candidate beside incumbent) a would-be keep is measured on
    confirm_pairs: int = Field(default=30, ge=1, le=100)

    @model_validator(mode="after")
    def _one_rate(self) -> Acceptance:
        if self.confidence is not None and "false_keep_rate" in self.model_fields_set:
            raise ValueError("give acceptance.false_keep_rate or acceptance.confidence, "
                             "not both")
        return self

    @property
    def rate(self) -> float:
        """The false-keep rate in force."""
        return 1.0 - self.confidence if self.confidence is not None else self.false_keep_rate


class Prep(Strict):
    run: str  # a shell command writing into $RATCHET_DATA


NotifyEvent = Literal["keep", "crash", "end", "budget"]


class Notify(Strict):
    """`[notify]`: tell someone when a keep, a crash streak, the end or a budget stop
    happens (ratchet.ui.notify). Its failures are logged and never stop the study."""

    command: str | None = None  # run by /bin/sh; the summary in $RATCHET_SUMMARY, JSON on stdin
    url: str | None = None  # POST JSON {"text": summary, ...} (Slack-style webhooks take it)
    url_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # URL kept out of git
    on: list[NotifyEvent] = ["keep", "crash", "end", "budget"]  # which events to send
    crash_streak: int = Field(default=3, ge=1)  # crashes in a row that make one "crash" notice
    timeout: Duration = 10.0  # each delivery's limit

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL with a host")
        return url

    @field_validator("command")
    @classmethod
    def _command_not_blank(cls, command: str | None) -> str | None:
        if command is not None and not command.strip():
            raise ValueError("is empty: give a command, or leave the key out")
        return command

    @model_validator(mode="after")
    def _somewhere(self) -> Notify:
        if not (self.command or self.url or self.url_env):
            raise ValueError("set command, url or url_env (where to send the notices)")
        return self


class Search(Strict):
    # a registered proposer kind (ratchet.proposers.proposer_kinds(): tune, llm, agent,
    # patches, plug-ins)
    proposer: str = "tune"
    parallel: int = Field(default=2, ge=1, le=1024)  # K: candidates at once
    rounds: int = Field(default=4, ge=1)
    # rounds: best of K, then the next round from the winner; rolling: a freed slot gets a
    # new candidate from the current incumbent at once, each result judged at once
    mode: Literal["rounds", "rolling"] = "rounds"
    # rolling: the budget in candidates that run (default rounds x parallel)
    candidates: int | None = Field(default=None, ge=1)
    seed: int = 0  # the proposer's random seed
    # rounds: propose round R+1 while round R runs (speculation), before its verdicts.
    # Hides the proposer's latency, but R+1 does not see R's results, and when R moves
    # the incumbent its proposals are re-based or dropped (each dropped one is billed);
    # default off: each round sees the last one's verdicts, as the practice defines it
    ahead: bool = False
    # rounds: while a would-be keep is confirmed, the next round is proposed on it and
    # starts in the slots its pairs leave free; refused, those candidates are withdrawn
    # (never blamed) and carried onto the incumbent; kept, the round is topped up to K
    # (driver/beside.py). Off: the free slots take grouped looks of pairs instead
    beside: bool = True

    @field_validator("proposer")
    @classmethod
    def _proposer_is_registered(cls, kind: str, info: ValidationInfo) -> str:
        return registered(kind, catalogue_of(info).proposer_kinds(), "proposer")


def registered(kind: str, known: list[str], what: str) -> str:
    """`kind` when a plug-in of that name is registered, else the error naming the
    closest one and every known name (the one check for every plug-in registry)."""
    if kind not in known:
        close = difflib.get_close_matches(kind, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown {what} {kind!r}{hint} (expected {' | '.join(known)})")
    return kind


def parse_hours(value: Any) -> float:
    """Hours: a bare number (8, 0.5), or a duration ('90m', '8h', '30s')."""
    if isinstance(value, bool):
        raise ValueError("expected hours (8, 0.5) or a duration such as '90m'")
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError("must be positive")
        return float(value)
    try:
        return parse_duration(value) / 3600.0
    except ValueError:
        raise ValueError(f"expected hours (8, 0.5) or a duration such as '90m', got "
                         f"{value!r}") from None


Hours = Annotated[float, BeforeValidator(parse_hours)]


class Budget(Strict):
    """Limits that stop a study cleanly at the first one it would cross (budget.py):
    no new proposals, running jobs finished and judged. Any subset; the whole study's
    spend counts (a resumed study goes on from what it spent), and a higher limit in
    ratchet.toml lets `ratchet run` resume a study a limit stopped."""

    usd: float | None = Field(default=None, gt=0)  # proposer calls + priced compute
    tokens: int | None = Field(default=None, ge=1)  # proposer tokens, in + out
    hours: Hours | None = None  # slot-hours of compute (GPU/CPU-hours)
    wall: Hours | None = None  # wall-clock hours of the study's sessions
    candidates: int | None = Field(default=None, ge=1)  # candidates proposed

    @property
    def limits(self) -> dict[str, float]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


KnobValue = int | float | str | bool | None


class Knob(Strict):
    """One tunable: a module-level `NAME = literal` in an editable file."""

    choices: list[KnobValue] | None = None  # the values to try, or low/high
    low: int | float | None = None  # ints stay ints: `low = 1, high = 8` is an int knob
    high: int | float | None = None
    log: bool = False  # sample low..high on a log scale
    step: int | float | None = None  # a grid step between low and high
    int_: bool = Field(default=False, alias="int")  # an int knob whatever low/high say

    @model_validator(mode="after")
    def _one_kind(self) -> Knob:
        if self.choices is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give either choices or low/high, not both")
            if not self.choices:
                raise ValueError("choices must not be empty")
        else:
            if self.low is None or self.high is None:
                raise ValueError("needs choices = [...] or both low and high")
            if self.low >= self.high:
                raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
            if self.log and self.low <= 0:
                raise ValueError("log = true needs low > 0")
        return self

    @property
    def is_int(self) -> bool:
        """Int knob when asked (`int = true`) or when low, high (and step) are written as ints."""
        return self.int_ or (
            self.choices is None
            and isinstance(self.low, int)
            and isinstance(self.high, int)
            and (self.step is None or isinstance(self.step, int))
        )


class Tune(Strict):
    knobs: dict[str, Knob] = {}
    sampler: Literal["tpe", "random"] = "tpe"  # Optuna's sampler

    @field_validator("knobs")
    @classmethod
    def _knob_keys(cls, knobs: dict[str, Knob]) -> dict[str, Knob]:
        for key in knobs:
            file, sep, name = key.rpartition(":")
            if not sep or not file or not name.isidentifier():
                raise ValueError(f"knob {key!r} must look like 'file.py:NAME'")
        return knobs


class Backend(Strict):
    # a registered backend (ratchet.backends.backends(): local, ray, shell, plug-ins)
    kind: str = "local"
    slots: int | None = Field(default=None, ge=1)  # default: one per GPU, else one per core
    gpus: list[str] | None = None  # GPU ids to lease, default: all visible
    memory_limit_gb: float | None = Field(default=None, gt=0)  # per job (address space)
    disk_limit_gb: float | None = Field(default=None, gt=0)  # largest file a job may write
    # the job's work and tmp directories together (a watched bound: past it, a crash)
    job_disk_gb: float | None = Field(default=None, gt=0)
    # kept free on the filesystem of the study's state; default: 5% of it, at most 1 GiB
    disk_reserve_gb: float | None = Field(default=None, ge=0)
    job_pids: int | None = Field(default=4096, ge=8)  # processes and threads of one job
    log_limit_mb: float = Field(default=16.0, gt=0)  # per phase log: head and tail kept
    # auto: bubblewrap, else a PID namespace (util-linux unshare); none: no isolation
    sandbox: Literal["auto", "bwrap", "none"] = "auto"
    keep_workdirs: Literal["none", "kept", "all"] = "kept"  # job work dirs kept after judging
    # CPU slots for builds declared `task.build_on = "cpu"`: candidates build there while
    # others hold the GPU slots (local backend)
    build_slots: int = Field(default=2, ge=1)
    standby_workers: bool = True  # local: start the next jobs' workers ahead of time
    gpu_hourly_usd: float = Field(default=0.0, ge=0)  # prices for the cost columns
    cpu_hourly_usd: float = Field(default=0.0, ge=0)
    # `[backend.<name>]` tables, each validated by the settings model its backend
    # registered (`[backend.ray]` -> RayConfig); filled from those tables, not written
    engines: dict[str, SerializeAsAny[BaseModel]] = Field(default={}, exclude=True)

    @field_validator("kind")
    @classmethod
    def _kind_is_registered(cls, kind: str, info: ValidationInfo) -> str:
        known = catalogue_of(info)
        if kind in known.backend_names():  # known without importing every engine
            return kind
        return registered(kind, list(known.backends()), "backend")

    @model_validator(mode="before")
    @classmethod
    def _engine_tables(cls, data: Any, info: ValidationInfo) -> Any:
        """Each `[backend.<name>]` table of a registered backend, validated by its model."""
        if not isinstance(data, dict) or not any(k not in cls.model_fields for k in data):
            return data  # no engine's table: no engine imported to look for one
        models = catalogue_of(info).backends()
        data = dict(data)
        engines = dict(data.pop("engines", None) or {})
        for name in [k for k in data if k in models and k not in cls.model_fields]:
            raw = data.pop(name)
            engines[name] = raw if isinstance(raw, BaseModel) else \
                section(models[name], raw, f"backend.{name}")
        data["engines"] = engines
        return data


class SectionError(ValueError):
    """A plug-in's settings table did not validate; the message names the key."""


def section(model: type[M], data: Any, prefix: str, docs: str = "docs/backends.md") -> M:
    """Validate a plug-in's table (an engine's `[backend.ray]`, a proposer's `[llm]`);
    the error names the key, e.g. `backend.ray.address: ...`, and a misspelt key the
    one it most probably meant."""
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        first = _causes([dict(e) for e in exc.errors()], model, EntryPointNames())[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            meant = misspelling(first, model)
            message = (f"unknown key; did you mean {meant!r}? (check the spelling)" if meant
                       else f"unknown key (check the spelling; see {docs})")
        elif first["type"] == "missing":
            message = "required key is missing"
        if not where and re.match(r"^[\w.]+: ", message):  # a model check naming its key
            where, message = message.split(": ", 1)
        raise SectionError(f"{prefix}.{where}: {message}" if where else f"{prefix}: {message}") \
            from None


class Config(Strict):
    task: Task
    acceptance: Acceptance = Acceptance()
    prep: Prep | None = None
    search: Search = Search()
    budget: Budget = Budget()
    tune: Tune = Tune()
    backend: Backend = Backend()
    notify: Notify | None = None
    llm: dict[str, Any] = {}
    agent: dict[str, Any] = {}
    patches: dict[str, Any] = {}
    context: dict[str, Any] = {}
    # the tables of plug-in proposers, `[<name>]` as the built-in kinds' `[llm]`: raw after
    # the first pass, each its kind's settings model after the second (`parse_config`)
    tables: dict[str, Any] = Field(default={}, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _plugin_tables(cls, data: Any, info: ValidationInfo) -> Any:
        """A top-level table named after a registered proposer kind is that kind's."""
        if not isinstance(data, dict) or all(k in cls.model_fields for k in data):
            return data  # no table of a plug-in: no registry read to look for one
        kinds = catalogue_of(info).proposer_kinds()
        data = dict(data)
        tables = dict(data.pop("tables", None) or {})
        for name in [k for k in data if k in kinds and k not in cls.model_fields]:
            tables[name] = data.pop(name)
        data["tables"] = tables
        return data

    @model_validator(mode="before")
    @classmethod
    def _search_budget(cls, data: Any) -> Any:
        """`[search] budget = {usd = 20, ...}` is the same table as `[budget]`."""
        if not isinstance(data, dict) or not isinstance(data.get("search"), dict) \
                or "budget" not in data["search"]:
            return data
        data = dict(data)
        search = dict(data["search"])
        if "budget" in data:
            raise ValueError("budget: given both as [budget] and as search.budget; keep one")
        data["budget"] = search.pop("budget")
        data["search"] = search
        return data

    @model_validator(mode="after")
    def _knobs_in_editable_files(self) -> Config:
        for key in self.tune.knobs:
            file = key.rpartition(":")[0]
            if not matches_any(file, self.task.editable):
                raise ValueError(
                    f"tune.knobs: {key!r} is in {file!r}, which is not in task.editable"
                )
        # Whether the chosen proposer has what it needs (knobs for `tune`, models for
        # `llm`) is checked when the proposer is built: `ratchet submit` / `wait` and
        # `ratchet run --proposer P` must not be judged by a proposer they do not use.
        return self

    @property
    def metric(self) -> Metric:
        return self.task.metric


def matches_any(path: str, globs: list[str]) -> bool:
    """Glob match one path segment at a time ('*' never spans '/', '**' does); a bare
    directory covers its files. The rules live in ratchet.core.paths."""
    return paths.matches_any(path, globs)


# ---------------------------------------------------------------------------------------
# loading


def _model_at(loc: tuple, root: type[BaseModel]) -> type[BaseModel] | None:
    """The section model that holds the key at `loc` (None if it is not a section)."""
    model: Any = root
    for part in loc[:-1]:
        if typing.get_origin(model) is dict:  # `part` is a key of a table of sections
            model = _section_type(typing.get_args(model)[1])
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = next((f for n, f in model.model_fields.items()
                      if part in (n, f.alias)), None)
        if field is None:
            return None
        model = _section_type(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _section_type(annotation: Any) -> Any:
    """Unwrap `X | None` and `dict[str, X]` down to a model class, if there is one."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation)
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if models else None
    return annotation


def _keys_of(model: type[BaseModel], known: Catalogue) -> list[str]:
    keys = [f.alias or n for n, f in model.model_fields.items()
            if not f.exclude]  # `Backend.engines` is filled, never written
    if model is Backend:  # its tables are the registered backends' names
        keys += list(known.backends())
    if model is Config:  # and its top-level ones the proposer kinds' (`[mine]`)
        keys += [k for k in known.proposer_kinds() if k not in keys]
    return keys


def misspelling(error: Mapping[str, Any], root: type[BaseModel] | None = None,
                known: Catalogue | None = None) -> str | None:
    """For a pydantic `extra_forbidden` error, the known key it most probably meant
    ('editabel' -> 'editable'), or None. `root`: the model that was validated (any
    section model, e.g. an engine's or a proposer's settings); default the whole config.
    `known`: the plug-ins whose tables are keys too (default: the entry points' names)."""
    loc = error["loc"]
    model = _model_at(loc, root or Config) if loc else None
    if model is None or not isinstance(loc[-1], str):
        return None
    keys = _keys_of(model, known or EntryPointNames())
    close = difflib.get_close_matches(loc[-1], keys, n=1, cutoff=0.6)
    return close[0] if close else None


def _describe(error: dict[str, Any], known: Catalogue) -> str:
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, SectionError):  # a plug-in's table: it names its own key
        return str(cause)
    location = ".".join(str(part) for part in error["loc"] if part != "__root__")
    message = error["msg"]
    message = message.removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        meant = misspelling(error, known=known)
        message = "unknown key (check the spelling; every key: docs/reference/config.md)"
        if meant is not None:
            message = f"unknown key; did you mean {meant!r}? (check the spelling)"
    elif error["type"] == "missing":
        message = "required key is missing"
    elif error["type"].endswith("_type") or error["type"].endswith("_parsing"):
        message = f"{message} (got {error.get('input')!r})"
    return f"{location}: {message}" if location else message


def _causes(errors: list[dict[str, Any]], root: type[BaseModel],
            known: Catalogue) -> list[dict[str, Any]]:
    """The errors in the order to name them. A misspelt key shows up twice: as an unknown
    key and, when it was required, as a missing one. The misspelling is the cause, so it
    is named first, and the "missing" error it explains is not counted as another problem."""
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    explained = {(*e["loc"][:-1], meant) for e in unknown
                 if (meant := misspelling(e, root, known)) is not None}
    return unknown + [e for e in errors if e["type"] != "extra_forbidden"
                      and not (e["type"] == "missing" and tuple(e["loc"]) in explained)]


def validate(data: dict[str, Any], source: str, known: Catalogue) -> Config:
    """The first pass: the whole schema, the plug-ins known through `known`; one
    ConfigError naming the first problem (and how many more)."""
    try:
        return Config.model_validate(data, context={"plugins": known})
    except ValidationError as exc:
        errors = _causes([dict(e) for e in exc.errors()], Config, known)
        first = errors[0]
        more = len(errors) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise ConfigError(f"{source}: {_describe(first, known)}{suffix}") from None


def read_toml(raw: bytes, source: str = CONFIG_FILE) -> dict[str, Any]:
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
