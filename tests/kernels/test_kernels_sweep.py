"""sweep(): per-shape check + interleaved timing + roofline floor; hold-out shapes; metric lines."""

from __future__ import annotations

import json
import textwrap

import kernel_cases as kc
import numpy as np
import pytest

from ratchet.evaluator.kernels import (
    CandidateProcess,
    Peaks,
    PerShape,
    emit,
    holdout_requested,
    load_holdout,
    measure_peaks,
    results_from_sweeps,
    sweep,
)
from ratchet.evaluator.kernels.dispatch import build_dispatch_table

QUICK = {"max_time_s": 0.15, "min_reps": 3, "warmup": 1}
# Shapes where a Python loop over rows loses by several times, so the verdicts below hold
# on a loaded machine too (at 8 rows the per-call round trip's jitter can decide).
MANY_ROWS = [{"rows": 1024, "cols": 16}, {"rows": 2048, "cols": 32}]
BYTES = "2 * rows * cols * itemsize"  # read x, write y
FLOPS = "5 * rows * cols"


@pytest.fixture(scope="module")
def cand():
    with CandidateProcess(kc.__file__, timeout=60) as proc:
        yield proc


@pytest.fixture(scope="module")
def peaks(tmp_path_factory):
    cache = tmp_path_factory.mktemp("peaks") / "peaks.json"
    return measure_peaks(copy_bytes=16 << 20, matmul_n=256, reps=2, cache_path=cache)


def test_holdout_shapes_load_only_when_requested(tmp_path):
    path = tmp_path / "holdout.json"
    path.write_text(json.dumps({"shapes": kc.HOLDOUT}))
    assert not holdout_requested([], {})
    assert load_holdout(path, argv=[], env={}) == []
    assert load_holdout(path, argv=["--holdout"], env={}) == kc.HOLDOUT
    assert load_holdout(str(path), argv=[], env={"RATCHET_HOLDOUT": "1"}) == kc.HOLDOUT
    assert load_holdout(tmp_path / "missing.json", argv=[], env={}) == []  # never even opened
    assert load_holdout(path, argv=[], env={"RATCHET_HOLDOUT": "0"}) == []


def test_holdout_file_in_the_hidden_ratchet_holdout_dir_wins(tmp_path):
    visible = tmp_path / "holdout.json"
    visible.write_text(json.dumps([{"rows": 1, "cols": 1}]))
    hidden = tmp_path / "state" / "holdout"
    hidden.mkdir(parents=True)
    (hidden / "holdout.json").write_text(json.dumps({"shapes": kc.HOLDOUT}))
    # the worker sets RATCHET_HOLDOUT to the hidden directory for the hold-out phase only
    assert load_holdout(visible, argv=[], env={"RATCHET_HOLDOUT": str(hidden)}) == kc.HOLDOUT
    assert load_holdout(visible, argv=["--holdout"], env={}) == [{"rows": 1, "cols": 1}]


def test_honest_faster_kernel_passes_with_a_speedup(peaks, cand):
    holdout = load_holdout(kc.HOLDOUT, argv=["--holdout"], env={})
    report = sweep(
        cand.function("honest"), kc.slow_baseline, kc.reference, kc.make_inputs, MANY_ROWS,
        holdout=holdout, flops=FLOPS, bytes=BYTES, peaks=peaks, bench_options=QUICK,
    )
    assert report.correct, report.table()
    m = report.metrics()
    assert m["correct"] is True and m["shapes"] == 3 and m["shapes_failed"] == 0
    assert m["speedup"] > 1.2  # a vectorised kernel vs a Python loop over rows; generous
    assert m["holdout_speedup"] > 0 and m["public_speedup"] > 0
    assert m["speedup_sem"] > 0 and m["time_ms_sem"] > 0 and isinstance(m["timing_precise"], bool)
    assert "reason" not in m
    for r in report.results:
        assert r.roofline and 0 < r.roofline["pct_of_bound"] <= 200 and r.roofline["bound"] in ("memory", "compute", "overhead")
        assert r.verified_calls and r.calls_per_request
    assert "holdout" in report.table()


def test_special_cased_public_shapes_fail_on_holdout(cand):
    holdout = load_holdout(kc.HOLDOUT, argv=[], env={"RATCHET_HOLDOUT": "1"})
    report = sweep(cand.function("special_cases_public"), kc.slow_baseline, kc.reference, kc.make_inputs, kc.PUBLIC, holdout=holdout, bench_options=QUICK)
    assert not report.correct
    [failure] = report.failures
    assert failure.holdout and "outside tolerance" in failure.reasons[0]
    m = report.metrics()
    assert m["correct"] is False and m["speedup"] == 0.0 and m["public_speedup"] > 0 and m["holdout_speedup"] == 0.0
    assert m["reason"].startswith("cols=777,rows=33 float32 (hold-out): trial 0:")


