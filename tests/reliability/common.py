"""Shared pieces of the reliability tests: a deterministic task, driver processes, scans."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
from helpers import ROOT, config_text, make_repo

from ratchet.store.ledger import Ledger


# Settings of X (1.25 among them); the score (X - 1.25)^2 is a pure function of X, so
# every run of the same study has one right answer.
def choices(n: int = 60) -> str:
    """n distinct settings of X (the tuner never repeats one: n bounds a study's length)."""
    return "[" + ", ".join(f"{-2.0 + 9.75 * i / n:.4f}" for i in range(n)) + "]"


CHOICES = choices()

SOLUTION = '''
"""Editable."""
import time

X = 3.0  # the knob


def score():
    time.sleep(0.15)
    return (X - 1.25) ** 2
'''

EVALUATOR = "import solution\nprint('correct: true')\nprint(f'score: {solution.score():.6f}')\n"


def deterministic_repo(path: Path, rounds: int = 16, parallel: int = 2,
                       sleep: float = 0.15, settings: int = 60) -> Path:
    return make_repo(path, {
        "ratchet.toml": config_text(
            search=f'[search]\nproposer = "tune"\nparallel = {parallel}\nrounds = {rounds}\n',
            knobs=f'[tune]\nsampler = "random"\n[tune.knobs]\n"solution.py:X" = '
                  f'{{ choices = {choices(settings)} }}\n',
        ),
        "evaluate.py": EVALUATOR,
        "solution.py": SOLUTION.replace("time.sleep(0.15)", f"time.sleep({sleep})"),
    })


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "RATCHET_FAULT"}
    out["PYTHONPATH"] = str(ROOT / "src")
    out.update(extra)
    return out


ROLLING_CLI = Path(__file__).parent / "rolling_cli.py"


def start_run(repo: Path, *args: str, rolling: bool = False,
              **extra_env: str) -> subprocess.Popen:
    """`ratchet run` as a real driver process; `rolling`: search.mode = "rolling"."""
    entry = [str(ROLLING_CLI)] if rolling else ["-m", "ratchet.cli"]
    return subprocess.Popen(
        [sys.executable, *entry, "run", "--repo", str(repo), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(**extra_env),
    )


def ledger(repo: Path) -> Ledger:
    return Ledger(repo / ".ratchet" / "ledger.db")


def snapshot(repo: Path) -> tuple:
    """Every row of the ledger (candidates, events, meta, ideas), for before/after checks."""
    db_path = repo / ".ratchet" / "ledger.db"
    if not db_path.exists():
        return ()
    db = sqlite3.connect(str(db_path))
    try:
        return tuple(
            tuple(db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall())
            for table in ("meta", "candidates", "events", "ideas")
        )
    finally:
        db.close()


def processes_under(path: Path) -> list[str]:
    """Live processes whose command line or working directory mentions `path`."""
    token = str(path)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        if token in cmdline or token in (proc.info["cwd"] or ""):
            found.append(f"{proc.pid}: {cmdline}")
    return found


def wait_until(predicate, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_no_processes(path: Path, timeout: float = 15) -> list[str]:
    deadline = time.monotonic() + timeout
    left = processes_under(path)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_under(path)
    return left
