"""Spend and budgets through the CLI with the tune proposer (no server needed): the wall
time leaves out the idle time between invocations, the estimate before the first round,
one-line errors for a bad [budget], a slot-hours limit."""

from __future__ import annotations

import json
import time

from helpers import config_text, make_repo, ratchet, score_repo

from ratchet.store.ledger import Ledger

SLOW = '''
"""Editable."""

X = 3.0  # the knob
SLEEP = 0.4


def score():
    import time
    time.sleep(SLEEP)
    return (X - 1.25) ** 2
'''


def slow_repo(path, **overrides):
    from helpers import SCORE_EVALUATOR

    return make_repo(path, {"ratchet.toml": config_text(**overrides),
                            "evaluate.py": SCORE_EVALUATOR, "solution.py": SLOW})


def test_wall_time_leaves_out_the_idle_time_between_runs(tmp_path):
    repo = slow_repo(tmp_path / "r")
    began = time.time()
    ratchet(repo, "run", "--rounds", "1", check=True)
    time.sleep(6)  # nobody runs the study meanwhile
    ratchet(repo, "run", "--rounds", "2", check=True)
    elapsed = time.time() - began
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    sessions = ledger.sessions()
    ledger.close()
    assert len(sessions) == 2 and all(end > start for start, end in sessions)
    status = json.loads(ratchet(repo, "status", "--json", check=True).stdout)
    wall = status["wall_hours"] * 3600
    assert wall <= elapsed - 5.5  # the 6 s between the runs are not the study's
    assert wall >= sum(end - start for start, end in sessions) - 2.5  # beats: every 2 s
    # the achieved rate is over that wall time: jobs x 3600 / wall
    text = ratchet(repo, "status", check=True).stdout
    assert "achieved" in text and "wall" in text


def test_the_first_run_prints_an_estimate_per_round(tmp_path):
    repo = score_repo(tmp_path / "r", backend='[backend]\nkind = "local"\nslots = 2\n'
                      'cpu_hourly_usd = 3.6\n', budget="[budget]\nusd = 1\n")
    proc = ratchet(repo, "run", "--rounds", "1", check=True)
    out = proc.stdout + proc.stderr
    # 2 jobs x the 60 s timeout at $3.6/h: at most $0.12 of compute a round
    assert "estimate per round of 2: proposer about $0.0000" in out
    assert "compute at most $0.1200 (2 jobs x timeout 60 s at $3.6/h" in out
    assert "budget.usd $1 covers about 8 round(s)" in out
    again = ratchet(repo, "run", "--rounds", "2", check=True)
    assert "estimate per round" not in again.stdout + again.stderr  # once, before round 1


def test_a_bad_budget_is_one_line_naming_the_field(tmp_path):
    for table, message in (
            ("[budget]\nusd = -2\n", "budget.usd: Input should be greater than 0"),
            ("[budget]\nhuors = 3\n", "budget.huors: unknown key; did you mean 'hours'?"),
            ("[budget]\nwall = \"soon\"\n", "budget.wall: expected hours (8, 0.5) or a "
             "duration such as '90m', got 'soon'"),
            ("[budget]\nusd = 1\n[search.budget]\nusd = 2\n", "budget: given both")):
        repo = score_repo(tmp_path / f"r{len(message)}", budget=table)
        proc = ratchet(repo, "run")
        assert proc.returncode == 2, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr


def test_slot_hours_stop_a_study(tmp_path):
    # each job holds its slot about half a second: 2 slot-seconds allow a few candidates
    repo = slow_repo(tmp_path / "r", search='[search]\nproposer = "tune"\nparallel = 2\n'
                     'rounds = 20\n', budget='[budget]\nhours = "2s"\n')
    proc = ratchet(repo, "run", check=True)
    assert "stopped at budget.hours: " in proc.stdout
    status = json.loads(ratchet(repo, "status", "--json", check=True).stdout)
    used = status["budget"]["limits"]["hours"]["used"]
    assert status["budget"]["stopped"]["limit"] == "budget.hours"
    made = sum(n for s, n in status["counts"].items() if s not in ("committed", "submitted"))
    assert made < 20 * 2  # stopped long before the rounds ran out
    # it stopped at the first round that would cross the limit (or had reached it)
    stop = status["budget"]["stopped"]
    assert stop["spent"] + stop["step"] > stop["allowed"] or used >= 2 / 3600
