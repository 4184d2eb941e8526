"""Is the candidate right? `check()` runs it against a float64 reference with every guard on.

Each guard closes a hole that kernels written by people or models have slipped through
(see shared/notes/kernel-verification.md):

- fresh seeded random inputs every trial, with a random scale and offset, never zeros;
  odd trials reuse the previous trial's buffers with *new values written in place*, so
  a result cache keyed on input pointer or id returns a stale answer and fails;
- the reference runs on float64 copies of the very same inputs; tolerances per dtype;
  a relative error-norm check beside the per-element one (tiny outputs cannot pass
  by hiding under atol); NaN/Inf never pass; shape and dtype must match exactly;
- order candidate -> reference -> candidate; the two candidate outputs must agree
  (non-determinism, reading leftover memory) and the second must not be the first's
  buffer returned again;
- an output buffer passed with out= is poisoned (NaN / sentinel) and checked fully
  written; inputs are compared with copies afterwards; outputs must not alias inputs;
- results must be plain, materialised arrays (no subclasses, memmaps, lazy iterators,
  broadcast views, meta tensors); background threads left running are reported;
- the timer/comparison functions are verified after each case (guard.py).

The report says, per shape and dtype, which guard fired and why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from . import arrays, guard

# dtype -> (rtol, atol). fp32 ~1e-4, tf32 ~3e-4, fp16/bf16 ~1e-2, fp8 ~1e-1, integers exact.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "tf32": (3e-4, 1e-4),
    "float16": (1e-2, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
    "float8_e4m3fn": (1.25e-1, 1e-1),
    "float8_e5m2": (2.5e-1, 1e-1),
}

Shape = Mapping[str, Any]
MakeInputs = Callable[[Shape, str, np.random.Generator], Any]


def tolerance(dtype: str, overrides: Mapping[str, tuple[float, float]] | None = None) -> tuple[float, float]:
    """(rtol, atol) for an output dtype; integers and bools are exact."""
    if overrides and dtype in overrides:
        return overrides[dtype]
    if dtype in DEFAULT_TOLERANCES:
        return DEFAULT_TOLERANCES[dtype]
    if dtype.startswith(("int", "uint", "bool")):
        return (0.0, 0.0)
    return DEFAULT_TOLERANCES["float32"]


def shape_key(shape: Shape) -> str:
    """A stable text key for a shape dict: 'cols=1024,rows=64'."""
    return ",".join(f"{k}={shape[k]}" for k in sorted(shape))


@dataclass
class CaseResult:
    """One (shape, dtype): did every trial pass, and if not, which guard fired."""

    shape: dict[str, Any]
    dtype: str
    ok: bool
    reasons: list[str]
    trials: int
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    rel_norm_err: float = 0.0
    holdout: bool = False

    @property
    def key(self) -> str:
        return f"{shape_key(self.shape)} {self.dtype}"

    def to_dict(self) -> dict[str, Any]:
        return arrays.jsonable(asdict(self))


@dataclass
class CheckReport:
    """Per-case results; `.ok` only when every case passed."""

    cases: list[CaseResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(c.ok for c in self.cases)

    @property
    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.ok]

    def reasons(self) -> list[str]:
        return [f"{c.key}: {r}" for c in self.failures for r in c.reasons]

    def summary(self) -> str:
        """One line: counts, and the first failure's first reason."""
        n_ok = sum(c.ok for c in self.cases)
        line = f"correctness: {n_ok}/{len(self.cases)} cases ok"
        if self.failures:
            first = self.failures[0]
            line += f"; FAIL {first.key}{' (hold-out)' if first.holdout else ''}: {first.reasons[0]}"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "summary": self.summary(), "cases": [c.to_dict() for c in self.cases]}

    def extend(self, other: CheckReport) -> None:
        self.cases.extend(other.cases)


class _Fail(Exception):
    """A guard fired; the trial stops with this reason."""


def _describe(x: Any) -> str:
    return f"{'tensor' if arrays.is_torch(x) else 'array'}{tuple(x.shape)} {arrays.dtype_name(x)}"


