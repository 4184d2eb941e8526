"""Issue 34, attack 4: a forged progress curve entrenches itself.

A candidate with a small real gain reports a loss of 1e-9 at every step on
$RATCHET_PROGRESS_FD and is kept (its gain is real). Were its curve the reference every
later run is stopped against, the truly best candidate would be "stopped early" and
discarded, and nothing better could ever be kept. Two ways out, one per study:

- the curve measures the metric (the baseline's curve ends where its metric is): the
  forged curve disagrees with the forger's own trusted metric, so it is never a reference;
- the curve measures something else (here: ten times the loss): the forged curve is a
  reference once a re-run reproduced it, but after three stops in a row one candidate
  runs in full, and the best one is kept.
"""

from __future__ import annotations

import pytest
from helpers import config_text, git, make_repo, sandbox_env, submit_and_wait

from security.studies import (
    LEVELS,
    assert_contained,
    checkout,
    incumbent,
    rows,
)

TRAIN = """
import os, time
FINAL = 4.0  # the loss the run ends at; the evaluator reads it from final.txt
FORGE = False
SCALE = {scale}  # what the curve reports: the loss itself (1.0) or another quantity
fd = int(os.environ.get("RATCHET_PROGRESS_FD", "-1"))
value = None
for step in range(40):
    value = FINAL + 2.0 / (1.0 + 0.2 * step)
    if fd >= 0:
        os.write(fd, f"{{step}} {{1e-9 if FORGE else value * SCALE}}\\n".encode())
    time.sleep(0.02)
open("final.txt", "w").write(str(value))
"""
EVALUATE = 'print(f"score: {float(open(\'final.txt\').read())}")\n'


def study(tmp_path, level: str, scale: float):
    mode = "bwrap" if level == "bwrap" else "auto"
    task = ('[task]\nname = "curve"\neditable = ["train.py"]\nprotected = ["evaluate.py"]\n'
            'run = "python train.py"\nevaluate = "python evaluate.py"\ntimeout = "60s"\n')
    return make_repo(tmp_path / "repo", {
        "ratchet.toml": config_text(
            task=task, knobs="", search='[search]\nproposer = "tune"\nparallel = 1\n',
            backend=f'[backend]\nkind = "local"\nslots = 1\nsandbox = "{mode}"\n'),
        "evaluate.py": EVALUATE, "train.py": TRAIN.format(scale=scale)})


def candidate(repo, name: str, final: float, forge: bool = False) -> str:
    """A commit on the incumbent (as an agent makes one) with this final loss."""
    text = (repo / "train.py").read_text().replace("FINAL = 4.0", f"FINAL = {final}")
    started = (repo / ".ratchet" / "ledger.db").exists()
    git(repo, "checkout", "-q", "-B", name, incumbent(repo) if started else "main")
    (repo / "train.py").write_text(text.replace("FORGE = False", f"FORGE = {forge}"))
    git(repo, "commit", "-qam", name)
    git(repo, "checkout", "-q", "main")
    return name


@pytest.mark.parametrize("quantity", ["metric", "other"])
@pytest.mark.parametrize("level", LEVELS)
def test_a_forged_curve_never_stops_a_better_candidate_for_good(tmp_path, level, quantity):
    env = sandbox_env(level, tmp_path)
    repo = study(tmp_path, level, 1.0 if quantity == "metric" else 10.0)
    before = checkout(repo)
    # the forger's gain is real (2.25 against 4): kept, as it should be
    assert submit_and_wait(repo, candidate(repo, "forger", 2.25, forge=True), env)[
        "status"] == "keep"
    stops = []
    if quantity == "other":  # its curve is believed once reproduced: these are stopped
        for i, final in enumerate((3.0, 2.6, 2.4)):
            verdict = submit_and_wait(repo, candidate(repo, f"worse{i}", final), env)
            assert verdict["status"] == "discard", verdict
            stops.append(verdict["id"])
    verdict = submit_and_wait(repo, candidate(repo, "best", 0.5), env)
    assert verdict["status"] == "keep", verdict
    by_id = {c.id: c for c in rows(repo)}
    best_row = by_id[verdict["id"]]
    assert best_row.result["sandbox"] == level
    assert not (best_row.extra or {}).get("stopped_early")
    assert incumbent(repo) == best_row.commit_sha  # the best is the incumbent, not the forger
    # stops are recorded as such, each naming the curve it was stopped against
    for cand_id in stops:
        assert by_id[cand_id].code == "stopped-early", by_id[cand_id]
        assert "run stopped at " in by_id[cand_id].reasons
    assert_contained(repo, before, env)
