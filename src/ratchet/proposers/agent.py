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
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ratchet.core import sanitize
from ratchet.core.candidate import Candidate, Proposal
from ratchet.core.config import CONFIG_FILE, Config, Duration, parse_duration
from ratchet.core.errors import HardStop
from ratchet.core.vocab import CallOutcome
from ratchet.job import egress, gitrepo, reach, sandbox
from ratchet.job.procs import CappedLog
from ratchet.proposers import Estimate, ProposalContext, Proposer, ProposerError, scratch
from ratchet.proposers.agent_clis import PRESETS, failure_reason, model_endpoints, upstream_proxy
from ratchet.proposers.context import (
    build_context,
    context_settings,
    editable_files,
    hypotheses,
    hypothesis_text,
    repair_text,
    validate_section,
    warm_context,
)
from ratchet.store.calls import Call, Flight, Meter, gather

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


AGENT_REPAIR = """\
## Your job now

Re-apply that change in this private copy of the repository ({worktree}), at the new \
incumbent: edit the editable files in place so they make the same change on top of \
what is there now. Do not edit protected files and do not commit. When you are done, \
print one final line:

DESCRIPTION: <what the change does now>
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
    # the price of an agent's time, for a CLI that does not report its own cost
    hourly_usd: float = Field(default=0.0, ge=0)
    # endpoints ("host", "host:port" or a URL) the agent may reach beyond its model's: the
    # CLI's API host and the URLs in `env` are allowed already (docs/security-network.md)
    allow: list[str] = []

    @model_validator(mode="after")
    def _endpoints(self) -> AgentSettings:
        for i, text in enumerate(self.allow):
            if egress.endpoint(text) is None:
                raise ValueError(f"allow[{i}]: {text!r} is not a host, host:port or URL")
        return self

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
    summary = "a coding-agent CLI in a sandbox"
    settings_model = AgentSettings

    @classmethod
    def estimate(cls, config: Config, repo: Path, commit: str, k: int) -> Estimate | None:
        """k agents, each for at most its timeout at `hourly_usd` (what the CLIs report
        replaces it once they ran)."""
        if not config.agent:
            return None
        hourly = float(config.agent.get("hourly_usd") or 0.0)
        timeout = parse_duration(config.agent.get("timeout", 1800.0))
        return Estimate(k * hourly * timeout / 3600,
                        f"{k} agents x at most {timeout:g} s at ${hourly:g}/h agent.hourly_usd"
                        ", or what the CLI reports")

    @classmethod
    def sandbox_status(cls, config: Config) -> str | None:
        return describe_agent_sandbox(config)

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
        # which of the K agents asked for run now (the live view reads it: `activity`)
        self._count_lock = threading.Lock()
        self._asked = 0
        self._running: set[int] = set()
        self._repairs = 0  # repairs asked so far (each works in a directory of its own)

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
        with self._count_lock:
            self._asked, self._running = k, set()
        with Meter(ctx.state_dir) as meter:  # every agent run is in the ledger as it ends
            return self._propose(k, ctx, meter)

    def activity(self) -> str | None:
        with self._count_lock:
            running, asked = sorted(self._running), self._asked
        if not running:
            return None
        if asked == 1:
            return "agent running"
        if len(running) == 1:  # one at a time (alone), or the last one of them
            return f"agent {running[0] + 1} of {asked} running"
        return f"{len(running)} of {asked} agents running"

    def _propose(self, k: int, ctx: ProposalContext, meter: Meter) -> list[Proposal]:
        files = editable_files(ctx.repo, ctx.incumbent, ctx.config)
        shared = build_context(ctx, self.context, files)
        plans = hypotheses(k, ctx)
        if ctx.alone is not None:  # no filesystem sandbox: one at a time, each watched
            return [self._watched(ctx, i, k, idea, angle, shared, sorted(files), meter)
                    for i, (idea, angle) in enumerate(plans)]
        pool = ThreadPoolExecutor(max_workers=max(k, 1))
        try:
            futures = [
                pool.submit(self._one, ctx, i, k, idea, angle, shared, sorted(files), meter)
                for i, (idea, angle) in enumerate(plans)
            ]
            return gather(futures, meter)
        finally:  # stopped at once: the agents are billed and ended, not waited for
            pool.shutdown(wait=not meter.interrupted, cancel_futures=True)

    @property
    def unsandboxed(self) -> bool:
        return self.level == sandbox.NONE

    @property
    def contained(self) -> bool:  # type: ignore[override]
        """Can the agent reach nothing the driver trusts? Under bubblewrap, or in a PID and
        mount namespace as an unprivileged uid of its own (the driver is root): the
        repository is hidden from it and it cannot undo that."""
        return agent_contained(self.level)

    def _watched(self, ctx: ProposalContext, i: int, k: int, idea: str | None, angle: str,
                 shared: str, files: list[str], meter: Meter | None = None) -> Proposal:
        """One agent alone, the study's state checked around it: what changed meanwhile is
        this agent's doing, and only its proposal is rejected for it."""
        assert ctx.alone is not None
        proposal, tampered = ctx.alone(
            lambda: self._one(ctx, i, k, idea, angle, shared, files, meter))
        if tampered:
            proposal.files, proposal.commit = {}, None
            proposal.error = ("tampering: the study's state changed while this agent ran "
                              "(it ran alone)")
        return proposal

    def _one(self, ctx: ProposalContext, i: int, k: int, idea: str | None, angle: str,
             shared: str, files: list[str], meter: Meter | None = None) -> Proposal:
        with self._count_lock:
            self._running.add(i)
        try:
            return self._one_agent(ctx, i, k, idea, angle, shared, files, meter)
        finally:
            with self._count_lock:
                self._running.discard(i)

    def repair(self, proposal: Proposal, diff: str, ctx: ProposalContext) -> Proposal | None:
        """One agent, in a copy of the new incumbent, asked to re-apply the change (its
        diff, and the files it lands on, in the prompt); its run is billed `repaired`.
        An agent that could tamper does not repair: it would run beside candidates."""
        if not self.contained:
            return None
        with self._count_lock:
            self._repairs += 1
            name = f"repair-{ctx.round}-{self._repairs}"
        files = editable_files(ctx.repo, ctx.incumbent, ctx.config)
        shared = repair_text(ctx, proposal.description, diff, files)
        with Meter(ctx.state_dir) as meter:
            got = self._one_agent(ctx, 0, 1, proposal.idea, "", shared, sorted(files), meter,
                                  name=name, instructions=AGENT_REPAIR,
                                  ok=CallOutcome.REPAIRED)
        got.calls = [*proposal.calls, *got.calls]
        if got.error:
            got.error = f"the repair failed: {got.error}"
        elif got.description.startswith("agent: "):  # it printed no description
            got.description = proposal.description
        return got

    def _one_agent(self, ctx: ProposalContext, i: int, k: int, idea: str | None, angle: str,
                   shared: str, files: list[str], meter: Meter | None = None,
                   name: str | None = None, instructions: str = "",
                   ok: CallOutcome = CallOutcome.OK) -> Proposal:
        name = name or f"{ctx.round}-{i}"
        work_dir = record_dir(ctx.state_dir / "agents", name)  # the driver's: prompt, log
        fallback = f"idea: {idea}" if idea else f"agent: {angle}"
        try:
            copy = scratch.make(ctx.repo, ctx.incumbent, name)
        except scratch.ScratchError as exc:
            raise ProposerError(f"agent: {exc}; free space there (or set TMPDIR) and run "
                                "again") from None
        try:
            job = instructions.format(worktree=copy.tree) if instructions else \
                AGENT_INSTRUCTIONS.format(hypothesis=hypothesis_text(idea, angle, i, k),
                                          worktree=copy.tree)
            prompt = shared + "\n" + job
            prompt_file = copy.root / "prompt.md"  # inside the sandbox's view
            prompt_file.write_text(prompt)
            (work_dir / "prompt.md").write_text(prompt)
            argv = self._argv(prompt, prompt_file, copy.tree, files)
            if isinstance(argv, str):
                return Proposal(description=fallback, idea=idea, context=prompt, error=argv)
            return self._run_in(copy, ctx, argv, prompt, prompt_file, work_dir, idea, angle,
                                fallback, meter, ok)
        finally:
            copy.remove()

    def _run_in(self, copy: scratch.Scratch, ctx: ProposalContext, argv: list[str],
                prompt: str, prompt_file: Path, work_dir: Path, idea: str | None, angle: str,
                fallback: str, meter: Meter | None = None,
                ok: CallOutcome = CallOutcome.OK) -> Proposal:
        # a home and a temp dir of its own, inside the only place it may write: CLIs keep
        # sessions and caches there (the real HOME is out of reach in the sandbox), with
        # copies of the config dirs the user names (scratch.private_home)
        env = {**self.env, "RATCHET_WORKTREE": str(copy.tree),
               "RATCHET_PROMPT_FILE": str(prompt_file),
               **scratch.private_home(copy.root, self.env)}
        env["XDG_CACHE_HOME"] = str(Path(env["HOME"]) / ".cache")
        scratch.keep_path_in_login_shells(Path(env["HOME"]), env.get("PATH", ""))
        proxy = self.start_proxy(argv[0], env)
        try:
            return self._run_proxied(copy, ctx, argv, env, proxy, prompt, work_dir, idea,
                                     angle, fallback, meter, ok)
        finally:
            proxy.close()

    def start_proxy(self, command: str, env: dict[str, str]) -> egress.Proxy:
        """The agent's only way out: a proxy that lets through its model's endpoints alone
        (its CLI's API host, the URLs the user hands it, `[agent] allow`), itself going out
        through the user's own proxy where there is one. `env` is pointed at it."""
        found = [egress.endpoint(text) for text in
                 [*model_endpoints(command, env), *self.settings.allow]]
        upstream = upstream_proxy(self.env)
        proxy = egress.Proxy(egress.AllowList(e for e in found if e is not None),
                             upstream=egress.endpoint(upstream, 80) if upstream else None)
        for name in [n for n in env if n.upper() == "NO_PROXY"]:
            del env[name]  # nothing bypasses it: a direct connection finds no network
        env.update(dict.fromkeys(egress.PROXY_ENV, egress.PROXY_URL))
        return proxy

    def _run_proxied(self, copy: scratch.Scratch, ctx: ProposalContext, argv: list[str],
                     env: dict[str, str], proxy: egress.Proxy, prompt: str, work_dir: Path,
                     idea: str | None, angle: str, fallback: str, meter: Meter | None,
                     ok: CallOutcome) -> Proposal:
        policy = self._policy(argv, env, copy, ctx, proxy.socket_path)
        # a hard stop (Ctrl-C twice) bills the run as it stands and ends its sandbox
        flight = None if meter is None else meter.begin(partial(self._bill_interrupted,
                                                                argv[0]))
        try:
            code, timed_out, output, seconds = run_agent(
                argv, copy.tree, env, work_dir / "agent.log", self.settings.timeout,
                int(self.settings.log_limit_mb * (1 << 20)), self.level, policy,
                on_start=None if flight is None else partial(_cancel_with, flight))
        except FileNotFoundError as exc:
            # the sandbox program vanished mid-study: the machine's fault, no verdict
            if meter is not None and flight is not None:
                meter.land(flight)
            raise ProposerError(f"agent: cannot start the agent's sandbox ({exc}); reinstall "
                                "it (apt-get install bubblewrap util-linux), then run again"
                                ) from None
        if meter is not None and flight is not None and not meter.land(flight):
            raise HardStop("agent: the study was stopped at once; the run is billed as "
                           "interrupted")
        params: dict[str, dict[str, Any]] = {"agent": {"command": argv[0], "exit_code": code,
                            "seconds": round(seconds, 2), "log": str(work_dir / "agent.log"),
                            "hypothesis": idea or angle, "sandbox": str(self.level),
                            "allowed": str(proxy.allow)}}
        if proxy.refused:  # what it tried to reach beyond its model, for `ratchet show`
            params["agent"]["refused"] = list(dict.fromkeys(proxy.refused))[:20]
        # a CLI printing JSON (claude --output-format json) has its final text in it
        reported = reported_usage(output)
        found = _DESCRIPTION.findall(output) or _DESCRIPTION.findall(reported.text)
        description = sanitize.line(found[-1].strip().strip("`"), 200) if found else fallback
        base = Proposal(description=description, idea=idea, context=prompt, params=params)
        if meter is not None:  # the run is spent whatever becomes of its change
            call = self._call_record(argv[0], code, timed_out, reported, seconds, ok)
            base.calls = [meter.record(call)]
            params["agent"].update(cost_usd=round(call.cost_usd, 6),
                                   cost_source=call.detail)
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

    def _call_record(self, command: str, code: int | None, timed_out: bool,
                     reported: Usage, seconds: float, ok: CallOutcome = CallOutcome.OK) -> Call:
        """One agent run as a call: its time, and its cost as its CLI reports it (Claude
        Code's and Codex's JSON output), else its time at agent.hourly_usd."""
        if reported.cost_usd is not None:
            cost, source = reported.cost_usd, "cost reported by the agent's CLI"
        else:
            cost = self.settings.hourly_usd * seconds / 3600
            source = f"{seconds:.1f} s at ${self.settings.hourly_usd:g}/h agent.hourly_usd"
        outcome = (CallOutcome.TIMEOUT if timed_out else ok if code == 0
                   else CallOutcome.FAILED)
        return Call(proposer="agent", model=command, outcome=outcome,
                    input_tokens=reported.input_tokens, output_tokens=reported.output_tokens,
                    cost_usd=cost, seconds=seconds, detail=source)

    def _bill_interrupted(self, command: str, seconds: float) -> list[Call]:
        """A run a hard stop does not wait for: its time so far at agent.hourly_usd (its
        CLI's own figure comes at its end, which never came)."""
        return [Call(proposer="agent", model=command, outcome=CallOutcome.INTERRUPTED,
                     cost_usd=self.settings.hourly_usd * seconds / 3600, seconds=seconds,
                     detail=f"{seconds:.1f} s at ${self.settings.hourly_usd:g}/h "
                            "agent.hourly_usd, until the stop")]

    def _policy(self, argv: list[str], env: dict[str, str], copy: scratch.Scratch,
                ctx: ProposalContext, proxy: Path | None = None) -> sandbox.Policy:
        return self._jail_policy(argv, env, copy.root, ctx.repo, ctx.state_dir, proxy)

    def _jail_policy(self, argv: list[str], env: dict[str, str], root: Path, repo: Path,
                     state_dir: Path, proxy: Path | None = None) -> sandbox.Policy:
        """Only its copy (`root`) writable; the user's checkout (with .git and .ratchet),
        the hold-out data and the other agents' copies out of sight; a private /tmp; a
        network namespace of its own whose only way out is `proxy` (its model's endpoints).
        Its own command and the files the user names in `[agent] env` (a CA bundle) stay
        readable wherever they live."""
        hidden: list[Path] = [repo, root.parent]  # the parent: every agent's copy
        common = _git_common_dir(repo)
        if common is not None and not common.is_relative_to(repo):
            hidden.append(common)
        holdout = self.config.task.holdout_data
        if holdout:
            path = Path(holdout)
            hidden.append(path if path.is_absolute() else repo / path)
        named = [env.get(name, "") for name in self.settings.env]
        # by their real paths: a link is bound where it points (bubblewrap cannot mount
        # onto a link whose target is hidden)
        real = {Path(p).resolve() for p in [*argv, *named] if p.startswith("/")}
        readonly = sorted(p for p in real if p.exists()
                          and not any(p.is_relative_to(h) for h in hidden))
        # no network but the proxy to its model's API (docs/security-network.md)
        policy = sandbox.Policy(writable=[root], hidden=hidden, readonly=readonly,
                                seed=f"agents:{state_dir}", network=False,
                                proxy=proxy)
        sandbox.grant([root], policy)  # its copy and home are its own uid's
        return policy

    def unreachable(self, repo: Path, state_dir: Path) -> str | None:
        """Probe as an agent would start: in a stand-in copy where the copies live, with
        its policy and uid, reading the interpreter (its sandbox's warden), the venv and
        its own command."""
        try:
            root = Path(tempfile.mkdtemp(prefix="reach-", dir=scratch.agents_dir()))
        except OSError as exc:
            return f"agent: cannot make a directory for the agent's copies: {exc}"
        try:
            env = {**self.env, **scratch.private_home(root, self.env)}
            argv = self.settings.argv
            exe = shutil.which(argv[0], path=env.get("PATH"))
            command = [Path(exe).resolve()] if exe else []
            policy = self._jail_policy([*map(str, command), *argv[1:]], env, root, repo,
                                       state_dir)
            return reach.probe(self.level, policy, reach.needed(extra=[root, *command]),
                               f"the agent ({argv[0]})", env=env, cwd=root)
        finally:
            shutil.rmtree(root, ignore_errors=True)

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


