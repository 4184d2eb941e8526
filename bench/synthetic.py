"""The synthetic study the benchmarks run: one knob, and an evaluator that sleeps.

The score is the knob's value (lower is better), so `start` against `choices` decides
whether candidates are ever kept. The run time is the evaluator's sleep: fixed, or
lognormal by the candidate's number, so both sides of a comparison see the same times.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

CONFIG = """
[task]
name = "{name}"
editable = ["knob.py"]
protected = {protected}
{phases}
evaluate = "python evaluate.py"
timeout = "{timeout}"

[task.metric]
name = "score"
goal = "minimize"

[search]
proposer = "{proposer}"
mode = "{mode}"
parallel = {k}
rounds = {rounds}

[tune]
sampler = "{sampler}"

[tune.knobs]
"knob.py:X" = {{ choices = {choices} }}

[backend]
kind = "{kind}"
{backend_keys}
{extra}
"""

EVALUATE = """
import os, random, time
import knob
seq = int(os.environ.get("RATCHET_CANDIDATE", "c0")[1:] or 0)
sleep = {sleep}
if {lognormal}:
    sleep = {sleep} * random.Random(seq).lognormvariate(0.0, 0.9)
time.sleep(sleep)
# a relative noise of `noise` (0: deterministic), drawn afresh at every evaluation
print(f"score: {{knob.X * (1.0 + {noise} * random.gauss(0.0, 1.0))}}")
"""


# the `llm` proposer pointed at a fake OpenAI-compatible server (tests/llm_server.py): no
# retries to wait on, so a bench times the study, not the client's back-off
LLM = """
[llm]
timeout = 30
max_retries = 0
retries = 1
backoff = 0.05

[[llm.models]]
provider = "openai"
model = "{model}"
base_url = "{url}"
"""


def llm_section(url: str, model: str = "fake") -> str:
    """ratchet.toml's [llm] table for a fake model at `url`."""
    return LLM.format(url=url, model=model)


def git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    subprocess.run(["git", "-C", str(repo), *args], check=True, env=env, capture_output=True)


def make_repo(path: Path, *, k: int, rounds: int, sleep: float = 1.0, name: str = "bench",
              proposer: str = "tune", mode: str = "rounds", sampler: str = "tpe",
              kind: str = "local", backend_keys: str | None = None, extra: str = "",
              start: int = 10, choices: Iterable[int] = range(100, 300),
              lognormal: bool = False, timeout: str = "5m", noise: float = 0.0,
              protected: tuple[str, ...] = ("evaluate.py",), phases: str = "",
              files: dict[str, str] | None = None) -> Path:
    """A committed study repository at `path` (`files` adds or replaces files)."""
    path.mkdir(parents=True)
    (path / "ratchet.toml").write_text(CONFIG.format(
        name=name, protected=list(protected), phases=phases, timeout=timeout,
        proposer=proposer, mode=mode, k=k, rounds=rounds, sampler=sampler,
        choices=list(choices), kind=kind, extra=extra,
        backend_keys=f"slots = {k}" if backend_keys is None else backend_keys))
    (path / "knob.py").write_text(f"X = {start}\n")
    (path / "evaluate.py").write_text(EVALUATE.format(sleep=sleep, lognormal=lognormal,
                                                      noise=noise))
    (path / "program.md").write_text("# program\nLower X.\n")
    for rel, text in (files or {}).items():
        (path / rel).write_text(text)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "bench")
    return path
