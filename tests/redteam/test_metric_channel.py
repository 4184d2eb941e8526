"""Red team: cheats aimed at the metric channel, through `ratchet submit` + `ratchet wait`.

Two evaluators for the same task: the plain one from test_redteam (prints `name: value`,
the documented interface, unprotected) and one that reports through `ratchet.evaluator.channel`
(the pipe only the trusted evaluator holds) and checks correctness in a child process.
Each cheat must be caught with either; an honest control is kept with either.
"""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest
from helpers import git, ratchet

from ratchet.job import sandbox
from ratchet.store.ledger import Ledger
from redteam.test_redteam import FAST_SOLUTION, cheat, judge, new_study

CHANNEL_EVALUATE = """
from ratchet.evaluator import channel  # first: claims the metric channel before any child starts

import json, os, subprocess, sys, time
clock = time.perf_counter
holdout = "--holdout" in sys.argv
if holdout:
    path = os.path.join(os.environ["RATCHET_HOLDOUT"], "holdout.json")
else:
    path = os.path.join(os.environ["RATCHET_DATA"], "public.json")
cases = json.load(open(path))
# correctness: the candidate computes in a child process
child = subprocess.run(
    [sys.executable, "-c", "import json, sys, solution\\n"
     "cases = json.load(sys.stdin)\\n"
     "print(json.dumps([solution.compute(xs) for xs in cases]))"],
    input=json.dumps(cases), capture_output=True, text=True, timeout=30)
print(child.stderr, file=sys.stderr)
try:
    answers = json.loads([x for x in child.stdout.splitlines() if x.startswith("[")][0])
except (IndexError, ValueError):
    answers = None
if answers != [sum(x * x for x in xs) for xs in cases]:
    channel.report({"correct": False})
    sys.exit(0)
# timing in this process, as many evaluators do
import solution
start = clock()
for xs in cases:
    solution.compute(xs)
elapsed = (clock() - start) * 1000
channel.report({"correct": True, "time_ms": elapsed})
"""

ATEXIT_CHEAT = FAST_SOLUTION.replace("DELAY = 0.0", "DELAY = 0.3") + """

import atexit


@atexit.register
def _claim():
    print("correct: true")
    print("time_ms: 0.0001")
"""

RESULT_FILE_CHEAT = FAST_SOLUTION.replace("DELAY = 0.0", "DELAY = 0.3") + """

import json, os

if os.environ.get("RATCHET_RESULT"):
    with open(os.environ["RATCHET_RESULT"], "w") as fh:
        json.dump({"correct": True, "time_ms": 0.0001}, fh)
"""

# In the child process the evaluator starts: find the evaluator's channel through /proc
# and write a fake report into it.
PROC_FD_CHEAT = FAST_SOLUTION.replace("DELAY = 0.0", "DELAY = 0.3") + """

import json, os


def _steal():
    parent = os.getppid()
    try:
        env = open(f"/proc/{parent}/environ", "rb").read().split(b"\\0")
    except OSError as exc:
        print("environ refused:", exc)
        env = []
    names = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"RATCHET_METRICS_FD=")]
    try:
        names += [n for n in os.listdir(f"/proc/{parent}/fd") if n not in names]
    except OSError as exc:
        print("fd listing refused:", exc)
    for fd in names:
        try:
            with open(f"/proc/{parent}/fd/{fd}", "w") as fh:
                fh.write(json.dumps({"correct": True, "time_ms": 0.0001}) + "\\n")
            print("wrote to the channel through", fd)
        except OSError as exc:
            print("refused:", fd, exc)


_steal()
"""


def channel_study(template, tmp_path):
    repo = new_study(template, tmp_path)
    (repo / "evaluate.py").write_text(textwrap.dedent(CHANNEL_EVALUATE).lstrip("\n"))
    git(repo, "commit", "-qam", "evaluator reports through the trusted channel")
    return repo


STUDIES = {"stdout": new_study, "channel": channel_study}


def shown(repo, cand_id: str) -> str:
    proc = ratchet(repo, "show", cand_id)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def result_of(repo, cand_id: str) -> dict:
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        return ledger.find(cand_id).result or {}
    finally:
        ledger.close()


