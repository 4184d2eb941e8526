"""`ratchet export NAME`: the kept steps of a real study as a branch, the user's checkout untouched."""

from __future__ import annotations

import pytest
from handoff_study import KEPT, handoff_study
from helpers import git, ratchet


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return handoff_study(tmp_path_factory)


def checkout_state(repo) -> dict[str, str]:
    """Everything of the user's that export must not touch."""
    return {
        "HEAD": git(repo, "symbolic-ref", "HEAD"),
        "main": git(repo, "rev-parse", "main"),
        "status": git(repo, "status", "--porcelain"),
        "index": git(repo, "ls-files", "--stage"),
        "staged": git(repo, "diff", "--cached"),
        "worktree": (repo / "solution.py").read_text() + (repo / "notes.txt").read_text(),
        "study branch": git(repo, "rev-parse", "ratchet/demo"),
    }


def test_export_writes_one_commit_per_kept_step_and_the_incumbents_tree(study):
    repo = study.repo
    before = checkout_state(repo)
    proc = ratchet(repo, "export", "demo-kept")
    assert proc.returncode == 0, proc.stderr
    assert "branch demo-kept" in proc.stdout and "3 kept steps" in proc.stdout
    assert checkout_state(repo) == before  # HEAD, main, index, worktree, study branch

    start, incumbent = study.meta("pinned"), study.meta("incumbent")
    commits = git(repo, "rev-list", "--reverse", "--first-parent", f"{start}..demo-kept").split()
    kept = [study.by_idea()[idea] for idea in KEPT]
    assert len(commits) == len(kept) == 3
    assert git(repo, "rev-parse", f"{commits[0]}^") == start
    for commit, cand in zip(commits, kept, strict=True):
        # each step has exactly the tree of the candidate that was kept at that point
        assert git(repo, "rev-parse", f"{commit}^{{tree}}") == git(repo, "rev-parse", f"{cand.commit_sha}^{{tree}}")
        assert len(git(repo, "rev-list", "--parents", "-n1", commit).split()) == 2  # one parent
    assert git(repo, "rev-parse", "demo-kept^{tree}") == git(repo, "rev-parse", f"{incumbent}^{{tree}}")
    assert git(repo, "diff", "ratchet/demo", "demo-kept") == ""

    # every message tells the step: description, idea, proposer, metric and gain, judge, hold-out
    messages = [git(repo, "log", "-1", "--format=%B", c) for c in commits]
    assert messages[0].splitlines()[0] == "X = 2.0: closer to the optimum"
    assert "score: 0.5625 (minimize) from 3.0625 (c0000): gain +2.5 (+81.63%)" in messages[0]
    assert f"score: 0.0625 (minimize) from 0.5625 ({kept[0].id}): gain +0.5 (+88.89%)" in messages[1]
    assert f"score: 0.0225 (minimize) from 0.0625 ({kept[1].id}): gain +0.04 (+64.00%)" in messages[2]
    for message, cand, idea in zip(messages, kept, KEPT, strict=True):
        assert f"idea: {idea}" in message and "proposed by: agent" in message
        assert f"candidate {cand.id}, round {cand.round}" in message
        assert f"judge: gain {cand.gain:.4g} > margin {cand.margin:.4g}" in message
        assert f"hold-out score: {cand.holdout:.6g}" in message
        assert f"original commit: {cand.commit_sha}" in message
    assert "kept step 3 of 3" in messages[2]


def test_an_existing_branch_is_refused_unless_forced(study):
    repo = study.repo
    git(repo, "branch", "taken", "main")
    proc = ratchet(repo, "export", "taken")
    assert proc.returncode != 0
    assert "branch taken already exists" in proc.stderr and "--force" in proc.stderr
    assert git(repo, "rev-parse", "taken") == study.main_head  # untouched

    proc = ratchet(repo, "export", "taken", "--force")
    assert proc.returncode == 0, proc.stderr
    assert "replaced" in proc.stdout
    assert git(repo, "rev-parse", "taken^{tree}") == git(repo, "rev-parse", "ratchet/demo^{tree}")
    assert len(git(repo, "rev-list", f"{study.meta('pinned')}..taken").split()) == 3


def test_squash_is_one_commit_with_the_whole_story(study):
    repo = study.repo
    before = checkout_state(repo)
    proc = ratchet(repo, "export", "demo-squashed", "--squash")
    assert proc.returncode == 0, proc.stderr
    assert checkout_state(repo) == before
    assert git(repo, "rev-parse", "demo-squashed^") == study.meta("pinned")
    assert git(repo, "rev-parse", "demo-squashed^{tree}") == git(repo, "rev-parse", "ratchet/demo^{tree}")
    message = git(repo, "log", "-1", "--format=%B", "demo-squashed")
    assert message.splitlines()[0] == "ratchet demo: score 3.0625 -> 0.0225 in 3 kept steps"
    assert "Overall gain +3.04 (+99.27%) over the baseline (c0000)" in message
    for i, idea in enumerate(KEPT, 1):
        cand = study.by_idea()[idea]
        assert f"{i}. {cand.id}: {cand.description}" in message
        assert f"idea: {idea}" in message
    assert "Candidates tried: 7 (crash 1, discard 2, keep 3, rejected 1)" in message


@pytest.mark.parametrize(("name", "why"), [
    ("main", "already exists"),
    ("ratchet/demo", "the study's own branch"),
    ("bad..name", "not a valid branch name"),
])
def test_names_export_never_writes(study, name, why):
    before = checkout_state(study.repo)
    proc = ratchet(study.repo, "export", name)
    assert proc.returncode != 0 and why in proc.stderr
    assert checkout_state(study.repo) == before


def test_a_checked_out_branch_is_never_moved_even_with_force(study):
    proc = ratchet(study.repo, "export", "main", "--force")
    assert proc.returncode != 0 and "checked out" in proc.stderr
    assert git(study.repo, "rev-parse", "main") == study.main_head


def test_nothing_kept_is_refused(tmp_path):
    from helpers import score_repo

    repo = score_repo(tmp_path / "r", knobs='[tune.knobs]\n"solution.py:X" = { choices = [5.0] }\n',
                      search='[search]\nproposer = "tune"\nparallel = 1\nrounds = 2\n')
    ratchet(repo, "run", check=True)
    proc = ratchet(repo, "export", "none")
    assert proc.returncode != 0 and "nothing was kept yet" in proc.stderr
    assert git(repo, "branch", "--list", "none") == ""
