"""Red team: known cheats run through the real loop; none is ever kept.

One small task stands in for both kinds of research: `solution.py` (editable) computes
sums of squares, slowly; `train.py` (editable) is the candidate's own `run` phase; the
protected evaluator checks correctness on prepared public data and times the solution;
the hold-out evaluator uses data in a directory only it can see. Each cheat is a commit
submitted with `ratchet submit` and judged with `ratchet wait`, exactly as an agent
would; if a guard failed, the cheat would look like an improvement and be kept.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import textwrap
from pathlib import Path

import pytest
from helpers import git, make_repo, ratchet

from ratchet.core.vocab import Status
from ratchet.job import sandbox
from ratchet.store.ledger import Ledger


def blocked(reasons: str) -> bool:
    """The write failed: a read-only mount, or (root) the candidate's unprivileged uid."""
    return any(why in reasons for why in ("Read-only file system", "Permission denied"))


needs_sandbox = pytest.mark.skipif(not sandbox.bwrap_works(),
                                   reason="bubblewrap not available (apt-get install bubblewrap)")

CONFIG = """
[task]
name = "redteam"
editable = ["solution.py", "train.py", "lib/**"]
protected = ["evaluate.py", "prepare.py"]
run = "python train.py"
evaluate = "python evaluate.py"
holdout = "python evaluate.py --holdout"
holdout_data = "{holdout}"
timeout = "60s"
forbid = ['import\\s+ctypes']

[task.metric]
name = "time_ms"
goal = "minimize"

[acceptance]
min_improvement = "5%"

[prep]
run = "python prepare.py"

[search]
proposer = "tune"
parallel = 2
rounds = 1

[tune.knobs]
"solution.py:DELAY" = {{ choices = [0.2, 0.1] }}

[backend]
kind = "local"
slots = 2
sandbox = "{sandbox}"
"""

PREPARE = """
import json, os, random
rng = random.Random(1)
data = [[rng.randint(-50, 50) for _ in range(rng.randint(5, 40))] for _ in range(20)]
with open(os.path.join(os.environ["RATCHET_DATA"], "public.json"), "w") as fh:
    json.dump(data, fh)
"""

EVALUATE = """
import json, os, sys, time
clock = time.perf_counter
holdout = "--holdout" in sys.argv
if holdout:
    path = os.path.join(os.environ["RATCHET_HOLDOUT"], "holdout.json")
else:
    path = os.path.join(os.environ["RATCHET_DATA"], "public.json")
cases = json.load(open(path))
import solution
start = clock()
for xs in cases:
    if solution.compute(xs) != sum(x * x for x in xs):
        print("correct: false")
        sys.exit(0)
elapsed = (clock() - start) * 1000
print("correct: true")
print(f"time_ms: {elapsed:.3f}")
"""

SOLUTION = """
import time

DELAY = 0.2  # the honest way to improve is to lower this


def compute(xs):
    time.sleep(DELAY / 20)
    return sum(x * x for x in xs)
"""

FAST_SOLUTION = SOLUTION.replace("DELAY = 0.2", "DELAY = 0.0")


def new_study(template, tmp_path, sandbox_mode="auto") -> Path:
    _, holdout = template
    repo = make_repo(tmp_path / "repo", {
        "ratchet.toml": CONFIG.format(holdout=holdout, sandbox=sandbox_mode),
        "prepare.py": PREPARE,
        "evaluate.py": EVALUATE,
        "solution.py": SOLUTION,
        "train.py": "print('training…')\n",
    })
    return repo


def cheat(repo: Path, name: str, files: dict[str, str | None], symlinks=None) -> str:
    """Commit a cheat on a branch off main; return the branch name."""
    git(repo, "checkout", "-q", "-B", name, "main")
    for rel, text in files.items():
        path = repo / rel
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    for rel, target in (symlinks or {}).items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        path.symlink_to(target)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"cheat: {name}")
    git(repo, "checkout", "-q", "main")
    return name


def judge(repo: Path, branch: str) -> dict:
    main_before = git(repo, "rev-parse", "main")
    proc = ratchet(repo, "submit", branch)
    assert proc.returncode == 0, proc.stderr
    cand_id = proc.stdout.strip().splitlines()[-1]
    proc = ratchet(repo, "wait", cand_id, "--json")
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    incumbent = ledger.get("incumbent")
    baseline = [c for c in ledger.candidates() if c.kind == "baseline"][0]
    ledger.close()
    # the incumbent never moves and the user's branch is untouched
    assert incumbent == baseline.commit_sha, "the incumbent moved"
    assert git(repo, "rev-parse", "ratchet/redteam") == baseline.commit_sha
    assert git(repo, "rev-parse", "main") == main_before
    assert verdict["status"] != "keep", verdict
    return verdict


