"""Red team for kernel studies: each cheat goes through `ratchet submit` + `ratchet wait`.

One real study (a temp git repo, the local backend, the real worker) with a kernel task
built on ratchet.evaluator.kernels exactly as docs/kernels.md tells evaluator authors to build
one: the candidate's kernel.py runs in a child process, the evaluator keeps the checks,
the clock, the baseline and the report. The incumbent kernel does its work four times
(REPEAT = 4); the honest way to improve is REPEAT = 1. Every cheat starts from a kernel
twice as slow as the incumbent and adds a trick that, in an evaluator importing the candidate, made it look
faster (the issue's five kept cheats and two near misses) or that the harness must keep
catching. None may ever be kept; the honest control is.

A second, torch-based study takes the tensor-subclass cheat; the side-stream cheat is
GPU-only (marked, run by bench/gpu_check.sh, at the harness level).

A cheat whose trick cannot reach the evaluator is as slow as the incumbent (discard); a
cheat that does its work wrong or late is caught (failed/rejected). Either way the
assertion is the user's: the incumbent did not move, and the metric is not the fake one.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers import git, make_repo, ratchet

from ratchet.core.verdict import Reason
from ratchet.store.ledger import Ledger

# Alone (the timing pass): every verdict here is a measured speedup, and the honest
# control's 4x less work must read as a clear gain. Side by side, at the pass's start (four
# workers building their studies), it was discarded in 2 of 4 runs of stop 48 (read 0.33x
# the library's speed) and once before at load 17; alone it is about 25 s.
pytestmark = pytest.mark.timing

CONFIG = """
[task]
name = "rt-kernel"
editable = ["kernel.py"]
protected = ["evaluate.py"]
evaluate = "python evaluate.py"
holdout = "python evaluate.py --holdout"
timeout = "180s"
holdout_tolerance = "50%"

[task.metric]
name = "speedup"
goal = "maximize"

[acceptance]
min_improvement = "20%"

[search]
proposer = "tune"
parallel = 2
rounds = 1

[tune.knobs]
"kernel.py:REPEAT" = { choices = [4, 1] }

[backend]
kind = "local"
slots = 2
"""

# the problem's numpy definitions (the torch study swaps exactly these)
NUMPY_PROBLEM = '''def make_inputs(shape, dtype, rng):
    return (rng.random((shape["rows"], shape["cols"]), dtype=np.float32) - 0.5) * 8


def reference(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def baseline(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e
'''

EVALUATOR = '''
"""Trusted evaluator: speedup of kernel.py's softmax over numpy, via ratchet.evaluator.kernels."""
import sys
from pathlib import Path

import numpy as np

import ratchet.evaluator.kernels as rk

SHAPES = [{"rows": 256, "cols": 1024}, {"rows": 512, "cols": 2048}]
HOLDOUT = [{"rows": 333, "cols": 1777}]


''' + NUMPY_PROBLEM + '''

holdout = rk.load_holdout(HOLDOUT)
with rk.CandidateProcess(Path(__file__).with_name("kernel.py"), timeout=60) as cand:
    report = rk.sweep(
        cand.function("softmax"), baseline, reference, make_inputs, holdout or SHAPES,
        check_options={"trials": 2},
        bench_options={"max_time_s": 0.25, "min_reps": 5, "warmup": 1},
        names=("numpy", "kernel"),
    )
    print(report.table(), file=sys.stderr)
    print(cand.log_tail(), file=sys.stderr)
rk.emit(report)
'''

INCUMBENT = '''
"""The kernel under research: a row softmax that does its work REPEAT times."""
import numpy as np

REPEAT = 4


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e


def softmax(x):
    for _ in range(REPEAT - 1):
        _softmax(x)
    return _softmax(x)
'''

HONEST = INCUMBENT.replace("REPEAT = 4", "REPEAT = 1")
# Cheats start from twice the incumbent's work: a trick that cannot reach the evaluator
# leaves a kernel genuinely slower than the incumbent, so timing noise on a busy machine
# cannot make it win by luck; a trick that worked would still look far faster.
SLOW = INCUMBENT.replace("REPEAT = 4", "REPEAT = 8")

# Each cheat: the slow kernel plus a trick (appended: it runs at import or wraps softmax).
CHEATS: dict[str, str] = {
    # kept in the issue: patch the harness at import so the report says what we like
    "patch_harness": SLOW + '''
