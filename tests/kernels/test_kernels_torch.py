"""The same guards on torch tensors (CPU here, in shared memory; CUDA goes by IPC handle).

The candidates live in a module loaded into a real candidate process.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ratchet.evaluator.kernels import CandidateProcess, bench, check, compare  # noqa: E402

SHAPES = [{"rows": 4, "cols": 50}, {"rows": 16, "cols": 300}]

CANDIDATES = '''
import torch

def honest(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)

class Lazy(torch.Tensor):
    pass

def subclass(x):
    return torch.softmax(x, -1).as_subclass(Lazy)

def meta(x):
    return torch.empty(x.shape, dtype=x.dtype, device="meta")

CACHE = {}

def by_pointer(x):
    key = x.data_ptr()
    if key not in CACHE:
        CACHE[key] = torch.softmax(x, -1)
    return CACHE[key].clone()

def upcast(x):
    return torch.softmax(x.float(), -1)

def mutates(x):
    return torch.softmax(x.mul_(1.0001), -1)

def half_work(x):
    """float16 compute for float32 inputs."""
    return torch.softmax(x.half(), -1).float()

import time as _time

_original_softmax = torch.softmax


def _slow_softmax(*a, **k):
    _time.sleep(0.2)
    return _original_softmax(*a, **k)


def wraps_baseline(x):
    """Slows down torch.softmax by 200 ms (in its own process: the baseline runs elsewhere)."""
    torch.softmax = _slow_softmax
    return _original_softmax(x, -1)
'''


@pytest.fixture(scope="module")
def cand(tmp_path_factory):
    path = tmp_path_factory.mktemp("torchcand") / "tk.py"
    path.write_text(textwrap.dedent(CANDIDATES))
    with CandidateProcess(path, timeout=120) as proc:
        yield proc


def make_inputs(shape, dtype, rng):
    g = torch.Generator().manual_seed(int(rng.integers(2**62)))
    return torch.randn(shape["rows"], shape["cols"], generator=g, dtype=getattr(torch, dtype))


def reference(x):
    assert x.dtype == torch.float64  # the harness upcasts before calling the reference
    return torch.softmax(x, dim=-1)


def run(cand, name, dtypes=("float32", "bfloat16")):
    return check(cand.function(name), reference, make_inputs, SHAPES, dtypes=dtypes)


def reasons(report) -> str:
    assert not report.ok
    return " ".join(report.reasons())


def test_honest_torch_kernel_passes_in_fp32_and_bf16(cand):
    report = run(cand, "honest")
    assert report.ok, report.summary()


def test_tensor_subclass_and_meta_outputs_are_rejected(cand):
    reason = reasons(run(cand, "subclass"))
    assert "tk.Lazy, not a plain torch.Tensor" in reason
    assert "on meta, not a dense tensor with data" in reasons(run(cand, "meta"))


def test_pointer_cache_is_caught(cand):
    assert "stale result" in reasons(run(cand, "by_pointer", dtypes=("float32",)))


def test_wrong_dtype_silent_upcast_is_caught(cand):
    assert "torch.float32 on cpu, expected (4, 50) torch.bfloat16" in reasons(run(cand, "upcast", dtypes=("bfloat16",)))


def test_float16_compute_for_float32_is_caught(cand):
    assert "outside tolerance" in reasons(run(cand, "half_work", dtypes=("float32",)))


def test_input_mutation_is_caught_on_tensors(cand):
    assert "modified input 0 in place" in reasons(run(cand, "mutates", dtypes=("float32",)))


def test_bench_torch_cpu_tensors(cand):
    r = bench(cand.function("honest"), make_inputs, {"rows": 64, "cols": 512}, reference=reference, max_time_s=0.2, min_reps=3)
    assert r.ok, r.summary()
    assert r.median_s > 0 and r.device == "cpu" and np.isfinite(r.iqr_s)


def test_wrapping_the_library_the_baseline_calls_changes_nothing(cand):
    """The candidate replaces torch.softmax in its process; the baseline runs in ours."""
    shape = {"rows": 64, "cols": 512}
    # The baseline runs with torch's default intra-op threads (two on a 2-core machine):
    # the harness no longer leaves a spinning thread pool beside it (docs/kernels.md).
    cheat = compare(lambda x: torch.softmax(x, -1), cand.function("wraps_baseline"), make_inputs, shape, reference=reference, max_time_s=0.3, min_reps=3)
    assert cheat.ok
    # The wrapper adds 200 ms to every call of the baseline it reaches; ours stays far
    # below. (Not the speedup: other load on a 2-core machine moves a two-thread baseline
    # by up to two orders of magnitude in a bad moment, in either direction.)
    assert cheat.a.median_s < 0.1, cheat.summary()


def test_device_side_comparison_agrees_with_the_host_one():
    """CUDA outputs are compared on the device (_compare_torch); same verdicts as on the host."""
    from ratchet.evaluator.kernels.correctness import _compare, _compare_torch

    rng = np.random.default_rng(3)
    want = rng.standard_normal((16, 33))
    for noise in (0.0, 1e-7, 1e-3):
        got = want + noise * rng.standard_normal(want.shape)
        host = _compare(got, want, 1e-4, 1e-5)
        device = _compare_torch(torch.from_numpy(got), torch.from_numpy(want), 1e-4, 1e-5)
        assert bool(host[0]) == bool(device[0])
        assert device[1] == pytest.approx(host[1]) and device[3] == pytest.approx(host[3])
        if host[0]:
            assert host[0][0].split(";")[0] == device[0][0].split(";")[0]  # same count of bad elements
