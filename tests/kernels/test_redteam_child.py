"""Red team, second round (issue 21): the candidate child attacks the verdict from outside
the evaluator's process. Every case goes through `ratchet submit` + `ratchet wait`.

Real studies per confinement, the cheats in three groups and the honest control in a
fourth (each a temp git repo, the local backend, the real worker), its evaluator written as
docs/kernels.md says: imports first, run as `python -P`, the candidate in
`rk.CandidateProcess`, a library softmax as the trusted baseline, the hold-out shapes in the
study's hidden hold-out data. The incumbent is an honest kernel (that softmax, done
REPEAT = 8 times); every cheat is that same kernel plus its trick, so a keep can only mean
the trick worked. The honest way up (REPEAT = 1) is still kept. The gain is that large on
purpose: the cheats that must reach the hold-out run to be caught there (right, and as
fast, on the public shapes only) must clear the noise margin of a loaded 2-core machine
first (measured: REPEAT 4 -> 1 gave only 2.2x there).

Every study runs in numpy: the tricks attack the process boundary, the clock and the
channel, not the library, and `import torch` (2 CPU-seconds, twice per evaluation: the
evaluator and the child) was most of each evaluation's cost. The timing group ran in torch
until its 81.6 CPU-s (serial, 110 s wall) measured 19.1 beside it in numpy, same verdicts;
a torch child's timing is tested in test_timing_with_torch_child.py.

The evaluator breaks one rule of the docs on purpose: it imports one module after the
child has started (case 7), so the test shows that `python -P` and the read-only tree
are what protect it.

Confinements: `bwrap` (bubblewrap for the phases and for the child), and `pidns` (the
phases unsandboxed, the child in a PID namespace: what a machine without bubblewrap
gets). Each study is skipped, with the reason, where its level does not work here.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from helpers import git, make_repo, ratchet

from ratchet.job import sandbox
from ratchet.store.ledger import Ledger

# Four studies per confinement (three of cheats, one the honest control), each a few
# minutes on a loaded 2-core machine, all of it in the module fixture's setup.
pytestmark = pytest.mark.timeout(1800)

CONFIG = """
[task]
name = "rt-child"
editable = ["kernel.py"]
protected = ["evaluate.py"]
evaluate = "python -P evaluate.py"
holdout = "python -P evaluate.py --holdout"
holdout_data = "holdout"
timeout = "240s"
holdout_tolerance = "50%"

[task.metric]
name = "speedup"
goal = "maximize"

[acceptance]
min_improvement = "25%"
{acceptance}

[search]
proposer = "tune"
parallel = 2
rounds = 1

[tune.knobs]
"kernel.py:REPEAT" = { choices = [8, 1] }