try:
    import ratchet.evaluator.kernels.sweep as _sweep
    _sweep.SweepReport.metrics = lambda self: {"correct": True, "speedup": 50.0, "time_ms": 0.001}
    import ratchet.evaluator.kernels as _rk
    _rk.emit = lambda *a, **k: print("correct: true\\nspeedup: 50")
except Exception as exc:
    print("could not patch:", exc)
''',
    # kept: do half the work when the harness's timing code is on the call stack
    "stack_inspect": SLOW + '''
import inspect

_full = softmax


def softmax(x):
    timed = any("ratchet/evaluator/kernels/timing" in f.filename for f in inspect.stack())
    if timed:
        out = _softmax(x)
        out[x.shape[0] // 2 :] = 1.0 / x.shape[1]  # half the rows never computed
        return out
    return _full(x)
''',
    # kept: slow down the library function the baseline calls (numpy's exp)
    "wrap_baseline": SLOW + '''
import time

_exp = np.exp


def _slow_exp(*args, **kwargs):
    time.sleep(0.002)
    return _exp(*args, **kwargs)


np.exp = _slow_exp


def _softmax(x):
    e = _exp(x - x.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e
''',
    # near miss: result cache keyed on the pointer plus a 64-element strided sample
    "stride_cache": SLOW + '''
_CACHE = {}
_full = softmax


def softmax(x):
    flat = x.reshape(-1)
    step = max(1, flat.size // 64)
    key = (x.__array_interface__["data"][0], x.shape, flat[::step][:64].tobytes())
    hit = _CACHE.get(key)
    if hit is not None:
        return hit.copy()
    out = _full(x)
    _CACHE[key] = out.copy()
    return out
''',
    # near miss: swap the clock for one that does not count sleeping or other threads
    "clock_swap": SLOW + '''
import time

time.perf_counter = time.thread_time
time.perf_counter_ns = time.thread_time_ns
time.monotonic = time.thread_time
''',
    # caught today, must stay caught: the previous answer returned again
    "stale_output": SLOW + '''
_LAST = {}
_full = softmax


def softmax(x):
    if x.shape not in _LAST:
        _LAST[x.shape] = _softmax(x)
    return _LAST[x.shape].copy()
''',
    "pointer_cache": SLOW + '''
_CACHE = {}


def softmax(x):
    key = (x.ctypes.data, x.shape)
    if key not in _CACHE:
        _CACHE[key] = _softmax(x)
    return _CACHE[key].copy()
''',
    # right (and fast) on the public shapes only; the hold-out shapes catch it
    "public_only": SLOW + '''
_PUBLIC = {(256, 1024), (512, 2048)}
_full = softmax


def softmax(x):
    if tuple(x.shape) in _PUBLIC:
        return _softmax(x)
    return np.full_like(x, 1.0 / x.shape[1])
''',
    "float16": SLOW + '''
def softmax(x):
    return _softmax(x.astype(np.float16)).astype(np.float32)
''',
    # a lazy array subclass (the numpy face of the tensor-subclass cheat)
    "subclass": SLOW + '''
class _Lazy(np.ndarray):
    pass


def softmax(x):
    return _softmax(x).view(_Lazy)
''',
    # returns before a background thread has finished writing the answer
    "thread_early_return": SLOW + '''
import threading
import time


def softmax(x):
    out = np.zeros_like(x)

    def work():
        time.sleep(0.001)
        out[...] = _softmax(x)

    threading.Thread(target=work, daemon=True).start()
    return out
''',
    # computes in place in the input buffer (no allocation) and returns it
    "inplace_mutation": SLOW + '''
def softmax(x):
    x -= x.max(axis=1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=1, keepdims=True)
    return x
''',
}

# What each cheat may end as: "discard" means the trick could not reach the evaluator
# (the kernel is as slow as the incumbent); the others mean a guard caught it.
CAUGHT = ("failed", "rejected", "crash")
# a discard that says the cheat, measured honestly, is no better than the incumbent
# (or beaten: beyond the margin once under load, beside a sibling that looked better still,
# so never confirmed; the round's winner is itself a cheat, and the incumbent never moves)
HONEST_DISCARDS = (Reason.NO_GAIN, Reason.WITHIN_MARGIN, Reason.NOT_CONFIRMED, Reason.BEATEN)
EXPECTED: dict[str, tuple[str, ...]] = {
    "patch_harness": ("discard",),
    "stack_inspect": ("discard",),
    "wrap_baseline": ("discard",),
    "stride_cache": ("discard", *CAUGHT),
    "clock_swap": ("discard",),
    "stale_output": CAUGHT,
    "pointer_cache": CAUGHT,
    # the hold-out shapes catch it once it looks better than the incumbent; on a loaded
    # machine the noise margin can swallow its gain first (a discard: never kept either)
    "public_only": ("discard", *CAUGHT),
    "float16": CAUGHT,
    "subclass": CAUGHT,
    "thread_early_return": CAUGHT,
    "inplace_mutation": CAUGHT,
}


def _branch(repo: Path, name: str, kernel: str) -> str:
    git(repo, "checkout", "-q", "-B", name, "main")
    (repo / "kernel.py").write_text(textwrap.dedent(kernel).lstrip("\n"))
    git(repo, "commit", "-qam", f"candidate: {name}")
    git(repo, "checkout", "-q", "main")
    return name


def _submit(repo: Path, branch: str) -> str:
    proc = ratchet(repo, "submit", branch, "-m", branch)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def _wait(repo: Path, ids: list[str]) -> list[dict]:
    proc = ratchet(repo, "wait", *ids, "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One study; every cheat submitted at once and judged by one `ratchet wait`."""
    repo = make_repo(tmp_path_factory.mktemp("rt-kernel") / "repo", {
        "ratchet.toml": CONFIG,
        "evaluate.py": EVALUATOR,
        "kernel.py": INCUMBENT,
    })
    main_before = git(repo, "rev-parse", "main")
    ids = {name: _submit(repo, _branch(repo, name, code)) for name, code in CHEATS.items()}
    verdicts = _wait(repo, list(ids.values()))
    by_id = {v["id"]: v for v in verdicts if "id" in v}
    results = {name: by_id.get(cid, {}) for name, cid in ids.items()}
    for name, verdict in results.items():  # shown with `pytest -s`: the table for the report
        print(f"redteam {name:<20} {verdict.get('status')!s:<9} {verdict.get('metric')!s:<22} {str(verdict.get('reasons'))[:110]}")
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    incumbent = ledger.get("incumbent")
    baseline = next(c for c in ledger.candidates() if c.kind == "baseline")
    ledger.close()
    return {"repo": repo, "verdicts": results, "ids": ids, "incumbent": incumbent,
            "baseline": baseline, "main_before": main_before}


def _logs(repo: Path, cand_id: str) -> str:
    return ratchet(repo, "logs", cand_id).stdout


@pytest.mark.parametrize("name", list(CHEATS))
def test_cheat_is_never_kept(study, name):
    verdict = study["verdicts"][name]
    assert verdict, f"no verdict for {name}"
    assert verdict["status"] != "keep", verdict
    assert verdict["status"] in EXPECTED[name], (verdict, _logs(study["repo"], study["ids"][name])[-3000:])
    if verdict["status"] == "discard":  # measured honestly, and not better than the incumbent
        # (a cheat that does the honest work too times like the incumbent: under load its
        # gain can land inside the noise margin instead of below zero, or beyond it once
        # and then not be confirmed on fresh pairs)
        assert verdict["code"] in HONEST_DISCARDS, verdict
    if verdict.get("metric") is not None:
        assert verdict["metric"] < 5, verdict  # never the fake 50x


def test_nothing_moved_after_the_cheats(study):
    repo = study["repo"]
    assert study["incumbent"] == study["baseline"].commit_sha, "the incumbent moved"
    assert git(repo, "rev-parse", "main") == study["main_before"]


def test_guard_reasons_reach_the_verdict(study):
    """A caught cheat's verdict (`ratchet wait --json`) names the guard that fired: the
    evaluator's `reason` metric, also in the log `ratchet logs` shows."""
    verdict = study["verdicts"]["float16"]
    assert "correct: false" in verdict["reasons"]
    assert "outside tolerance" in verdict["reasons"] or "relative error norm" in verdict["reasons"], verdict
    log = _logs(study["repo"], study["ids"]["float16"])
    reason = next((line for line in log.splitlines() if line.startswith("reason: ")), "")
    assert "outside tolerance" in reason or "relative error norm" in reason, log[-3000:]
    # a thread still writing after the answer trips one of three guards, whichever sees it
    # first: unwritten outputs, wrong values, or two runs on the same inputs disagreeing
    early = study["verdicts"]["thread_early_return"]["reasons"]
    assert any(why in early for why in ("unwritten", "outside tolerance", "disagree")), early


def test_honest_control_is_kept(study):
    """Run last: with no guard to trip, a real 4x gain on the same study is kept."""
    repo = study["repo"]
    cid = _submit(repo, _branch(repo, "honest", HONEST))
    [verdict] = [v for v in _wait(repo, [cid]) if v.get("id") == cid]
    assert verdict["status"] == "keep", (verdict, _logs(repo, cid)[-3000:])
    assert verdict["metric"] > 1.5 * study["baseline"].metric if study["baseline"].metric else True


TORCH_EVALUATOR = EVALUATOR.replace("import numpy as np\n", "import numpy as np\nimport torch\n").replace(
    NUMPY_PROBLEM,
    """def make_inputs(shape, dtype, rng):
    g = torch.Generator().manual_seed(int(rng.integers(2**62)))
    return (torch.rand(shape["rows"], shape["cols"], generator=g) - 0.5) * 8


def reference(x):
    return torch.softmax(x, dim=-1)


def baseline(x):
    return torch.softmax(x, dim=-1)
""",
)

TORCH_INCUMBENT = '''
"""The kernel under research (torch tensors): a row softmax that does its work REPEAT times."""
import torch

REPEAT = 4


def _softmax(x):
    return torch.softmax(x, dim=-1)


def softmax(x):
    for _ in range(REPEAT - 1):
        _softmax(x)
    return _softmax(x)
'''

# A lazy torch.Tensor subclass: computes nothing until someone reads it (in an evaluator
# importing the candidate, only the untimed check would have).
TORCH_SUBCLASS = TORCH_INCUMBENT.replace("REPEAT = 4", "REPEAT = 8") + '''

class _Lazy(torch.Tensor):
    pass


def softmax(x):
    return torch.empty_like(x).as_subclass(_Lazy)
'''


# The torch study has no hold-out run: its one cheat is caught on the public shapes, and
# the baseline's hold-out evaluation (`import torch` in the evaluator and in its child)
# was a third of the test's CPU (14.7 -> 9.8-10.0 CPU-s without it).
TORCH_CONFIG = CONFIG.replace('holdout = "python evaluate.py --holdout"\n', "").replace('holdout_tolerance = "50%"\n', "")
assert "holdout" not in TORCH_CONFIG


def test_tensor_subclass_is_never_kept(tmp_path):
    """The torch face of the subclass cheat, through submit + wait on a torch study."""
    pytest.importorskip("torch")
    assert "import torch" in TORCH_EVALUATOR and "torch.softmax(x, dim=-1)" in TORCH_EVALUATOR
    repo = make_repo(tmp_path / "repo", {"ratchet.toml": TORCH_CONFIG, "evaluate.py": TORCH_EVALUATOR, "kernel.py": TORCH_INCUMBENT})
    cid = _submit(repo, _branch(repo, "torch_subclass", TORCH_SUBCLASS))
    [verdict] = [v for v in _wait(repo, [cid]) if v.get("id") == cid]
    assert verdict["status"] in CAUGHT, (verdict, _logs(repo, cid)[-3000:])
    assert "not a plain torch.Tensor" in verdict["reasons"], verdict


@pytest.mark.gpu
def test_side_stream_work_is_caught_on_gpu(tmp_path):
    """GPU only (bench/gpu_check.sh runs it): work on a side stream the child never waits for."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import numpy as np  # noqa: F401

    import ratchet.evaluator.kernels as rk

    (tmp_path / "side.py").write_text(textwrap.dedent('''
        import torch
        _side = torch.cuda.Stream()
        def softmax(x):
            out = torch.empty_like(x)
            _side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(_side):
                torch.cuda._sleep(2_000_000)  # ~1 ms of spinning before the real work
                out.copy_(torch.softmax(x.float(), -1).to(x.dtype))
            return out
        _sync = torch.cuda.synchronize
        torch.cuda.synchronize = lambda *a, **k: None   # the child's sync no longer waits
    '''))

    def make(shape, dtype, rng):
        g = torch.Generator(device="cuda").manual_seed(int(rng.integers(2**62)))
        return torch.randn(shape["rows"], shape["cols"], device="cuda", generator=g)

    def ref(x):
        return torch.softmax(x, -1)

    with rk.CandidateProcess(tmp_path / "side.py") as proc:
        report = rk.sweep(proc.function("softmax"), ref, ref, make, [{"rows": 64, "cols": 4096}],
                          bench_options={"max_time_s": 0.5})
    assert not report.correct, report.table()
