"""Build real research repositories in temp dirs for tests (no mocks: real git)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RATCHET = [sys.executable, "-m", "ratchet.cli"]

GIT_ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}

# A deterministic task: the score is a pure function of the knob X; the evaluator is
# protected. Minimising (X - 1.25)^2 over choices gives a known answer.
SCORE_EVALUATOR = '''
import solution
print("correct: true")
print(f"score: {solution.score():.6f}")
'''

SCORE_SOLUTION = '''
"""Editable."""

X = 3.0  # the knob
SLEEP = 0.0


def score():
    import time
    time.sleep(SLEEP)
    return (X - 1.25) ** 2
'''


def config_text(**overrides: str) -> str:
    sections = {
        "task": textwrap.dedent('''
            [task]
            name = "demo"
            editable = ["solution.py"]
            protected = ["evaluate.py"]
            evaluate = "python evaluate.py"
            timeout = "60s"
        '''),
        "metric": '[task.metric]\nname = "score"\ngoal = "minimize"\n',
        "search": '[search]\nproposer = "tune"\nparallel = 2\nrounds = 3\n',
        "knobs": '[tune.knobs]\n"solution.py:X" = { choices = [3.0, 2.0, 1.5, 1.0, 0.0, 5.0] }\n',
        "backend": '[backend]\nkind = "local"\nslots = 2\n',
    }
    sections.update(overrides)
    return "\n".join(s for s in sections.values() if s)


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
        check=True,
    )
    return out.stdout.strip()


def make_repo(path: Path, files: dict[str, str], commit: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    for rel, text in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text).lstrip("\n") if rel.endswith(".py") else text)
    if commit:
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", "task")
    return path


def score_repo(path: Path, **config_overrides: str) -> Path:
    return make_repo(
        path,
        {
            "ratchet.toml": config_text(**config_overrides),
            "evaluate.py": SCORE_EVALUATOR,
            "solution.py": SCORE_SOLUTION,
        },
    )


def ratchet(repo: Path, *args: str, timeout: float = 240, env: dict | None = None,
            check: bool = False, python: str | None = None) -> subprocess.CompletedProcess:
    """`python`: run the CLI under that interpreter (its venv is the one jobs use)."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(ROOT / "src")
    cli = [python, *RATCHET[1:]] if python else RATCHET
    proc = subprocess.run(
        [*cli, *args, "--repo", str(repo)] if args and args[0] not in ("--help",) else
        [*cli, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"ratchet {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def results_tsv(repo: Path) -> list[dict[str, str]]:
    lines = (repo / "results.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def job_result(repo: Path, job_id: str) -> dict:
    """A local job's result as the driver reads it: unsealed with the job's own key."""
    import json

    from ratchet.job.jobspec import JobResult
    from ratchet.job.seal import KeyStore

    state = repo / ".ratchet"
    key = KeyStore(state).get(job_id)
    assert key is not None, f"no result key for {job_id}"
    text = (state / "jobs" / job_id / "result.json").read_text()
    return json.loads(JobResult.from_sealed(text, key, job_id).to_json())
