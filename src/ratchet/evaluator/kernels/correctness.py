"""Is the candidate right? `check()` runs it against a float64 reference with every guard on.

The candidate runs in its own process (`ratchet.evaluator.isolate`); this module, the reference
and every comparison run in the trusted evaluator. Each guard closes a hole that kernels
written by people or models have slipped through (see shared/notes/kernel-verification.md):

- fresh seeded random inputs every trial, with a random scale and offset, never zeros;
  odd trials write the new values into the previous trial's buffers, so a result cache
  keyed on input pointer returns a stale answer and fails;
- the reference runs here on float64 copies of the very same inputs; tolerances per
  dtype; a relative error-norm check beside the per-element one; NaN/Inf never pass;
- outputs land in buffers the harness owns, with the exact shape and dtype expected;
  they are poisoned (NaN / sentinel) before every call and must be fully written; they
  are read back the moment the call answers, and must not change afterwards (work left
  running on a thread or stream after the answer fails);
- the candidate runs twice on the same inputs and must give bit-identical outputs;
- inputs are compared with the harness's private copies afterwards;
- a returned value must be a plain, materialised array (no subclass, lazy object, meta
  tensor): the child copies it into the harness's buffer inside the call.

The report says, per shape and dtype, which guard fired and why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from . import arrays
from .runner import CallFailed, Runner, Slot, as_runner, fill, new_slot, sync_all

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


def expected_dtype_of(spec: str | Callable[[str, int], str] | None, dtype: str, ref_out: Any, index: int) -> str:
    """The dtype output `index` must have: integers as the reference's, floats as `dtype`."""
    if not arrays.is_floating(ref_out):
        return arrays.dtype_name(ref_out)
    if spec is None:
        return dtype
    return spec if isinstance(spec, str) else spec(dtype, index)


OutFactory = Callable[[Shape, str, tuple[Any, ...]], Any]


def output_specs(
    refs: tuple[Any, ...],
    inputs: tuple[Any, ...],
    shape: Shape,
    dtype: str,
    expected_dtype: str | Callable[[str, int], str] | None,
    out: OutFactory | None,
) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each output buffer: from the out= factory, else from the reference."""
    if out is not None:
        return [(tuple(b.shape), arrays.dtype_name(b)) for b in arrays.as_tuple(out(shape, dtype, inputs))]
    return [(tuple(r.shape), expected_dtype_of(expected_dtype, dtype, r, i)) for i, r in enumerate(refs)]


def snapshot(slot: Slot) -> tuple[Any, ...]:
    """Private copies of the slot's outputs, taken right after the call answered."""
    outs = tuple(arrays.clone(o) for o in slot.output_views())
    arrays.synchronize(outs)
    return outs


def unwritten_or_bad(outputs: tuple[Any, ...], who: str) -> None:
    """Poison left (not fully written) or NaN/Inf in any output."""
    for i, out in enumerate(outputs):
        if arrays.clean(out):
            continue
        value = arrays.to_numpy64(out)
        unwritten = arrays.count_poisoned(out)
        if unwritten:
            nan = " or NaN" if arrays.is_floating(out) else ""
            raise _Fail(
                f"{who} left {unwritten} of {value.size} elements of output {i} unwritten (still the poison value{nan})"
            )
        if arrays.is_floating(out):
            bad = ~np.isfinite(value)
            if bad.any():
                raise _Fail(f"{who} output {i} has {int(bad.sum())} NaN/Inf values (of {value.size})")


def changed_after_answer(slot: Slot, taken: tuple[Any, ...], who: str) -> None:
    """Outputs that changed after the call answered: it answered before the work was done."""
    for i, (now, then) in enumerate(zip(slot.output_views(), taken, strict=True)):
        if not arrays.equal(now, then):
            raise _Fail(
                f"{who} output {i} changed after the call had answered: work left running "
                "(a background thread or another stream) after the call returned"
            )


