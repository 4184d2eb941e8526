"""check(): every guard fires on its cheat with a clear reason; honest kernels pass."""

from __future__ import annotations

import json

import kernel_cases as kc
import numpy as np
import pytest

from ratchet.kernels import check, tolerance
from ratchet.kernels.correctness import _compare


def run(candidate, **kw):
    kw.setdefault("dtypes", ("float32",))
    return check(candidate, kc.reference, kc.make_inputs, kc.PUBLIC, **kw)


def only_reason(report) -> str:
    assert not report.ok
    return " | ".join(report.reasons())


def test_honest_kernel_passes_every_shape_and_dtype():
    report = run(kc.honest, dtypes=("float32", "float64", "float16"))
    assert report.ok, report.summary()
    assert len(report.cases) == 6
    assert all(c.trials == 4 for c in report.cases)
    assert report.summary() == "correctness: 6/6 cases ok"
    assert max(c.max_rel_err for c in report.cases if c.dtype == "float64") < 1e-10


def test_report_is_json_serialisable_with_reasons_per_case():
    report = run(kc.half_precision)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False
    assert data["cases"][0]["shape"] == {"rows": 8, "cols": 100}
    assert data["cases"][0]["reasons"]
    assert data["summary"].startswith("correctness: 0/2 cases ok; FAIL cols=100,rows=8 float32")


def test_stale_output_same_buffer_is_caught():
    reason = only_reason(run(kc.StaleSameBuffer()))
    assert "buffer it returned on an earlier call" in reason


def test_stale_output_copy_is_caught_as_identical_to_previous_trial():
    reason = only_reason(run(kc.StaleCopy()))
    assert "outside tolerance" in reason
    assert "identical to the previous trial's output" in reason


@pytest.mark.parametrize("cheat", [kc.CacheByPointer, kc.CacheById])
def test_cache_keyed_on_input_pointer_or_id_is_caught(cheat):
    report = run(cheat())
    reason = only_reason(report)
    # trial 0 is honest; trial 1 writes new values into the same buffers
    assert report.cases[0].trials == 2
    assert "trial 1" in reason and "stale result" in reason


def test_special_casing_public_shapes_is_caught_by_holdout_shapes():
    public_only = run(kc.special_cases_public)
    assert public_only.ok  # the cheat works on what the proposer can see...
    with_holdout = run(kc.special_cases_public, holdout=kc.HOLDOUT)
    assert not with_holdout.ok  # ...and fails on shapes it never saw
    failure = with_holdout.failures[0]
    assert failure.holdout and failure.shape == kc.HOLDOUT[0]
    assert "(hold-out)" in with_holdout.summary()


def test_input_mutation_is_caught():
    assert "modified input 0 in place" in only_reason(run(kc.mutates_input))


def test_output_aliasing_input_is_caught():
    # a view of the input: nothing modified, but the "output" is the input's memory
    assert "output 0 shares memory with input 0" in only_reason(run(lambda x: x.reshape(x.shape)))
    # the in-place kernel that returns its input is caught by the mutation guard first
    assert "modified input 0 in place" in only_reason(run(kc.returns_input))


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
@pytest.mark.parametrize(
    ("cheat", "words"),
    [
        (kc.lazy_generator, "lazy iterator"),
        (kc.matrix_subclass, "ndarray subclass"),
        (kc.broadcast_view, "zero stride"),
    ],
)
def test_lazy_or_subclass_results_are_rejected(cheat, words):
    assert words in only_reason(run(cheat))


def test_memmap_result_is_rejected(tmp_path):
    def memmap_result(x):
        m = np.memmap(tmp_path / "out.bin", dtype=x.dtype, mode="w+", shape=x.shape)
        m[:] = kc.honest(x)
        return m

    assert "memmap" in only_reason(run(memmap_result))


def test_silent_lower_precision_fails_tolerance():
    reason = only_reason(run(kc.half_precision))
    assert "outside tolerance (rtol=0.0001" in reason


def test_nondeterminism_is_caught():
    assert "two runs on the same inputs disagree" in only_reason(run(kc.nondeterministic))


def test_wrong_dtype_and_shape_are_caught():
    assert "dtype float64, expected float32" in only_reason(run(kc.wrong_dtype))
    assert "has shape (" in only_reason(run(lambda x: kc.honest(x)[:, :-1]))


def test_nan_output_is_caught():
    def with_nan(x):
        out = kc.honest(x)
        out[-1, -1] = np.nan
        return out

    assert "NaN/Inf" in only_reason(run(with_nan))


def test_background_thread_is_reported():
    assert "background thread(s) running (cheat-worker)" in only_reason(run(kc.background_thread))


def test_exception_is_a_finding_not_a_crash():
    def boom(x):
        raise RuntimeError("kernel launch failed")

    assert "candidate raised RuntimeError: kernel launch failed" in only_reason(run(boom))


def out_factory(shape, dtype, inputs):
    return np.empty_like(inputs[0])


def test_out_buffer_honest_passes():
    assert run(kc.honest_out, out=out_factory).ok


def test_out_buffer_poisoned_and_checked_fully_written():
    reason = only_reason(run(kc.writes_half, out=out_factory))
    assert "unwritten (still the poison value)" in reason


def test_out_buffer_ignored_is_caught():
    assert "instead of filling the out= buffer" in only_reason(run(kc.ignores_out, out=out_factory))


def test_inputs_are_fresh_scaled_and_reused_in_place():
    seen = []

    def spy(x):
        seen.append((x.ctypes.data, x.copy()))
        return kc.honest(x)

    assert run(spy, trials=4).ok
    calls = seen[:8]  # first shape: 4 trials x (first run, second run)
    values = [v for _, v in calls[::2]]
    assert all(np.count_nonzero(v) == v.size for v in values)  # never zeros
    spreads = [float(v.std()) for v in values]
    assert len({round(s, 6) for s in spreads}) == 4  # a random scale per trial
    assert all(not np.array_equal(values[i], values[i + 1]) for i in range(3))  # new values
    assert calls[2][0] == calls[0][0]  # trial 1 reuses trial 0's buffer (same pointer)...
    assert calls[6][0] == calls[4][0]  # ...and trial 3 reuses trial 2's


def test_relative_norm_check_catches_tiny_outputs_hidden_by_atol():
    want = np.full(100, 1e-7)
    reasons, *_ = _compare(np.zeros(100), want, rtol=1e-4, atol=1e-5)
    assert any("relative error norm" in r for r in reasons)


def test_tolerances_per_dtype_and_overrides():
    assert tolerance("float16") == (1e-2, 1e-3)
    assert tolerance("int32") == (0.0, 0.0)
    assert tolerance("float32", {"float32": (1e-2, 1e-2)}) == (1e-2, 1e-2)
    # a global override lets the half-precision kernel pass; the default does not
    assert run(kc.half_precision, rtol=2e-2, atol=1e-3).ok
