"""A declared workload, and the profile of a model under it (`workload.json`).

A kernel study is worth what its shapes are worth. The workload says how the model is
really run (the serving mix of prefill and decode points, batch sizes, sequence and
context lengths, dtype, device, and whether CUDA graphs or torch.compile are used); the
profile (`ratchet profile`, `profile.py`) says what the model computes under it: each
operator with its input shapes, dtypes, calls and share of the model's time.

This module is the data and its arithmetic, with no torch in it:

- `Workload.load("workload.toml")`: the declaration (TOML, below);
- `Profile` / `load_profile` / `save_profile`: `workload.json`, which round-trips;
- `op_shapes(profile, op)`: the shapes one swappable operator sees, with their weights
  (calls and time per model step) and which are held out: the *largest* shapes of each
  operator (the long-context tail), so a kernel only fast at small contexts is judged
  where it is slow;
- `weighted_metrics(report, shapes)`: the study metric as model time saved, each shape
  weighted by the time it stands for in the model (not an unweighted geomean).

    model = "model.py"          # the model module: build_model, make_inputs, OPS
    device = "cpu"              # or "cuda"
    dtype = "float32"
    mode = "eager"              # eager | cuda_graphs | compile
    compile_backend = "inductor"  # torch.compile's backend under mode = "compile"
    threads = 1                 # torch intra-op threads, as the server runs it (default: torch's)
    holdout_fraction = 0.25     # of each operator's shapes, the largest, held out

    [[point]]                   # one entry of the serving mix
    phase = "prefill"
    batch = 1
    seq = 256
    weight = 0.3                # its share of the model's forward passes

    [ops.gelu]                  # roofline formulas (shape names: rows, cols, itemsize)
    flops = "8 * rows * cols"
    bytes = "2 * rows * cols * itemsize"
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ...core.errors import UserError

FORMAT = 1
HOLDOUT_ENV = "RATCHET_HOLDOUT"


class Mode(StrEnum):
    """How the model is executed, as the serving or training stack runs it."""

    EAGER = "eager"
    CUDA_GRAPHS = "cuda_graphs"
    COMPILE = "compile"


@dataclass
class OpSpec:
    """Roofline formulas for one swappable operator (ratchet.evaluator.kernels.roofline.evaluate)."""

    flops: str | float | None = None
    bytes: str | float | None = None


@dataclass
class Workload:
    """The declaration: how the model is run. Every field has a one-line error when wrong."""

    model: str
    points: list[dict[str, Any]]
    device: str = "cpu"
    dtype: str = "float32"
    mode: Mode = Mode.EAGER
    compile_backend: str = "inductor"  # under Mode.COMPILE, as torch.compile(backend=...) names it
    holdout_fraction: float = 0.25
    threads: int | None = None  # torch.set_num_threads in every process that runs the model
    # timed forwards per point, after `warmup` (each operator's median over them counts):
    # cheap, timed without recording shapes, and on a loaded machine a few are preempted
    steps: int = 20
    warmup: int = 2
    ops: dict[str, OpSpec] = field(default_factory=dict)
    root: Path = field(default_factory=Path.cwd)  # the directory `model` is relative to

    @property
    def model_path(self) -> Path:
        return (self.root / self.model).resolve()

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Workload:
        where = Path(path)
        try:
            data = tomllib.loads(where.read_text())
        except OSError as exc:
            raise UserError(f"{where}: cannot read the workload ({exc.strerror or exc}); pass the path of a workload TOML file") from None
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{where}: not valid TOML ({exc}); fix the file") from None
        return cls.from_dict(data, root=where.resolve().parent, source=str(where))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, root: Path | None = None, source: str = "workload") -> Workload:
        known = {"model", "point", "device", "dtype", "mode", "compile_backend", "threads", "holdout_fraction", "steps", "warmup", "ops"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"{source}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        if not isinstance(data.get("model"), str) or not data["model"]:
            raise UserError(f'{source}: `model` must name the model module, e.g. model = "model.py"')
        points = data.get("point")
        if not isinstance(points, list) or not points or not all(isinstance(p, dict) for p in points):
            raise UserError(f"{source}: declare at least one [[point]] (phase, batch, seq, weight) of the serving mix")
        for i, p in enumerate(points):
            w = p.get("weight", 1.0)
            if not isinstance(w, int | float) or isinstance(w, bool) or w <= 0:
                raise UserError(f"{source}: point {i + 1}: weight must be a number > 0 (its share of the forward passes), got {w!r}")
        try:
            mode = Mode(data.get("mode", "eager"))
        except ValueError:
            raise UserError(f"{source}: mode {data.get('mode')!r} is not one of {', '.join(m.value for m in Mode)}") from None
        backend = data.get("compile_backend", cls.compile_backend)
        if not isinstance(backend, str) or not backend:
            raise UserError(f"{source}: compile_backend must name a torch.compile backend, e.g. \"inductor\", got {backend!r}")
        fraction = data.get("holdout_fraction", 0.25)
        if not isinstance(fraction, int | float) or not 0 <= fraction < 1:
            raise UserError(f"{source}: holdout_fraction must be in [0, 1), got {fraction!r}")
        ops = {}
        for name, spec in (data.get("ops") or {}).items():
            if not isinstance(spec, dict) or set(spec) - {"flops", "bytes"}:
                raise UserError(f"{source}: [ops.{name}] takes only flops and bytes (formula strings or numbers)")
            ops[name] = OpSpec(**spec)
        threads = data.get("threads")
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise UserError(f"{source}: threads must be an integer >= 1 (torch's intra-op threads), got {threads!r}")
        steps, warmup = data.get("steps", cls.steps), data.get("warmup", cls.warmup)
        if not isinstance(steps, int) or steps < 1 or not isinstance(warmup, int) or warmup < 0:
            raise UserError(f"{source}: steps must be an integer >= 1 and warmup >= 0")
        return cls(
            model=data["model"], points=[dict(p) for p in points], device=str(data.get("device", "cpu")),
            dtype=str(data.get("dtype", "float32")), mode=mode, compile_backend=backend, holdout_fraction=float(fraction),
            threads=threads, steps=steps, warmup=warmup, ops=ops, root=root or Path.cwd(),
        )

    def weights(self) -> list[float]:
        """Each point's share of the forward passes, normalised to sum to 1."""
        raw = [float(p.get("weight", 1.0)) for p in self.points]
        total = sum(raw)
        return [w / total for w in raw]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "device": self.device, "dtype": self.dtype, "mode": self.mode.value, "compile_backend": self.compile_backend,
            "threads": self.threads, "holdout_fraction": self.holdout_fraction, "steps": self.steps, "warmup": self.warmup,
            "point": self.points, "ops": {k: asdict(v) for k, v in self.ops.items()},
        }


