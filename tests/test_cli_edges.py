"""Rough edges a new user hit, each through the real CLI: one line and the right exit code,
never a traceback (issue 22)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from helpers import RATCHET, ROOT, git, ratchet, score_repo
from terminal import run_on_tty, screen

from ratchet.driver import words
from ratchet.driver.study import Study


def _one_error_line(proc, *words: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_status_of_a_started_study_with_no_candidates(tmp_path):
    repo = score_repo(tmp_path / "r")
    with Study(repo) as study:
        study.ensure_started()  # pinned, nothing proposed yet
    proc = ratchet(repo, "status")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "no candidates yet" in proc.stdout
    assert "study demo round 0" in proc.stdout


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
@pytest.mark.timing  # alone: test_cluster_safety's cluster on the default ports, beside it,
# would be found
def test_the_ray_backend_with_no_cluster_is_one_line_naming_the_key(tmp_path):
    repo = score_repo(tmp_path / "r")
    proc = ratchet(repo, "run", "--backend", "ray", timeout=300,
                   env={"RAY_ADDRESS": "", "RAY_TMPDIR": str(tmp_path / "no-ray")})
    _one_error_line(proc, "cannot connect", "[backend.ray] cluster")


def test_an_unknown_backend_on_the_command_line_lists_the_known_ones(tmp_path):
    repo = score_repo(tmp_path / "r")
    proc = ratchet(repo, "run", "--backend", "rya")
    _one_error_line(proc, "'rya'", "local | ray | shell")


def test_an_empty_idea_is_refused_not_already_queued(tmp_path):
    repo = score_repo(tmp_path / "r")
    proc = ratchet(repo, "idea", "  ")
    _one_error_line(proc, "an idea needs some text")
    assert "already queued" not in proc.stdout


def test_show_of_a_kept_commit_is_the_candidate_not_its_re_measure(tmp_path):
    # co_run_incumbent: the kept commit is measured again in the next round (a row of
    # its own with the same commit)
    repo = score_repo(tmp_path / "r",
                      search='[search]\nproposer = "tune"\nparallel = 2\nrounds = 3\n',
                      knobs='[tune.knobs]\n"solution.py:X" = { choices = [3.0, 1.25] }\n'
                            '[acceptance]\nco_run_incumbent = true\n')
    ratchet(repo, "run", check=True)
    with Study(repo) as study:
        cands = study.ledger.candidates()
    kept = [c for c in cands if c.status == "keep" and c.kind == "candidate"]
    assert kept, [(c.id, c.kind, c.status) for c in cands]
    sha = kept[0].commit_sha
    assert any(c.commit_sha == sha and c.id != kept[0].id for c in cands), "no re-measure"
    proc = ratchet(repo, "show", sha[:8])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(kept[0].id), proc.stdout
    assert git(repo, "rev-parse", sha) == sha


def test_an_editable_glob_that_matches_no_file_stops_the_study_in_one_line(tmp_path):
    task = ('[task]\nname = "demo"\neditable = ["solutoin.py"]\nprotected = ["evaluate.py"]\n'
            'evaluate = "python evaluate.py"\ntimeout = "60s"\n')
    repo = score_repo(tmp_path / "r", task=task, knobs="")
    # `submit` starts the study with no proposer in the way
    line = _one_error_line(ratchet(repo, "submit"),
                           "task.editable: 'solutoin.py' matches no file",
                           "did you mean 'solution.py'?")
    assert "ratchet.toml" in line
    assert not (repo / ".ratchet" / "jobs").exists()  # refused before anything ran


def test_one_editable_glob_of_several_matching_nothing_is_a_warning(tmp_path):
    task = ('[task]\nname = "demo"\neditable = ["solution.py", "extra/*.py"]\n'
            'protected = ["evaluate.py"]\nevaluate = "python evaluate.py"\ntimeout = "60s"\n')
    repo = score_repo(tmp_path / "r", task=task,
                      search='[search]\nproposer = "tune"\nparallel = 1\nrounds = 1\n')
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    assert "warning: task.editable: 'extra/*.py' matches no file" in proc.stderr


def test_at_80_columns_no_word_is_cut_across_lines(tmp_path):
    """A line longer than the terminal wraps at a space (the rest indented), never
    inside a number or a word: the verdicts of `run`, the summary of `status`."""
    repo = score_repo(tmp_path / "r")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    screens = {}
    for command in ("run", "status"):
        code, raw = run_on_tty([*RATCHET, command], env, repo, cols=80)
        assert code == 0, raw
        screens[command] = screen(raw, 80)
    with Study(repo) as study:
        # the reasons a round's block shows: why a candidate was not kept, in plain words
        reasons = [words.verdict(c, "minimize") for c in study.ledger.candidates()
                   if c.reasons and c.status == "discard"]
        sandbox = study.sandbox_status()
    expected = {"run": reasons, "status": [f"sandbox now: {sandbox}"]}
    for command, lines in screens.items():
        assert all(len(line) <= 80 for line in lines), lines
        joined = " ".join(line.strip() for line in lines)  # each wrapped line joined again
        for text in expected[command]:
            assert text in joined, (text, lines)
    assert any(len(line) > 70 for line in screens["run"]), "no line long enough to wrap"


def test_rolling_prints_each_verdict_once_before_the_keep_it_makes(tmp_path):
    """Rolling has no rounds of K: no `round 1/6` headers (6 was the candidate budget),
    every verdict once, and a `keep cN` line after the line that lists cN."""
    repo = score_repo(tmp_path / "r", search='[search]\nproposer = "tune"\nparallel = 2\n'
                                              'mode = "rolling"\ncandidates = 6\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    code, raw = run_on_tty([*RATCHET, "run"], env, repo, cols=120)
    assert code == 0, raw
    lines = screen(raw, 120)
    assert not [line for line in lines if line.startswith("round ")], lines
    with Study(repo) as study:
        cands = study.ledger.candidates()
    for cand in cands:
        listed = [i for i, line in enumerate(lines) if line.startswith(f"  {cand.id} ")]
        assert len(listed) == 1, (cand.id, lines)
        keeps = [i for i, line in enumerate(lines) if line.startswith(f"keep {cand.id} ")]
        assert all(i > listed[0] for i in keeps), (cand.id, lines)
    assert any(line.startswith("keep ") for line in lines), lines


@pytest.mark.parametrize("option", ["--rounds", "--parallel"])
def test_zero_rounds_or_parallel_is_refused_not_the_default(tmp_path, option):
    repo = score_repo(tmp_path / "r")
    proc = ratchet(repo, "run", option, "0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"Invalid value for '{option}'" in proc.stderr
    assert not (repo / ".ratchet" / "jobs").exists()  # nothing ran


LONG_ERROR_EVALUATOR = '''
import sys, solution
if solution.X != 3.0:
    sys.stderr.write(" ".join(f"averyveryverylongwordnumber{i:03d}" for i in range(80)) + "\\n")
    sys.exit(1)
print("correct: true")
print(f"score: {solution.score():.6f}")
'''


def test_results_tsv_cuts_a_long_reason_between_words(tmp_path):
    from helpers import SCORE_SOLUTION, config_text, make_repo, results_tsv

    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(search='[search]\nproposer = "tune"\nparallel = 2\n'
                                           'rounds = 1\n'),
        "evaluate.py": LONG_ERROR_EVALUATOR, "solution.py": SCORE_SOLUTION})
    ratchet(repo, "run", check=True)
    with Study(repo) as study:
        crashed = [c for c in study.ledger.candidates() if c.status == "crash"]
    assert crashed and len(crashed[0].reasons) > 160
    full = " ".join(crashed[0].reasons.split())
    row = next(r for r in results_tsv(repo) if r["status"] == "crash")
    shown = row["description"].split(" [", 1)[1].removesuffix("]")
    assert shown.endswith("…"), shown
    kept = shown.removesuffix("…")
    assert full.startswith(kept) and full[len(kept)] == " ", (kept, full)  # a whole word


def test_show_of_a_proposal_that_never_applied_says_so_not_commit_none(tmp_path):
    patch = ("--- a/solution.py\n+++ b/solution.py\n@@ -1,1 +1,1 @@\n"
             "-this line is not in the file\n+X = 1.25\n")
    repo = score_repo(tmp_path / "r", knobs="",
                      search='[search]\nproposer = "patches"\nparallel = 1\nrounds = 2\n'
                             '[patches]\ndir = "patches"\n')
    (repo / "patches").mkdir()
    (repo / "patches" / "bad.patch").write_text(patch)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a patch that does not apply")
    ratchet(repo, "run", check=True)
    with Study(repo) as study:
        unapplied = [c for c in study.ledger.candidates() if c.commit_sha is None]
    assert unapplied, "the bad patch made a commit"
    proc = ratchet(repo, "show", unapplied[0].id)
    assert proc.returncode == 0, proc.stderr
    assert "None" not in proc.stdout, proc.stdout
    assert "no commit: the proposal was not applied" in proc.stdout


OVERFIT_HOLDOUT = '''
import solution
print("correct: true")
# the start holds up on the hold-out; every change regresses there (it overfit)
print(f"score: {3.0625 if solution.X == 3.0 else 100.0:.6f}")
'''


def test_the_report_says_the_rounds_status_says_and_lists_no_pass_text_as_a_failure(tmp_path):
    import html
    import json

    from helpers import SCORE_EVALUATOR, SCORE_SOLUTION, config_text, make_repo

    task = ('[task]\nname = "demo"\neditable = ["solution.py"]\n'
            'protected = ["evaluate.py", "holdout.py"]\nevaluate = "python evaluate.py"\n'
            'holdout = "python holdout.py"\ntimeout = "60s"\n')
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(task=task, search='[search]\nproposer = "tune"\n'
                                                      'parallel = 2\nrounds = 2\n',
                                    knobs='[tune.knobs]\n"solution.py:X" = '
                                          '{ choices = [2.0, 1.5, 1.25, 1.0] }\n'),
        "evaluate.py": SCORE_EVALUATOR, "holdout.py": OVERFIT_HOLDOUT,
        "solution.py": SCORE_SOLUTION})
    ratchet(repo, "run", check=True)
    with Study(repo) as study:
        overfit = [c for c in study.ledger.candidates() if c.code == "overfit"]
    assert overfit and "gain" in overfit[0].reasons  # it passed the comparison first
    status = json.loads(ratchet(repo, "status", "--json", check=True).stdout)
    ratchet(repo, "report", check=True)
    page = html.unescape((repo / ".ratchet" / "report" / "index.html").read_text())
    assert f"round {status['round']} · branch" in page
    shares = page[page.index("crash and rejection reasons"):]
    assert "rejected: overfit: hold-out score N" in shares
    assert "gain N > margin" not in shares


def test_ctrl_c_outside_run_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C during a long command that is not `run` (here `prep`): one line saying what
    stays, exit 130 (the shell's convention), never a traceback or a bare 'Aborted!'."""
    import signal
    import subprocess
    import time

    repo = score_repo(tmp_path / "r")
    with open(repo / "ratchet.toml", "a") as fh:
        fh.write('\n[prep]\nrun = "sleep 60"\n')
    git(repo, "commit", "-qam", "prep that takes a while")
    proc = subprocess.Popen(
        [*RATCHET, "prep", "--repo", str(repo)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((repo / ".ratchet").glob("**/prep*")):
        time.sleep(0.2)  # prep has started
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "Aborted" not in err, err
    assert err.strip().splitlines()[-1].startswith("interrupted (Ctrl-C)"), err
