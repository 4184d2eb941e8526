"""Issue 21's GPU forms (bench/gpu_check.sh runs them on a lent GPU; skipped without one).

Each candidate is torch.softmax itself plus a trick, timed against torch.softmax as the
trusted baseline: an honest harness says "about 1x" or rejects it; a trick that worked
would show a speed-up.

1. the child slows down the empty requests the clock's correction is measured with;
2. a setsid'd helper in its own CUDA context queues GPU work at the end of every
   candidate request, so the baseline timed next shares the GPU with it;
3. the child queues work on a side stream it never waits for (its sync patched out)
   right before it answers, so that work runs while the baseline is timed.
"""

from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.gpu

SHAPE = {"rows": 64, "cols": 8192}
TIMING = {"max_time_s": 1.0, "min_reps": 10, "warmup": 2}

BASE = '''
import sys
import time

import torch


def softmax(x):
    return torch.softmax(x, dim=-1)
'''

RTT_SLEEP = BASE + '''
_child = sys.modules["__main__"].Child
_real = _child.call
_last = [0.0]
_empty = [0]


def empty_requests_seen():
    return _empty[0]


def _call(self, msg):
    if not msg.get("calls"):
        _empty[0] += 1
        time.sleep(_last[0])
        return {"ok": True}
    t0 = time.perf_counter()
    reply = _real(self, msg)
    _last[0] = time.perf_counter() - t0
    return reply


_child.call = _call
'''

OTHER_CONTEXT = BASE + '''
import os

_r, _w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # the helper: its own CUDA context, outside the child's process group
        import torch as t
        t.cuda.init()
        while os.read(_r, 1):
            for _ in range(20):
                t.cuda._sleep(1_000_000)  # ~0.5 ms each: ~10 ms queued per request
        os._exit(0)
    os._exit(0)
os.wait()
_child = sys.modules["__main__"].Child
_real = _child.call


def _call(self, msg):
    reply = _real(self, msg)
    if msg.get("calls"):
        os.write(_w, b"x")  # queue the helper's work right before the answer
        time.sleep(0.001)
    return reply


_child.call = _call
'''

SIDE_STREAM = BASE + '''
_side = torch.cuda.Stream()
_child = sys.modules["__main__"].Child
_real = _child.call
_child.sync = lambda self: torch.cuda.current_stream().synchronize()  # not the side stream


def _call(self, msg):
    reply = _real(self, msg)
    if msg.get("calls"):
        with torch.cuda.stream(_side):
            for _ in range(20):
                torch.cuda._sleep(1_000_000)
    return reply


_child.call = _call
'''


@pytest.fixture(scope="module")
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def _compare(torch, tmp_path, name, source):
    import ratchet.evaluator.kernels as rk

    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))

    def make(shape, dtype, rng):
        g = torch.Generator(device="cuda").manual_seed(int(rng.integers(2**62)))
        return torch.randn(shape["rows"], shape["cols"], device="cuda", generator=g)

    def ref(x):
        return torch.softmax(x, -1)

    cand = rk.CandidateProcess(tmp_path / f"{name}.py", timeout=120)
    try:
        result = rk.compare(lambda x: torch.softmax(x, -1), cand.function("softmax"), make, SHAPE,
                            reference=ref, **TIMING)
        extra = cand.call("empty_requests_seen") if name == "rtt_sleep" else None
    finally:
        cand.close()
    return result, extra


def test_gpu_round_trip_correction_comes_from_the_clean_twin(torch_cuda, tmp_path):
    result, empty_seen = _compare(torch_cuda, tmp_path, "rtt_sleep", RTT_SLEEP)
    assert result.ok, result.b.reasons
    assert empty_seen == 0, "the candidate answered an empty request"
    assert result.speedup < 1.3, result.summary()  # the same kernel: no gain


def test_gpu_helper_in_another_context_cannot_stretch_the_baseline(torch_cuda, tmp_path):
    result, _ = _compare(torch_cuda, tmp_path, "other_context", OTHER_CONTEXT)
    assert not result.ok or result.speedup < 1.3, result.summary()


def test_gpu_side_stream_work_during_the_baseline_is_not_a_gain(torch_cuda, tmp_path):
    result, _ = _compare(torch_cuda, tmp_path, "side_stream", SIDE_STREAM)
    assert not result.ok or result.speedup < 1.3, result.summary()


def test_gpu_honest_kernel_times_like_the_baseline(torch_cuda, tmp_path):
    """The control: torch.softmax in the confined child against itself, about 1x."""
    result, _ = _compare(torch_cuda, tmp_path, "honest", BASE)
    assert result.ok, result.b.reasons
    assert 0.75 < result.speedup < 1.3, result.summary()
