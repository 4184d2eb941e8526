"""`proposer = "agent"`: a coding-agent CLI edits a throwaway copy of the incumbent.

K agents run at once, each non-interactively in its own private directory outside the
repository (proposers/scratch.py: the incumbent's files and a git of its own), inside the
study's sandbox (only that directory writable; the user's checkout, `.git`, `.ratchet/`,
the hold-out data and the driver's processes out of sight), with the shared context
(context.py) as its prompt, a scrubbed environment (only the variables `[agent] env`
names, plus PATH/HOME/locale), and a timeout after which its whole process tree, daemons
included, is killed. Only the editable files it changed come back, as new file contents,
through the same path an LLM's edits take; its tool and cache files never do.

Where no sandbox works on this machine an agent does not start, unless the user says so
(`unsandboxed = true`); `ratchet status` and the report then say the agent runs
unsandboxed, and its proposals are never made while candidates run (so tampering in a
round is blamed on the round's candidates alone, and an agent's on its own proposals).

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

from ratchet import gitrepo, sandbox, sanitize
from ratchet.candidate import Proposal
from ratchet.config import CONFIG_FILE, Config, Duration
from ratchet.ledger import Candidate
from ratchet.procs import CappedLog, kill_group, kill_tree
from ratchet.proposers import ProposalContext, Proposer, ProposerError, scratch
from ratchet.proposers.agent_clis import PRESETS, failure_reason
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

You are in a private copy of the repository ({worktree}) with a git repository of its \
own, at the incumbent. Implement ONE focused change by editing the editable files in \
place. You may read any file and run quick checks, but do not edit protected files and \
do not commit: ratchet reads the editable files back from this copy when you end, and \
evaluates them. When you are done, print one final line:

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
    # run agents with the driver's own rights where no sandbox works (shown by `status`
    # and the report); without it such a machine refuses to start agents
    unsandboxed: bool = False

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
        self.level = agent_sandbox_level(config, self.settings)
        self._live: set[Path] = set()  # every agent's private copy, hidden from the others
        self._live_lock = threading.Lock()

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
        if ctx.alone is not None:  # no filesystem sandbox: one at a time, each watched
            return [self._watched(ctx, i, k, idea, angle, shared, sorted(files))
                    for i, (idea, angle) in enumerate(plans)]
        with ThreadPoolExecutor(max_workers=max(k, 1)) as pool:
            futures = [
                pool.submit(self._one, ctx, i, k, idea, angle, shared, sorted(files))
                for i, (idea, angle) in enumerate(plans)
            ]
            return [f.result() for f in futures]

    @property
    def unsandboxed(self) -> bool:
        return self.level == sandbox.NONE

    @property
    def contained(self) -> bool:  # type: ignore[override]
        """Only bubblewrap keeps the agent's hands off the repository's files."""
        return self.level == sandbox.BWRAP

    def _watched(self, ctx: ProposalContext, i: int, k: int, idea: str | None, angle: str,
                 shared: str, files: list[str]) -> Proposal:
        """One agent alone, the study's state checked around it: what changed meanwhile is
        this agent's doing, and only its proposal is rejected for it."""
        assert ctx.alone is not None
        proposal, tampered = ctx.alone(
            lambda: self._one(ctx, i, k, idea, angle, shared, files))
        if tampered:
            proposal.files, proposal.commit = {}, None
            proposal.error = ("tampering: the study's state changed while this agent ran "
                              "(it ran alone)")
        return proposal

    def _one(self, ctx: ProposalContext, i: int, k: int, idea: str | None, angle: str,
             shared: str, files: list[str]) -> Proposal:
        name = f"{ctx.round}-{i}"
        work_dir = ctx.state_dir / "agents" / name  # the driver's record: prompt and log
        work_dir.mkdir(parents=True, exist_ok=True)
        fallback = f"idea: {idea}" if idea else f"agent: {angle}"
        try:
            copy = scratch.make(ctx.repo, ctx.incumbent, name)
        except scratch.ScratchError as exc:
            raise ProposerError(f"agent: {exc}; free space there (or set TMPDIR) and run "
                                "again") from None
        with self._live_lock:
            self._live.add(copy.root)
        try:
            prompt = shared + "\n" + AGENT_INSTRUCTIONS.format(
                hypothesis=hypothesis_text(idea, angle, i, k), worktree=copy.tree)
            prompt_file = copy.root / "prompt.md"  # inside the sandbox's view
            prompt_file.write_text(prompt)
            (work_dir / "prompt.md").write_text(prompt)
            argv = self._argv(prompt, prompt_file, copy.tree, files)
            if isinstance(argv, str):
                return Proposal(description=fallback, idea=idea, context=prompt, error=argv)
            return self._run_in(copy, ctx, argv, prompt, prompt_file, work_dir, idea, angle,
                                fallback)
        finally:
            with self._live_lock:
                self._live.discard(copy.root)
            copy.remove()

    def _run_in(self, copy: scratch.Scratch, ctx: ProposalContext, argv: list[str],
                prompt: str, prompt_file: Path, work_dir: Path, idea: str | None, angle: str,
                fallback: str) -> Proposal:
        # a home and a temp dir of its own, inside the only place it may write: CLIs keep
        # sessions and caches there (and the real HOME is read-only in the sandbox)
        env = {**self.env, "RATCHET_WORKTREE": str(copy.tree),
               "RATCHET_PROMPT_FILE": str(prompt_file), "HOME": str(copy.home),
               "TMPDIR": "/tmp" if _private_tmp(self.level, argv, self.env) else str(copy.tmp),
               "XDG_CACHE_HOME": str(copy.home / ".cache")}
        env.update(self._private_dirs(copy, ctx.repo))
        scratch.keep_path_in_login_shells(copy.home, env.get("PATH", ""))
        with self._live_lock:
            others = [p for p in self._live if p != copy.root]
        jailed = self._jail(argv, copy, ctx, others)
        if jailed[0] != argv[0] and shutil.which(jailed[0]) is None:
            # the sandbox program vanished mid-study: the machine's fault, no verdict
            raise ProposerError(f"agent: the sandbox program {jailed[0]} is gone; reinstall "
                                "it (apt-get install bubblewrap util-linux), then run again")
        code, timed_out, output, seconds = run_agent(
            jailed, copy.tree, env, work_dir / "agent.log", self.settings.timeout,
            int(self.settings.log_limit_mb * (1 << 20)))
        params = {"agent": {"command": argv[0], "exit_code": code,
                            "seconds": round(seconds, 2), "log": str(work_dir / "agent.log"),
                            "hypothesis": idea or angle, "sandbox": str(self.level)}}
        found = _DESCRIPTION.findall(output)
        description = sanitize.line(found[-1].strip().strip("`"), 200) if found else fallback
        base = Proposal(description=description, idea=idea, context=prompt, params=params)
        if timed_out:
            base.error = (f"agent timed out after {self.settings.timeout:g}s; its process "
                          "tree was killed")
            return base
        if code != 0:
            why = sanitize.line(failure_reason(output))  # the CLI's error line, not usage
            base.error = f"agent exited with code {code}" + (f": {why}" if why else "")
            return base
        protected = [*ctx.config.task.protected, CONFIG_FILE]
        try:
            got = scratch.harvest(ctx.repo, ctx.incumbent, copy.tree,
                                  ctx.config.task.editable, protected)
        except OSError as exc:
            raise ProposerError(f"agent: cannot read back the agent's copy: {exc}") from None
        if got.ignored:
            params["agent"]["ignored"] = got.ignored  # changed, not editable: not taken
        if got.problems:
            base.error = "; ".join(dict.fromkeys(got.problems))
            return base
        if not got.files:
            base.error = "agent made no change"
            return base
        base.files = got.files
        return base

    def _private_dirs(self, copy: scratch.Scratch, repo: Path) -> dict[str, str]:
        """A variable of `[agent] env` that names a file or a directory (a CA bundle,
        CODEX_HOME, CLAUDE_CONFIG_DIR: a CLI's settings, where it also writes its
        sessions) is given to the agent as a private copy in its home: readable in the
        sandbox wherever the original lives (/tmp is private there), writable for the
        agent, the original never written. Never a path of the repository."""
        out = {}
        for name in self.settings.env:
            path = Path(self.env.get(name, ""))
            if not path.is_absolute() or not path.exists() or path.is_relative_to(repo):
                continue
            target = copy.home / f".ratchet-env-{name}" / path.name
            try:
                scratch.copy_path(path, target)
            except (OSError, scratch.ScratchError) as exc:
                raise ProposerError(f"agent.env: cannot copy {name}={path} for the agent: "
                                    f"{exc}") from None
            out[name] = str(target)
        return out

    def _jail(self, argv: list[str], copy: scratch.Scratch, ctx: ProposalContext,
              others: list[Path]) -> list[str]:
        """The agent's command line inside the sandbox: only its copy writable; the user's
        checkout (with .git and .ratchet), the hold-out data and the other agents' copies
        out of sight; the network open for its model."""
        if self.level == sandbox.NONE:
            return argv
        hidden = [str(ctx.repo), *(str(p) for p in others)]
        hidden += _private_tmp(self.level, argv, self.env)
        common = _git_common_dir(ctx.repo)
        if common is not None and not common.is_relative_to(ctx.repo):
            hidden.append(str(common))
        holdout = ctx.config.task.holdout_data
        if holdout:
            path = Path(holdout)
            hidden.append(str(path if path.is_absolute() else ctx.repo / path))
        return sandbox.wrap(self.level, argv, writable=[copy.root], hidden=hidden)

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