def logs(repo: Path, cand_id: str) -> str:
    return ratchet(repo, "logs", cand_id).stdout


def test_honest_improvement_is_kept(template, tmp_path):
    """The control: without a guard to trip, the same task does keep a real gain."""
    repo = new_study(template, tmp_path)
    branch = cheat(repo, "honest", {"solution.py": FAST_SOLUTION})
    proc = ratchet(repo, "submit", branch)
    cand_id = proc.stdout.strip().splitlines()[-1]
    verdict = json.loads(ratchet(repo, "wait", cand_id, "--json").stdout.splitlines()[-1])
    assert verdict["status"] == "keep", verdict
    assert git(repo, "rev-parse", "ratchet/redteam") == git(repo, "rev-parse", "honest")


def test_editing_the_evaluator(template, tmp_path):
    repo = new_study(template, tmp_path)
    branch = cheat(repo, "edit-eval", {"evaluate.py": "print('correct: true')\nprint('time_ms: 0.001')\n"})
    verdict = judge(repo, branch)
    assert verdict["status"] == "rejected"
    assert "touches protected path evaluate.py" in verdict["reasons"]


def test_editing_the_evaluator_via_a_symlink(template, tmp_path):
    repo = new_study(template, tmp_path)
    branch = cheat(repo, "symlink", {"solution.py": FAST_SOLUTION},
                   symlinks={"lib/evaluate.py": "../evaluate.py"})
    verdict = judge(repo, branch)
    assert verdict["status"] == "rejected"
    assert "lib/evaluate.py is a symlink" in verdict["reasons"]


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_rewriting_the_evaluator_at_run_time(template, tmp_path, mode):
    repo = new_study(template, tmp_path, mode)
    branch = cheat(repo, "rewrite", {"train.py": """
        fake = "print('correct: true')\\nprint('time_ms: 0.001')\\n"
        try:
            open("evaluate.py", "w").write(fake)
        except OSError as exc:
            print("could not rewrite:", exc)
    """})
    verdict = judge(repo, branch)
    assert verdict["status"] == "rejected"
    assert "protected file evaluate.py was modified" in verdict["reasons"]


def test_printing_a_fake_metric_from_run(template, tmp_path):
    repo = new_study(template, tmp_path)
    branch = cheat(repo, "fake-metric", {"train.py": """
        print("correct: true")
        print("time_ms: 0.0001")
    """, "solution.py": SOLUTION.replace("DELAY = 0.2", "DELAY = 0.3")})
    verdict = judge(repo, branch)
    # the fake line is ignored: the metric is the evaluator's, and it is worse (the
    # cheat is genuinely slower, so timing noise cannot make it win)
    assert verdict["status"] == "discard"
    assert verdict["metric"] > 100
    assert "no improvement" in verdict["reasons"]


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_writing_the_prepared_data(template, tmp_path, mode):
    repo = new_study(template, tmp_path, mode)
    branch = cheat(repo, "poison-data", {"train.py": """
        import json, os
        path = os.path.join(os.environ["RATCHET_DATA"], "public.json")
        os.chmod(path, 0o644)  # read-only does not stop root
        json.dump([[1]], open(path, "w"))
    """, "solution.py": FAST_SOLUTION})
    verdict = judge(repo, branch)
    assert verdict["status"] in ("rejected", "crash")
    if mode == "none" or not sandbox.bwrap_works():
        assert "prepared data ($RATCHET_DATA) was modified" in verdict["reasons"]
    else:
        assert blocked(verdict["reasons"]), verdict["reasons"]


@needs_sandbox
def test_writing_results_tsv_or_the_ledger_is_impossible(template, tmp_path):
    repo = new_study(template, tmp_path)
    branch = cheat(repo, "ledger", {"train.py": """
        import os, sqlite3
        repo = os.path.abspath(os.path.join(os.environ["RATCHET_WORKDIR"], *[".."] * 4))
        open(os.path.join(repo, "results.tsv"), "a").write("deadbee\\t0.0\\t0.0\\tkeep\\tfake\\n")
    """, "solution.py": FAST_SOLUTION})
    verdict = judge(repo, branch)
    assert verdict["status"] == "crash"
    assert blocked(verdict["reasons"]), verdict["reasons"]
    assert "deadbee" not in (repo / "results.tsv").read_text().split()


