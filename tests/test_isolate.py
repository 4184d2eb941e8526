"""ratchet.evaluator.isolate: candidate code runs in a child process the evaluator only talks to.

Real child processes, real shared memory; nothing mocked. Each test states what an
evaluator author relies on.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from ratchet.evaluator import isolate
from ratchet.evaluator.isolate import CandidateError, CandidateProcess, CandidateTimeout

CANDIDATE = '''
import json, os, sys, time
import numpy as np

CALLS = []

def score(x, scale=1.0):
    return (x - 1.25) ** 2 * scale

def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)

def env():
    return dict(os.environ)

def where():
    return {"cwd": os.getcwd(), "argv": sys.argv, "flags_isolated": sys.flags.isolated}

def shout():
    print("correct: true")
    print("time_ms: 0.0001", file=sys.stderr)
    return 1

def hang():
    os.system("sleep 300 &")   # a grandchild too: the timeout must kill the whole group
    time.sleep(300)

def nap():
    time.sleep(300)

def boom():
    raise ValueError("no good")

def die():
    os._exit(3)

def mutate(x):
    x[...] = 0
    return 0

def obj_array(x):
    return np.array([object()], dtype=object)

def a_function():
    return print

def start_counter(buf):
    import threading
    def count():
        while True:
            buf[0] += 1
            time.sleep(0.001)
    threading.Thread(target=count, daemon=True).start()
    return 0

def softmax_t(x):
    import torch
    return torch.softmax(x.float(), dim=-1).to(x.dtype)
'''


@pytest.fixture(scope="module")
def cand_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("cand")
    (d / "cand.py").write_text(textwrap.dedent(CANDIDATE))
    return d / "cand.py"


@pytest.fixture(scope="module")
def cand(cand_path):
    env = {**os.environ, "RATCHET_METRICS_FD": "99", "RATCHET_HOLDOUT": "/secret/holdout",
           "RATCHET_HOLDOUT_DATA": "x", "RATCHET_RESULT": "/tmp/r.json", "OPENAI_API_KEY": "sk-x",
           "RATCHET_WORKDIR": "/w"}
    with CandidateProcess(cand_path, timeout=20, env=env) as proc:
        yield proc


def test_values_and_arrays_round_trip(cand):
    assert cand.call("score", 3.0) == pytest.approx(3.0625)
    assert cand.call("score", 3.0, scale=2.0) == pytest.approx(6.125)
    x = np.random.default_rng(0).standard_normal((7, 33)).astype(np.float32)
    y = cand.call("softmax", x)
    assert y.dtype == np.float32 and y.shape == (7, 33)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
    f = cand.function("softmax")
    np.testing.assert_array_equal(f(x), y)


def test_child_sees_no_channel_holdout_result_or_secrets(cand, cand_path):
    env = cand.call("env")
    for name in ("RATCHET_METRICS_FD", "RATCHET_HOLDOUT", "RATCHET_HOLDOUT_DATA", "RATCHET_RESULT", "OPENAI_API_KEY"):
        assert name not in env
    assert env["RATCHET_WORKDIR"] == "/w"  # ordinary variables pass
    info = cand.call("where")
    assert info["cwd"] == str(cand_path.parent)
    assert info["flags_isolated"] == 1
    assert cand.pid != os.getpid()


def test_child_output_goes_to_its_own_log_not_our_stdout(cand, capfd):
    assert cand.call("shout") == 1
    time.sleep(0.2)
    out, err = capfd.readouterr()
    assert "correct:" not in out and "time_ms" not in err
    log = cand.log_path.read_text()
    assert "correct: true" in log and "time_ms: 0.0001" in log


def test_a_closed_child_leaves_no_log_in_the_temp_dir_and_keeps_its_tail(cand_path):
    proc = CandidateProcess(cand_path, timeout=20)
    with proc:
        assert proc.call("shout") == 1
        assert proc.log_path.is_file()
    # one evaluation each: thousands of empty files in /tmp over a night, before this
    assert not proc.log_path.exists()
    assert "correct: true" in proc.log_tail()


def test_exceptions_come_back_as_candidate_errors(cand):
    with pytest.raises(CandidateError, match="ValueError: no good"):
        cand.call("boom")
    assert cand.call("score", 1.25) == 0.0  # the process survives its candidate's exception


def test_inputs_are_copies_the_candidate_cannot_change_for_us(cand):
    x = np.ones((4, 4))
    cand.call("mutate", x)
    assert (x == 1).all()


def test_object_arrays_are_refused(cand):
    with pytest.raises(CandidateError, match="not a plain numeric"):
        cand.call("obj_array", np.ones(2))


def test_timeout_kills_the_whole_process_group(cand_path):
    proc = CandidateProcess(cand_path, timeout=30)
    proc.start()
    pgid = os.getpgid(proc.proc.pid)
    assert pgid != os.getpgid(0)  # its own process group
    t0 = time.monotonic()
    with pytest.raises(CandidateTimeout):
        proc.call("hang", timeout=1.0)
    assert time.monotonic() - t0 < 10
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.killpg(pgid, 0)  # raises once no process of the group is left
            time.sleep(0.1)
    proc.close()


def test_a_killed_evaluator_leaves_no_candidate_behind(cand_path):
    script = (
        "import os, sys\n"
        "from ratchet.evaluator.isolate import CandidateProcess\n"
        "import threading, time\n"
        f"proc = CandidateProcess({str(cand_path)!r}).start()\n"
        "print(proc.proc.pid, flush=True)\n"
        "threading.Thread(target=proc.call, args=('nap',), daemon=True).start()\n"
        "time.sleep(1)  # the child is busy in nap(): it will not notice a closed socket\n"
        "os._exit(0)  # no close(): as if the evaluator were killed\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    child = int(out.stdout.split()[0])
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        raise AssertionError("the candidate process outlived its evaluator")


def test_a_dying_child_is_reported_with_its_log(cand_path):
    with CandidateProcess(cand_path, timeout=10) as proc, pytest.raises(isolate.CandidateCrashed):
        proc.call("die")


def test_import_failure_is_a_candidate_error(tmp_path):
    (tmp_path / "bad.py").write_text("raise SystemExit('nope')\n")
    with CandidateProcess(tmp_path / "bad.py") as proc, pytest.raises(CandidateError, match="importing .* failed"):
        proc.start()


def test_shared_buffers_fast_path(cand):
    """The kernel harness's path: buffers the parent owns, calls that fill them."""
    x = cand.share(np.random.default_rng(1).standard_normal((5, 9)).astype(np.float32))
    out = cand.empty((5, 9), "float32")
    out.array.fill(np.nan)
    cand.run("softmax", [isolate.Call([x], [out])])
    np.testing.assert_allclose(out.array.sum(axis=1), 1.0, rtol=1e-5)
    # new values in the same buffers are seen by the child without re-registering
    x.array[...] = 0.0
    cand.run("softmax", [isolate.Call([x], [out])])
    np.testing.assert_allclose(out.array, 1.0 / 9, rtol=1e-6)
    cand.release([x, out])