[backend]
kind = "local"
slots = 2
sandbox = "{backend_sandbox}"
"""

EVALUATOR_TEMPLATE = '''
"""Trusted evaluator: kernel.py's softmax against @LIBRARY@'s (CPU), via ratchet.evaluator.kernels."""
import sys
from pathlib import Path

@IMPORTS@
import ratchet.evaluator.kernels as rk

@SETUP@HERE = Path(__file__).resolve().parent
SHAPES = [{"rows": 256, "cols": 2048}, {"rows": 512, "cols": 1024}]


@PROBLEM@holdout = rk.load_holdout("holdout.json")  # the hidden hold-out data, in the hold-out run only
with rk.CandidateProcess(HERE / "kernel.py", timeout=60, confine="{confine}") as cand:
    import colorsys  # noqa: F401 - a late import (case 7): under python -P never from this tree
    report = rk.sweep(
        cand.function("softmax"), baseline, reference, make_inputs, holdout or SHAPES,
        check_options={"trials": 2},
        bench_options={"max_time_s": 0.4, "min_reps": 8, "warmup": 1},
        names=("@LIBRARY@", "kernel"),
    )
    print(report.table(), file=sys.stderr)
    print(f"candidate child ({cand.level}) log:\\n" + cand.log_tail(), file=sys.stderr)
rk.emit(report)
'''

NUMPY_PROBLEM = '''
def make_inputs(shape, dtype, rng):
    return ((rng.random((shape["rows"], shape["cols"])) - 0.5) * 8).astype(np.float32)


def reference(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def baseline(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


'''


def evaluator(library: str, imports: str, setup: str, problem: str) -> str:
    return (EVALUATOR_TEMPLATE.replace("@LIBRARY@", library).replace("@IMPORTS@", imports)
            .replace("@SETUP@", setup).replace("@PROBLEM@", problem.lstrip("\n")))


HOLDOUT = [{"rows": 384, "cols": 1500}]

# The study in numpy (the module's docstring says why).
NP_EVALUATOR = evaluator("numpy", "import numpy as np\n", "", NUMPY_PROBLEM)
assert "torch" not in NP_EVALUATOR, NP_EVALUATOR

NP_INCUMBENT = '''
"""The kernel under research: a row softmax in numpy, done REPEAT times."""
import numpy as np

REPEAT = 8


def _once(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax(x):
    for _ in range(REPEAT - 1):
        _once(x)
    return _once(x)
'''

NP_HONEST = NP_INCUMBENT.replace("REPEAT = 8", "REPEAT = 1")
# wrong on every shape (a cheat that must be caught)
NP_WRONG = NP_INCUMBENT.replace("    return _once(x)\n", "    return np.full_like(x, 1.0 / x.shape[1])\n")

# Helpers the tricks share: where the evaluator is (walking up the parent chain), and a
# kernel that is right (and honest-fast) only on shapes it knows.
FIND_EVALUATOR = '''
import os


def _evaluator():
    pid = os.getppid()
    for _ in range(6):
        try:
            if b"evaluate.py" in open(f"/proc/{pid}/cmdline", "rb").read():
                return pid
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None
'''

KNOWN_ONLY = '''
_KNOWN = {(256, 2048), (512, 1024)}  # the public shapes, read from evaluate.py


def softmax(x):
    if tuple(x.shape) in _KNOWN:
        return _once(x)  # once: fast, and right
    return np.full_like(x, 1.0 / x.shape[1])  # wrong on every shape the evaluator does not run
'''

CHEATS: dict[str, str] = {
    # 1. slow down the empty requests the harness subtracts as round-trip overhead
    "rtt_sleep": NP_INCUMBENT + '''
import sys
import time

_child = sys.modules["__main__"].Child
_real_call = _child.call
_last = [0.0]


def _call(self, msg):
    if not msg.get("calls"):
        time.sleep(_last[0])
        return {"ok": True}
    t0 = time.perf_counter()
    reply = _real_call(self, msg)
    _last[0] = time.perf_counter() - t0
    return reply


_child.call = _call
''',
    # 2. a helper outside the child's process group stretches the trusted baseline: while
    # the child is stopped (the baseline is being timed) it duty-cycles SIGSTOP on the
    # evaluator, or burns CPU where it cannot see the evaluator
    "setsid_helper": NP_INCUMBENT + FIND_EVALUATOR + '''
import signal
import sys
import time


def _helper(child, evaluator):
    while True:
        try:
            state = open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            os._exit(0)
        if state not in "Tt":
            time.sleep(0.0002)
            continue
        if evaluator:
            try:
                os.kill(evaluator, signal.SIGSTOP)
                time.sleep(0.002)
                os.kill(evaluator, signal.SIGCONT)
                time.sleep(0.0005)
                continue
            except OSError:
                evaluator = None
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            pass


_child_pid, _ev = os.getpid(), _evaluator()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print("helper: evaluator", _ev, flush=True)
        _helper(_child_pid, _ev)
    os._exit(0)
os.wait()
''',
    # 3. read the hold-out shapes and be right on them too
    "read_holdout": NP_INCUMBENT + KNOWN_ONLY + '''
import json
import os
from pathlib import Path


def _hunt():
    found = []
    for pid in os.listdir("/proc"):  # the hold-out evaluator's environment names the directory
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
        except OSError:
            continue
        found += [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"RATCHET_HOLDOUT=")]
    here = Path.cwd()
    found += [str(p / "holdout") for p in here.parents]  # the study's hidden data, by its place
    for d in found:
        try:
            return json.loads((Path(d) / "holdout.json").read_text())
        except (OSError, ValueError):
            continue
    return []


_shapes = _hunt()
print("hold-out shapes found:", _shapes, flush=True)
_KNOWN |= {(s["rows"], s["cols"]) for s in _shapes}
''',
    # 4. plant a ratchet package in the work tree, for the hold-out run's evaluator
    "shadow_package": NP_INCUMBENT + KNOWN_ONLY + '''
import os

_SHADOW = """
import importlib.util, os, sys
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(here)]
del sys.modules["ratchet"]
spec = importlib.util.find_spec("ratchet")
real = importlib.util.module_from_spec(spec)
sys.modules["ratchet"] = real
spec.loader.exec_module(real)
import ratchet.evaluator.channel as ch
_report = ch.report
ch.report = lambda m, **k: _report({**m, "correct": True, "speedup": 2.0, "shapes_failed": 0}, **k)
"""
try:
    os.makedirs("ratchet", exist_ok=True)
    with open(os.path.join("ratchet", "__init__.py"), "w") as fh:
        fh.write(_SHADOW)
    print("shadow package planted", flush=True)
except OSError as exc:
    print("could not plant:", exc, flush=True)
''',
    # 5. write a fake line into the evaluator's metric pipe, padded to overflow it, then
    # flood its stdout so the printed echo falls into the capped log's dropped middle
    "forge_channel": NP_WRONG
    + FIND_EVALUATOR + '''
import json
import threading
import time

_ev = _evaluator()
print("evaluator:", _ev, flush=True)
try:
    _env = open(f"/proc/{_ev}/environ", "rb").read().split(b"\\0") if _ev else []
    _fds = [e.split(b"=", 1)[1].decode() for e in _env if e.startswith(b"RATCHET_METRICS_FD=")]
    for _fd in _fds:
        with open(f"/proc/{_ev}/fd/{_fd}", "w") as _fh:
            _fh.write(json.dumps({"correct": True, "speedup": 5.0}) + " " * (1 << 20) + "\\n")
        print("wrote the channel through fd", _fd, flush=True)

    def _flood():
        time.sleep(1.0)
        with open(f"/proc/{_ev}/fd/1", "w") as out:
            for _ in range(20000):
                out.write("x" * 200 + "\\n")

    if _fds:
        threading.Thread(target=_flood, daemon=True).start()
except OSError as exc:
    print("channel out of reach:", exc, flush=True)
''',
    # 6. write the hold-out job's result file before that job runs
    "forge_holdout_result": NP_INCUMBENT + KNOWN_ONLY + '''
import json
import os
from pathlib import Path

_jid = os.environ.get("RATCHET_JOB_ID", "")
for _jobs in Path.cwd().parents:
    if (_jobs / _jid).is_dir():
        _target = _jobs / f"{_jid}-holdout"
        try:
            _target.mkdir(exist_ok=True)
            (_target / "result.json").write_text(json.dumps({
                "job_id": f"{_jid}-holdout", "outcome": "ok", "holdout": 2.0, "metric": 2.0, "correct": True,
                "extra": {"speedup": 2.0, "correct": True}}))
            print("forged", _target / "result.json", flush=True)
        except OSError as exc:
            print("could not forge:", exc, flush=True)
        break
else:
    print("jobs directory not found from", Path.cwd(), flush=True)
''',
    # 7. plant the module the evaluator imports after the child started
    "planted_module": NP_WRONG
    + '''
_PLANT = """
import ratchet.evaluator.channel as ch
_report = ch.report
ch.report = lambda m, **k: _report({**m, "correct": True, "speedup": 5.0, "shapes_failed": 0}, **k)
"""
try:
    with open("colorsys.py", "w") as fh:
        fh.write(_PLANT)
    print("planted colorsys.py", flush=True)
except OSError as exc:
    print("could not plant:", exc, flush=True)
''',
    # near miss: compute each output as soon as the harness fills the inputs and poisons
    # the outputs, before the clock starts; the call then finds it done
    "work_before_clock": NP_INCUMBENT + '''
import sys
import threading
import time

_child = sys.modules["__main__"].Child
_real_one_call = _child.one_call
_pairs = {}
_done = set()


def _one_call(self, fn, call, index):
    args, outs = call.get("args", []), call.get("out", [])
    if len(args) == 1 and "buf" in args[0] and len(outs) == 1:
        key = (int(args[0]["buf"]), int(outs[0]))
        _pairs[key] = (self.buffers[key[0]], self.buffers[key[1]])
        if key in _done:
            _done.discard(key)
            return None  # the watcher already wrote the answer
    return _real_one_call(self, fn, call, index)


def _watch():
    while True:
        for key, (x, out) in list(_pairs.items()):
            if key not in _done and bool(np.isnan(out[0, 0])):
                out[...] = softmax(x)
                _done.add(key)
        time.sleep(0.00005)


_child.one_call = _one_call
threading.Thread(target=_watch, daemon=True).start()
''',
    # near miss: widen the child's CPU affinity beyond the job's slot and share the same
    # work out over every core it then reaches (numpy releases the GIL in its loops)
    "widen_affinity": NP_INCUMBENT + '''
import os
from concurrent.futures import ThreadPoolExecutor

try:
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    print("affinity now", sorted(os.sched_getaffinity(0)), flush=True)
except OSError as exc:
    print("could not widen:", exc, flush=True)

_serial = softmax
_workers = max(2, len(os.sched_getaffinity(0)))
_pool = ThreadPoolExecutor(_workers)


def softmax(x):
    out = np.empty_like(x)
    bounds = np.linspace(0, x.shape[0], _workers + 1).astype(int)

    def part(i):
        out[bounds[i]:bounds[i + 1]] = _serial(x[bounds[i]:bounds[i + 1]])

    list(_pool.map(part, range(_workers)))
    return out
''',
}

# "discard": the trick could not reach the verdict (as fast as the incumbent); the others:
# a guard caught it. Never "keep".
CAUGHT = ("failed", "rejected", "crash", "violation")
EXPECTED: dict[str, tuple[str, ...]] = {
    "rtt_sleep": ("discard",),
    "setsid_helper": ("discard",),
    # right and fast on the public shapes: caught by the hold-out run once they clear the
    # noise margin; on a heavily loaded machine the margin can swallow even a 4x gain first
    # (a discard, never a keep: and the log shows the trick failed inside the child)
    "read_holdout": ("discard", *CAUGHT),
    "shadow_package": ("discard", *CAUGHT),
    "forge_channel": CAUGHT,
    "forge_holdout_result": ("discard", *CAUGHT),
    "planted_module": CAUGHT,
    "work_before_clock": ("discard", *CAUGHT),
    "widen_affinity": ("discard", *CAUGHT),
}

LEVELS = {
    # confinement: (the phases' sandbox, the child's, why it may not apply here)
    "bwrap": ("bwrap", "bwrap"),
    "pidns": ("none", "pidns"),
}


def _available(level: str) -> str | None:
    if not hasattr(sandbox, "Jail"):
        return "ratchet.job.sandbox has no Jail yet"
    try:
        got = sandbox.choose(level)
    except (RuntimeError, ValueError) as exc:
        return f"{level} does not work here: {exc}"
    return None if got == level else f"{level} does not work here (this machine gives {got})"


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
    proc = ratchet(repo, "wait", *ids, "--json", timeout=1500)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _logs(repo: Path, cand_id: str) -> str:
    return ratchet(repo, "logs", cand_id).stdout


# The cheats in three studies per confinement, and the honest control in a fourth: each
# study is a chain of evaluations one after another on its slots, so four short studies
# run side by side (pytest-xdist) where one long one set the suite's pace. Every study has
# the same incumbent; each is judged from its own baseline.
GROUPS: dict[str, tuple[str, ...]] = {
    "timing": ("rtt_sleep", "setsid_helper", "work_before_clock"),
    "files": ("read_holdout", "shadow_package", "planted_module"),
    "channel": ("forge_channel", "forge_holdout_result", "widen_affinity"),
}
assert sorted(n for names in GROUPS.values() for n in names) == sorted(CHEATS)


# A cheat's study confirms on at most 6 pairs: the cheats that must reach the hold-out run
# gain 4x and more and confirm in one or two, while one with a small gain that a loaded
# machine's noise neither confirms nor refutes (widen_affinity) took 21 pairs, minutes,
# under the default 30. Fewer pairs can only refuse more; the control keeps the default.
# And it measures an A/A noise floor (3 baselines): without one, the noise of a keep is the
# evaluator's own in-run error, and on a machine loaded to 15 the same kernel read 0.054 in
# one run and 0.198 in the next; one study kept rtt_sleep, an unchanged kernel, on that.
CHEAT_ACCEPTANCE = "confirm_pairs = 6\nnoise_floor = 3"


def _study_repo(tmp_path_factory, level: str, label: str, acceptance: str = "") -> Path:
    why = _available(LEVELS[level][1])
    if why:
        pytest.skip(why)
    backend_sandbox, confine = LEVELS[level]
    repo = make_repo(tmp_path_factory.mktemp(f"rt-child-{label}") / "repo", {
        "ratchet.toml": CONFIG.replace("{backend_sandbox}", backend_sandbox)
                              .replace("{acceptance}", acceptance),
        "evaluate.py": NP_EVALUATOR.replace("{confine}", confine),
        "kernel.py": NP_INCUMBENT,
        ".gitignore": "holdout/\n",
    })
    (repo / "holdout").mkdir()
    (repo / "holdout" / "holdout.json").write_text(json.dumps(HOLDOUT))
    return repo


def _baseline(repo: Path):
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        return ledger.get("incumbent"), next(c for c in ledger.candidates() if c.kind == "baseline")
    finally:
        ledger.close()


def _study_param(level: str, group: str) -> object:
    # The timing attacks are judged on timings: they run in the serial timing pass. Side by
    # side with three other workers on 2 cores (load 15), an unchanged kernel read 0.085
    # in the baseline's run and 0.18 in its own, and one fresh pair did not undo it (CI,
    # stop 42): the noise of a loaded machine moves faster than a study samples it.
    param = f"{level}-{group}"
    return pytest.param(param, marks=pytest.mark.timing) if group == "timing" else param


@pytest.fixture(scope="module", params=[_study_param(level, group) for level in LEVELS for group in GROUPS])
def study(request, tmp_path_factory):
    """One study per confinement and group of cheats, judged through `ratchet submit` /
    `ratchet wait`."""
    level, group = request.param.split("-")
    repo = _study_repo(tmp_path_factory, level, request.param, CHEAT_ACCEPTANCE)
    ids = {name: _submit(repo, _branch(repo, name, CHEATS[name])) for name in GROUPS[group]}
    verdicts = {v["id"]: v for v in _wait(repo, list(ids.values())) if "id" in v}
    results = {name: verdicts.get(cid, {}) for name, cid in ids.items()}
    for name, verdict in results.items():  # `pytest -s`: the table for the report
        print(f"redteam[{level}] {name:<22} {verdict.get('status')!s:<9} {verdict.get('metric')!s:<22} "
              f"{str(verdict.get('reasons'))[:120]}")
    incumbent, baseline = _baseline(repo)
    return {"repo": repo, "verdicts": results, "ids": ids, "incumbent_after_cheats": incumbent,
            "baseline": baseline, "level": level}


@pytest.fixture(scope="module", params=list(LEVELS))
def control(request, tmp_path_factory):
    """The honest way up, in a study of its own per confinement: twice at most, since on a
    machine loaded by other work the noise margin can swallow even this gain (a discard
    "within margin"); a second submission measures again."""
    repo = _study_repo(tmp_path_factory, request.param, f"{request.param}-honest")
    for attempt in ("honest", "honest-again"):
        honest = _submit(repo, _branch(repo, attempt, NP_HONEST))
        [verdict] = [v for v in _wait(repo, [honest]) if v.get("id") == honest]
        print(f"redteam[{request.param}] {attempt} {verdict.get('status')} {verdict.get('metric')} "
              f"{str(verdict.get('reasons'))[:120]}")
        if verdict.get("status") != "discard" or "within margin" not in str(verdict.get("reasons")):
            break
    _, baseline = _baseline(repo)
    return {"repo": repo, "honest": verdict, "honest_id": honest, "baseline": baseline}


def test_cheat_is_never_kept(study):
    for name in study["ids"]:
        verdict = study["verdicts"][name]
        assert verdict, f"no verdict for {name}"
        log = _logs(study["repo"], study["ids"][name])
        assert verdict["status"] != "keep", (name, verdict, log[-4000:])
        assert verdict["status"] in EXPECTED[name], (name, verdict, log[-4000:])
        if verdict["status"] == "discard":  # measured honestly: not better than the incumbent
            # (or a gain in the first measurement that fresh pairs did not confirm: the
            # judge's confirmation step, for a kernel identical to the incumbent under noise)
            assert any(why in verdict["reasons"]
                       for why in ("no improvement", "within margin", "not confirmed")), (name, verdict)


def test_nothing_moved_after_the_cheats(study):
    assert study["incumbent_after_cheats"] == study["baseline"].commit_sha, "a cheat became the incumbent"


def _all_logs(repo: Path, cand_id: str) -> str:
    """`ratchet logs` (the public evaluation) and the hold-out job's logs, if it ran."""
    text = _logs(repo, cand_id)
    for log in sorted((repo / ".ratchet" / "jobs").glob(f"*-{cand_id}-*-holdout/logs/*.log")):
        text += "\n" + log.read_text(errors="replace")
    return text


