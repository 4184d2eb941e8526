"""bench()/compare(): statistics are sane, cache modes are explicit, patched timers are caught."""

from __future__ import annotations

import time

import kernel_cases as kc
import numpy as np
import pytest

import ratchet.kernels.guard as guard
from ratchet.kernels import bench, compare, verify_timers
from ratchet.kernels.timing import make_sets

FAST = {"max_time_s": 0.3, "min_reps": 5, "warmup": 1}


def sleeper(seconds):
    def fn(*_):
        time.sleep(seconds)

    fn.__name__ = f"sleep_{seconds}"
    return fn


def test_bench_statistics_are_sane():
    x = np.ones(1000)
    r = bench(sleeper(2e-3), (x,), cache="warm", **FAST)
    assert r.ok, r.reasons
    assert r.reps >= 5 and len(r.times_s) == r.reps
    assert 1.5e-3 < r.median_s < 50e-3  # generous: sleep overshoots on a busy machine
    assert 0 <= r.iqr_s < r.median_s
    assert min(r.times_s) <= r.median_s <= max(r.times_s)
    assert np.isfinite(r.sem_rel) and r.sem_rel >= 0
    assert r.inner == 1 and r.timer == "perf_counter" and r.cache == "warm"
    d = r.to_dict()
    assert "times_s" not in d and d["ok"] is True


def test_bench_stops_when_standard_error_is_small():
    r = bench(lambda x: x.sum(), (np.ones(10_000),), cache="warm", target_sem=0.5, min_reps=3, max_time_s=5)
    # a 50% target is met within a few reps (a loaded machine can add an outlier or two)
    assert r.converged and r.reps < 50


def test_tiny_calls_are_batched_and_divided():
    r = bench(lambda x: None, (np.ones(1),), cache="warm", **FAST)
    assert r.inner > 1
    assert r.median_s < 20e-6


def test_flush_mode_is_explicit_and_larger_than_llc():
    r = bench(kc.honest, (np.ones((8, 100), dtype=np.float32),), cache="flush", flush_bytes=8 << 20, **FAST)
    assert r.cache == "flush 8 MiB" and r.inner == 1
    r = bench(kc.honest, (np.ones((8, 100), dtype=np.float32),), cache="flush", **FAST)
    from ratchet.kernels import llc_bytes

    assert int(r.cache.split()[1]) >= 2 * llc_bytes() >> 20


def test_rotate_builds_enough_sets_to_exceed_llc():
    from ratchet.kernels import llc_bytes

    rng = np.random.default_rng(0)
    sets = make_sets(None, lambda: (rng.standard_normal(1 << 17),), "rotate", None)  # 1 MiB each
    assert len(sets) == min(64, max(2, -(-2 * llc_bytes() // (1 << 20))))
    assert len({s[0].ctypes.data for s in sets}) == len(sets)
    with pytest.raises(ValueError):
        make_sets((np.ones(3),), lambda: (np.ones(3),), "warm", None)


def test_touch_changes_inputs_between_calls_so_content_caches_miss():
    seen = []
    x = np.ones((4, 4))
    bench(lambda a: seen.append(a.copy()), (x,), cache="warm", inner=1, **FAST)
    assert len({v.tobytes() for v in seen}) > len(seen) // 2


def test_compare_interleaves_and_finds_the_faster():
    slow, fast = sleeper(4e-3), sleeper(1e-3)
    calls = []

    def a(*args):
        calls.append("a")
        slow()

    def b(*args):
        calls.append("b")
        fast()

    c = compare(a, b, (np.ones(3),), cache="warm", **FAST)
    assert c.ok
    assert c.speedup > 1.5 and c.ratio_median < 0.7 and c.significant
    # warm-up pair, one calibration call each, then timed pairs in ABBA order
    assert "".join(calls[:4]) == "abab"
    assert "".join(calls[4:12]) == "abbaabba"
    assert c.a.reps == c.b.reps


def test_candidate_patching_time_perf_counter_is_caught():
    real = time.perf_counter
    fake_now = [0.0]

    def fake():
        fake_now[0] += 1e-9
        return fake_now[0]

    def cheat(x):
        time.perf_counter = fake  # make itself look instant to any naive timer
        return x.sum()

    try:
        r = bench(cheat, (np.ones(100_000),), cache="warm", **FAST)
        assert any("time.perf_counter was replaced" in reason for reason in r.reasons), r.reasons
        assert not r.ok
        # the harness kept timing with the clock it captured at import, so the numbers are real
        assert r.median_s > 1e-7
    finally:
        time.perf_counter = real
    assert verify_timers() == []


def test_candidate_patching_the_harness_clock_is_caught():
    real = guard.clock

    def cheat(x):
        guard.clock = lambda: 0.0
        return x.sum()

    try:
        r = bench(cheat, (np.ones(1000),), cache="warm", **FAST)
        assert any("the harness's own timer" in reason for reason in r.reasons)
    finally:
        guard.clock = real
    assert verify_timers() == []


def test_patching_numpy_comparison_is_caught_by_check():
    from ratchet.kernels import check

    real = np.isfinite

    def cheat(x):
        np.isfinite = lambda a: np.ones(np.shape(a), dtype=bool)
        return kc.honest(x)

    try:
        report = check(cheat, kc.reference, kc.make_inputs, kc.PUBLIC[:1])
        assert not report.ok
        assert "numpy.isfinite was replaced" in " ".join(report.reasons())
    finally:
        np.isfinite = real
    assert verify_timers() == []