def inputs_unchanged(slot: Slot, fresh: tuple[Any, ...], who: str) -> None:
    for j, (now, then) in enumerate(zip(slot.input_views(), fresh, strict=True)):
        if arrays.is_array(now) and not (arrays.equal(now, then) or arrays.same_bits(now, then)):
            changed = int((arrays.to_numpy64(now) != arrays.to_numpy64(then)).sum())
            raise _Fail(f"{who} modified input {j} in place ({changed} elements changed)")


def _sum_of_squares(x: np.ndarray) -> float:
    """sum(x*x) without BLAS and without a temporary (einsum's own loop).

    Not `np.linalg.norm` or `np.dot`: for more than ~10k elements they call OpenBLAS's
    threaded dot, whose worker threads then busy-wait ~0.1 s for more work. On a 2-core
    machine that spinning thread took a core from the multi-threaded baseline timed next,
    and torch's OpenMP barriers then waited for a descheduled thread: torch.softmax 0.05 ->
    2-8 ms per call, the candidate's speedup inflated 40-160x (docs/kernels.md).
    """
    flat = x.reshape(-1)
    return float(np.einsum("i,i->", flat, flat, dtype=np.float64))


def _compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> tuple[list[str], float, float, float]:
    """Per-element |got-want| <= atol + rtol|want| and ||got-want|| / ||want|| <= rtol.

    Three full-size temporaries, reused in place: a large output's check is one of the
    harness's biggest costs on the host (a 512x4096 float64 check took 31 ms with a
    temporary per step, 20 ms so), and the timing check repeats it for sampled calls."""
    if want.size == 0:
        return [], 0.0, 0.0, 0.0
    diff = np.subtract(got, want, dtype=np.float64)
    np.abs(diff, out=diff)
    magnitude = np.abs(want, dtype=np.float64)
    max_abs = float(diff.max())
    norm_want = math.sqrt(_sum_of_squares(want))
    norm_diff = math.sqrt(_sum_of_squares(diff))
    scratch = np.multiply(magnitude, rtol)
    scratch += atol  # the allowed error of each element
    bad = diff > scratch
    n_bad = int(np.count_nonzero(bad))
    worst = int(np.argmax(diff - scratch)) if n_bad else 0
    np.maximum(magnitude, np.finfo(np.float64).tiny, out=magnitude)
    np.divide(diff, magnitude, out=scratch)
    max_rel = float(scratch.max())
    rel_norm = norm_diff / norm_want if norm_want > 0 else norm_diff
    reasons = []
    if n_bad:
        idx = np.unravel_index(worst, diff.shape)
        reasons.append(
            f"{n_bad} of {diff.size} elements outside tolerance (rtol={rtol:g}, atol={atol:g}); "
            f"worst at {tuple(int(i) for i in idx)}: got {got[idx]:.6g}, want {want[idx]:.6g}"
        )
    if rel_norm > max(rtol, 1e-12 if rtol > 0 else 0.0):
        reasons.append(f"relative error norm {rel_norm:.3g} exceeds {rtol:g}")
    return reasons, max_abs, max_rel, rel_norm


def _wide(r: Any) -> Any:
    """The reference in float64 (int64 for integers): on the device for CUDA tensors.

    Large GPU outputs (hundreds of MB) are compared where they live; copying them to the
    host as float64 for every check would take longer than the whole timing.
    """
    if arrays.is_torch(r) and r.is_cuda:
        torch = arrays.loaded_torch()
        return r.detach().to(torch.float64 if r.is_floating_point() else torch.int64)
    return arrays.to_numpy64(r)