def point_label(point: Mapping[str, Any]) -> str:
    """'decode batch=8 context=1024 seq=1': the phase, then the sizes (weight left out)."""
    sizes = " ".join(f"{k}={v}" for k, v in sorted(point.items()) if k not in ("phase", "weight"))
    return f"{point.get('phase', 'point')} {sizes}".strip()


# -- the profile: workload.json ------------------------------------------------------------


@dataclass
class ShapeRecord:
    """One operator at one input shape: what it costs per model forward of the mix."""

    shape: dict[str, Any]  # named dims, e.g. {"rows": 256, "cols": 1024}
    input_shapes: list[list[int]]
    dtypes: list[str]
    calls: float  # per forward pass of the mix (weighted by the points' weights)
    time_s: float  # per forward pass of the mix
    share: float  # of the model's time
    points: list[str] = field(default_factory=list)  # which workload points produce it
    holdout: bool = False


@dataclass
class OpRecord:
    """One operator (a swappable model op, or an aten op outside them), all its shapes."""

    name: str
    kind: str  # "model" (a swappable op of the model's OPS) | "aten"
    calls: float
    time_s: float
    share: float
    shapes: list[ShapeRecord]
    flops: float = 0.0  # per forward of the mix, summed over calls
    bytes: float = 0.0
    bound: str = ""  # compute | memory | overhead
    roofline_time_s: float | None = None
    amdahl_speedup: float | None = None  # the model's speed-up if this op reached its roofline