def test_caching_once_timed_is_caught_by_verifying_timed_calls(cand):
    """Honest during the check, then a cached array: the verified timed calls catch it."""
    report = sweep(cand.function("fast_when_timed"), kc.honest, kc.reference, kc.make_inputs, [{"rows": 64, "cols": 512}], bench_options=QUICK)
    [r] = report.results
    assert r.check["ok"]  # the check could not tell...
    assert not r.correct and "a timed call's output is wrong" in " ".join(r.reasons)  # ...the timed calls could


def test_time_beyond_the_physical_floor_is_rejected(cand):
    slow_device = Peaks(device="cpu: a device slower than this one", bandwidth_Bps=1e6, flops={"float32": 1e9}, overhead_s=1e-7)
    report = sweep(cand.function("honest"), kc.honest, kc.reference, kc.make_inputs, kc.PUBLIC[:1], flops=FLOPS, bytes=BYTES, peaks=slow_device, bench_options=QUICK)
    [r] = report.results
    assert not r.correct and r.roofline["impossible"]
    assert "of the memory roofline" in report.metrics()["reason"] and "impossible" in report.metrics()["reason"]


def test_a_model_built_per_shape(tmp_path):
    """sweep builds the candidate (in its process) and the baseline per shape."""
    (tmp_path / "model.py").write_text(textwrap.dedent('''
        import numpy as np
        class Scale:
            def __init__(self, cols):
                self.w = np.linspace(0.5, 1.5, cols).astype(np.float32)
            def __call__(self, x):
                return x * self.w
    '''))

    def reference(x):
        return x * np.linspace(0.5, 1.5, x.shape[1])

    with CandidateProcess(tmp_path / "model.py") as proc:
        report = sweep(
            PerShape(lambda shape, dtype: proc.construct("Scale", shape["cols"])),
            PerShape(lambda shape, dtype: (lambda x, w=np.linspace(0.5, 1.5, shape["cols"]).astype(np.float32): x * w)),
            reference, kc.make_inputs, kc.PUBLIC, bench_options=QUICK,
        )
    assert report.correct, report.table()


def test_a_reference_built_per_shape(tmp_path):
    """One sweep, a reference model built for each shape's sizes (its weights depend on
    cols): right per shape, and a reference built for the wrong shape fails the kernel."""
    (tmp_path / "model.py").write_text(textwrap.dedent('''
        import numpy as np
        def scale(x):
            return x * np.linspace(0.5, 1.5, x.shape[1]).astype(np.float32)
    '''))
    built = []

    def reference_for(shape, dtype, top=1.5):
        built.append((shape["cols"], dtype))
        w = np.linspace(0.5, top, shape["cols"])
        return lambda x: x * w

    with CandidateProcess(tmp_path / "model.py") as proc:
        fn = proc.function("scale")
        report = sweep(fn, PerShape(lambda s, d: fn), PerShape(reference_for), kc.make_inputs, kc.PUBLIC, bench_options=QUICK)
        assert report.correct, report.table()
        assert sorted(built) == sorted((s["cols"], "float32") for s in kc.PUBLIC)
        wrong = sweep(fn, PerShape(lambda s, d: fn), PerShape(lambda s, d: reference_for(s, d, top=1.6)),
                      kc.make_inputs, kc.PUBLIC[:1], bench_options=QUICK)
    assert not wrong.correct and "outside tolerance" in wrong.reason, wrong.table()


def test_emit_reports_through_the_channel_and_prints_metric_lines(capsys):
    metrics = {"correct": True, "time_ms": 1.5, "speedup": 2.0, "note": "x", "graph_speedup": None}
    printed = emit(metrics, extra={"shapes": 3})
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["correct: true", "speedup: 2.0", "time_ms: 1.5"]
    assert "note: x" in lines and "shapes: 3" in lines
    assert "graph_speedup" not in printed  # None values are left out


def test_emit_failure_reports_correct_false_and_the_reason(capsys):
    emit({"correct": False, "reason": "cols=8 float32: trial 0: 3 elements outside tolerance"})
    assert capsys.readouterr().out.splitlines() == ["correct: false", "reason: cols=8 float32: trial 0: 3 elements outside tolerance"]