def _compare_torch(got: Any, want: Any, rtol: float, atol: float) -> tuple[list[str], float, float, float]:
    """`_compare` for tensors on a device (same rules, only scalars come to the host)."""
    torch = arrays.loaded_torch()
    if want.numel() == 0:
        return [], 0.0, 0.0, 0.0
    diff = (got - want).abs()
    allowed = atol + rtol * want.abs()
    bad = diff > allowed
    max_abs = float(diff.max())
    max_rel = float((diff / want.abs().clamp_min(np.finfo(np.float64).tiny)).max())
    norm_want = float(torch.linalg.vector_norm(want))
    norm_diff = float(torch.linalg.vector_norm(diff))
    rel_norm = norm_diff / norm_want if norm_want > 0 else norm_diff
    reasons = []
    n_bad = int(bad.sum())
    if n_bad:
        flat = int(torch.argmax((diff - allowed).reshape(-1)))
        idx = tuple(int(i) for i in np.unravel_index(flat, tuple(diff.shape)))
        reasons.append(
            f"{n_bad} of {diff.numel()} elements outside tolerance (rtol={rtol:g}, atol={atol:g}); "
            f"worst at {idx}: got {float(got[idx]):.6g}, want {float(want[idx]):.6g}"
        )
    if rel_norm > max(rtol, 1e-12 if rtol > 0 else 0.0):
        reasons.append(f"relative error norm {rel_norm:.3g} exceeds {rtol:g}")
    return reasons, max_abs, max_rel, rel_norm


def fresh_inputs(
    make_inputs: MakeInputs,
    shape: Shape,
    dtype: str,
    rng: np.random.Generator,
    perturb: bool = True,
    scale_range: tuple[float, float] = (1e-2, 16.0),
) -> tuple[Any, ...]:
    """make_inputs(shape, dtype, rng), then a random scale and offset per floating input."""
    inputs = arrays.as_tuple(make_inputs(shape, dtype, rng))
    if perturb:
        lo, hi = np.log(scale_range[0]), np.log(scale_range[1])
        for x in inputs:
            if arrays.is_array(x):
                scale = float(np.exp(rng.uniform(lo, hi)))
                arrays.perturb_(x, scale, float(rng.uniform(-1.0, 1.0)) * scale)
    return inputs


def verify_outputs(
    got: tuple[Any, ...],
    refs64: Sequence[Any],
    rtol: float | None,
    atol: float | None,
    tolerances: Mapping[str, tuple[float, float]] | None,
    result: CaseResult | None = None,
) -> list[str]:
    """Tolerance check of each output against the float64 reference; reasons (empty: ok)."""
    problems = []
    for i, (o, want) in enumerate(zip(got, refs64, strict=True)):
        rt, at = tolerance(arrays.dtype_name(o), tolerances)
        rt = rt if rtol is None else rtol
        at = at if atol is None else atol
        if arrays.is_torch(want):  # a CUDA reference: compare on the device, not on the host
            reasons, max_abs, max_rel, rel_norm = _compare_torch(o.detach().to(want.dtype), want, rt, at)
        else:
            reasons, max_abs, max_rel, rel_norm = _compare(arrays.to_numpy64(o), want, rt, at)
        if result is not None:
            result.max_abs_err = max(result.max_abs_err, max_abs)
            result.max_rel_err = max(result.max_rel_err, max_rel)
            result.rel_norm_err = max(result.rel_norm_err, rel_norm)
        if reasons:
            problems.append((f"output {i}: " if len(got) > 1 else "") + "; ".join(reasons))
    return problems


def reference_outputs(reference: Callable[..., Any], fresh: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[Any]]:
    """The reference on float64 copies: (raw outputs, float64 copies: numpy, or on the device)."""
    try:
        refs = arrays.as_tuple(reference(*(arrays.upcast(x) for x in fresh)))
    except Exception as exc:
        raise _Fail(f"reference raised {type(exc).__name__}: {exc} (harness or make_inputs problem)") from exc
    ref64 = [_wide(r) for r in refs]
    if any(not arrays.clean(r) for r in ref64 if arrays.is_floating(r)):
        raise _Fail("reference produced NaN/Inf for these inputs (make_inputs/scale_range problem)")
    return refs, ref64