@dataclass
class Profile:
    """workload.json: the model's operators under the declared workload."""

    workload: dict[str, Any]
    device: str
    model_time_s: float  # one forward pass of the mix, measured inside the profiler (per point: its operators' and gaps' medians)
    ops_time_s: float  # what the operators' own records add up to; the rest is host time between them
    ops: list[OpRecord]
    model_time_unprofiled_s: float | None = None  # the same, timed without the profiler
    per_point: list[dict[str, Any]] = field(default_factory=list)
    peaks: dict[str, Any] | None = None
    versions: dict[str, str] = field(default_factory=dict)
    format: int = FORMAT

    @property
    def coverage(self) -> float:
        """The operators' own time / the model's time, in the same forwards: near 1 when
        the operators take the time, lower by the host time between them (Python)."""
        return self.ops_time_s / self.model_time_s if self.model_time_s else 0.0

    @property
    def host_s(self) -> float:
        """Time in the forward outside every operator: the interpreter between the calls."""
        return max(0.0, self.model_time_s - self.ops_time_s)

    def op(self, name: str) -> OpRecord:
        for op in self.ops:
            if op.name == name:
                return op
        have = ", ".join(o.name for o in self.ops if o.kind == "model") or "none"
        raise UserError(f"workload.json has no operator {name!r} (model operators: {have}); profile the model with it in OPS")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["coverage"], data["host_s"] = self.coverage, self.host_s
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        if data.get("format") != FORMAT:
            raise UserError(f"workload.json format {data.get('format')!r}, expected {FORMAT}: run `ratchet profile` again")
        ops = []
        for o in data["ops"]:
            shapes = [ShapeRecord(**s) for s in o["shapes"]]
            ops.append(OpRecord(**{**o, "shapes": shapes}))
        fields = {k: v for k, v in data.items() if k not in ("ops", "coverage", "host_s")}
        return cls(**{**fields, "ops": ops})


def save_profile(profile: Profile, path: str | os.PathLike[str] = "workload.json") -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(profile.to_dict(), indent=2, sort_keys=True) + "\n")
    tmp.replace(out)
    return out


def redacted(profile: Profile) -> Profile:
    """The profile without its hold-out shapes: the copy a proposer may read."""
    data = profile.to_dict()
    for op in data["ops"]:
        op["shapes"] = [s for s in op["shapes"] if not s["holdout"]]
    return Profile.from_dict(data)


def load_profile(path: str | os.PathLike[str] = "workload.json", env: Mapping[str, str] | None = None) -> Profile:
    """Read workload.json; in the hold-out run (RATCHET_HOLDOUT names a directory holding
    a file of the same name) that full copy wins over the tree's redacted one."""
    env = os.environ if env is None else env
    where = Path(path)
    hidden = env.get(HOLDOUT_ENV, "")
    if hidden and Path(hidden).is_dir() and (Path(hidden) / where.name).is_file():
        where = Path(hidden) / where.name
    try:
        data = json.loads(where.read_text())
    except OSError as exc:
        raise UserError(f"{where}: cannot read the profile ({exc.strerror or exc}); run `ratchet profile` first") from None
    except ValueError as exc:
        raise UserError(f"{where}: not valid JSON ({exc}); run `ratchet profile` again") from None
    return Profile.from_dict(data)


