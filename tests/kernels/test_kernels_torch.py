"""The same guards on torch tensors (CPU here; CUDA takes the same code paths plus events)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ratchet.kernels import bench, check  # noqa: E402

SHAPES = [{"rows": 4, "cols": 50}, {"rows": 16, "cols": 300}]


def make_inputs(shape, dtype, rng):
    g = torch.Generator().manual_seed(int(rng.integers(2**62)))
    return torch.randn(shape["rows"], shape["cols"], generator=g, dtype=getattr(torch, dtype))


def reference(x):
    assert x.dtype == torch.float64  # the harness upcasts before calling the reference
    return torch.softmax(x, dim=-1)


def run(candidate, dtypes=("float32", "bfloat16")):
    return check(candidate, reference, make_inputs, SHAPES, dtypes=dtypes)


def test_honest_torch_kernel_passes_in_fp32_and_bf16():
    report = run(lambda x: torch.softmax(x.float(), dim=-1).to(x.dtype))
    assert report.ok, report.summary()


def test_tensor_subclass_is_rejected():
    class Lazy(torch.Tensor):
        pass

    reason = " ".join(run(lambda x: torch.softmax(x, -1).as_subclass(Lazy)).reasons())
    assert "tensor subclass" in reason and "Lazy" in reason


def test_meta_and_expanded_outputs_are_rejected():
    assert "meta tensor" in " ".join(run(lambda x: torch.empty(x.shape, dtype=x.dtype, device="meta")).reasons())
    assert "zero stride" in " ".join(run(lambda x: torch.softmax(x, -1)[:1].expand_as(x)).reasons())


def test_output_aliasing_input_storage_is_caught():
    reason = " ".join(run(lambda x: x.view(x.shape)).reasons())
    assert "shares memory with input 0" in reason


def test_stale_buffer_and_pointer_cache_are_caught():
    cache = {}

    def by_pointer(x):
        key = x.data_ptr()
        if key not in cache:
            cache[key] = torch.softmax(x, -1)
        return cache[key].clone()

    assert "stale result" in " ".join(run(by_pointer, dtypes=("float32",)).reasons())
    last = []

    def same_buffer(x):
        if not last:
            last.append(torch.softmax(x, -1))
        return last[0]

    assert "buffer it returned on an earlier call" in " ".join(run(same_buffer, dtypes=("float32",)).reasons())


def test_wrong_dtype_silent_upcast_is_caught():
    reason = " ".join(run(lambda x: torch.softmax(x.float(), -1), dtypes=("bfloat16",)).reasons())
    assert "dtype float32, expected bfloat16" in reason


def test_input_mutation_is_caught_on_tensors():
    reason = " ".join(run(lambda x: torch.softmax(x.mul_(1.0001), -1), dtypes=("float32",)).reasons())
    assert "modified input 0 in place" in reason


def test_bench_torch_cpu_tensors():
    x = torch.randn(64, 512)
    r = bench(lambda t: torch.softmax(t, -1), (x,), cache="warm", max_time_s=0.2, min_reps=3)
    assert r.ok and r.median_s > 0 and r.device == "cpu"
    assert np.isfinite(r.iqr_s)
