"""bench()/compare(): the evaluator's clock around requests to a candidate process.

Timing assertions are ratios measured side by side with generous margins: the machine
running the tests is shared and loaded.
"""

from __future__ import annotations

import textwrap

import kernel_cases as kc
import numpy as np
import pytest

from ratchet.evaluator.kernels import CandidateProcess, bench, compare

SMALL = {"rows": 64, "cols": 100}
QUICK = {"max_time_s": 0.3, "min_reps": 3, "warmup": 1}


@pytest.fixture(scope="module")
def cand():
    with CandidateProcess(kc.__file__, timeout=60) as proc:
        yield proc


@pytest.mark.timing  # batching follows one probe call's time: load made single-call batches twice
def test_bench_statistics_are_sane(cand):
    r = bench(cand.function("honest"), kc.make_inputs, SMALL, reference=kc.reference, **QUICK)
    if r.calls == 1:
        # the batch size comes from one probe call: a load spike there (a probe call over
        # the 1 ms target) gives single-call batches; a second bench probes afresh
        r = bench(cand.function("honest"), kc.make_inputs, SMALL, reference=kc.reference, **QUICK)
    assert r.ok, r.summary()
    assert r.reps >= 3 and len(r.times_s) == r.reps
    assert r.median_s > 0 and r.iqr_s >= 0 and r.sem_rel > 0
    assert r.device == "cpu" and r.timer == "host clock around one request"
    assert r.calls > 1  # a ~0.1 ms call is batched so the round trip does not dominate
    assert r.request_overhead_s > 0 and r.host_overhead_per_call_s == pytest.approx(r.request_overhead_s / r.calls)
    assert r.verified >= r.reps  # at least one call of every batch checked against the reference
    assert "ms/call" in r.summary()


def test_missing_the_sem_target_is_reported_as_imprecise(cand):
    r = bench(cand.function("honest"), kc.make_inputs, SMALL, reference=kc.reference, target_sem=1e-9, max_time_s=0.1, min_reps=3)
    assert r.ok and not r.converged
    assert "IMPRECISE" in r.summary()


def test_every_batch_uses_distinct_buffers_and_fresh_inputs(tmp_path):
    (tmp_path / "spy.py").write_text(textwrap.dedent('''
        import numpy as np
        LOG = []
        def softmax(x):
            LOG.append((int(x.ctypes.data), float(x.sum())))
            e = np.exp(x - x.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)
        def log():
            return LOG
    '''))
    with CandidateProcess(tmp_path / "spy.py") as proc:
        r = bench(proc.function("softmax"), kc.make_inputs, SMALL, reference=kc.reference, calls=8, min_reps=3, max_reps=3, warmup=1)
        assert r.ok and r.calls == 8
        log = proc.call("log")
    timed = log[-8 * 3 :]  # 3 timed batches of 8 calls (after the probe, the warm-up)
    batches = [timed[i : i + 8] for i in range(0, len(timed), 8)]
    for batch in batches:
        assert len({ptr for ptr, _ in batch}) == 8  # N calls, N distinct buffer sets
    assert [p for p, _ in batches[0]] == [p for p, _ in batches[1]]  # the same sets, rotated...
    sums = [s for _, s in timed]
    assert len({round(s, 3) for s in sums}) == len(sums)  # ...refilled with fresh data every batch


@pytest.mark.timing  # asserts a speed ratio: 4 workers' load on 2 cores read 0.36x once
def test_compare_interleaves_and_finds_the_faster(cand):
    cmp = compare(kc.slow_baseline, cand.function("honest"), kc.make_inputs, {"rows": 256, "cols": 64},
                  reference=kc.reference, names=("loop", "vectorised"), **QUICK)
    assert cmp.ok, cmp.summary()
    assert cmp.speedup > 1.5  # a Python loop over 256 rows vs one vectorised call
    assert cmp.a.name == "loop" and cmp.b.name == "vectorised"
    assert cmp.a.verified == 0 and cmp.b.verified > 0  # only the candidate is checked
    assert cmp.speedup_sem_rel > 0


def test_a_candidate_that_caches_after_the_check_fails_while_timed(cand):
    """Honest for the first calls, then a stale answer: the timed calls are verified too."""
    r = bench(cand.function("fast_when_timed"), kc.make_inputs, SMALL, reference=kc.reference, **QUICK)
    assert not r.ok
    assert "a timed call's output is wrong" in r.reasons[0]


def test_answering_before_the_work_is_done_fails_while_timed(cand):
    def out(shape, dtype, inputs):
        return np.empty_like(inputs[0])

    r = bench(cand.function("early_return"), kc.make_inputs, SMALL, reference=kc.reference, out=out, **QUICK)
    assert not r.ok
    assert "unwritten" in r.reasons[0] or "changed after the call had answered" in r.reasons[0]


@pytest.mark.timing  # compares timings against a floor: other tests' load moves them
def test_the_candidate_cannot_touch_the_clock(tmp_path):
    """Patching time in the candidate's process changes nothing: the clock is ours."""
    (tmp_path / "clockcheat.py").write_text(textwrap.dedent('''
        import time
        import numpy as np
        _sleep = time.sleep
        time.perf_counter = lambda: 0.0
        time.perf_counter_ns = lambda: 0
        time.monotonic = lambda: 0.0
        def softmax(x):
            _sleep(0.002)
            e = np.exp(x - x.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)
    '''))
    with CandidateProcess(tmp_path / "clockcheat.py") as proc:
        r = bench(proc.function("softmax"), kc.make_inputs, SMALL, reference=kc.reference, **QUICK)
    assert r.ok and r.median_s >= 0.0018


def test_options_are_checked():
    with pytest.raises(TypeError, match="unknown timing option"):
        bench(kc.honest, kc.make_inputs, SMALL, reference=kc.reference, cache="flush")