TMP_DIRS = ("/tmp", "/var/tmp")


def _private_tmp(level: str, argv: list[str], env: dict[str, str]) -> list[str]:
    """The temp directories to give the agent empty and private (bubblewrap only): a CLI's
    own sandbox writes there (Codex makes /tmp/.git). Kept as they are, read-only, when
    the agent's own command or a PATH entry lives there."""
    if level != sandbox.BWRAP:
        return []
    used = [a for a in argv if a.startswith("/")] + env.get("PATH", "").split(os.pathsep)
    if any(Path(p).is_relative_to(t) for p in used if p for t in TMP_DIRS):
        return []
    return list(TMP_DIRS)


def _git_common_dir(repo: Path) -> Path | None:
    try:
        out = gitrepo.git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
    except gitrepo.GitError:
        return None
    return Path(out) if out else None


def agent_sandbox_level(config: Config, settings: AgentSettings) -> str:
    """The sandbox agents run in here; refuses (ProposerError) where none works unless
    `[agent] unsandboxed = true`."""
    try:
        level = sandbox.choose(config.backend.sandbox)
    except RuntimeError as exc:
        raise ProposerError(f"agent: {exc}; install bubblewrap or set backend.sandbox = "
                            "\"auto\"") from None
    if level == sandbox.NONE and not settings.unsandboxed:
        raise ProposerError(
            "agent: no sandbox works here (neither bubblewrap nor a PID namespace), so a "
            "coding agent would run with your rights, next to your repository; install "
            "bubblewrap (apt-get install bubblewrap), or set unsandboxed = true in [agent] "
            "to accept that (status and the report will say so)")
    return level


def describe_agent_sandbox(config: Config) -> str:
    """What confines agents here, in words (`ratchet status`, the report)."""
    unsandboxed = bool((config.agent or {}).get("unsandboxed"))
    try:
        level = sandbox.choose(config.backend.sandbox)
    except RuntimeError as exc:
        return f"refused: {exc}"
    if level == sandbox.BWRAP:
        return ("bubblewrap: only each agent's private copy is writable; the repository, its "
                ".git, .ratchet and the hold-out data are out of sight")
    if level == sandbox.PIDNS:
        return ("PID namespace only, no filesystem sandbox: agents cannot see the driver's "
                "processes, but could write your files; they propose between rounds, alone, "
                "checked in a window of their own")
    if unsandboxed:
        return ("UNSANDBOXED ([agent] unsandboxed = true): agents run with your rights and "
                "can read and write your files; they propose between rounds, alone, checked "
                "in a window of their own")
    return "refused: no sandbox works here (install bubblewrap, or set [agent] unsandboxed)"
