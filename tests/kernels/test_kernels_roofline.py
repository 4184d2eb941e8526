"""Roofline: formulas, classification, the impossible-time floor, and the peaks cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ratchet.evaluator.kernels import (
    Peaks,
    assess,
    evaluate,
    load_peaks,
    measure_peaks,
    peaks_cache_path,
    write_hardware_md,
)

# A made-up device: 100 GB/s, 1 TFLOP/s fp32, 5 us per call. Ridge = 10 FLOP/byte.
DEV = Peaks(device="test-device", bandwidth_Bps=100e9, flops={"float32": 1e12, "float16": 4e12}, overhead_s=5e-6)


def test_formula_strings_callables_and_numbers():
    shape = {"rows": 64, "cols": 1000}
    assert evaluate("2 * rows * cols * itemsize", shape, "float16") == 2 * 64 * 1000 * 2
    assert evaluate("max(rows, cols) + log2(1024) - ceil(0.5)", shape) == 1000 + 10 - 1
    assert evaluate(lambda s: s["rows"] * 3, shape) == 192
    assert evaluate(123, shape) == 123.0


@pytest.mark.parametrize("bad", ["__import__('os').system('true')", "rows.bit_length()", "open('x')", "unknown * 2", "[1, 2]"])
def test_formula_rejects_anything_but_arithmetic(bad):
    with pytest.raises(ValueError):
        evaluate(bad, {"rows": 2})


def test_memory_bound_kernel_and_percent_of_bound():
    # 1e9 bytes -> 10 ms at 100 GB/s; 1e9 FLOPs -> 1 ms. Measured 20 ms -> 50% of bound.
    p = assess(20e-3, 1e9, 1e9, DEV)
    assert p.bound == "memory" and not p.impossible
    assert p.t_min_s == pytest.approx(10e-3)
    assert p.pct_of_bound == pytest.approx(50.0)
    assert p.intensity == pytest.approx(1.0)


def test_compute_bound_uses_the_dtype_peak():
    p32 = assess(0.1, 1e11, 1e8, DEV, "float32")  # 100 ms compute vs 1 ms memory
    assert p32.bound == "compute" and p32.pct_of_bound == pytest.approx(100.0)
    p16 = assess(0.1, 1e11, 1e8, DEV, "float16")
    assert p16.t_compute_s == pytest.approx(0.025)
    # an unmeasured dtype falls back to the highest peak: the generous (lower) floor
    assert assess(0.1, 1e11, 1e8, DEV, "bfloat16").t_compute_s == pytest.approx(0.025)


def test_overhead_bound_small_problem():
    p = assess(8e-6, 1e3, 4e3, DEV)  # t_min 40 ns, one call costs 5 us
    assert p.bound == "overhead"
    # however slow the call, a problem whose roofline minimum is below one call's fixed
    # cost is bound by that fixed cost (the launch-bound decode rows of the issue)
    assert assess(40e-6, 1e3, 4e3, DEV).bound == "overhead"
    assert assess(500e-3, 1e3, 4e9, DEV).bound == "memory"  # 40 ms of traffic: memory


def test_time_below_the_physical_floor_is_impossible():
    p = assess(1e-3, 0, 1e9, DEV)  # 1 GB in 1 ms = 1 TB/s on a 100 GB/s device
    assert p.impossible
    assert "1000% of the memory roofline" in p.reason and "test-device" in p.reason
    assert not assess(6e-3, 0, 1e9, DEV).impossible  # 167%: CPU peaks move with load; the CPU limit is 200%


def test_gpu_limit_is_110_percent_of_the_measured_peak():
    gpu = Peaks(device="cuda: test", bandwidth_Bps=1e11, flops={"float32": 1e12}, overhead_s=5e-6)
    assert not assess(9.2e-3, 0, 1e9, gpu).impossible  # 109%
    p = assess(8.9e-3, 0, 1e9, gpu)  # 112%
    assert p.impossible and "limit 110%" in p.reason


@pytest.mark.timing  # measures the machine's peaks, then a bench against them: beside the
# side-by-side pass at load ~8 the peaks read low and numpy's own softmax read "impossible"
def test_honest_library_calls_are_never_impossible_on_cpu(tmp_path):
    """Peaks measured the robust way (best of rounds) keep numpy and torch under the floor."""
    from ratchet.evaluator.kernels import bench, measure_peaks

    peaks = measure_peaks(copy_bytes=32 << 20, matmul_n=256, reps=3, rounds=3, cache_path=tmp_path / "p.json")

    def make(shape, dtype, rng):
        return rng.standard_normal((shape["rows"], shape["cols"])).astype(dtype)

    def np_softmax(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    impls = [np_softmax]
    try:
        import torch

        impls.append(lambda x: torch.softmax(torch.from_numpy(x), dim=-1).numpy())
    except ImportError:
        pass
    shape = {"rows": 1024, "cols": 1024}
    for impl in impls:
        r = bench(impl, make, shape, reference=np_softmax, max_time_s=0.3, min_reps=3)
        point = assess(r.median_s, 5 * 1024 * 1024, 2 * 1024 * 1024 * 4, peaks)
        assert not point.impossible, point.reason
        assert point.pct_of_bound < 200


def test_peaks_are_measured_once_and_cached(tmp_path):
    cache = tmp_path / "peaks.json"
    small = {"copy_bytes": 8 << 20, "matmul_n": 128, "reps": 2, "cache_path": cache}
    first = measure_peaks(**small)
    assert first.bandwidth_Bps > 1e8 and first.flops["float32"] > 1e7 and 0 < first.overhead_s < 1e-3
    data = json.loads(cache.read_text())
    assert list(data["devices"]) == [first.device] and first.device.startswith("cpu: ")
    again = measure_peaks(**small)
    assert again == first  # loaded, not re-measured (same timestamp and numbers)
    data["devices"][first.device]["bandwidth_Bps"] = 1.0
    cache.write_text(json.dumps(data))
    assert measure_peaks(**small).bandwidth_Bps == 1.0  # proof it came from the file
    refreshed = measure_peaks(**small, refresh=True)
    assert refreshed.bandwidth_Bps > 1e8
    assert load_peaks(first.device, cache) == refreshed


def test_cache_location_follows_ratchet_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RATCHET_CACHE", str(tmp_path / "c"))
    assert peaks_cache_path() == tmp_path / "c" / "peaks.json"
    assert load_peaks() is None


def test_hardware_md_includes_cached_peaks(tmp_path):
    from ratchet.evaluator.kernels import save_peaks

    save_peaks(DEV, tmp_path / "peaks.json")
    out = write_hardware_md(tmp_path / "hardware.md", cache_path=tmp_path / "peaks.json")
    text = out.read_text()
    assert "## CPU" in text and "## Measured peaks" in text
    assert "test-device: memory bandwidth 100.0 GB/s" in text
    assert "float32 matmul: 1000.0 GFLOP/s" in text
    assert "ridge point (FLOP/byte): float16 40.0, float32 10.0" in text
