"""One GPU kept busy: builds declared `task.build_on = "cpu"` run on CPU build slots while
other candidates hold the (one, logical) GPU slot.

Real studies through `ratchet run`, real workers; the GPU is a logical slot
(`gpus = ["0"]`): what is checked is the schedule and what each phase sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, config_text, git, make_repo, ratchet

from ratchet.core.candidate import Candidate
from ratchet.job.slots import WaitingLine
from ratchet.store.ledger import Ledger, slot_seconds, throughput

BUILD = '''
import json, os, time
import solution  # the candidate's code runs in its build
if solution.BREAK_BUILD:
    raise SystemExit("build broken on purpose")
time.sleep(1.0)
json.dump({"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "slot": os.environ.get("RATCHET_SLOT"),
           "cpus": sorted(os.sched_getaffinity(0))}, open("built.json", "w"))
'''

RUN = '''
import json, os, time
built = json.load(open("built.json"))  # the build ran first, in this same tree
time.sleep(1.0)
json.dump({"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "slot": os.environ.get("RATCHET_SLOT"), "built": built}, open("ran.json", "w"))
'''

EVALUATE = '''
from ratchet.evaluator.channel import report
import solution
report({"score": (solution.X - 1.25) ** 2 + solution.Y ** 2 + solution.Z ** 2})
'''

SOLUTION = '''
X = 3.0
# (a line apart, so that changes to two settings merge cleanly)
Y = 1.0
#
Z = 1.0
#
BREAK_BUILD = False
#
TAMPER = False
if TAMPER:  # candidate code run by the build: writes a protected file
    open("evaluate.py", "a").write("\\n# tampered\\n")
'''


def pipelined_repo(path: Path, variants: dict[str, str]) -> Path:
    """A study over git refs, one per variant of solution.py (the patches proposer)."""
    task = config_text().split("[task.metric]")[0].replace(
        'protected = ["evaluate.py"]', 'protected = ["evaluate.py", "build.py", "run.py"]'
    ) + 'build = "python build.py"\nbuild_on = "cpu"\nrun = "python run.py"\n'
    refs = ", ".join(f'"{name}"' for name in variants)
    repo = make_repo(path, {
        "ratchet.toml": config_text(
            task=task, knobs="",
            search='[search]\nproposer = "patches"\nmode = "rolling"\nparallel = 3\n'
                   f"candidates = {len(variants) + 3}\n\n[patches]\nrefs = [{refs}]\n",
            backend='[backend]\nkind = "local"\nslots = 1\ngpus = ["0"]\nbuild_slots = 2\n'),
        "solution.py": SOLUTION, "build.py": BUILD, "run.py": RUN, "evaluate.py": EVALUATE,
    })
    for name, change in variants.items():
        git(repo, "checkout", "-q", "-b", name, "main")
        text = (repo / "solution.py").read_text()
        for line in change.splitlines():
            key = line.split("=")[0].strip()
            text = "\n".join(line if ln.startswith(f"{key} =") else ln
                             for ln in text.splitlines()) + "\n"
        (repo / "solution.py").write_text(text)
        git(repo, "commit", "-qam", f"{name}: {change}")
    git(repo, "checkout", "-q", "main")
    return repo


def intervals(cand: Candidate, gpu: bool) -> list[tuple[float, float]]:
    return [(p["started_at"], p["started_at"] + p["seconds"]) for p in cand.phases or []
            if (p["name"] != "build") == gpu]


def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


def test_builds_run_on_cpu_slots_while_the_gpu_slot_runs_others(tmp_path):
    repo = pipelined_repo(tmp_path / "r", {
        "x1": "X = 1.0", "y0": "Y = 0.0", "broken": "BREAK_BUILD = True",
        "tamper": "TAMPER = True", "z0": "Z = 0.0",
    })
    proc = ratchet(repo, "run", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cands = Ledger(repo / ".ratchet" / "ledger.db").candidates()
    by_desc = {c.description.split(":")[0].removeprefix("ref "): c
               for c in cands if c.kind == "candidate"}
    assert set(by_desc) == {"x1", "y0", "broken", "tamper", "z0"}, [
        (c.id, c.status, c.description) for c in cands]

    # a broken build fails its candidate on the build slot; a build that writes a
    # protected file is caught there too, exactly as a build in the job's own slot is
    broken = by_desc["broken"]
    assert broken.status == "crash" and broken.failed_stage == "build", broken.reasons
    assert "evaluate.py" in (by_desc["tamper"].reasons or ""), by_desc["tamper"].reasons
    assert by_desc["tamper"].status in ("rejected", "failed")

    ran = [c for c in cands if c.status in ("keep", "discard")]
    assert {c.description.split(":")[0].removeprefix("ref ") for c in ran} >= {"x1", "y0", "z0"}
    assert any(c.status == "keep" and c.kind == "candidate" for c in ran)
    # work dirs of discarded candidates are cleaned up; kept ones stay (keep_workdirs)
    kept = [c for c in ran if c.status == "keep"]
    for cand in kept:
        work = repo / ".ratchet" / "jobs" / cand.job_id / "work"
        seen = json.loads((work / "ran.json").read_text())
        # the build saw no GPU and ran on a build slot; the run saw the GPU slot's device
        assert seen["built"]["cuda"] == "" and seen["built"]["slot"].startswith("build")
        assert seen["cuda"] == "0" and seen["slot"] == "gpu0"
    for cand in ran:
        assert cand.slot == "gpu0"
        build = [p for p in cand.phases if p["name"] == "build"]
        assert build and all(p["off_slot"] for p in build)
        assert not any(p["off_slot"] for p in cand.phases if p["name"] != "build")

    # one GPU slot: no two candidates' GPU phases ever overlap ...
    gpu = sorted(i for c in ran for i in intervals(c, gpu=True))
    for a, b in zip(gpu, gpu[1:], strict=False):
        assert overlap(a, b) <= 0.01, (a, b)
    # ... while builds of upcoming candidates ran during other candidates' GPU phases
    built_during_gpu = sum(
        max(0.0, overlap(b, g))
        for c in cands for b in intervals(c, gpu=False)
        for d in ran if d.id != c.id for g in intervals(d, gpu=True))
    assert built_during_gpu > 1.0, built_during_gpu

    # first built, first on the GPU: a built candidate never waits while later ones run
    turns = sorted((max(e for _, e in intervals(c, gpu=False)), min(s for s, _ in
                    intervals(c, gpu=True)), c.id) for c in ran if intervals(c, gpu=False))
    for (built_a, gpu_a, a), (built_b, gpu_b, b) in zip(turns, turns[1:], strict=False):
        if built_b - built_a > 0.2:
            assert gpu_a < gpu_b, (a, b, turns)

    # the duty cycle counts slot time only (builds excluded), over the one GPU slot
    status = json.loads(ratchet(repo, "status", "--json").stdout)
    assert 0 < status["duty_cycle"] <= 1
    assert throughput(cands, 1).busy_s == round(sum(slot_seconds(c) for c in cands), 3)
    assert all(slot_seconds(c) < (c.run_s or 0) for c in ran)


def test_waiting_line_is_first_come_first_served_and_forgets_the_dead(tmp_path):
    first = WaitingLine(tmp_path, "gpu")
    second = WaitingLine(tmp_path, "gpu")
    assert (first.ahead(), second.ahead()) == (0, 1)
    # a waiter killed while in line: its ticket's lock goes with it, and the line moves on
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT / 'src')!r}); "
            "from pathlib import Path; from ratchet.job.slots import WaitingLine; "
            f"held = WaitingLine(Path({str(tmp_path)!r}), 'gpu'); "
            "print('in line', flush=True); time.sleep(60)")
    dead = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert dead.stdout.readline().strip() == "in line"
    third = WaitingLine(tmp_path, "gpu")
    assert third.ahead() == 3
    dead.kill()
    dead.wait()
    assert third.ahead() == 2
    first.leave()
    assert (second.ahead(), third.ahead()) == (0, 1)
    second.leave()
    third.leave()
    assert not [p for p in (tmp_path / "line-gpu").iterdir()]


def test_slot_seconds_leave_out_builds_on_a_build_slot():
    cand = Candidate(id="c1", seq=1, round=1, status="keep",
                     run_s=8.0, submitted_at=0.0, finished_at=8.0,
                     phases=[{"name": "build", "seconds": 3.0, "off_slot": True},
                             {"name": "run", "seconds": 4.5},
                             {"name": "evaluate", "seconds": 0.5, "off_slot": False}])
    assert slot_seconds(cand) == 5.0
    legacy = Candidate(id="c2", seq=2, round=1, status="keep",
                       run_s=8.0, submitted_at=0.0, finished_at=8.0)
    assert slot_seconds(legacy) == 8.0  # no phase record: all of its time
    tp = throughput([cand], slots=1)
    assert tp.busy_s == 5.0 and tp.duty == 0.625