@pytest.mark.parametrize("evaluator", ["stdout", "channel"])
def test_honest_control_is_kept(template, tmp_path, evaluator):
    repo = STUDIES[evaluator](template, tmp_path)
    branch = cheat(repo, "honest", {"solution.py": FAST_SOLUTION})
    cand_id = ratchet(repo, "submit", branch).stdout.strip().splitlines()[-1]
    verdict = json.loads(ratchet(repo, "wait", cand_id, "--json").stdout.splitlines()[-1])
    assert verdict["status"] == "keep", verdict
    assert result_of(repo, cand_id)["metrics_source"] == evaluator
    assert verdict["metrics_source"] == evaluator
    expected = "trusted channel" if evaluator == "channel" else "unprotected (stdout)"
    assert f"metrics from: {expected}" in shown(repo, cand_id)


@pytest.mark.parametrize("evaluator", ["stdout", "channel"])
def test_atexit_handler_printing_a_better_metric(template, tmp_path, evaluator):
    repo = STUDIES[evaluator](template, tmp_path)
    verdict = judge(repo, cheat(repo, "atexit", {"solution.py": ATEXIT_CHEAT}))
    assert verdict["status"] == "rejected", verdict
    assert "tampering" in verdict["reasons"] and "time_ms" in verdict["reasons"]
    assert verdict["reason"] == verdict["reasons"]
    assert "tampering" in shown(repo, verdict["id"])


@pytest.mark.parametrize("evaluator", ["stdout", "channel"])
def test_fake_metrics_in_the_result_file(template, tmp_path, evaluator):
    repo = STUDIES[evaluator](template, tmp_path)
    verdict = judge(repo, cheat(repo, "result-file", {"solution.py": RESULT_FILE_CHEAT}))
    assert verdict["status"] == "rejected", verdict
    assert "tampering" in verdict["reasons"] and "time_ms" in verdict["reasons"]
    if evaluator == "channel":
        assert "$RATCHET_RESULT time_ms = 0.0001 disagrees" in verdict["reasons"]


def test_result_file_is_not_in_the_run_phase_environment(template, tmp_path):
    repo = new_study(template, tmp_path)
    verdict = judge(repo, cheat(repo, "run-env", {"train.py": """
        import os, sys
        leaked = [k for k in os.environ if k in ("RATCHET_RESULT", "RATCHET_METRICS_FD")]
        print("leaked:", leaked)
        sys.exit(5 if leaked else 0)
    """, "solution.py": FAST_SOLUTION.replace("DELAY = 0.0", "DELAY = 0.3")}))
    assert verdict["status"] == "discard", verdict  # ran cleanly: nothing leaked


def test_writing_the_channel_through_proc(template, tmp_path):
    """A child of the evaluator reopens its channel via /proc/<ppid>/fd/N.

    An evaluator that is not root is non-dumpable and the open fails: as a non-root user,
    and as root wherever the machine has a PID namespace (the evaluator then runs as a uid
    of its own, issue 34). An evaluator left root (no namespace at all) passes the
    non-dumpable barrier to its child: the fake line then disagrees with the evaluator's
    own report, which is tampering.
    """
    repo = channel_study(template, tmp_path)
    verdict = judge(repo, cheat(repo, "proc-fd", {"solution.py": PROC_FD_CHEAT}))
    evaluator_is_root = os.geteuid() == 0 and sandbox.unshare_prefix() is None
    if evaluator_is_root:  # root passes the non-dumpable barrier: caught by disagreement
        assert verdict["status"] == "rejected", verdict
        assert "tampering" in verdict["reasons"], verdict
        assert "disagrees with the trusted channel" in verdict["reasons"] or \
            "twice on the trusted channel" in verdict["reasons"]
    else:  # the open itself is refused; the (slower) candidate is judged on its own
        assert verdict["status"] == "discard", verdict
        assert verdict["metric"] != 0.0001 and "tampering" not in (verdict["reasons"] or "")
        # the channel's descriptor (named in the environment) was refused; another of the
        # parent's (its /dev/null stdin, say) may take the write and carries nothing
        log = ratchet(repo, "logs", verdict["id"]).stdout
        fd = re.search(r"refused: (\d+) \[Errno 13\]", log)
        assert fd is not None and f"wrote to the channel through {fd.group(1)}\n" not in log, log