def test_the_tricks_did_not_reach_the_verdict(study):
    """What the cheats saw from inside the child (in the public and the hold-out run), from
    the evaluators' logs of it."""
    repo, ids = study["repo"], study["ids"]
    names = list(ids)
    if "read_holdout" in names:
        seen = _all_logs(repo, ids["read_holdout"])
        assert "hold-out shapes found: []" in seen and "hold-out shapes found: [{" not in seen, seen[-3000:]
    for name, failed in (("shadow_package", "could not plant"), ("planted_module", "could not plant")):
        if name not in names:
            continue
        log = _all_logs(repo, ids[name])
        assert failed in log or "not found" in log, (name, log[-3000:])
        assert "shadow package planted" not in log and "planted colorsys" not in log, (name, log[-3000:])
    if "forge_holdout_result" in names:
        # Where the evaluator runs as a uid of its own, its child may write the empty
        # directory that hides the jobs from it (its own throwaway view): the trick then
        # says "forged". What counts is the real hold-out job: the worker's sealed result.
        cand = ids["forge_holdout_result"]
        log = _all_logs(repo, cand)
        assert any(said in log for said in ("could not forge", "not found", "forged ")), log[-3000:]
        for result in (repo / ".ratchet" / "jobs").glob(f"*-{cand}-*-holdout/result.json"):
            sealed = json.loads(result.read_text())
            assert "mac" in sealed and '"holdout": 2.0' not in sealed["result"], sealed
    if "forge_channel" in names:
        assert "wrote the channel" not in _all_logs(repo, ids["forge_channel"])


