"""check(): every guard fires on its cheat with a clear reason; honest kernels pass.

The candidates run in a real candidate process (kernel_cases.py loaded there), exactly as
an evaluator runs them; the reference and the checks run here.
"""

from __future__ import annotations

import json

import kernel_cases as kc
import numpy as np
import pytest

from ratchet.evaluator.kernels import CandidateProcess, check, tolerance
from ratchet.evaluator.kernels.correctness import _compare


@pytest.fixture(scope="module")
def cand():
    with CandidateProcess(kc.__file__, timeout=60) as proc:
        yield proc


def run(cand, name, **kw):
    kw.setdefault("dtypes", ("float32",))
    return check(cand.function(name), kc.reference, kc.make_inputs, kc.PUBLIC, **kw)


def only_reason(report) -> str:
    assert not report.ok
    return " | ".join(report.reasons())


def out_factory(shape, dtype, inputs):
    return np.empty_like(inputs[0])


def test_honest_kernel_passes_every_shape_and_dtype(cand):
    report = run(cand, "honest", dtypes=("float32", "float64", "float16"))
    assert report.ok, report.summary()
    assert len(report.cases) == 6
    assert all(c.trials == 4 for c in report.cases)
    assert report.summary() == "correctness: 6/6 cases ok"
    assert max(c.max_rel_err for c in report.cases if c.dtype == "float64") < 1e-10


def test_report_is_json_serialisable_with_reasons_per_case(cand):
    report = run(cand, "half_precision")
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False
    assert data["cases"][0]["shape"] == {"rows": 8, "cols": 100}
    assert data["cases"][0]["reasons"]
    assert data["summary"].startswith("correctness: 0/2 cases ok; FAIL cols=100,rows=8 float32")


@pytest.mark.parametrize("name", ["stale_same_buffer", "stale_copy"])
def test_stale_output_is_caught_as_identical_to_previous_trial(cand, name):
    reason = only_reason(run(cand, name))
    assert "outside tolerance" in reason
    assert "identical to the previous trial's output" in reason


@pytest.mark.parametrize("name", ["cache_by_pointer", "cache_by_id"])
def test_cache_keyed_on_input_pointer_or_id_is_caught(cand, name):
    report = run(cand, name)
    reason = only_reason(report)
    # trial 0 is honest; trial 1 writes new values into the same buffers
    assert report.cases[0].trials == 2
    assert "trial 1" in reason and "stale result" in reason


def test_special_casing_public_shapes_is_caught_by_holdout_shapes(cand):
    public_only = run(cand, "special_cases_public")
    assert public_only.ok  # the cheat works on what the proposer can see...
    with_holdout = run(cand, "special_cases_public", holdout=kc.HOLDOUT)
    assert not with_holdout.ok  # ...and fails on shapes it never saw
    failure = with_holdout.failures[0]
    assert failure.holdout and failure.shape == kc.HOLDOUT[0]
    assert "(hold-out)" in with_holdout.summary()


@pytest.mark.parametrize("name", ["mutates_input", "returns_input"])
def test_input_mutation_is_caught(cand, name):
    assert "modified input 0 in place" in only_reason(run(cand, name))


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("lazy_generator", "returned a builtins.generator, not a plain numpy array"),
        ("matrix_subclass", "returned a numpy.matrix, not a plain numpy array"),
        ("memmap_result", "returned a numpy.memmap, not a plain numpy array"),
    ],
)
def test_lazy_or_subclass_results_are_rejected(cand, name, words):
    assert words in only_reason(run(cand, name))


def test_a_broadcast_view_is_copied_and_judged_by_its_values(cand):
    assert "outside tolerance" in only_reason(run(cand, "broadcast_view"))


def test_silent_lower_precision_fails_tolerance(cand):
    assert "outside tolerance (rtol=0.0001" in only_reason(run(cand, "half_precision"))


def test_nondeterminism_is_caught(cand):
    assert "two runs on the same inputs disagree" in only_reason(run(cand, "nondeterministic"))


def test_wrong_dtype_and_shape_are_caught(cand):
    assert "float64, expected (8, 100) float32" in only_reason(run(cand, "wrong_dtype"))
    assert "returned shape (8, 99)" in only_reason(run(cand, "truncated"))


def test_nan_output_is_caught(cand):
    # NaN is the poison: a NaN result reads as an unwritten element
    assert "1 of 800 elements of output 0 unwritten (still the poison value or NaN)" in only_reason(run(cand, "with_nan"))


def test_answering_before_the_work_is_done_is_caught(cand):
    """A thread finishing the output after the call returned: poison left, or late writes."""
    reason = only_reason(run(cand, "early_return", out=out_factory))
    assert "unwritten (still the poison value" in reason or "changed after the call had answered" in reason
    assert "outside tolerance" in only_reason(run(cand, "early_return_alloc"))


def test_exception_is_a_finding_not_a_crash(cand):
    assert "raised RuntimeError: kernel launch failed" in only_reason(run(cand, "boom"))
    assert run(cand, "honest").ok  # the candidate process carries on


def test_out_buffer_honest_passes(cand):
    assert run(cand, "honest_out", out=out_factory).ok


def test_out_buffer_poisoned_and_checked_fully_written(cand):
    assert "unwritten (still the poison value" in only_reason(run(cand, "writes_half", out=out_factory))


def test_out_buffer_ignored_is_caught(cand):
    assert "instead of filling the out= buffer" in only_reason(run(cand, "ignores_out", out=out_factory))


def test_inputs_are_fresh_scaled_and_reused_in_place(tmp_path):
    with CandidateProcess(kc.__file__) as proc:
        assert run(proc, "spy", trials=4).ok
        calls = proc.call("seen")  # first shape: 4 trials x (first run, second run)
    firsts = calls[::2]
    assert all(nonzero for _, nonzero, _, _ in firsts)  # never zeros
    assert len({round(std, 6) for _, _, std, _ in firsts}) == 4  # a random scale per trial
    assert len({round(total, 3) for _, _, _, total in firsts}) == 4  # new values every trial
    assert calls[2][0] == calls[0][0]  # trial 1 reuses trial 0's buffer (same pointer)...
    assert calls[6][0] == calls[4][0]  # ...and trial 3 reuses trial 2's


def test_trusted_callables_still_work_in_process():
    """Baselines and references are plain callables run here: check() accepts them too."""
    assert check(kc.honest, kc.reference, kc.make_inputs, kc.PUBLIC).ok
    assert not check(kc.half_precision, kc.reference, kc.make_inputs, kc.PUBLIC).ok


def test_relative_norm_check_catches_tiny_outputs_hidden_by_atol():
    want = np.full(100, 1e-7)
    reasons, *_ = _compare(np.zeros(100), want, rtol=1e-4, atol=1e-5)
    assert any("relative error norm" in r for r in reasons)


def test_tolerances_per_dtype_and_overrides(cand):
    assert tolerance("float16") == (1e-2, 1e-3)
    assert tolerance("int32") == (0.0, 0.0)
    assert tolerance("float32", {"float32": (1e-2, 1e-2)}) == (1e-2, 1e-2)
    # a global override lets the half-precision kernel pass; the default does not
    assert run(cand, "half_precision", rtol=2e-2, atol=1e-3).ok