def check_case(
    candidate: Any,
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
    out: OutFactory | None = None,
    perturb: bool = True,
    scale_range: tuple[float, float] = (1e-2, 16.0),
    expected_dtype: str | Callable[[str, int], str] | None = None,
    exact_repeat: bool = True,
    allow_inplace: bool = False,
    holdout: bool = False,
    case_index: int = 0,
) -> CaseResult:
    """All trials of one (shape, dtype); stops at the first trial a guard fails.

    `candidate`: a `RemoteFunction` (runs in its candidate process), a Runner, or a
    trusted callable (runs here, unprotected: for baselines and tests).
    """
    runner = as_runner(candidate)
    mode = "out" if out is not None else "return"
    result = CaseResult(shape=dict(shape), dtype=dtype, ok=True, reasons=[], trials=0, holdout=holdout)
    slot: Slot | None = None
    slots: list[Slot] = []
    previous: list[Any] | None = None
    try:
        for trial in range(trials):
            rng = np.random.default_rng([seed, case_index, trial])
            try:
                fresh = fresh_inputs(make_inputs, shape, dtype, rng, perturb, scale_range)
                refs, ref64 = reference_outputs(reference, fresh)
                if slot is None or trial % 2 == 0:  # odd trials: same buffers, new values
                    slot = new_slot(runner, fresh, output_specs(refs, fresh, shape, dtype, expected_dtype, out))
                    slots.append(slot)
                first = _run_once(runner, slot, fresh, mode, allow_inplace, "candidate")
                second = _run_once(runner, slot, fresh, mode, allow_inplace, "candidate (second run)")
                for i, (a, b) in enumerate(zip(first, second, strict=True)):
                    if exact_repeat and not (arrays.equal(a, b) or arrays.same_bits(a, b)):
                        diff = float(np.abs(arrays.to_numpy64(a) - arrays.to_numpy64(b)).max())
                        raise _Fail(
                            f"two runs on the same inputs disagree in output {i} (max diff {diff:.3g}): "
                            "non-deterministic or reading stale memory"
                        )
                if not exact_repeat:
                    reasons = verify_outputs(first, ref64, rtol, atol, tolerances, result)
                    if reasons:
                        raise _Fail("first run: " + "; ".join(reasons))
                reasons = verify_outputs(second, ref64, rtol, atol, tolerances, result)
                if reasons:
                    if previous is not None and all(arrays.equal(p, g) for p, g in zip(previous, second, strict=False)):
                        reasons.append(
                            "output is identical to the previous trial's output: a stale result "
                            "(cached by input pointer/id, or work skipped)"
                        )
                    raise _Fail("; ".join(reasons))
                previous = list(second)
            except _Fail as fail:
                result.ok = False
                result.reasons.append(f"trial {trial}: {fail}")
                result.trials = trial + 1
                break
            result.trials = trial + 1
    finally:
        runner.release(slots)
    return result


def _run_once(runner: Runner, slot: Slot, fresh: tuple[Any, ...], mode: str, allow_inplace: bool, who: str) -> tuple[Any, ...]:
    """Fill, poison, one call, read back; the guards of a single call."""
    fill(slot, fresh)
    sync_all([slot])
    try:
        runner.run([slot], mode)
    except CallFailed as exc:
        raise _Fail(f"{who} failed: {exc}") from exc
    with runner.frozen():  # a thread the call left running cannot finish the work now
        taken = snapshot(slot)
    unwritten_or_bad(taken, who)
    if not allow_inplace:
        inputs_unchanged(slot, fresh, who)
    changed_after_answer(slot, taken, who)
    return taken


def check(
    candidate: Any,
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
    holdout: Iterable[Shape] = (),
) -> CheckReport:
    """Check `candidate` against `reference` on every shape x dtype (then hold-out shapes).

    make_inputs(shape, dtype, rng) returns the inputs (one array or a tuple); draw them
    from `rng` so trials differ. The harness then scales and offsets floating inputs at
    random (perturb=False to opt out, e.g. for probabilities). The reference gets float64
    copies. With `out=factory(shape, dtype, inputs)` the candidate is called as
    candidate(*inputs, out=buffer) and must fill the (poisoned) buffer; otherwise it
    returns its output(s), which are copied into the harness's buffers. `candidate` is a
    `RemoteFunction` from a `ratchet.evaluator.isolate.CandidateProcess` (or a trusted callable). `rtol`/`atol` override every dtype, `tolerances` some dtypes.
    """
    report = CheckReport()
    options: dict[str, Any] = dict(
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
