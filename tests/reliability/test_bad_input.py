"""Bad input: one clear line naming the problem and the fix, a non-zero exit, no
traceback, and nothing already recorded changed.
"""

from __future__ import annotations

import shutil

import pytest
from common import deterministic_repo, ledger, snapshot
from helpers import config_text, git, make_repo, ratchet


def assert_one_clear_error(proc, *phrases: str) -> None:
    assert proc.returncode != 0, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for phrase in phrases:
        assert phrase in proc.stderr, (phrase, proc.stderr)


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """A study that ran one round; each test breaks a copy of it."""
    repo = deterministic_repo(tmp_path_factory.mktemp("started") / "r", rounds=1)
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    return repo


@pytest.fixture
def study_copy(started, tmp_path):
    repo = tmp_path / "r"
    shutil.copytree(started, repo, symlinks=True)
    return repo


def test_malformed_toml(study_copy):
    before = snapshot(study_copy)
    (study_copy / "ratchet.toml").write_text("[task\nname = 'demo'\n")
    proc = ratchet(study_copy, "run", "--rounds", "2")
    assert_one_clear_error(proc, "ratchet.toml: not valid TOML", "line 1")
    assert snapshot(study_copy) == before


def test_misspelt_key(study_copy):
    before = snapshot(study_copy)
    toml = study_copy / "ratchet.toml"
    toml.write_text(toml.read_text().replace("parallel = 2", "paralel = 2"))
    proc = ratchet(study_copy, "run", "--rounds", "2")
    assert_one_clear_error(proc, "search.paralel: unknown key", "spelling")
    assert snapshot(study_copy) == before


def test_missing_config(tmp_path):
    repo = make_repo(tmp_path / "r", {"solution.py": "X = 1\n"})
    proc = ratchet(repo, "run")
    assert_one_clear_error(proc, "ratchet.toml: not found", "ratchet init")
    assert not (repo / ".ratchet").exists()


def test_not_a_git_repository(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "ratchet.toml").write_text(config_text())
    proc = ratchet(plain, "run")
    assert_one_clear_error(proc, "not a git repository", "git init")
    assert sorted(p.name for p in plain.iterdir()) == ["ratchet.toml"]


@pytest.mark.parametrize("kind", ["invalid utf-8", "a directory"])
def test_unreadable_ideas_file(study_copy, kind):
    before = snapshot(study_copy)
    ideas = study_copy / "ideas.md"
    if kind == "a directory":
        ideas.mkdir()
    else:
        ideas.write_bytes(b"- try caf\xe9 \xff\n")
    proc = ratchet(study_copy, "run", "--rounds", "2")
    assert_one_clear_error(proc, "ideas.md: cannot read the ideas file", "UTF-8", "remove it")
    assert snapshot(study_copy) == before


def test_unreadable_ideas_file_on_a_new_study_records_nothing(tmp_path):
    repo = deterministic_repo(tmp_path / "r", rounds=1)
    (repo / "ideas.md").write_bytes(b"\xff\xfe")
    proc = ratchet(repo, "run")
    assert_one_clear_error(proc, "ideas.md: cannot read the ideas file")
    assert not ledger_started(repo)


def ledger_started(repo) -> bool:
    db = ledger(repo)
    try:
        return db.get("pinned") is not None
    finally:
        db.close()


def test_missing_evaluator_fails_before_the_study_starts(tmp_path):
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(search="[search]\nparallel = 2\nrounds = 1\n"),
        "solution.py": "X = 3.0\n",
    })
    proc = ratchet(repo, "run")
    assert_one_clear_error(proc, "task.evaluate runs evaluate.py, which is not in commit",
                           "git add evaluate.py")
    assert not ledger_started(repo)
    assert git(repo, "branch", "--list", "ratchet/*") == ""