def test_ledger_tampering_without_sandbox_is_undone_and_rejected(template, tmp_path):
    repo = new_study(template, tmp_path, "none")
    branch = cheat(repo, "ledger-nosandbox", {"train.py": """
        import json, os, sqlite3, subprocess
        repo = os.path.abspath(os.path.join(os.environ["RATCHET_WORKDIR"], *[".."] * 4))
        me = subprocess.run(["git", "-C", repo, "rev-parse", "refs/ratchet/redteam/"
                             + os.environ["RATCHET_CANDIDATE"]], capture_output=True,
                            text=True).stdout.strip()
        db = sqlite3.connect(os.path.join(repo, ".ratchet", "ledger.db"))
        db.execute("UPDATE meta SET value = ? WHERE key = 'incumbent'", (json.dumps(me),))
        db.execute("UPDATE meta SET value = '0.0001' WHERE key = 'incumbent_metric'")
        db.commit()
        subprocess.run(["git", "-C", repo, "update-ref", "refs/heads/ratchet/redteam", me])
    """})
    verdict = judge(repo, branch)
    assert verdict["status"] == "rejected"
    assert "tampering" in verdict["reasons"]
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    assert ledger.get("incumbent_metric") > 100


def test_a_plant_between_the_starts_two_checks_is_undone_not_a_refusal(template, tmp_path):
    """`ratchet wait` after `submit` checks the state (`verify_state`), then the branch
    (`repair_branch`). An unsandboxed candidate running since `submit` can plant itself
    as the ledger's incumbent between the two, as the cheat above does: the second check
    undoes it as the first would (the last keep restored, the planter rejected). It once
    refused to start instead ("the state was tampered with"), seen on a loaded machine."""
    from ratchet.driver.study import Study

    repo = new_study(template, tmp_path, "none")
    branch = cheat(repo, "plant-late", {"solution.py": FAST_SOLUTION})
    proc = ratchet(repo, "submit", branch)
    assert proc.returncode == 0, proc.stderr
    cand_id = proc.stdout.strip().splitlines()[-1]
    with Study(repo) as study:
        baseline = study.ledger.study().incumbent.commit
        planted = study.ledger.candidate(cand_id).commit_sha
        # the plant lands after the first check looked: written as the candidate writes it
        db = sqlite3.connect(repo / ".ratchet" / "ledger.db")
        db.execute("UPDATE meta SET value = ? WHERE key = 'incumbent'", (json.dumps(planted),))
        db.commit()
        db.close()
        assert study.guard.repair_branch()  # undone: True, no IntegrityError
        assert study.ledger.study().incumbent.commit == baseline
        cand = study.ledger.candidate(cand_id)
        assert cand.status == Status.REJECTED and "tampering" in cand.reasons
    assert git(repo, "rev-parse", "ratchet/redteam") == baseline
    proc = ratchet(repo, "wait", cand_id, "--json")  # the study goes on
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "rejected"


@needs_sandbox
def test_reading_the_holdout_data_from_run(template, tmp_path):
    _, holdout = template
    repo = new_study(template, tmp_path)
    branch = cheat(repo, "peek", {"train.py": f"""
        import shutil
        shutil.copy("{holdout}/holdout.json", "stolen.json")
    """, "solution.py": FAST_SOLUTION})
    verdict = judge(repo, branch)
    assert verdict["status"] == "crash"
    assert "No such file or directory" in verdict["reasons"]


def test_hard_coding_the_public_cases_fails_the_holdout(template, tmp_path):
    repo = new_study(template, tmp_path)
    # answers the public cases from a table built from the public data; wrong elsewhere
    branch = cheat(repo, "hardcode", {"solution.py": """
        import json, os
        DELAY = 0.0
        _TABLE = {tuple(xs): sum(x * x for x in xs) for xs in
                  json.load(open(os.path.join(os.environ["RATCHET_DATA"], "public.json")))}


        def compute(xs):
            return _TABLE.get(tuple(xs), 0)
    """})
    verdict = judge(repo, branch)
    assert verdict["status"] == "rejected"
    assert "overfit" in verdict["reasons"] and "correct: false" in verdict["reasons"]