def mark_holdout(shapes: list[ShapeRecord], fraction: float) -> None:
    """Hold out the largest `fraction` of the shapes (by elements; ties: the later)."""
    if fraction <= 0 or len(shapes) < 2:
        return
    count = min(len(shapes) - 1, max(1, round(fraction * len(shapes))))
    order = sorted(range(len(shapes)), key=lambda i: (_size(shapes[i]), i))
    for i in order[-count:]:
        shapes[i].holdout = True


def _size(record: ShapeRecord) -> int:
    return sum(math.prod(s) for s in record.input_shapes) or math.prod(int(v) for v in record.shape.values() if isinstance(v, int))


# -- what a kernel study takes from it -------------------------------------------------------


@dataclass
class WeightedShape:
    shape: dict[str, Any]
    dtype: str
    calls: float  # per forward of the mix
    time_s: float  # the library op's time at this shape, per forward of the mix (profiled)
    holdout: bool


def op_shapes(profile: Profile, op: str, *, holdout: bool | None = None) -> list[WeightedShape]:
    """The shapes `op` sees in the model, with their weights; `holdout` True/False picks
    the held-out (largest) or the public ones, None all of them."""
    record = profile.op(op)
    chosen = [s for s in record.shapes if holdout is None or s.holdout == holdout]
    return [WeightedShape(dict(s.shape), s.dtypes[0] if s.dtypes else profile.workload.get("dtype", "float32"), s.calls, s.time_s, s.holdout) for s in chosen]


def weighted_metrics(report: Any, shapes: Sequence[WeightedShape], profile: Profile | None = None, op: str | None = None) -> dict[str, Any]:
    """The sweep's result as the model sees it: each shape weighted by its calls.

    weighted_speedup = sum(calls x baseline time) / sum(calls x candidate time): the op's
    own speed-up inside the model, dominated by the shapes that take the model's time.
    model_time_saved_ms: per forward of the mix. With `profile` and `op`, the Amdahl
    estimate of the model's speed-up (`model_speedup_est`) from the op's share.
    A failed shape (or one not timed) makes the whole thing 0, as a sweep does.
    """
    by_key = {(json.dumps(s.shape, sort_keys=True), s.dtype): s for s in shapes}
    base = cand = 0.0
    for r in report.results:
        w = by_key.get((json.dumps(r.shape, sort_keys=True), r.dtype))
        if w is None:
            continue
        if not r.correct or not r.time_s or not r.baseline_time_s:
            return {"weighted_speedup": 0.0, "model_time_saved_ms": 0.0}
        base += w.calls * r.baseline_time_s
        cand += w.calls * r.time_s
    if not cand:
        return {"weighted_speedup": 0.0, "model_time_saved_ms": 0.0}
    speedup = base / cand
    out: dict[str, Any] = {"weighted_speedup": speedup, "model_time_saved_ms": (base - cand) * 1e3}
    if profile is not None and op is not None:
        share = profile.op(op).share
        out["op_share"] = share
        out["model_speedup_est"] = amdahl(share, speedup)
    return out


def amdahl(share: float, speedup: float) -> float:
    """The model's speed-up when a part taking `share` of its time gets `speedup` faster."""
    if speedup <= 0:
        return 0.0
    return 1.0 / ((1.0 - share) + share / speedup)


def group_shapes(records: Iterable[ShapeRecord]) -> list[ShapeRecord]:
    """Merge records of the same shape and dtypes (from different points) into one."""
    merged: dict[str, ShapeRecord] = {}
    for r in records:
        key = json.dumps([r.input_shapes, r.dtypes, r.shape], sort_keys=True)
        if key in merged:
            m = merged[key]
            m.calls += r.calls
            m.time_s += r.time_s
            m.share += r.share
            m.points += [p for p in r.points if p not in m.points]
        else:
            merged[key] = ShapeRecord(**{**asdict(r), "points": list(r.points)})
    return sorted(merged.values(), key=lambda r: -r.time_s)
