"""The worker contains what a candidate does: timeouts kill trees, secrets never leak."""

import os
import time
import uuid
from pathlib import Path

import psutil
from helpers import config_text, git, make_repo, ratchet, results_tsv

from ratchet.store.ledger import Ledger


def processes_with(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(token in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def single_candidate_repo(path, solution: str, evaluate: str, **config):
    """A repo whose one tune candidate flips MODE from 'base' to 'cand'."""
    overrides = {
        "knobs": '[tune.knobs]\n"solution.py:MODE" = { choices = ["cand"] }\n',
        "search": "[search]\nparallel = 2\nrounds = 1\n",
        **config,
    }
    return make_repo(path, {
        "ratchet.toml": config_text(**overrides),
        "solution.py": "MODE = 'base'\n" + solution,
        "evaluate.py": evaluate,
    })


def test_timeout_kills_the_whole_process_tree(tmp_path):
    token = f"ratchet-test-{uuid.uuid4().hex}"
    solution = f'''
import os, subprocess, sys, time
def run():
    if MODE == "base":
        return 1.0
    # a child, a grandchild in its own session (escapes the process group), then hang
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{token}"])
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{token}"],
                     start_new_session=True)
    time.sleep(600)
'''
    evaluate = "import solution\nprint(f'score: {solution.run()}')\n"
    repo = single_candidate_repo(tmp_path / "r", solution, evaluate,
                                 task=config_text().split("[task.metric]")[0].replace(
                                     'timeout = "60s"', 'timeout = "3s"'))
    started = time.monotonic()
    proc = ratchet(repo, "run", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 60
    cand = Ledger(repo / ".ratchet" / "ledger.db").candidates()[1]
    assert cand.status == "crash"
    assert "timed out" in cand.reasons and "process tree killed" in cand.reasons
    time.sleep(0.5)
    assert processes_with(token) == []


def test_secrets_never_reach_candidate_processes(tmp_path):
    solution = '''
import os
def run():
    with open("env.txt", "a") as fh:  # the job's own directory: the only writable one
        for key in sorted(os.environ):
            fh.write(key + "=" + os.environ[key] + "\\n")
    return 2.0 if MODE == "base" else 1.0
'''
    evaluate = "import solution\nprint(f'score: {solution.run()}')\n"
    task = config_text().split("[task.metric]")[0] + 'env = ["ALLOWED_SETTING"]\n'
    repo = single_candidate_repo(tmp_path / "r", solution, evaluate, task=task)
    secrets = {
        "OPENAI_API_KEY": "sk-should-not-leak",
        "ANTHROPIC_API_KEY": "sk-ant-should-not-leak",
        "GITHUB_TOKEN": "ghp-should-not-leak",
        "AWS_SECRET_ACCESS_KEY": "aws-should-not-leak",
        "SOME_RANDOM_VARIABLE": "not-allow-listed",
        "ALLOWED_SETTING": "visible",
    }
    proc = ratchet(repo, "run", env=secrets)
    assert proc.returncode == 0, proc.stderr
    jobs = repo / ".ratchet" / "jobs"
    seen = "".join(p.read_text() for p in jobs.glob("*/work/env.txt"))
    # every evaluation's environment: the baseline, the candidate, any confirmation pairs
    assert seen.count("RATCHET_CANDIDATE=") == len(list(jobs.glob("*/work/env.txt"))) >= 2
    for key, value in secrets.items():
        if key == "ALLOWED_SETTING":
            assert f"{key}=visible" in seen
        else:
            assert value not in seen, key
    assert "RATCHET_CANDIDATE=" in seen and "PATH=" in seen


def test_huge_output_is_capped_and_the_job_finishes(tmp_path):
    solution = '''
import sys
def run():
    if MODE == "cand":
        chunk = "x" * 65536 + "\\n"
        for _ in range(2000):  # ~128 MiB of output
            sys.stdout.write(chunk)
    return 2.0 if MODE == "base" else 1.0
'''
    evaluate = "import solution\nv = solution.run()\nprint(f'score: {v}')\n"
    repo = single_candidate_repo(tmp_path / "r", solution, evaluate,
                                 backend='[backend]\nkind = "local"\nslots = 2\nlog_limit_mb = 1\n')
    proc = ratchet(repo, "run", timeout=200)
    assert proc.returncode == 0, proc.stderr
    cand = Ledger(repo / ".ratchet" / "ledger.db").candidates()[1]
    assert cand.status == "keep", cand.reasons  # the metric line survives in the tail
    log = cand.phases[-1]["log"]
    assert os.path.getsize(log) < 1.1 * (1 << 20)
    assert "bytes of output dropped" in Path(log).read_text()


def test_memory_limit_turns_a_hog_into_a_crash(tmp_path):
    solution = '''
def run():
    if MODE == "cand":
        hog = bytearray(3 << 30)  # 3 GiB
        return len(hog)
    return 1.0
'''
    evaluate = "import solution\nprint(f'score: {solution.run()}')\n"
    repo = single_candidate_repo(
        tmp_path / "r", solution, evaluate,
        backend='[backend]\nkind = "local"\nslots = 2\nmemory_limit_gb = 1\n')
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    cand = Ledger(repo / ".ratchet" / "ledger.db").candidates()[1]
    assert cand.status == "crash"
    assert "MemoryError" in cand.reasons


ALLOCATE = '''
import time
hog = b"\\x01" * (240 << 20)  # ~250 MB, every page touched
time.sleep(1.5)
'''


def test_memory_gb_is_the_training_runs_peak(tmp_path):
    """`run` allocates ~250 MB; the evaluator itself is small; memory_gb is the run's."""
    task = config_text().split("[task.metric]")[0].replace(
        'evaluate = "python evaluate.py"', 'run = "python train.py"\nevaluate = "python evaluate.py"')
    repo = single_candidate_repo(tmp_path / "r", "def run():\n    return 2.0 if MODE == 'base' else 1.0\n",
                                 "import solution\nprint(f'score: {solution.run()}')\n",
                                 task=task)
    (repo / "train.py").write_text(ALLOCATE)
    git(repo, "add", "train.py")
    git(repo, "commit", "-qm", "train")
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    cands = Ledger(repo / ".ratchet" / "ledger.db").candidates()
    for cand in cands:
        assert cand.extra["memory_gb"] >= 0.2, cand.extra
        assert cand.extra["memory_gb"] < 2.0, cand.extra
        assert cand.result["memory_source"].startswith("run phase")
    rows = results_tsv(repo)
    assert all(float(row["memory_gb"]) >= 0.2 for row in rows), rows
    assert "memory_gb 0.2" in ratchet(repo, "show", "c0001").stdout


def test_memory_constraint_uses_the_measurement(tmp_path):
    task = config_text().split("[task.metric]")[0].replace(
        'evaluate = "python evaluate.py"',
        'run = "python train.py"\nevaluate = "python evaluate.py"\n'
        'constraints = ["memory_gb <= 0.1"]')
    solution = '''
def run():
    return 2.0 if MODE == "base" else 1.0
'''
    train = ("import solution, time\nif solution.MODE == 'cand':\n"
             "    hog = b'\\x01' * (240 << 20)\n    time.sleep(1.0)\n")
    repo = single_candidate_repo(tmp_path / "r", solution,
                                 "import solution\nprint(f'score: {solution.run()}')\n"
                                 "print('memory_gb: 0.001')\n",  # the evaluator's own claim
                                 task=task)
    (repo / "train.py").write_text(train)
    git(repo, "add", "train.py")
    git(repo, "commit", "-qm", "train")
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    base, cand = Ledger(repo / ".ratchet" / "ledger.db").candidates()[:2]
    assert base.extra["memory_gb"] < 0.1, base.extra
    assert cand.status == "rejected", (cand.status, cand.reasons)
    assert "memory_gb <= 0.1" in cand.reasons


def test_memory_without_a_run_phase_counts_the_evaluators_children(tmp_path):
    evaluate = '''
import subprocess, sys
subprocess.run([sys.executable, "-c", "import time; hog = b'\\\\x01' * (240 << 20); time.sleep(1.5)"],
               check=True)
from solution import MODE
print(f"score: {2.0 if MODE == 'base' else 1.0}")
'''
    repo = single_candidate_repo(tmp_path / "r", "", evaluate)
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    for cand in Ledger(repo / ".ratchet" / "ledger.db").candidates():
        assert cand.extra["memory_gb"] >= 0.2, cand.extra
        assert "child processes" in cand.result["memory_source"]


def test_every_result_records_the_machine(tmp_path):
    repo = single_candidate_repo(tmp_path / "r", "", "from solution import MODE\n"
                                 "print(f\"score: {2.0 if MODE == 'base' else 1.0}\")\n")
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    for cand in Ledger(repo / ".ratchet" / "ledger.db").candidates():
        fp = cand.result["fingerprint"]
        assert fp["cores"] == str(os.cpu_count()) and fp["python"] and "hostname" not in fp


WRITE_CACHE = '''
import os, pathlib
pathlib.Path(os.environ["TORCHINDUCTOR_CACHE_DIR"], "compiled-by-run").write_text("x")
'''

EVALUATE_WITH_OWN_CACHE = '''
import os, pathlib, solution
cache = pathlib.Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
# the trusted phase compiles into a private cache: nothing a candidate wrote is there
assert not (cache / "compiled-by-run").exists(), cache
print(f"score: {solution.run()}")
'''


def test_compile_cache_is_shared_by_candidates_and_private_to_the_evaluator(tmp_path):
    """Under the sandbox, `run` can write the study's compile cache (a compiler that
    cannot write its cache fails); the evaluator gets its own, never the shared one."""
    task = config_text().split("[task.metric]")[0].replace(
        'evaluate = "python evaluate.py"', 'run = "python train.py"\nevaluate = "python evaluate.py"')
    repo = single_candidate_repo(tmp_path / "r", "def run():\n    return 2.0 if MODE == 'base' else 1.0\n",
                                 EVALUATE_WITH_OWN_CACHE, task=task)
    (repo / "train.py").write_text(WRITE_CACHE)
    git(repo, "add", "train.py")
    git(repo, "commit", "-qm", "train")
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    rows = results_tsv(repo)
    assert [row["status"] for row in rows] == ["keep", "keep"], rows
    assert (repo / ".ratchet" / "cache" / "inductor" / "compiled-by-run").read_text() == "x"
