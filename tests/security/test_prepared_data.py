"""Poisoned prepared data: the offender is rejected, the next honest candidate passes.

Without bubblewrap (and as root, where read-only files do not bind) a candidate can
write the prepared-data cache. The worker restores it from a digest-checked pristine
copy and gives small data to each job as a private copy; the digest covers modes too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import job_result, ratchet
from redteam.test_redteam import FAST_SOLUTION, SOLUTION, cheat, judge, new_study

from ratchet.job import sandbox
from ratchet.job.prep import data_digest
from ratchet.store.ledger import Ledger

SLOWER = SOLUTION.replace("DELAY = 0.2", "DELAY = 0.3")


def read_only(mode: str) -> bool:
    """bubblewrap mounts the cache read-only; with a namespace, a root worker also runs the
    candidate as an unprivileged uid, which cannot write root's files: the write fails."""
    level = sandbox.choose(mode)
    return level == "bwrap" or (os.geteuid() == 0 and level == "pidns")


def assert_caught(verdict: dict, mode: str) -> None:
    if read_only(mode):
        assert verdict["status"] == "crash", verdict
        assert any(why in verdict["reasons"] for why in
                   ("Read-only file system", "Permission denied", "Operation not permitted",
                    # the job's spec.json, the cheat's map to the cache, is out of sight
                    "No such file or directory")), verdict["reasons"]
    else:
        assert verdict["status"] == "rejected", verdict
        assert "prepared data ($RATCHET_DATA) was modified" in verdict["reasons"]


def submit_and_wait(repo, branch: str) -> dict:
    proc = ratchet(repo, "submit", branch)
    assert proc.returncode == 0, proc.stderr
    cand_id = proc.stdout.strip().splitlines()[-1]
    proc = ratchet(repo, "wait", cand_id, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shared_cache(repo):
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        return Path(ledger.get("data_dir")), ledger.get("data_digest")
    finally:
        ledger.close()


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_poisoning_ratchet_data_rejects_only_the_offender(template, tmp_path, mode):
    repo = new_study(template, tmp_path, mode)
    poison = cheat(repo, "poison", {"train.py": """
        import json, os
        path = os.path.join(os.environ["RATCHET_DATA"], "public.json")
        os.chmod(path, 0o644)
        json.dump([[1]], open(path, "w"))
    """, "solution.py": FAST_SOLUTION})
    assert_caught(judge(repo, poison), mode)
    data, digest = shared_cache(repo)
    assert data_digest(data) == digest  # the shared cache is intact for everyone else
    honest = submit_and_wait(repo, cheat(repo, "honest", {"solution.py": FAST_SOLUTION}))
    assert honest["status"] == "keep", honest


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_poisoning_the_shared_cache_is_restored_for_the_next_job(template, tmp_path, mode):
    """The cheat finds the shared cache through its job's spec.json and rewrites it."""
    repo = new_study(template, tmp_path, mode)
    poison = cheat(repo, "poison-shared", {"train.py": """
        import json, os
        job = os.path.dirname(os.environ["RATCHET_WORKDIR"])
        shared = json.load(open(os.path.join(job, "spec.json")))["data_dir"]
        path = os.path.join(shared, "public.json")
        os.chmod(shared, 0o755)
        os.chmod(path, 0o644)
        json.dump([[1]], open(path, "w"))
        print("poisoned", path)
    """, "solution.py": SLOWER})
    verdict = judge(repo, poison)
    data, digest = shared_cache(repo)
    if read_only(mode):
        assert_caught(verdict, mode)
    else:
        assert "poisoned" in ratchet(repo, "logs", "c0001").stdout  # the attack landed
    honest = submit_and_wait(repo, cheat(repo, "honest", {"solution.py": FAST_SOLUTION}))
    assert honest["status"] == "keep", honest
    # the first job after the attack (the hold-out of the baseline, or the honest one)
    # found the cache modified and restored it before running anything
    notes = [note for job in (repo / ".ratchet" / "jobs").glob("*/result.json")
             for note in job_result(repo, job.parent.name).get("notes", [])]
    assert read_only(mode) or any("found modified and restored" in note for note in notes), notes
    assert data_digest(data) == digest
    assert json.loads((data / "public.json").read_text()) != [[1]]


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_a_mode_change_alone_is_a_modification(template, tmp_path, mode):
    repo = new_study(template, tmp_path, mode)
    branch = cheat(repo, "chmod", {"train.py": """
        import os
        os.chmod(os.path.join(os.environ["RATCHET_DATA"], "public.json"), 0o666)
    """, "solution.py": FAST_SOLUTION})
    assert_caught(judge(repo, branch), mode)
    honest = submit_and_wait(repo, cheat(repo, "honest", {"solution.py": FAST_SOLUTION}))
    assert honest["status"] == "keep", honest


def test_concurrent_honest_candidate_is_not_blamed(template, tmp_path):
    """Two jobs at once, no sandbox: one poisons $RATCHET_DATA, the other is honest. Each
    job has its own copy of small prepared data, so only the offender is rejected."""
    repo = new_study(template, tmp_path, "none")
    ratchet(repo, "submit", "main")  # the baseline first, so both run side by side next
    poison = cheat(repo, "poison-slow", {"train.py": """
        import json, os, time
        path = os.path.join(os.environ["RATCHET_DATA"], "public.json")
        os.chmod(path, 0o644)
        json.dump([[1]], open(path, "w"))
        time.sleep(2)  # keep the poisoned data around while the other job evaluates
    """, "solution.py": FAST_SOLUTION})
    honest = cheat(repo, "honest", {"solution.py": FAST_SOLUTION})
    ids = [ratchet(repo, "submit", b).stdout.strip().splitlines()[-1] for b in (poison, honest)]
    proc = ratchet(repo, "wait", *ids, "--json")
    assert proc.returncode == 0, proc.stderr
    verdicts = {v["id"]: v for v in map(json.loads, proc.stdout.strip().splitlines())}
    assert verdicts[ids[0]]["status"] == "rejected", verdicts
    assert "prepared data ($RATCHET_DATA) was modified" in verdicts[ids[0]]["reasons"]
    assert verdicts[ids[1]]["status"] == "keep", verdicts
