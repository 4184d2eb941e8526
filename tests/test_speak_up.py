"""A run that speaks up (issue 36): each quiet situation says one line, as a user sees it.

- an exhausted search space ends the study and says so (the kernel example's 12 knob
  settings with `--rounds 9`), instead of re-measuring the incumbent alone;
- `--rounds` at or below what is done says nothing will run, and how to run more;
- `ratchet idea` on a proposer that does not read ideas says so;
- status, show and the report name the sandbox the jobs ran under (their own word), not
  only what this machine would give now;
- output that is not a terminal gets a progress line while a long round runs;
- `ratchet serve` before the first run waits for the study, then serves it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request

from helpers import (
    RATCHET,
    ROOT,
    SCORE_SOLUTION,
    make_repo,
    ratchet,
    sandbox_env,
    score_repo,
)
from test_cli_tune import EVALUATOR as KERNEL_EVALUATOR

from ratchet.core.vocab import Kind
from ratchet.store.ledger import Ledger


def test_an_exhausted_search_space_ends_the_study_and_says_so(tmp_path):
    example = ROOT / "examples" / "kernel-cpu"
    toml = (example / "ratchet.toml").read_text().replace(
        # the stand-in evaluator imports the kernel in-process (it tests the rounds)
        "python -P evaluate.py", "python evaluate.py")
    assert "co_run_incumbent = true" in toml  # the case that re-measured in silence
    repo = make_repo(tmp_path / "k", {"ratchet.toml": toml,
                                      "kernel.py": (example / "kernel.py").read_text(),
                                      "evaluate.py": KERNEL_EVALUATOR})
    proc = ratchet(repo, "run", "--rounds", "9", timeout=600)
    assert proc.returncode == 0, proc.stderr
    ledger = Ledger.readonly(repo / ".ratchet" / "ledger.db")
    cands = ledger.candidates()
    tried = [c for c in cands if c.kind == Kind.CANDIDATE]
    assert len(tried) == 11  # 6 x 2 settings, less the baseline's
    last = max(c.round for c in tried)
    said = [line for line in proc.stderr.splitlines() if "nothing new to try" in line]
    assert said == [f"round {last + 1} of 9: the proposer has nothing new to try (its "
                    "search space is exhausted); the study ends here"], said
    # no round of re-measures alone after the space ran out (at most the one started
    # while the proposer was asked)
    alone = {c.round for c in cands if c.kind == Kind.INCUMBENT and c.round > last}
    assert alone <= {last + 1}, alone
    ledger.close()


def test_rounds_at_or_below_what_is_done_says_nothing_runs(tmp_path):
    repo = score_repo(tmp_path / "r")
    assert ratchet(repo, "run", "--rounds", "2").returncode == 0
    for asked in ("2", "1"):
        proc = ratchet(repo, "run", "--rounds", asked)
        assert proc.returncode == 0, proc.stderr
        assert (f"the study has run 2 rounds and --rounds {asked} is the total: nothing to "
                f"run (--rounds {2 + int(asked)} runs {asked} more)") in proc.stderr
    more = ratchet(repo, "run", "--rounds", "3")
    assert more.returncode == 0 and "nothing to run" not in more.stderr
    assert "round 3/3" in more.stdout


def test_an_idea_the_proposer_cannot_use_is_said(tmp_path):
    repo = score_repo(tmp_path / "r")  # proposer = "tune"
    proc = ratchet(repo, "idea", "try X = 1.25")
    assert proc.returncode == 0 and proc.stdout.strip() == "queued"
    assert ("note: the tune proposer does not read ideas; it stays pending until the "
            "study runs with one that does (`--proposer llm` or `agent`)") in proc.stderr


def test_status_show_and_report_name_the_sandbox_the_jobs_ran_under(tmp_path):
    env = sandbox_env("pidns", tmp_path)  # this run's jobs: no bubblewrap
    repo = score_repo(tmp_path / "r", search='[search]\nproposer = "tune"\nparallel = 2\n'
                                             'rounds = 1\n')
    assert ratchet(repo, "run", env=env).returncode == 0
    ledger = Ledger.readonly(repo / ".ratchet" / "ledger.db")
    jobs = sum(ledger.sandboxes().values())
    ledger.close()
    assert jobs >= 2
    status = ratchet(repo, "status").stdout  # asked where bubblewrap works (or not)
    assert f"sandbox: the jobs ran under pidns ({jobs} jobs)" in status.splitlines()
    assert any(line.startswith("sandbox now: ") for line in status.splitlines())
    assert json.loads(ratchet(repo, "status", "--json").stdout)["sandbox_ran"] == {
        "pidns": jobs}
    assert "sandbox: ran under pidns" in ratchet(repo, "show", "c0001").stdout.splitlines()
    assert ratchet(repo, "report").returncode == 0
    index = (repo / ".ratchet" / "report" / "index.html").read_text()
    assert f'<p class="note" id="sandbox">the jobs ran under pidns ({jobs} jobs)</p>' in index


def test_output_that_is_not_a_terminal_gets_progress_lines(tmp_path):
    solution = SCORE_SOLUTION.replace("SLEEP = 0.0", "SLEEP = 1.5")
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": (score_repo(tmp_path / "cfg") / "ratchet.toml").read_text().replace(
            "rounds = 3", "rounds = 1"),
        "evaluate.py": "import solution\nprint(f'score: {solution.score():.6f}')\n",
        "solution.py": solution})
    proc = ratchet(repo, "run", env={"RATCHET_PROGRESS_EVERY": "0.5"})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines()
             if re.fullmatch(r"\d\d:\d\d:\d\d round 1/1: .*", line)]
    assert any(re.search(r"\d jobs? running \(longest c000\d \S.* \d+s\)", line)
               for line in lines), proc.stderr
    assert all(len(line) <= 80 for line in lines), lines


def test_serve_waits_for_a_study_then_serves_it(tmp_path):
    repo = score_repo(tmp_path / "r", search='[search]\nproposer = "tune"\nparallel = 2\n'
                                             'rounds = 1\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    server = subprocess.Popen([*RATCHET, "serve", "--port", "0", "--repo", str(repo)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert first.startswith(f"waiting for a study in {repo}"), first
        assert not (repo / ".ratchet").exists()  # waiting created nothing
        time.sleep(1.0)
        assert server.poll() is None  # still waiting, not refused
        assert ratchet(repo, "run").returncode == 0
        line = server.stdout.readline()
        url = re.search(r"serving (http://\S+)", line)
        assert url, line
        # the token moves into a cookie on the way to the page
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with browser.open(url.group(1), timeout=30) as page:
            assert page.status == 200 and "c0001" in page.read().decode()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_serve_where_no_study_can_appear_is_one_line(tmp_path):
    repo = make_repo(tmp_path / "plain", {"README": "no task here\n"})
    proc = ratchet(repo, "serve", "--port", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: {repo}: no ratchet.toml here, so no study will "
                                   "appear to serve (`ratchet init` writes one; or -C the "
                                   "study's repository)")
