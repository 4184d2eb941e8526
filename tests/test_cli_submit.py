"""Agent-driven mode needs no proposer (issue 12, item 7), through the real CLI."""

from __future__ import annotations

import json

from helpers import SCORE_EVALUATOR, SCORE_SOLUTION, config_text, git, make_repo, ratchet


def agent_repo(path):
    """A task with the default proposer (tune) and no knobs: nothing for a tuner to do,
    everything an agent driving `submit` / `wait` needs."""
    return make_repo(path, {
        "ratchet.toml": config_text(search="", knobs=""),
        "evaluate.py": SCORE_EVALUATOR,
        "solution.py": SCORE_SOLUTION,
    })


def test_submit_and_wait_never_build_a_proposer(tmp_path):
    repo = agent_repo(tmp_path / "r")
    git(repo, "checkout", "-q", "-b", "try-1")
    (repo / "solution.py").write_text((repo / "solution.py").read_text()
                                      .replace("X = 3.0", "X = 1.5"))
    git(repo, "commit", "-qam", "x to 1.5")
    submitted = ratchet(repo, "submit", "try-1")
    assert submitted.returncode == 0, submitted.stderr
    assert "tune" not in submitted.stderr
    cand = submitted.stdout.split()[-1]
    waited = ratchet(repo, "wait", cand, "--json")
    assert waited.returncode == 0, waited.stderr
    (line,) = [json.loads(x) for x in waited.stdout.splitlines()]
    assert line["id"] == cand and line["status"] == "keep"
    assert git(repo, "rev-parse", "ratchet/demo") == git(repo, "rev-parse", "try-1")


def test_run_with_the_tuner_and_no_knobs_says_what_is_missing(tmp_path):
    repo = agent_repo(tmp_path / "r")
    proc = ratchet(repo, "run")
    assert proc.returncode == 2
    assert "search.proposer = 'tune' needs at least one [tune.knobs] entry" in proc.stderr


def test_submitting_the_only_commit_makes_it_the_baseline(tmp_path):
    repo = agent_repo(tmp_path / "r")
    assert git(repo, "rev-list", "--count", "HEAD") == "1"
    head = git(repo, "rev-parse", "HEAD")
    submitted = ratchet(repo, "submit", "HEAD")
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.split() == ["c0000"]
    waited = ratchet(repo, "wait", "c0000", "--json")
    assert waited.returncode == 0, waited.stderr
    (line,) = [json.loads(x) for x in waited.stdout.splitlines()]
    assert line["commit"] == head and line["status"] == "keep" and line["metric"] == 3.0625
    assert git(repo, "rev-parse", "ratchet/demo") == head
    # the next commit is compared with it
    (repo / "solution.py").write_text((repo / "solution.py").read_text()
                                      .replace("X = 3.0", "X = 2.0"))
    git(repo, "commit", "-qam", "x to 2")
    nxt = ratchet(repo, "submit", "HEAD")
    assert nxt.returncode == 0, nxt.stderr
    assert nxt.stdout.split() == ["c0001"]
    waited = ratchet(repo, "wait", "c0001", "--json")
    assert json.loads(waited.stdout)["status"] == "keep"


def test_submit_is_not_blocked_by_knobs_it_never_uses(tmp_path):
    """[tune.knobs] belong to the tuner; agent-driven mode works with stale ones."""
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(
            search="", knobs='[tune.knobs]\n"solution.py:GONE" = { choices = [1, 2] }\n'),
        "evaluate.py": SCORE_EVALUATOR,
        "solution.py": SCORE_SOLUTION,
    })
    (repo / "solution.py").write_text((repo / "solution.py").read_text()
                                      .replace("X = 3.0", "X = 1.5"))
    git(repo, "commit", "-qam", "x to 1.5")
    submitted = ratchet(repo, "submit")
    assert submitted.returncode == 0, submitted.stderr
    waited = ratchet(repo, "wait", submitted.stdout.split()[-1], "--json")
    assert json.loads(waited.stdout)["status"] == "keep"


def test_a_repeat_of_an_earlier_candidate_is_rejected_unrun(tmp_path):
    """The same files as an earlier candidate are the same experiment, whoever made them."""
    repo = agent_repo(tmp_path / "r")
    git(repo, "checkout", "-q", "-b", "try-1")
    (repo / "solution.py").write_text((repo / "solution.py").read_text()
                                      .replace("X = 3.0", "X = 5.0"))
    git(repo, "commit", "-qam", "x to 5 (worse: discarded)")
    first = ratchet(repo, "submit", "try-1").stdout.split()[-1]
    done = ratchet(repo, "wait", first, "--json")
    assert json.loads(done.stdout.splitlines()[0])["status"] == "discard", done.stdout
    git(repo, "commit", "-q", "--allow-empty", "-m", "same files, another commit")
    again = ratchet(repo, "submit", "try-1")
    assert again.returncode == 0, again.stderr
    second = again.stdout.split()[-1]
    waited = ratchet(repo, "wait", second, "--json")
    (line,) = [json.loads(x) for x in waited.stdout.splitlines()]
    assert line["status"] == "rejected", line
    assert f"same files as {first}" in json.dumps(line)