def _call(
    fn: Callable[..., Any],
    inputs: tuple[Any, ...],
    out_factory: Callable[[Shape, str, tuple[Any, ...]], Any] | None,
    shape: Shape,
    dtype: str,
    allow_threads: bool,
    who: str,
) -> tuple[Any, ...]:
    """Run fn once with the guards that wrap a single call; returns its outputs."""
    before = set(threading.enumerate())
    try:
        if out_factory is not None:
            buffers = arrays.as_tuple(out_factory(shape, dtype, inputs))
            for b in buffers:
                arrays.poison_(b)
            result = fn(*inputs, out=buffers[0] if len(buffers) == 1 else buffers)
            returned = arrays.as_tuple(result) if result is not None else buffers
            if any(r is not b for r, b in zip(returned, buffers, strict=False)) or len(returned) != len(buffers):
                raise _Fail(f"{who} returned a new array instead of filling the out= buffer it was given")
            outputs = buffers
        else:
            outputs = arrays.as_tuple(fn(*inputs))
    except _Fail:
        raise
    except Exception as exc:  # the candidate's failure is a finding, not a harness crash
        raise _Fail(f"{who} raised {type(exc).__name__}: {exc}") from exc
    for o in outputs:
        problem = arrays.materialisation_problem(o)
        if problem:
            raise _Fail(f"{who}: {problem}")
    arrays.synchronize(outputs)
    if not allow_threads:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if extra:
            raise _Fail(
                f"{who} left {len(extra)} background thread(s) running ({', '.join(t.name for t in extra)}): "
                "work off the measured path"
            )
    return outputs


def _expected_dtype(spec: str | Callable[[str, int], str] | None, dtype: str, ref_out: Any, index: int) -> str:
    if not arrays.is_floating(ref_out):
        return arrays.dtype_name(ref_out)
    if spec is None:
        return dtype
    return spec if isinstance(spec, str) else spec(dtype, index)


