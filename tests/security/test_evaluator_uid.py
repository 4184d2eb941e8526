"""The trusted evaluator never runs as root, nor as the candidate (issue 34).

An evaluator may import candidate code into its own process, so when the job runs as root
it runs as a uid of its own: not 0, not the uid the candidate's phases run as. It must
still do its whole job: read the pinned evaluator and the hold-out data, start the
candidate in a sandboxed child, and report on the trusted channel. Through the real CLI
(`submit` + `wait`), a candidate that is kept (so the hold-out evaluation runs too), at
both sandbox levels.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from helpers import config_text, git, make_repo, ratchet, sandbox_env, submit_and_wait

from security.test_network import phase_logs

SOLUTION = '''
import os

X = 3.0


def score():
    return (X - 1.25) ** 2


if __name__ == "__main__":
    print(f"candidate uid: {os.getuid()}")
'''

EVALUATOR = '''
import json, os, sys
from ratchet.evaluator.channel import report
from ratchet.evaluator.isolate import CandidateProcess

if "--holdout" in sys.argv:
    with open(os.path.join(os.environ["RATCHET_HOLDOUT"], "cases.json")) as fh:
        assert json.load(fh) == ["the hold-out case"]
with CandidateProcess("solution.py") as cand:
    value = cand.call("score")
print(f"evaluator uid: {os.getuid()} {os.geteuid()}")
report({"correct": True, "score": value})
'''


def _study_with_a_better_branch(tmp_path: Path, run: str | None = None) -> Path:
    """A study with a hold-out, and branch `better` that improves the score."""
    lines = ([f'run = "{run}"'] if run else []) + [
        'evaluate = "python evaluate.py"', 'holdout = "python evaluate.py --holdout"',
        'holdout_data = "holdout"']
    task = config_text().split("[task.metric]")[0].replace(
        'evaluate = "python evaluate.py"', "\n".join(lines))
    repo = make_repo(tmp_path / "repo", {
        "ratchet.toml": config_text(task=task), "evaluate.py": EVALUATOR,
        "solution.py": SOLUTION, "holdout/cases.json": '["the hold-out case"]'})
    git(repo, "checkout", "-q", "-b", "better")
    (repo / "solution.py").write_text(SOLUTION.replace("X = 3.0", "X = 1.25"))
    git(repo, "commit", "-qam", "X at the minimum")
    git(repo, "checkout", "-q", "main")
    return repo


@pytest.mark.parametrize("level", ["bwrap", "pidns"])
def test_the_evaluator_runs_as_a_uid_of_its_own(tmp_path: Path, level: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("the uid drop needs root; not root, every party keeps the user's uid")
    env = sandbox_env(level, tmp_path)
    repo = _study_with_a_better_branch(tmp_path, run="python solution.py")
    cand = submit_and_wait(repo, "better", env=env)
    assert cand["status"] == "keep", cand  # the hold-out ran and passed: it read its data

    [candidate_uid] = {int(u) for u in re.findall(r"candidate uid: (\d+)",
                                                  phase_logs(repo, cand["id"], "run"))}
    assert candidate_uid != 0
    for phase in ("evaluate", "holdout"):
        uids = re.findall(r"evaluator uid: (\d+) (\d+)", phase_logs(repo, cand["id"], phase))
        assert uids, (phase, phase_logs(repo, cand["id"], phase))
        for uid, euid in uids:
            assert int(uid) == int(euid) != 0, (phase, uids)
            assert int(uid) != candidate_uid, (phase, uids, candidate_uid)


@pytest.mark.parametrize("level", ["bwrap", "pidns"])
def test_hold_out_data_closed_to_the_evaluator_is_the_machines_fault(tmp_path: Path,
                                                                    level: str) -> None:
    """Hold-out data only root may read (0600): the hold-out evaluator, now its own uid,
    cannot read it. That is a setup error, said in one line with the fix, never `rejected`
    as overfit on the candidate."""
    if os.geteuid() != 0:
        pytest.skip("the uid drop needs root")
    env = sandbox_env(level, tmp_path)
    repo = _study_with_a_better_branch(tmp_path)
    (repo / "holdout" / "cases.json").chmod(0o600)  # only root may read it
    proc = ratchet(repo, "submit", "better", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cand_id = proc.stdout.strip().splitlines()[-1]
    proc = ratchet(repo, "wait", cand_id, "--json", env=env)
    out = proc.stdout + proc.stderr
    assert "cases.json" in out and "fix:" in out, out
    assert '"rejected"' not in out and "overfit" not in out, out