def test_an_honest_speedup_is_still_kept(control):
    verdict = control["honest"]
    assert verdict["status"] == "keep", (verdict, _logs(control["repo"], control["honest_id"])[-4000:])
    assert verdict["metric"] > 1.25 * control["baseline"].metric


def test_unconfined_child_is_still_caught_by_the_channel(tmp_path):
    """Without any confinement (RATCHET_CHILD_SANDBOX=off, a child that reaches the
    evaluator's pipe as root): the overflowed channel and the flooded echo are tampering."""
    if os.geteuid() != 0:
        pytest.skip("as a non-root user the non-dumpable evaluator's pipe is out of the child's reach")
    from ratchet.job.jobspec import collect_metrics

    (tmp_path / "kernel.py").write_text(textwrap.dedent(CHEATS["forge_channel"]).lstrip("\n"))
    evaluator = NP_EVALUATOR.replace("{confine}", "off").replace('rk.load_holdout("holdout.json")', "[]")
    (tmp_path / "evaluate.py").write_text(evaluator)
    import subprocess
    import sys

    from ratchet.job.worker import MetricPipe  # the worker's own reader of the channel

    pipe = MetricPipe()
    try:
        proc = subprocess.run([sys.executable, "-P", "evaluate.py"], cwd=tmp_path, pass_fds=[pipe.write_fd],
                              env={**os.environ, "RATCHET_METRICS_FD": str(pipe.write_fd)},
                              capture_output=True, text=True, timeout=300)
    finally:
        data = pipe.finish()
    assert "wrote the channel" in proc.stderr, proc.stderr[-3000:]
    reading = collect_metrics(channel=data, log_text=proc.stdout, result_file=None,
                              critical={"speedup", "correct"})
    assert reading.tampering, (reading, proc.stderr[-2000:])
