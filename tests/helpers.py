"""Build real research repositories in temp dirs for tests (no mocks: real git)."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import traceback
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

# The same score with a hold-out (`python evaluate.py --holdout`) that agrees except at
# X = 1.2, a value "tuned to the benchmark": public best by far, hold-out terrible, so a
# candidate at 1.2 is refused as overfit.
HOLDOUT_EVALUATOR = '''
import sys
import solution
print("correct: true")
if "--holdout" in sys.argv:
    print(f"score: {99.0 if solution.X == 1.2 else solution.score():.6f}")
else:
    print(f"score: {solution.score():.6f}")
'''

# The same score, measured as docs/kernels.md says an evaluator should: the candidate is
# called in a sandboxed child (as the unprivileged uid), never imported by the evaluator.
CHILD_SCORE_EVALUATOR = '''
from ratchet.evaluator.isolate import CandidateProcess

with CandidateProcess("solution.py") as cand:
    value = cand.call("score")
print("correct: true")
print(f"score: {value:.6f}")
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


def solution_branches(repo: Path, values: dict[str, str]) -> None:
    """A branch off main per name, each setting solution.py's X to its value (refs for the
    patches proposer); the checkout is left on main."""
    for name, value in values.items():
        git(repo, "checkout", "-q", "-b", name, "main")
        (repo / "solution.py").write_text(f"X = {value}\n")
        git(repo, "commit", "-qam", f"X = {value}")
    git(repo, "checkout", "-q", "main")


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
            check: bool = False, process: bool | None = None,
            python: str | None = None) -> subprocess.CompletedProcess:
    """`ratchet ARGS --repo REPO`, as a user types it; what it printed and its exit code.

    It runs in this test's process (the command's own `main`, its streams and environment
    swapped for the call), which saves a Python start and the CLI's import on each of the
    suite's few hundred calls. Where the process itself is the point it is a real
    `python -m ratchet.cli`: `process=True`, and always for an injected fault
    (`RATCHET_FAULT` SIGKILLs the process it lands in), a study on Ray (`ray.init` is
    once per process) and another interpreter (`python`: its venv is the one jobs use).
    The study's jobs are real worker processes either way.
    """
    argv = [*args, "--repo", str(repo)] if args and args[0] not in ("--help",) else [*args]
    if process is None:
        process = python is not None or _needs_process(repo, args, env or {})
    proc = (_run_process(argv, timeout, env, python) if process
            else _run_in_process(argv, env))
    if check and proc.returncode != 0:
        raise AssertionError(f"ratchet {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _needs_process(repo: Path, args: tuple[str, ...], env: dict) -> bool:
    if "RATCHET_FAULT" in env or "ray" in args:
        return True
    config = repo / "ratchet.toml"
    try:
        text = config.read_text()
    except OSError:
        return False
    return re.search(r'^\s*kind\s*=\s*"ray"', text, re.MULTILINE) is not None


def _run_process(argv: list[str], timeout: float, env: dict | None,
                 python: str | None = None) -> subprocess.CompletedProcess:
    # this checkout's src, after any path the test puts first (packages it installed)
    paths = [(env or {}).get("PYTHONPATH"), str(ROOT / "src")]
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    cli = [python, *RATCHET[1:]] if python else RATCHET
    return subprocess.run([*cli, *argv], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def _run_in_process(argv: list[str], env: dict | None) -> subprocess.CompletedProcess:
    from ratchet import cli

    saved_env = dict(os.environ)
    saved_argv = sys.argv
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    out, err = _captured(), _captured()
    code: int = 0
    try:
        os.environ.update({**(env or {}), "PYTHONPATH": str(ROOT / "src")})
        sys.argv = ["ratchet", *argv]
        sys.stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8")
        sys.stdout, sys.stderr = out, err
        cli.main()
    except SystemExit as exc:
        if isinstance(exc.code, str):  # sys.exit("message"): printed, exit status 1
            print(exc.code, file=err)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:  # a bug: its traceback on stderr and exit 1, as the interpreter does
        traceback.print_exc(file=err)
        code = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        for sig, handler in saved_handlers.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(["ratchet", *argv], code, _text(out), _text(err))


def _captured() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="replace",
                            write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8", "replace")


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


def sandbox_env(level: str, tmp_path: Path) -> dict[str, str]:
    """The environment that makes a study run its candidates at `level` ("bwrap" or
    "pidns"), or skips the test where this machine cannot: for pidns, a PATH whose
    bubblewrap does not work (as on a machine without it), so ratchet falls back."""
    import pytest

    from ratchet.job import sandbox

    if level == "bwrap" and not sandbox.bwrap_works():
        pytest.skip("bubblewrap does not work here")
    if level == "pidns" and sandbox.unshare_prefix() is None:
        pytest.skip("unshare cannot make a PID namespace here")
    return without_bwrap(tmp_path) if level == "pidns" else {}


def without_bwrap(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH finds a bubblewrap that does not work (as on a machine
    without it), so ratchet falls back to the next level."""
    stub = tmp_path / "stub-bin"
    stub.mkdir(exist_ok=True)
    (stub / "bwrap").write_text("#!/bin/sh\nexit 1\n")
    (stub / "bwrap").chmod(0o755)
    return {"PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}


def submit_and_wait(repo: Path, rev: str, env: dict[str, str] | None = None) -> dict:
    """`ratchet submit REV` then `ratchet wait` on it, as a person (or an agent) would:
    the candidate's row as `wait --json` prints it."""
    import json

    proc = ratchet(repo, "submit", rev, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cand_id = proc.stdout.strip().splitlines()[-1]
    proc = ratchet(repo, "wait", cand_id, "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