def _validate_outputs(
    outputs: tuple[Any, ...],
    refs: tuple[Any, ...],
    inputs: tuple[Any, ...],
    dtype: str,
    expected_dtype: str | Callable[[str, int], str] | None,
    poisoned: bool,
    allow_inplace: bool,
    who: str,
) -> list[np.ndarray]:
    """Count, shape, dtype, finiteness, unwritten elements, aliasing; returns float64 copies."""
    if len(outputs) != len(refs):
        raise _Fail(f"{who} returned {len(outputs)} output(s), the reference {len(refs)}")
    copies = []
    for i, (out, ref) in enumerate(zip(outputs, refs, strict=True)):
        want_dtype = _expected_dtype(expected_dtype, dtype, ref, i)
        if tuple(out.shape) != tuple(ref.shape):
            raise _Fail(f"{who} output {i} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
        if arrays.dtype_name(out) != want_dtype:
            raise _Fail(f"{who} output {i} has dtype {arrays.dtype_name(out)}, expected {want_dtype}")
        if not allow_inplace:
            for j, inp in enumerate(inputs):
                if arrays.is_array(inp) and arrays.shares_memory(out, inp):
                    raise _Fail(f"{who} output {i} shares memory with input {j} (aliases its input)")
        value = arrays.to_numpy64(out)
        if poisoned:
            unwritten = arrays.count_poisoned(out)
            if unwritten:
                raise _Fail(
                    f"{who} left {unwritten} of {value.size} elements of the out= buffer {i} unwritten "
                    "(still the poison value)"
                )
        if arrays.is_floating(out):
            bad = ~np.isfinite(value)
            if bad.any():
                raise _Fail(f"{who} output {i} has {int(bad.sum())} NaN/Inf values (of {value.size})")
        copies.append(value)
    return copies


def _inputs_unchanged(inputs: tuple[Any, ...], snapshot: tuple[Any, ...], who: str) -> None:
    for j, (now, then) in enumerate(zip(inputs, snapshot, strict=True)):
        if arrays.is_array(now) and not arrays.same_bits(now, then):
            changed = int((arrays.to_numpy64(now) != arrays.to_numpy64(then)).sum()) if tuple(now.shape) == tuple(then.shape) else -1
            raise _Fail(f"{who} modified input {j} in place ({changed} elements changed)")


def _compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> tuple[list[str], float, float, float]:
    """Per-element |got-want| <= atol + rtol|want| and ||got-want|| / ||want|| <= rtol."""
    diff = np.abs(got - want)
    if diff.size == 0:
        return [], 0.0, 0.0, 0.0
    allowed = atol + rtol * np.abs(want)
    bad = diff > allowed
    max_abs = float(diff.max())
    max_rel = float((diff / np.maximum(np.abs(want), np.finfo(np.float64).tiny)).max())
    norm_want = float(np.linalg.norm(want.ravel()))
    rel_norm = float(np.linalg.norm(diff.ravel())) / norm_want if norm_want > 0 else float(np.linalg.norm(diff.ravel()))
    reasons = []
    if bad.any():
        idx = np.unravel_index(int(np.argmax(diff - allowed)), diff.shape)
        reasons.append(
            f"{int(bad.sum())} of {diff.size} elements outside tolerance (rtol={rtol:g}, atol={atol:g}); "
            f"worst at {tuple(int(i) for i in idx)}: got {got[idx]:.6g}, want {want[idx]:.6g}"
        )
    if rel_norm > max(rtol, 1e-12 if rtol > 0 else 0.0):
        reasons.append(f"relative error norm {rel_norm:.3g} exceeds {rtol:g}")
    return reasons, max_abs, max_rel, rel_norm


def _fresh_inputs(
    make_inputs: MakeInputs,
    shape: Shape,
    dtype: str,
    rng: np.random.Generator,
    perturb: bool,
    scale_range: tuple[float, float],
) -> tuple[Any, ...]:
    inputs = arrays.as_tuple(make_inputs(shape, dtype, rng))
    if perturb:
        lo, hi = np.log(scale_range[0]), np.log(scale_range[1])
        for x in inputs:
            if arrays.is_array(x):
                scale = float(np.exp(rng.uniform(lo, hi)))
                arrays.perturb_(x, scale, float(rng.uniform(-1.0, 1.0)) * scale)
    return inputs


def _reuse_buffers(previous: tuple[Any, ...], fresh: tuple[Any, ...]) -> tuple[Any, ...]:
    """Write the fresh values into the previous trial's buffers: same pointers, new data."""
    if len(previous) != len(fresh):
        return fresh
    out = []
    for old, new in zip(previous, fresh, strict=True):
        if arrays.is_array(old) and arrays.is_array(new) and tuple(old.shape) == tuple(new.shape) and arrays.dtype_name(old) == arrays.dtype_name(new) and arrays.device_of(old) == arrays.device_of(new):
            arrays.copy_into(old, new)
            out.append(old)
        else:
            out.append(new)
    return tuple(out)


def check_case(
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: MakeInputs,
    shape: Shape,
    dtype: str,
    *,
    trials: int = 4,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    out: Callable[[Shape, str, tuple[Any, ...]], Any] | None = None,
    perturb: bool = True,
    scale_range: tuple[float, float] = (1e-2, 16.0),
    expected_dtype: str | Callable[[str, int], str] | None = None,
    exact_repeat: bool = True,
    allow_inplace: bool = False,
    allow_threads: bool = False,
    holdout: bool = False,
    case_index: int = 0,
) -> CaseResult:
    """All trials of one (shape, dtype); stops at the first trial a guard fails."""
    result = CaseResult(shape=dict(shape), dtype=dtype, ok=True, reasons=[], trials=0, holdout=holdout)
    previous_inputs: tuple[Any, ...] | None = None
    previous_out: list[np.ndarray] | None = None
    held: list[Any] = []  # earlier outputs kept alive, so their memory cannot be handed out again
    for trial in range(trials):
        rng = np.random.default_rng([seed, case_index, trial])
        try:
            inputs = _fresh_inputs(make_inputs, shape, dtype, rng, perturb, scale_range)
            if trial % 2 == 1 and previous_inputs is not None:
                inputs = _reuse_buffers(previous_inputs, inputs)
            snapshot = tuple(arrays.clone(x) if arrays.is_array(x) else x for x in inputs)

            first = _call(candidate, inputs, out, shape, dtype, allow_threads, "candidate")
            _inputs_unchanged(inputs, snapshot, "candidate")

            try:
                refs = arrays.as_tuple(reference(*(arrays.upcast(x) for x in inputs)))
            except Exception as exc:
                raise _Fail(f"reference raised {type(exc).__name__}: {exc} (harness or make_inputs problem)") from exc
            _inputs_unchanged(inputs, snapshot, "reference")
            ref64 = [arrays.to_numpy64(r) for r in refs]
            if any(not np.isfinite(r).all() for r in ref64 if r.dtype == np.float64):
                raise _Fail("reference produced NaN/Inf for these inputs (make_inputs/scale_range problem)")

            first64 = _validate_outputs(first, refs, inputs, dtype, expected_dtype, out is not None, allow_inplace, "candidate")
            second = _call(candidate, inputs, out, shape, dtype, allow_threads, "candidate (second run)")
            _inputs_unchanged(inputs, snapshot, "candidate (second run)")
            second64 = _validate_outputs(second, refs, inputs, dtype, expected_dtype, out is not None, allow_inplace, "candidate (second run)")
            for i, o in enumerate(second):
                for earlier in (*first, *held):
                    if arrays.is_array(earlier) and arrays.shares_memory(o, earlier) and out is None:
                        raise _Fail(
                            f"candidate output {i} is the buffer it returned on an earlier call "
                            "(stale output reuse: earlier results get overwritten)"
                        )
            for i, (a, b) in enumerate(zip(first64, second64, strict=True)):
                if exact_repeat and not np.array_equal(a, b):
                    raise _Fail(
                        f"two runs on the same inputs disagree in output {i} (max diff {float(np.abs(a - b).max()):.3g}): "
                        "non-deterministic or reading stale memory"
                    )
            for i, (got, want, o) in enumerate(zip(second64, ref64, second, strict=True)):
                rt, at = tolerance(arrays.dtype_name(o), tolerances)
                rt = rt if rtol is None else rtol
                at = at if atol is None else atol
                reasons, max_abs, max_rel, rel_norm = _compare(got, want, rt, at)
                result.max_abs_err = max(result.max_abs_err, max_abs)
                result.max_rel_err = max(result.max_rel_err, max_rel)
                result.rel_norm_err = max(result.rel_norm_err, rel_norm)
                if not exact_repeat:
                    reasons += [f"first run: {r}" for r in _compare(first64[i], want, rt, at)[0]]
                if reasons:
                    if previous_out is not None and i < len(previous_out) and previous_out[i].shape == got.shape and np.array_equal(previous_out[i], got):
                        reasons.append(
                            "output is identical to the previous trial's output: a stale result "
                            "(cached by input pointer/id, or work skipped)"
                        )
                    where = f"output {i}: " if len(second64) > 1 else ""
                    raise _Fail(where + "; ".join(reasons))
            previous_inputs, previous_out = inputs, second64
            if out is None:
                held = [*first, *second]
        except _Fail as fail:
            result.ok = False
            result.reasons.append(f"trial {trial}: {fail}")
            result.trials = trial + 1
            break
        result.trials = trial + 1
    tampered = guard.verify_timers()
    if tampered:
        result.ok = False
        result.reasons += tampered
    return result


def check(
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: MakeInputs,
    shapes: Iterable[Shape],
    *,
    dtypes: Sequence[str] = ("float32",),
    trials: int = 4,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    out: Callable[[Shape, str, tuple[Any, ...]], Any] | None = None,
    perturb: bool = True,
    scale_range: tuple[float, float] = (1e-2, 16.0),
    expected_dtype: str | Callable[[str, int], str] | None = None,
    exact_repeat: bool = True,
    allow_inplace: bool = False,
    allow_threads: bool = False,
    holdout: Iterable[Shape] = (),
) -> CheckReport:
    """Check `candidate` against `reference` on every shape x dtype (then hold-out shapes).

    make_inputs(shape, dtype, rng) returns the inputs (one array or a tuple); draw them
    from `rng` so trials differ. The harness then scales and offsets floating inputs at
    random (perturb=False to opt out, e.g. for probabilities). The reference gets float64
    copies. With `out=factory(shape, dtype, inputs)` the candidate is called as
    candidate(*inputs, out=buffer) and must fill the (poisoned) buffer; otherwise it
    returns its output(s). `rtol`/`atol` override every dtype, `tolerances` some dtypes.
    """
    report = CheckReport()
    options = dict(
        trials=trials,
        seed=seed,
        rtol=rtol,
        atol=atol,
        tolerances=tolerances,
        out=out,
        perturb=perturb,
        scale_range=scale_range,
        expected_dtype=expected_dtype,
        exact_repeat=exact_repeat,
        allow_inplace=allow_inplace,
        allow_threads=allow_threads,
    )
    index = 0
    for is_holdout, group in ((False, shapes), (True, holdout)):
        for shape in group:
            for dtype in dtypes:
                report.cases.append(
                    check_case(candidate, reference, make_inputs, shape, dtype, holdout=is_holdout, case_index=index, **options)
                )
                index += 1
    return report
