"""`proposer = "agent"`: a coding-agent CLI edits the code in its own git worktree.

K agents run at once, each non-interactively in `.ratchet/worktrees/<round>-<i>` (detached
at the incumbent) with the shared context (context.py) as its prompt, a scrubbed
environment (only the variables `[agent] env` names, plus PATH/HOME/locale), and a
timeout that kills the agent's whole process tree. Whatever it changed is committed in
the worktree and becomes the candidate; the study's scope check rejects changes outside
`task.editable` as for any candidate. The worktree is removed afterwards.

    [agent]
    preset = "claude"                 # claude | codex | aider
    env = ["ANTHROPIC_API_KEY"]       # the agent's own key(s)
    timeout = "20m"

    # or any command; placeholders: {prompt_file} {prompt} {worktree} {files}
    command = "my-agent --task {prompt_file}"

The agent should end its output with a line `DESCRIPTION: <what it tried>`; that line
becomes the candidate's description.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ratchet import gitrepo
from ratchet.candidate import Proposal
from ratchet.config import Config, Duration
from ratchet.ledger import Candidate
from ratchet.procs import CappedLog, kill_group, kill_tree
from ratchet.proposers import ProposalContext, Proposer, ProposerError
from ratchet.proposers.agent_clis import JUNK, PRESETS, failure_reason
from ratchet.proposers.context import (
    build_context,
    context_settings,
    editable_files,
    hypotheses,
    hypothesis_text,
    validate_section,
    warm_context,
)

PASS_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR",
            "TZ", "SHELL")
MAX_ARG_BYTES = 120_000  # Linux caps a single argv string at 128 KiB
_DESCRIPTION = re.compile(r"^\s*\**DESCRIPTION\**\s*:\s*\**\s*(.+?)\s*\**\s*$",
                          re.IGNORECASE | re.MULTILINE)

AGENT_INSTRUCTIONS = """\
## Your job now

{hypothesis}

You are in a git worktree of the repository ({worktree}), detached at the incumbent. \
Implement ONE focused change by editing the editable files in place. You may read any \
file and run quick checks, but do not edit protected files, do not commit, and do not \
move HEAD: ratchet commits and evaluates your change. When you are done, print one final \
line:

DESCRIPTION: <what this change tries and why it should help>
"""


class AgentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    preset: str | None = None
    command: str | list[str] | None = None
    timeout: Duration = 1800.0
    env: list[str] = []
    history: int | None = Field(default=None, ge=0)
    token_budget: int | None = Field(default=None, ge=500)
    log_limit_mb: float = Field(default=4.0, gt=0)

    @model_validator(mode="after")
    def _one_command(self) -> AgentSettings:
        if self.preset is None and self.command is None:
            raise ValueError(f"give preset = one of {', '.join(PRESETS)}, or command = "
                             "\"... {prompt_file}\"")
        if self.preset is not None and self.command is not None:
            raise ValueError("give either preset or command, not both")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r} (one of {', '.join(PRESETS)})")
        return self

    @property
    def argv(self) -> list[str]:
        if self.preset:
            return list(PRESETS[self.preset])
        if isinstance(self.command, list):
            return list(self.command)
        return shlex.split(self.command or "")


class AgentProposer(Proposer):
    name = "agent"

    def __init__(self, config: Config, history: list[Candidate]) -> None:
        self.config = config
        if not config.agent:
            raise ProposerError("search.proposer = 'agent' needs an [agent] section "
                                "(preset = \"claude\" | \"codex\" | \"aider\", or command)")
        self.settings = validate_section(AgentSettings, config.agent, "agent")
        self.context = context_settings(config, history=self.settings.history,
                                        token_budget=self.settings.token_budget)
        argv = self.settings.argv
        if not argv:
            raise ProposerError("agent.command: empty command")
        self.env = self._environment()
        if shutil.which(argv[0], path=self.env.get("PATH")) is None:
            raise ProposerError(f"agent: command {argv[0]!r} not found on PATH")
        self._git_lock = threading.Lock()  # worktree add/remove touch shared admin files

    def _environment(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        for i, name in enumerate(self.settings.env):
            value = os.environ.get(name)
            if value is None:
                raise ProposerError(f"agent.env[{i}]: environment variable {name} is not set")
            env[name] = value
        return env

    def warm_up(self) -> None:
        warm_context(self.context)  # the machine's description, before the first round

    def propose(self, k: int, ctx: ProposalContext) -> list[Proposal]:
        files = editable_files(ctx.repo, ctx.incumbent, ctx.config)
        shared = build_context(ctx, self.context, files)
        plans = hypotheses(k, ctx)
        with ThreadPoolExecutor(max_workers=max(k, 1)) as pool:
            futures = [
                pool.submit(self._one, ctx, i, k, idea, angle, shared, sorted(files))
                for i, (idea, angle) in enumerate(plans)
            ]
            return [f.result() for f in futures]

    def _one(self, ctx: ProposalContext, i: int, k: int, idea: str | None, angle: str,
             shared: str, files: list[str]) -> Proposal:
        name = f"{ctx.round}-{i}"
        worktree = ctx.state_dir / "worktrees" / name
        work_dir = ctx.state_dir / "agents" / name
        work_dir.mkdir(parents=True, exist_ok=True)
        prompt = shared + "\n" + AGENT_INSTRUCTIONS.format(
            hypothesis=hypothesis_text(idea, angle, i, k), worktree=worktree)
        prompt_file = work_dir / "prompt.md"
        prompt_file.write_text(prompt)
        fallback = f"idea: {idea}" if idea else f"agent: {angle}"
        argv = self._argv(prompt, prompt_file, worktree, files)
        if isinstance(argv, str):
            return Proposal(description=fallback, idea=idea, context=prompt, error=argv)
        self._fresh_worktree(ctx.repo, worktree, ctx.incumbent)
        try:
            env = {**self.env, "RATCHET_WORKTREE": str(worktree),
                   "RATCHET_PROMPT_FILE": str(prompt_file)}
            code, timed_out, output, seconds = run_agent(
                argv, worktree, env, work_dir / "agent.log", self.settings.timeout,
                int(self.settings.log_limit_mb * (1 << 20)))
            params = {"agent": {"command": argv[0], "exit_code": code,
                                "seconds": round(seconds, 2), "log": str(work_dir / "agent.log"),
                                "hypothesis": idea or angle}}
            found = _DESCRIPTION.findall(output)
            description = found[-1].strip().strip("`") if found else fallback
            base = Proposal(description=description, idea=idea, context=prompt, params=params)
            if timed_out:
                base.error = (f"agent timed out after {self.settings.timeout:g}s; its process "
                              "tree was killed")
                return base
            if code != 0:
                why = failure_reason(output)  # the CLI's own error line, not its usage text
                base.error = f"agent exited with code {code}" + (f": {why}" if why else "")
                return base
            _remove_junk(worktree)
            gitrepo.commit_worktree(worktree, f"agent: {description}")
            head = gitrepo.rev_parse(worktree, "HEAD")
            if head == ctx.incumbent:
                base.error = "agent made no change"
                return base
            base.commit = head
            return base
        finally:
            with self._git_lock:
                gitrepo.remove_worktree(ctx.repo, worktree)
            shutil.rmtree(worktree, ignore_errors=True)

    def _argv(self, prompt: str, prompt_file: Path, worktree: Path,
              files: list[str]) -> list[str] | str:
        argv: list[str] = []
        for arg in self.settings.argv:
            if arg == "{files}":
                argv.extend(files)
                continue
            if "{prompt}" in arg and len(prompt.encode()) > MAX_ARG_BYTES:
                return (f"the prompt ({len(prompt.encode())} bytes) is too long for a command "
                        "argument; use {prompt_file} or lower the token_budget")
            argv.append(arg.replace("{prompt_file}", str(prompt_file))
                        .replace("{worktree}", str(worktree))
                        .replace("{prompt}", prompt))
        return argv

    def _fresh_worktree(self, repo: Path, worktree: Path, commit: str) -> None:
        with self._git_lock:
            if worktree.exists():  # left over by a killed driver
                gitrepo.remove_worktree(repo, worktree)
                shutil.rmtree(worktree, ignore_errors=True)
            worktree.parent.mkdir(parents=True, exist_ok=True)
            gitrepo.add_worktree(repo, worktree, commit)


def run_agent(argv: list[str], cwd: Path, env: dict[str, str], log_path: Path,
              timeout: float, log_limit: int) -> tuple[int | None, bool, str, float]:
    """(exit code or None if killed, timed out, output, seconds).

    Not procs.run_capped: that one also kills every other descendant of this process,
    which in the driver would take the other agents and the local backend's jobs with it.
    This kills exactly the agent's own tree: its process group and its descendants.
    """
    log = CappedLog(log_path, log_limit)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except OSError as exc:
        log.feed(f"cannot start {argv[0]}: {exc}\n".encode())
        log.save()
        return 127, False, log.text(), 0.0
    drainer = threading.Thread(target=log.drain, args=(proc.stdout,), daemon=True)
    drainer.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc.pid, grace_s=1.0)  # descendants too, even ones that left the group
    proc.wait()
    kill_group(proc.pid, grace_s=0.5)  # anything still in its group (daemons it left)
    drainer.join(timeout=5)
    with contextlib.suppress(OSError):
        if proc.stdout:
            proc.stdout.close()
    log.save()
    code = None if timed_out else proc.returncode
    return code, timed_out, log.text(), time.monotonic() - start


def _remove_junk(worktree: Path) -> None:
    """Caches and tool state an agent leaves behind are not part of its change."""
    out = gitrepo.git_bytes(worktree, "ls-files", "--others", "--exclude-standard", "-z")
    for path in out.decode("utf-8", "replace").split("\0"):
        if path and JUNK.search(path):
            target = worktree / path
            with contextlib.suppress(OSError):
                target.unlink()
            # an emptied __pycache__ directory is invisible to git; leave it