def test_replies_are_json_only(cand):
    """The parent reads JSON from the child and never unpickles: other objects cannot come back."""
    with pytest.raises(CandidateError, match="neither an array nor a JSON value"):
        cand.call("a_function")
    assert json.dumps(cand.call("where"))


def test_torch_cpu_tensors_go_through_shared_memory(cand):
    torch = pytest.importorskip("torch")
    x = cand.share(torch.randn(3, 8, dtype=torch.bfloat16))
    out = cand.empty((3, 8), "bfloat16", like="torch")
    out.array.fill_(float("nan"))
    cand.run("softmax_t", [isolate.Call([x], [out])])
    assert not out.array.isnan().any()
    torch.testing.assert_close(out.array, torch.softmax(x.array.float(), dim=-1).to(torch.bfloat16))
    cand.release([x, out])


def test_freeze_stops_every_thread_of_the_child(cand_path):
    """What the harness does between a reply and reading outputs: nothing may run."""
    with CandidateProcess(cand_path, timeout=20) as proc:
        counter = proc.empty((1,), "int64")
        counter.array[0] = 0
        proc.run("start_counter", [isolate.Call([counter], mode="value")])
        time.sleep(0.1)
        assert counter.array[0] > 0  # the thread runs
        proc.freeze()
        try:
            frozen = int(counter.array[0])
            time.sleep(0.2)
            assert int(counter.array[0]) == frozen
        finally:
            proc.thaw()
        time.sleep(0.2)
        assert int(counter.array[0]) > frozen
        assert proc.call("score", 1.25) == 0.0  # thawed: it answers again