def record_dir(parent: Path, name: str) -> Path:
    """A new directory for one agent run's prompt and log: `name`, else `name.2`, ... A
    round asked again (its proposals made ahead conflicted) runs its agents under the
    same names, and the runs before keep their record (their calls name their logs)."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = parent / (name if n == 1 else f"{name}.{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise ProposerError(f"agent: {parent} holds 10,000 runs named {name}; clear it")


def _cancel_with(flight: Flight, jail: sandbox.Jail) -> None:
    """The agent's sandbox is up: a hard stop ends it (at once if one came already)."""
    flight.cancel = partial(jail.kill, grace_s=1.0)
    if flight.interrupted:
        flight.cancel()


def run_agent(argv: list[str], cwd: Path, env: dict[str, str], log_path: Path,
              timeout: float, log_limit: int, level: sandbox.Level | str,
              policy: sandbox.Policy,
              on_start: Callable[[sandbox.Jail], None] | None = None,
              ) -> tuple[int | None, bool, str, float]:
    """(exit code or None if killed, timed out, output, seconds).

    The agent runs as a sandbox.Jail: its whole tree, daemons that left its session
    included, ends when it ends or times out, and nothing else (not the other agents, not
    the local backend's jobs). FileNotFoundError: the sandbox program itself is gone.
    `on_start` is given the jail once it runs (a hard stop ends it through that).
    """
    log = CappedLog(log_path, log_limit)
    start = time.monotonic()
    try:
        jail = sandbox.Jail(argv, policy, level=level, cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    except FileNotFoundError:
        raise
    except OSError as exc:
        log.feed(f"cannot start {argv[0]}: {exc}\n".encode())
        log.save()
        return 127, False, log.text(), 0.0
    drainer = threading.Thread(target=log.drain, args=(jail.proc.stdout,), daemon=True)
    drainer.start()
    if on_start is not None:
        on_start(jail)
    timed_out = False
    try:
        jail.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    jail.kill(grace_s=1.0)  # every process left in its sandbox (a no-op once it ended)
    drainer.join(timeout=5)
    with contextlib.suppress(OSError):
        if jail.proc.stdout:
            jail.proc.stdout.close()
    log.save()
    code = None if timed_out else jail.proc.returncode
    return code, timed_out, log.text(), time.monotonic() - start


@dataclass
class Usage:
    cost_usd: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    text: str = ""  # the final text of a CLI that prints JSON (Claude Code's `result`)


MAX_REPORTED_USD = 10_000.0  # an agent's output is untrusted: a figure past this is not one


def reported_usage(output: str) -> Usage:
    """What the agent's CLI says it spent, from the JSON objects on its output's lines:
    Claude Code's result (`total_cost_usd`, `usage`), Codex's `turn.completed` usage
    (summed over turns). Untrusted text: only finite, non-negative, bounded numbers."""
    found = Usage()
    for line in output.splitlines()[-2000:]:
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")) or len(line) > 1_000_000:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        cost = _number(event.get("total_cost_usd"))
        if cost is not None and cost <= MAX_REPORTED_USD:
            found.cost_usd = cost  # the whole run's, in the last result
        if event.get("type") == "result" and isinstance(event.get("result"), str):
            found.text = event["result"][-100_000:]
        usage = event.get("usage")
        if isinstance(usage, dict) and (event.get("type") in ("result", "turn.completed")):
            tokens_in = sum(int(_number(usage.get(key)) or 0) for key in (
                "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
            tokens_out = int(_number(usage.get("output_tokens")) or 0)
            if event.get("type") == "result":  # the whole run's
                found.input_tokens, found.output_tokens = tokens_in, tokens_out
            else:
                found.input_tokens += tokens_in
                found.output_tokens += tokens_out
    return found


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and 0 <= number <= 1e12 else None


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


def agent_contained(level: str) -> bool:
    return level == sandbox.BWRAP or (level == sandbox.PIDNS and os.geteuid() == 0)


def describe_agent_sandbox(config: Config) -> str:
    """What confines agents here, in words (`ratchet status`, the report)."""
    unsandboxed = bool((config.agent or {}).get("unsandboxed"))
    try:
        level = sandbox.choose(config.backend.sandbox)
    except RuntimeError as exc:
        return f"refused: {exc}"
    hidden = ("only each agent's private copy is writable; the repository, its .git, "
              ".ratchet, the hold-out data and the other agents' copies are out of sight; "
              "no network but an allow-listing proxy to the model's endpoints "
              "(docs/security-network.md)")
    if level == sandbox.BWRAP:
        return f"bubblewrap: {hidden}"
    if agent_contained(level):
        return f"PID and mount namespace, an unprivileged uid of their own: {hidden}"
    if level == sandbox.PIDNS:
        return ("PID and mount namespace without a uid of their own (ratchet is not root): "
                "agents could undo what hides your files; they propose between rounds, "
                "alone, checked in a window of their own")
    if unsandboxed:
        return ("UNSANDBOXED ([agent] unsandboxed = true): agents run with your rights and "
                "can read and write your files; they propose between rounds, alone, checked "
                "in a window of their own")
    return "refused: no sandbox works here (install bubblewrap, or set [agent] unsandboxed)"
