"""sweep(): per-shape check + interleaved timing + roofline floor; hold-out shapes; metric lines."""

from __future__ import annotations

import io
import json

import kernel_cases as kc
import pytest

from ratchet.kernels import (
    emit,
    holdout_requested,
    load_holdout,
    measure_peaks,
    results_from_sweeps,
    sweep,
)
from ratchet.kernels.dispatch import build_dispatch_table

QUICK = {"max_time_s": 0.15, "min_reps": 3, "warmup": 1}
BYTES = "2 * rows * cols * itemsize"  # read x, write y
FLOPS = "5 * rows * cols"


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


def test_honest_faster_kernel_passes_with_a_speedup(peaks):
    holdout = load_holdout(kc.HOLDOUT, argv=["--holdout"], env={})
    report = sweep(
        kc.honest, kc.slow_baseline, kc.reference, kc.make_inputs, kc.PUBLIC,
        holdout=holdout, flops=FLOPS, bytes=BYTES, peaks=peaks, bench_options=QUICK,
    )
    assert report.correct, report.table()
    m = report.metrics()
    assert m["correct"] is True and m["shapes"] == 3 and m["shapes_failed"] == 0
    assert m["speedup"] > 1.2  # a vectorised kernel vs a Python loop over rows; generous
    assert m["holdout_speedup"] > 0 and m["public_speedup"] > 0
    for r in report.results:
        assert r.roofline and 0 < r.roofline["pct_of_bound"] <= 200 and r.roofline["bound"] in ("memory", "compute", "overhead")
    assert "holdout" in report.table()


def test_special_cased_public_shapes_fail_on_holdout(peaks):
    holdout = load_holdout(kc.HOLDOUT, argv=[], env={"RATCHET_HOLDOUT": "1"})
    report = sweep(kc.special_cases_public, kc.slow_baseline, kc.reference, kc.make_inputs, kc.PUBLIC, holdout=holdout, bench_options=QUICK)
    assert not report.correct
    [failure] = report.failures
    assert failure.holdout and "outside tolerance" in failure.reasons[0]
    m = report.metrics()
    assert m["correct"] is False and m["speedup"] == 0.0 and m["public_speedup"] > 0 and m["holdout_speedup"] == 0.0


def test_time_below_the_floor_is_rejected(peaks):
    # honest during the correctness check, then returns a cached array when timed
    cheat = kc.FastWhenTimed(honest_calls=8)
    shapes = [{"rows": 512, "cols": 4096}]
    report = sweep(cheat, kc.honest, kc.reference, kc.make_inputs, shapes, flops=FLOPS, bytes=BYTES, peaks=peaks, bench_options=QUICK)
    [r] = report.results
    assert r.check["ok"]  # the untimed check could not tell...
    assert not r.correct  # ...the physics floor could
    assert r.roofline["impossible"] and "below the physical floor" in " ".join(r.reasons)
    assert any("implausible" in w for w in r.warnings)
    assert report.metrics()["correct"] is False


def test_emit_prints_metric_lines_and_writes_result_json(tmp_path, monkeypatch):
    report = sweep(kc.honest, kc.slow_baseline, kc.reference, kc.make_inputs, kc.PUBLIC[:1], bench_options=QUICK)
    monkeypatch.setenv("RATCHET_RESULT", str(tmp_path / "result.json"))
    buf = io.StringIO()
    printed = emit(report, stream=buf, extra={"note": "x"})
    lines = buf.getvalue().splitlines()
    assert lines[0] == "correct: true"
    assert lines[1].startswith("speedup: ") and float(lines[1].split(": ")[1]) == pytest.approx(printed["speedup"], rel=1e-5)
    assert lines[2].startswith("time_ms: ")
    assert "note: x" in lines
    data = json.loads((tmp_path / "result.json").read_text())
    assert data["metrics"]["correct"] is True
    assert data["report"]["results"][0]["shape"] == kc.PUBLIC[0]


def test_emit_failure_prints_correct_false_and_inf_time():
    buf = io.StringIO()
    emit({"correct": False, "speedup": 0.0, "time_ms": float("inf")}, stream=buf, result_path=None)
    assert buf.getvalue().splitlines() == ["correct: false", "speedup: 0", "time_ms: inf"]


def test_dispatch_from_sweeps_falls_back_where_the_candidate_fails():
    extra = {"rows": 8, "cols": 3000}  # its own bucket, where the special-casing kernel is wrong
    ok = sweep(kc.honest, kc.slow_baseline, kc.reference, kc.make_inputs, kc.PUBLIC, bench_options=QUICK, names=("loop", "honest"))
    bad = sweep(kc.special_cases_public, kc.slow_baseline, kc.reference, kc.make_inputs, [*kc.PUBLIC, extra], bench_options=QUICK, names=("loop", "special"))
    table = build_dispatch_table(results_from_sweeps({"honest": ok, "special": bad}), baseline="loop", dims=["cols", "rows"], device="cpu-test")
    buckets = table["buckets"]
    assert set(buckets) == {"cols=128,rows=8 float32", "cols=1024,rows=64 float32", "cols=4096,rows=8 float32"}
    wrong = buckets["cols=4096,rows=8 float32"]
    assert wrong["impl"] == "loop" and wrong["candidates"]["special"]["ok"] is False
    for key in ("cols=128,rows=8 float32", "cols=1024,rows=64 float32"):
        assert buckets[key]["impl"] in ("honest", "special")  # both beat a Python loop over rows
        assert buckets[key]["candidates"]["loop"]["ok"]
