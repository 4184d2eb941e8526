"""What the agent sandbox costs per agent run.

    .venv/bin/python bench/agent_sandbox.py [--runs 20] [--files 200]

Two figures per sandbox level, medians over `--runs`:
- **jail**: starting an agent command that does nothing (`/bin/true`) as a sandbox.Jail
  under the agent's Policy and seeing its whole tree end, less a plain `Popen` of the
  same command: the sandbox itself.
- **per agent**: one whole `AgentProposer.propose(1, ...)` with that command (context,
  private copy of a repository of `--files` files, private home, jail, reading back,
  throwing the copy away), less the same with a plain `Popen` in place of the jail: what
  one agent run costs beyond the agent.
The target (issue 20) is at most 0.5 s per agent run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ratchet.driver.config import load_config  # noqa: E402
from ratchet.job import sandbox  # noqa: E402
from ratchet.proposers import ProposalContext  # noqa: E402
from ratchet.proposers import agent as agent_module  # noqa: E402
from ratchet.proposers.agent import AgentProposer  # noqa: E402

CONFIG = """
[task]
name = "bench"
editable = ["src/*.py"]
protected = ["evaluate.py"]
evaluate = "python evaluate.py"

[task.metric]
name = "score"
goal = "minimize"

[search]
proposer = "agent"

[agent]
command = ["/bin/true"]
unsandboxed = true

[context]
hardware = false
"""


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


def make_repo(path: Path, files: int) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "ratchet.toml").write_text(CONFIG)
    (path / "evaluate.py").write_text("print('score: 1')\n")
    (path / "src").mkdir()
    for i in range(files):
        (path / "src" / f"m{i:04d}.py").write_text(f"VALUE_{i} = {i}\n" * 40)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "bench")
    return path


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def plain_true() -> float:
    start = time.perf_counter()
    subprocess.run(["/bin/true"], stdin=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def jailed_true(level: sandbox.Level, root: Path) -> float:
    policy = sandbox.Policy(writable=[root], hidden=[], seed="bench", network=True)  # as agents
    sandbox.grant([root], policy)
    start = time.perf_counter()
    jail = sandbox.Jail(["/bin/true"], policy, level=level, cwd=root,
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    jail.wait()
    jail.kill()
    return time.perf_counter() - start


def propose_once(proposer: AgentProposer, repo: Path) -> float:
    config = proposer.config
    ctx = ProposalContext(repo=repo, state_dir=repo / ".ratchet", config=config,
                          study="bench", round=1, incumbent=git(repo, "rev-parse", "HEAD"),
                          incumbent_metric=1.0)
    start = time.perf_counter()
    [proposal] = proposer.propose(1, ctx)
    assert proposal.error == "agent made no change", proposal.error
    return time.perf_counter() - start


class PlainJail:
    """sandbox.Jail's shape around a plain Popen: the same run without the sandbox."""

    def __init__(self, argv, policy, *, level, **popen):
        self.proc = subprocess.Popen(argv, **popen)

    def wait(self, timeout=None):
        return self.proc.wait(timeout=timeout)

    def kill(self, grace_s=2.0):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--files", type=int, default=200)
    args = parser.parse_args()
    levels = [lvl for lvl, ok in ((sandbox.Level.BWRAP, sandbox.bwrap_works()),
                                  (sandbox.Level.PIDNS, sandbox.unshare_prefix() is not None),
                                  (sandbox.Level.NONE, True)) if ok]
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp) / "repo", args.files)
        (repo / ".ratchet").mkdir()
        proposer = AgentProposer(load_config(repo), [])
        print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
              f"{args.runs} runs each; repository of {args.files} editable files; "
              f"euid {os.geteuid()}")
        real_jail = sandbox.Jail
        print("| level | jail ms | plain Popen ms | jail - Popen ms | agent run ms | "
              "same without the jail ms | difference ms |")
        print("|---|---|---|---|---|---|---|")
        for level in levels:
            root = Path(tmp) / f"jail-{level}"
            root.mkdir()
            proposer.level = level
            jail, plain, whole, unjailed = [], [], [], []
            for _ in range(args.runs):  # interleaved: a loaded machine drifts
                plain.append(plain_true())
                jail.append(jailed_true(level, root))
                whole.append(propose_once(proposer, repo))
                agent_module.sandbox.Jail = PlainJail  # type: ignore[misc,assignment]
                try:
                    unjailed.append(propose_once(proposer, repo))
                finally:
                    agent_module.sandbox.Jail = real_jail  # type: ignore[misc]
            j, p, w, u = map(median_ms, (jail, plain, whole, unjailed))
            print(f"| {level} | {j:.1f} | {p:.1f} | {j - p:.1f} | {w:.1f} | {u:.1f} | "
                  f"{w - u:.1f} |")
        print(f"load average after: {os.getloadavg()[0]:.1f}")

if __name__ == "__main__":
    main()