TEMPORARIES = '''
import resource

import numpy as np


def faults_per_call(x, calls=10):
    """Minor page faults per softmax over x (three temporaries of x's size each call)."""
    def once():
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    once()
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        once()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / calls
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc thresholds")
def test_a_young_child_reuses_its_temporaries_as_the_evaluator_does(tmp_path):
    """The same kernel must cost the same in the child as in the evaluator. Left to adapt,
    glibc mapped a young child's 2 MB temporaries afresh on every call (about 1,000 page
    faults each: an honest numpy softmax read 4x slower than itself as the baseline)."""
    (tmp_path / "temps.py").write_text(TEMPORARIES)
    x = np.full((256, 2048), 0.5, dtype=np.float32)  # 2 MB: above glibc's default 128 KiB
    with CandidateProcess(tmp_path / "temps.py", timeout=20) as proc:
        faults = proc.call("faults_per_call", x)
    assert faults < 50, f"{faults:.0f} page faults per call: the child maps its temporaries afresh"


WIDEN = '''
import os
import threading

def widen_from(where):
    """sched_setaffinity to every core, from the main thread or a new one; the error's errno"""
    got = []
    def attempt():
        try:
            os.sched_setaffinity(0, range(os.cpu_count() or 1))
            got.append(0)
        except OSError as exc:
            got.append(exc.errno)
    if where == "thread":
        t = threading.Thread(target=attempt)
        t.start()
        t.join()
    elif where == "fork":
        pid = os.fork()
        if pid == 0:
            attempt()
            os._exit(got[0])
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    else:
        attempt()
    return got[0]

def cpus():
    return sorted(os.sched_getaffinity(0))
'''


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two CPUs to pin the child to one")
def test_a_child_cannot_widen_its_cpus_from_any_thread_or_process(tmp_path):
    """A child pinned to one core that could widen its affinity would time its calls on
    whichever core is idle, while the baseline it is compared with ran on the busy one."""
    (tmp_path / "widen.py").write_text(WIDEN)
    one = min(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {one})  # the evaluator's slot: one core; the child inherits it
    try:
        with CandidateProcess(tmp_path / "widen.py", timeout=20) as proc:
            for where in ("main", "thread", "fork"):
                assert proc.call("widen_from", where) == errno.EPERM, where
            assert proc.call("cpus") == [one]
    finally:
        os.sched_setaffinity(0, saved)


@pytest.mark.gpu
def test_cuda_tensors_are_shared_by_ipc(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    (tmp_path / "g.py").write_text("import torch\ndef sm(x):\n    return torch.softmax(x, dim=-1)\n")
    with CandidateProcess(tmp_path / "g.py") as proc:
        x = proc.share(torch.randn(4, 128, device="cuda"))
        out = proc.empty((4, 128), "float32", like="cuda", device=x.array.device)
        out.array.fill_(float("nan"))
        torch.cuda.synchronize()
        proc.run("sm", [isolate.Call([x], [out])])
        torch.testing.assert_close(out.array, torch.softmax(x.array, dim=-1))


def test_a_held_child_runs_no_candidate_code_until_first_used(tmp_path):
    """hold=True: an evaluator may start the child before its own imports (its start-up then
    overlaps them); the candidate's module is imported only at the first request, after the
    preloaded modules (a name that does not import is left to the candidate's own import)."""
    tmp_path.chmod(0o755)  # run as root, the child's uid must read the module
    (tmp_path / "late.py").write_text(
        "import sys, time\nLOADED = time.time()\nPRELOADED = 'colorsys' in sys.modules\n"
        "def seen():\n    return [LOADED, PRELOADED]\n"
    )
    with CandidateProcess(tmp_path / "late.py", timeout=20, hold=True, preload=["colorsys", "no_such_module_here"]) as proc:
        time.sleep(1.0)  # time enough for an unheld child to import the module
        asked = time.time()
        loaded, preloaded = proc.call("seen")
    assert loaded >= asked
    assert preloaded
    with pytest.raises(ValueError, match="preload"):
        CandidateProcess(tmp_path / "late.py", preload=["numpy; import os"])