def test_a_module_planted_during_the_public_evaluation_never_reaches_the_holdout(
        template, tmp_path):
    """Issue 21, case 4: while the public evaluator runs it, the candidate writes a module
    into its tree that the hold-out evaluator would import first (here `json.py`, which
    fakes a perfect hold-out). The hold-out job starts from the commit's files, so it is
    never there; the kernel, wrong on the hold-out's [2] * 33, is caught."""
    repo = new_study(template, tmp_path)
    branch = cheat(repo, "plant", {"solution.py": """
        import os, sys
        DELAY = 0.0
        if "--holdout" not in sys.argv:
            open("json.py", "w").write(
                "import sys\\nprint('correct: true')\\nprint('time_ms: 0.001')\\nsys.exit(0)\\n")


        def compute(xs):
            return 0 if xs == [2] * 33 else sum(x * x for x in xs)
    """})
    verdict = judge(repo, branch)
    assert verdict["status"] == "rejected", verdict
    assert "correct: false" in verdict["reasons"], verdict["reasons"]


def test_a_forbidden_pattern(template, tmp_path):
    repo = new_study(template, tmp_path)
    branch = cheat(repo, "ctypes", {"solution.py": "import ctypes\n" + FAST_SOLUTION})
    verdict = judge(repo, branch)
    assert verdict["status"] == "rejected"
    assert "matches forbid rule" in verdict["reasons"] and "import ctypes" in verdict["reasons"]


def test_reading_an_api_key_finds_none(template, tmp_path, monkeypatch):
    repo = new_study(template, tmp_path)
    branch = cheat(repo, "steal-key", {"train.py": """
        import os, sys
        keys = {k: v for k, v in os.environ.items() if "KEY" in k or "TOKEN" in k}
        print("found:", keys)
        sys.exit(0 if keys else 3)
    """, "solution.py": FAST_SOLUTION})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-secret")
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    verdict = judge(repo, branch)
    assert verdict["status"] == "crash"
    assert "exit code 3" in verdict["reasons"]
    assert "secret" not in logs(repo, verdict["id"])


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_moving_the_study_branch_from_inside(template, tmp_path, mode):
    repo = new_study(template, tmp_path, mode)
    branch = cheat(repo, "move-ref", {"train.py": """
        import os, subprocess
        repo = os.path.abspath(os.path.join(os.environ["RATCHET_WORKDIR"], *[".."] * 4))
        me = "refs/ratchet/redteam/" + os.environ["RATCHET_CANDIDATE"]
        for ref in ("refs/heads/ratchet/redteam", "refs/ratchet/redteam/c0000"):
            done = subprocess.run(["git", "-C", repo, "update-ref", ref, me])
            print("update-ref", ref, "exit", done.returncode, flush=True)
    """, "solution.py": SOLUTION.replace("DELAY = 0.2", "DELAY = 0.3")})
    verdict = judge(repo, branch)
    assert verdict["status"] in ("rejected", "discard")
    # Unsandboxed, the candidate moves the refs where its uid reaches the repository: the
    # move is then tampering. From a checkout under a private (0700) directory its own uid
    # cannot: the move fails, and it is judged on its score.
    moved = "exit 0" in logs(repo, verdict["id"])
    reachable = all(parent.stat().st_mode & 0o001 for parent in repo.resolve().parents)
    if mode == "none" and reachable:
        assert moved, logs(repo, verdict["id"])[-2000:]
    if moved:
        assert verdict["status"] == "rejected"
        assert "tampering" in verdict["reasons"]


def test_editing_ratchet_toml_to_flip_the_goal(template, tmp_path):
    repo = new_study(template, tmp_path)
    flipped = (repo / "ratchet.toml").read_text().replace('goal = "minimize"', 'goal = "maximize"')
    branch = cheat(repo, "flip", {"ratchet.toml": flipped,
                                  "solution.py": SOLUTION.replace("DELAY = 0.2", "DELAY = 2.0")})
    verdict = judge(repo, branch)
    assert verdict["status"] == "rejected"
    assert "touches protected path ratchet.toml" in verdict["reasons"]


def test_flipping_the_goal_at_run_time(template, tmp_path):
    repo = new_study(template, tmp_path, "none")
    branch = cheat(repo, "flip-runtime", {"train.py": """
        text = open("ratchet.toml").read().replace('"minimize"', '"maximize"')
        open("ratchet.toml", "w").write(text)
    """, "solution.py": SOLUTION.replace("DELAY = 0.2", "DELAY = 2.0")})
    verdict = judge(repo, branch)
    assert verdict["status"] == "rejected"
    assert "protected file ratchet.toml was modified" in verdict["reasons"]


def test_cleanup_template(template):
    shutil.rmtree(template[0], ignore_errors=True)
