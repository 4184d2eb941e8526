"""Shared pieces: a tiny task in a real git repo, and the loopback LLM server."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for llm_server

from llm_server import LLMServer  # noqa: E402

from ratchet.driver.config import load_config  # noqa: E402
from ratchet.proposers import ProposalContext  # noqa: E402
from ratchet.store.ledger import Ledger  # noqa: E402

SOLUTION = """\
# the value the evaluator reports; lower is better
VALUE = 10


def compute():
    total = VALUE
    return total
"""

EVALUATE = """\
import solution

print(f"score: {solution.compute()}")
"""

PROGRAM = "# program.md\nMake the score as low as possible without cheating.\n"

BASE_TOML = """\
[task]
name = "tiny"
editable = ["solution.py", "helpers/*.py"]
protected = ["evaluate.py"]
evaluate = "python evaluate.py"
timeout = "60s"

[task.metric]
name = "score"
goal = "minimize"

[search]
proposer = "{proposer}"
parallel = {parallel}
rounds = 1

[backend]
kind = "local"
slots = 2

[context]
hardware = false
{context}
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def make_repo(path: Path, proposer: str, extra_toml: str = "", parallel: int = 3,
              files: dict[str, str] | None = None, context: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    contents = {
        "solution.py": SOLUTION,
        "evaluate.py": EVALUATE,
        "program.md": PROGRAM,
        "ratchet.toml": BASE_TOML.format(proposer=proposer, parallel=parallel, context=context)
        + textwrap.dedent(extra_toml),
        **(files or {}),
    }
    for name, text in contents.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "task")
    return path


def context_for(repo: Path, round: int = 1, ideas: list[str] | None = None,
                history: list | None = None, metric: float | None = 10.0) -> ProposalContext:
    config = load_config(repo)
    state = repo / ".ratchet"
    state.mkdir(exist_ok=True)
    return ProposalContext(
        repo=repo, state_dir=state, config=config, study=config.task.name, round=round,
        incumbent=git(repo, "rev-parse", "HEAD"), incumbent_metric=metric,
        history=history or [], ideas=ideas or [],
    )


def ledger_of(repo: Path) -> Ledger:
    return Ledger(repo / ".ratchet" / "ledger.db")


@pytest.fixture
def server():
    with LLMServer() as srv:
        yield srv


@pytest.fixture(autouse=True)
def dummy_keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-dummy")


def edit(value: int, description: str = "", path: str = "solution.py") -> str:
    """A well-formed reply changing VALUE."""
    return (f"DESCRIPTION: {description or f'set VALUE to {value}'}\n\n"
            f"{path}\n<<<<<<< SEARCH\nVALUE = 10\n=======\nVALUE = {value}\n>>>>>>> REPLACE\n")


def whole_file(value: int) -> str:
    """A reply rewriting solution.py whole: it applies on any incumbent."""
    return (f"DESCRIPTION: set VALUE to {value}\n\nsolution.py\n<<<<<<< FILE\n"
            f"VALUE = {value}\n\n\ndef compute():\n    return VALUE\n>>>>>>> FILE\n")