def test_import_of_the_sweep_module_gives_the_module():
    import ratchet.evaluator.kernels as rk
    import ratchet.evaluator.kernels.sweep as sweep_module

    assert sweep_module.SweepReport is rk.SweepReport and callable(sweep_module.sweep)
    assert callable(rk.sweep)  # rk.sweep(...) still runs a sweep


def test_dispatch_from_sweeps_falls_back_where_the_candidate_fails(cand):
    extra = {"rows": 8, "cols": 3000}  # its own bucket, where the special-casing kernel is wrong
    ok = sweep(cand.function("honest"), kc.slow_baseline, kc.reference, kc.make_inputs, [*kc.PUBLIC, MANY_ROWS[1]], bench_options=QUICK, names=("loop", "honest"))
    bad = sweep(cand.function("special_cases_public"), kc.slow_baseline, kc.reference, kc.make_inputs, [*kc.PUBLIC, extra], bench_options=QUICK, names=("loop", "special"))
    table = build_dispatch_table(results_from_sweeps({"honest": ok, "special": bad}), baseline="loop", dims=["cols", "rows"], device="cpu-test")
    buckets = table["buckets"]
    assert set(buckets) == {"cols=128,rows=8 float32", "cols=1024,rows=64 float32", "cols=4096,rows=8 float32", "cols=32,rows=2048 float32"}
    wrong = buckets["cols=4096,rows=8 float32"]
    assert wrong["impl"] == "loop" and wrong["candidates"]["special"]["ok"] is False
    # 2048 short rows: a Python loop over rows loses by an order of magnitude (fewer rows
    # are too close to call on a busy machine)
    assert buckets["cols=32,rows=2048 float32"]["impl"] == "honest"
    for key in ("cols=128,rows=8 float32", "cols=1024,rows=64 float32"):
        assert buckets[key]["candidates"]["loop"]["ok"] and buckets[key]["candidates"]["honest"]["ok"]


FIVE = [{"rows": 256 + 128 * i, "cols": 16} for i in range(5)]


@pytest.mark.timing  # timings: under load the early stop needs more shapes
def test_a_candidate_clearly_slower_than_the_incumbent_stops_after_a_few_shapes(cand, monkeypatch):
    # the candidate is the baseline itself (speedup ~1); the incumbent ran 20x faster on
    # every shape: the driver passes its per-shape speedups in $RATCHET_INCUMBENT_EXTRA
    fast = {f"shape_speedup_{i}": 20.0 for i in range(5)}
    monkeypatch.setenv("RATCHET_INCUMBENT_EXTRA", json.dumps(fast))
    report = sweep(cand.function("slow_baseline"), kc.slow_baseline, kc.reference,
                   kc.make_inputs, FIVE, bench_options=QUICK)
    # stopped after 3 shapes (the fewest the test needs) or 4: before the end
    assert report.stopped_after in (3, 4) and len(report.results) == report.stopped_after
    m = report.metrics()
    assert m["stopped_early"] == 1 and m["stopped_after_shapes"] == report.stopped_after
    lines = "\n".join(f"{k}: {v}" for k, v in emit(report, echo=False).items())
    assert "stopped_early: 1" in lines
    # an incumbent no faster than the candidate: the whole sweep runs, and the report
    # carries the per-shape speedups a later candidate is compared with
    slow = {f"shape_speedup_{i}": 0.05 for i in range(5)}
    monkeypatch.setenv("RATCHET_INCUMBENT_EXTRA", json.dumps(slow))
    full = sweep(cand.function("slow_baseline"), kc.slow_baseline, kc.reference,
                 kc.make_inputs, FIVE, bench_options=QUICK)
    assert full.stopped_after is None and len(full.results) == 5
    assert "stopped_early" not in full.metrics()
    assert sorted(k for k in full.metrics() if k.startswith("shape_speedup_")) == [
        f"shape_speedup_{i}" for i in range(5)]
    # no incumbent (the baseline's own run, a confirmation re-measure): never stopped
    monkeypatch.delenv("RATCHET_INCUMBENT_EXTRA")
    assert len(sweep(cand.function("slow_baseline"), kc.slow_baseline, kc.reference,
                     kc.make_inputs, FIVE[:3], bench_options=QUICK).results) == 3
    monkeypatch.setenv("RATCHET_INCUMBENT_EXTRA", json.dumps(fast))
    assert len(sweep(cand.function("slow_baseline"), kc.slow_baseline, kc.reference,
                     kc.make_inputs, FIVE, bench_options=QUICK, early_stop=False).results) == 5