def test_evaluator_that_never_prints_the_metric(tmp_path):
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(search="[search]\nparallel = 2\nrounds = 1\n"),
        "solution.py": "X = 3.0\n",
        "evaluate.py": "print('loss: 1.0')\n",
    })
    proc = ratchet(repo, "run")
    assert_one_clear_error(proc, "evaluate printed no 'score: <number>' line",
                           "ratchet logs c0000", "fix the task")
    db = ledger(repo)
    cands = db.candidates()
    db.close()
    # the baseline is recorded as the crash it was; nothing was kept
    assert cands[0].kind == "baseline" and cands[0].status == "crash"
    assert all(c.status != "keep" for c in cands)


def test_dirty_tree_warns_and_starts_from_head(tmp_path):
    repo = deterministic_repo(tmp_path / "r", rounds=1)
    head = git(repo, "rev-parse", "HEAD")
    (repo / "solution.py").write_text("this is not python(\n")
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    assert f"uncommitted changes are ignored; the study starts from HEAD {head[:7]}" \
        in proc.stderr
    db = ledger(repo)
    assert db.get("pinned") == head and db.candidates()[0].metric is not None
    db.close()
    assert (repo / "solution.py").read_text() == "this is not python(\n"  # left alone


def test_detached_head_is_a_fine_starting_point(tmp_path):
    repo = deterministic_repo(tmp_path / "r", rounds=1)
    git(repo, "checkout", "-q", "--detach")
    head = git(repo, "rev-parse", "HEAD")
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    db = ledger(repo)
    assert db.get("pinned") == head
    db.close()
    assert git(repo, "rev-parse", "HEAD") == head  # the user's checkout stays detached
    assert git(repo, "rev-parse", "ratchet/demo") != ""


# -- issue 12, items 5 and 6: a start that fails pins nothing; the committed config rules --

def assert_nothing_recorded(repo) -> None:
    db = ledger(repo)
    try:
        assert db.get("pinned") is None
        assert db.candidates() == []
        assert db.db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0
    finally:
        db.close()
    assert git(repo, "branch", "--list", "ratchet/*") == ""


def test_bad_knob_pins_nothing_and_the_fixed_commit_starts_the_study(tmp_path):
    repo = deterministic_repo(tmp_path / "r", rounds=1)
    toml = repo / "ratchet.toml"
    toml.write_text(toml.read_text().replace('"solution.py:X"', '"solution.py:Y"'))
    git(repo, "commit", "-qam", "a knob that is not there")
    proc = ratchet(repo, "run")
    assert_one_clear_error(
        proc, "tune.knobs: 'solution.py:Y': solution.py: no module-level assignment `Y = ")
    assert_nothing_recorded(repo)
    toml.write_text(toml.read_text().replace('"solution.py:Y"', '"solution.py:X"'))
    git(repo, "commit", "-qam", "fix the knob")
    fixed = git(repo, "rev-parse", "HEAD")
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    db = ledger(repo)
    assert db.get("pinned") == fixed  # the study starts from the fixed commit
    db.close()


def test_tuner_without_knobs_pins_nothing(tmp_path):
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(knobs=""), "solution.py": "X = 3.0\n",
        "evaluate.py": "print('score: 1')\n"})
    proc = ratchet(repo, "run")
    assert_one_clear_error(proc, "needs at least one [tune.knobs] entry")
    assert_nothing_recorded(repo)


def test_uncommitted_config_edit_never_takes_effect(tmp_path):
    repo = deterministic_repo(tmp_path / "r", rounds=1)
    toml = repo / "ratchet.toml"
    assert "parallel = 2" in toml.read_text()
    toml.write_text(toml.read_text().replace("parallel = 2", "parallel = 3"))
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    assert "ratchet.toml has changes that are not in the study's config; they are ignored" \
        in proc.stderr
    db = ledger(repo)
    assert len(db.candidates(round=1)) == 2  # K as committed, not as edited
    db.close()
    # a started study keeps the config it was pinned with, even after a commit
    git(repo, "commit", "-qam", "three at a time")
    proc = ratchet(repo, "run", "--rounds", "2")
    assert proc.returncode == 0, proc.stderr
    assert "the study reads ratchet.toml as committed in" in proc.stderr
    db = ledger(repo)
    assert len(db.candidates(round=2)) == 2
    db.close()
