"""A result.json in a job's directory is a result only when the job's worker sealed it.

The attacker here is any party that can write the jobs directory (a candidate's daemon
without a sandbox, an agent, another job): it forges a finished, excellent result for a
job that is still running, as plain JSON and as an envelope with a made-up MAC. The study
must wait for the real worker and judge what it measured.
"""

from __future__ import annotations

import json
import time

from helpers import SCORE_EVALUATOR, config_text, git, job_result, make_repo, ratchet

SLOW = '''
X = 3.0
SLEEP = 3.0


def score():
    import time
    time.sleep(SLEEP)
    return (X - 1.25) ** 2
'''


def forge(job_dir, job_id: str) -> None:
    fake = {"job_id": job_id, "outcome": "ok", "metric": 1e-9, "samples": [1e-9],
            "extra": {"correct": True}, "correct": True, "phases": []}
    (job_dir / "result.json").write_text(json.dumps(fake))
    time.sleep(0.5)  # the driver polls: let it see the plain forgery first
    envelope = {"job_id": job_id, "mac": "0" * 64, "result": json.dumps(fake)}
    (job_dir / "result.json").write_text(json.dumps(envelope))


def test_a_forged_result_for_a_running_job_is_never_judged(tmp_path):
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(search='[search]\nproposer = "patches"\n'),
        "evaluate.py": SCORE_EVALUATOR,
        "solution.py": SLOW,
    })
    proc = ratchet(repo, "submit", "HEAD")
    assert proc.returncode == 0, proc.stderr
    cand_id = proc.stdout.strip().splitlines()[-1]
    jobs = repo / ".ratchet" / "jobs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(jobs.glob("*/spec.json")):
        time.sleep(0.05)
    (job_dir,) = [p.parent for p in jobs.glob("*/spec.json")]
    forge(job_dir, job_dir.name)
    waited = ratchet(repo, "wait", cand_id, "--json")
    assert waited.returncode == 0, waited.stderr
    verdict = json.loads(waited.stdout.strip().splitlines()[-1])
    # the real measurement (X = 3.0: (3 - 1.25)^2), not the forged 1e-9
    assert abs(verdict["metric"] - 3.0625) < 1e-6, verdict
    assert job_result(repo, job_dir.name)["metric"] == verdict["metric"]
    assert git(repo, "status", "--porcelain") == ""
