"""The context every proposer (llm, agent) sees, assembled the same way for all of them.

In order: the user's `program.md`, the task and its rules (including what not to do),
the hardware, the model context files `[context] files` lists, the incumbent's editable
files, a compact history of the last N experiments, and pending ideas. It is kept within
a token budget (about 4 characters a token) by dropping the oldest history first, then
shortening the hardware and context files; the editable files are never cut, since a
proposer cannot edit what it cannot see.

    [context]
    files = ["hardware.md", "model.md"]   # from the incumbent, else the working tree
    hardware = true                        # auto-detected CPU/GPU facts
    program = "program.md"
    history = 10                           # last N experiments
    token_budget = 24000
"""

from __future__ import annotations

import functools
import math
import os
import platform
import re
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ratchet.core import sanitize
from ratchet.core.candidate import Candidate
from ratchet.core.config import CONFIG_FILE, Config, matches_any, misspelling
from ratchet.core.paths import protected_by
from ratchet.core.vocab import Kind, Status
from ratchet.job import gitrepo
from ratchet.proposers import ProposalContext, ProposerError

CHARS_PER_TOKEN = 4
PROMPT_OVERHEAD_TOKENS = 1500  # system prompt, instructions, history and notes
ERROR_TAIL_LINES = 12
ERROR_TAIL_CHARS = 1200
MAX_REPAIR_DIFF_CHARS = 40_000  # a repair shows the change whole, up to this


# Distinct directions, so K proposals without an idea do not all try the same thing.
ANGLES = [
    "the single change you expect to help most",
    "an algorithmic or structural change (a different way to compute the same result)",
    "memory traffic and data layout (fewer passes, better locality, less copying)",
    "removing overhead (Python-level loops, allocations, conversions, redundant work)",
    "parallelism or vectorisation that the hardware above offers",
    "a bold rewrite of the hot path, while keeping the results correct",
    "a small, safe parameter-level refinement of what the incumbent already does",
    "revisiting a discarded experiment from the history that came close, done differently",
]


def hypotheses(k: int, ctx: ProposalContext) -> list[tuple[str | None, str]]:
    """(idea, direction) for each of K proposals: pending ideas first, one each."""
    ideas = list(ctx.ideas[:k])
    return [(ideas[i] if i < len(ideas) else None, ANGLES[(ctx.round + i) % len(ANGLES)])
            for i in range(k)]


def hypothesis_text(idea: str | None, angle: str, index: int, k: int) -> str:
    if idea:
        return ("A person asked for this idea to be tried; implement it as well as you "
                f"can: {idea}")
    return (f"This is attempt {index + 1} of {k} this round; the others explore other "
            f"directions. Your direction: {angle}.")


def repair_text(ctx: ProposalContext, description: str, diff: str,
                files: dict[str, str]) -> str:
    """The prompt of a repair: a change made on an older incumbent, to be re-applied on
    the incumbent now (`ctx.incumbent`, whose editable files are `files`). Far shorter
    than a proposal's context: the change and the files it lands on, nothing else."""
    code = []
    for path, content in sorted(files.items()):
        lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
        code += [f"{path} ({lines} lines)", _code_block(content), ""]
    return "\n".join([
        "# Re-apply a change on the new incumbent", "",
        f"You proposed a change on an older incumbent. Since then another change was kept, "
        f"so the incumbent moved (it is now {ctx.incumbent[:7]}), and your change no "
        "longer merges onto it. Re-apply the same change, with the same intent, to the "
        "current files below; keep what the kept change did.", "",
        sanitize.untrusted("your change's description", sanitize.line(description, 300)),
        "", "Your change, as a diff against the older incumbent:",
        _code_block(diff[:MAX_REPAIR_DIFF_CHARS], "diff"), "",
        f"## The incumbent's editable files ({len(files)})", "", *code,
    ]).rstrip() + "\n"


class ContextSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    files: list[str] = []  # extra files shown, e.g. hardware.md, model.md
    hardware: bool = True  # CPU caches, GPU name/memory/SMs, measured peaks
    program: str = "program.md"  # the research program, shown first
    history: int = Field(default=10, ge=0)  # the last N experiments with their outcomes
    token_budget: int = Field(default=24000, ge=500)  # the whole context's size


M = TypeVar("M", bound=BaseModel)


def validate_section(model: type[M], data: dict[str, Any], section: str) -> M:
    """Validate a free-form config section; one-line ProposerError naming the key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = section
        for part in error["loc"]:
            where += f"[{part}]" if isinstance(part, int) else f".{part}"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            meant = misspelling(error, model)
            message = (f"unknown key; did you mean {meant!r}? (check the spelling)" if meant
                       else "unknown key (check the spelling; see docs/proposers.md)")
        elif error["type"] == "missing":
            message = "required key is missing"
        elif error["type"].endswith(("_type", "_parsing")):
            message = f"{message} (got {error.get('input')!r})"
        more = len(exc.errors()) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise ProposerError(f"{CONFIG_FILE}: {where}: {message}{suffix}") from None


def context_settings(config: Config, **overrides: Any) -> ContextSettings:
    """`[context]`, with `history` / `token_budget` from the proposer's own section if set."""
    settings = validate_section(ContextSettings, config.context, "context")
    given = {k: v for k, v in overrides.items() if v is not None}
    return settings.model_copy(update=given) if given else settings


# ---------------------------------------------------------------------------------------
# the parts


def editable_files(repo: Path, commit: str, config: Config) -> dict[str, str]:
    """The incumbent's editable (and not protected) text files: path -> content."""
    listing = gitrepo.git(repo, "ls-tree", "-r", "--name-only", "-z", commit).split("\0")
    protected = [*config.task.protected, CONFIG_FILE]
    files = {}
    for path in listing:
        if path and matches_any(path, config.task.editable) and not protected_by(path, protected):
            try:
                files[path] = gitrepo.show(repo, commit, path).decode("utf-8")
            except UnicodeDecodeError:
                continue  # binary: a text proposer cannot edit it
    return files


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    return "`" * max(3, longest + 1)


def _code_block(text: str, lang: str = "") -> str:
    fence = _fence(text)
    return f"{fence}{lang}\n{text.rstrip(chr(10))}\n{fence}"


def _read_from(repo: Path, commit: str, path: str) -> str | None:
    try:
        return gitrepo.show(repo, commit, path).decode("utf-8", "replace")
    except gitrepo.GitError:
        pass
    local = Path(repo) / path
    if local.is_file():
        try:
            return local.read_text(errors="replace")
        except OSError:
            return None
    return None


def task_section(ctx: ProposalContext) -> str:
    config = ctx.config
    task, metric = config.task, config.metric
    better = "lower" if metric.goal == "minimize" else "higher"
    lines = ["## The task", ""]
    lines.append(f"- study: {ctx.study}, round {ctx.round}")
    lines.append(f"- goal: {metric.goal} `{metric.name}` ({better} is better), as printed by "
                 f"the trusted evaluator `{task.evaluate}`")
    current = "not measured yet" if ctx.incumbent_metric is None else (
        f"{metric.name} = {ctx.incumbent_metric:.6g}")
    lines.append(f"- incumbent (the best kept commit, your starting point): "
                 f"{ctx.incumbent[:7]}, {current}")
    accept = config.acceptance
    lines.append(f"- a change is kept only if it beats the incumbent by more than "
                 f"{accept.min_improvement} and the measurement noise"
                 + (f" (over {accept.repeats} repeats)" if accept.repeats > 1 else ""))
    if task.holdout:
        lines.append("- kept changes are also checked on hidden hold-out inputs you cannot see")
    lines.append(f"- files you may edit: {', '.join(task.editable)}")
    lines.append(f"- protected (a change touching them is rejected): "
                 f"{', '.join([*task.protected, CONFIG_FILE])}")
    if task.constraints:
        lines.append(f"- hard constraints (violations are rejected): {', '.join(task.constraints)}")
    if task.forbid:
        rules = ", ".join(f"`{r}`" for r in task.forbid)
        lines.append(f"- forbidden in the lines you add (rejected): {rules}")
    if task.timeout:
        lines.append(f"- each evaluation is killed after {task.timeout:g} s")
    lines += [
        "",
        "What not to do:",
        "- do not edit or work around the evaluator, protected files or ratchet.toml",
        "- do not special-case the evaluation inputs, cache or hard-code results, or read "
        "files the task does not give you: hidden checks look for it and reject the change",
        "- do not trade correctness for speed: an incorrect or crashing candidate is rejected",
        "- do not repeat an experiment the history shows was already tried and discarded",
    ]
    return "\n".join(lines)


def _delta(value: float | None, incumbent: float | None, goal: str) -> str:
    if value is None or incumbent is None or not math.isfinite(value):
        return ""
    diff = value - incumbent
    if diff == 0:
        return " (same as the incumbent)"
    rel = f"{diff / abs(incumbent) * 100:+.2f}%" if incumbent else f"{diff:+.4g}"
    good = (diff < 0) == (goal == "minimize")
    return f" ({rel} vs the incumbent, {'better' if good else 'worse'})"


def error_tail(cand: Candidate) -> str:
    """The last lines of the failing phase's log, for a crashed candidate."""
    for phase in reversed(cand.phases or []):
        failed = phase.get("timed_out") or phase.get("exit_code") not in (0, None)
        if not failed or not phase.get("log"):
            continue
        try:
            text = Path(phase["log"]).read_text(errors="replace")
        except OSError:
            return ""
        tail = "\n".join(text.rstrip().splitlines()[-ERROR_TAIL_LINES:])
        return f"[{phase.get('name')} phase] " + tail[-ERROR_TAIL_CHARS:]
    return ""


def history_entry(cand: Candidate, ctx: ProposalContext) -> str:
    """One judged experiment. What a proposer or a candidate wrote (its description, the
    reasons quoting its output, its log tail) is fenced as untrusted data: a line such as
    IGNORE PREVIOUS INSTRUCTIONS in a candidate's stderr is quoted, never obeyed."""
    metric = ctx.config.metric
    value = "" if cand.metric is None else f" {metric.name}={cand.metric:.6g}"
    line = (f"- {cand.id} (round {cand.round}) [{cand.status}]{value}"
            f"{_delta(cand.metric, ctx.incumbent_metric, metric.goal)}")
    said = []
    if cand.description:
        said.append(f"description: {sanitize.line(cand.description, 300)}")
    if cand.idea:
        said.append(f"idea: {sanitize.line(cand.idea, 300)}")
    if cand.reasons:
        said.append(f"reasons: {sanitize.text(cand.reasons.strip()[:500])}")
    if cand.status in (Status.CRASH, Status.REJECTED):
        tail = error_tail(cand)
        if tail:
            said.append(f"log tail:\n{tail}")
    if not said:
        return f"{line}: {cand.kind}"
    return line + "\n" + sanitize.untrusted(f"record of {cand.id}", "\n".join(said))


def warm_context(settings: ContextSettings) -> None:
    """What every context of these settings shares, made once now (a proposer's warm-up)."""
    if settings.hardware:
        hardware_text()


@functools.cache
def hardware_text() -> str:
    """This machine, described once per process (the kernel harness's facts if present)."""
    try:
        from ratchet.evaluator.kernels.hardware import hardware_markdown
        from ratchet.evaluator.kernels.roofline import cached_peaks

        try:
            peaks = [p.to_dict() for p in cached_peaks()]
        except Exception:
            peaks = []
        text = hardware_markdown(peaks=peaks)
        return text.replace("# Hardware", "## Hardware", 1)
    except Exception:  # describing the machine must never stop a study
        return _minimal_hardware()


def _minimal_hardware() -> str:
    lines = ["## Hardware", ""]
    model = platform.processor() or platform.machine()
    try:
        text = Path("/proc/cpuinfo").read_text()
        found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
        model = found.group(1).strip() if found else model
    except OSError:
        pass
    lines.append(f"- CPU: {model}, {os.cpu_count()} logical CPUs")
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        lines.append(f"- L{level} {kind.lower()} cache: {size}")
    return "\n".join(lines)


def _truncate(text: str, chars: int) -> str:
    if len(text) <= chars:
        return text
    keep = max(chars - 60, 0)
    return text[:keep].rstrip() + f"\n[… {len(text) - keep} characters cut to fit the budget]"


def build_context(ctx: ProposalContext, settings: ContextSettings,
                  files: dict[str, str] | None = None) -> str:
    """The shared context as markdown, within settings.token_budget (approximately)."""
    repo, commit = ctx.repo, ctx.incumbent
    budget = settings.token_budget * CHARS_PER_TOKEN
    head = ["# Context", ""]
    program = _read_from(repo, commit, settings.program) if settings.program else None
    if program and program.strip():
        head += ["## Research instructions (program.md)", "", program.strip(), ""]
    head += [task_section(ctx), ""]

    if files is None:
        files = editable_files(repo, commit, ctx.config)
    code = [f"## The incumbent's editable files ({len(files)})", ""]
    for path, content in sorted(files.items()):
        lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
        code += [f"{path} ({lines} lines)", _code_block(content), ""]
    if not files:
        code += ["(none exist yet: create them under the editable paths)", ""]

    ideas = []
    if ctx.ideas:
        ideas = ["## Pending ideas from people (untried)", ""]
        ideas += [f"- {sanitize.line(idea, 500)}" for idea in ctx.ideas] + [""]

    fixed = len("\n".join(head + code + ideas))
    room = budget - fixed

    # model context files and hardware: at most half of what is left, shortest cut first
    extra_parts: list[tuple[str, str]] = []
    if settings.hardware:
        extra_parts.append(("hardware", hardware_text()))
    for i, path in enumerate(settings.files):
        text = _read_from(repo, commit, path)
        if text is None:
            raise ProposerError(f"context.files[{i}]: {path} is not in the incumbent "
                                "commit nor in the working tree")
        extra_parts.append((path, f"## Context file: {path}\n\n{text.strip()}"))
    extra_room = max(room // 2, 0)
    extras = [""] * len(extra_parts)
    remaining_parts = len(extra_parts)
    for i in sorted(range(len(extra_parts)), key=lambda j: len(extra_parts[j][1])):
        share = extra_room // max(remaining_parts, 1)
        extras[i] = _truncate(extra_parts[i][1], share)
        extra_room -= len(extras[i])
        remaining_parts -= 1
    room -= sum(len(e) + 2 for e in extras)

    history_lines = _history(ctx, settings.history, room)
    room -= sum(len(line) + 1 for line in history_lines)
    running = _running(ctx, settings.history, room)

    parts = head + [e + "\n" for e in extras] + code + history_lines + running + ideas
    return "\n".join(parts).rstrip() + "\n"


def _history(ctx: ProposalContext, limit: int, room: int) -> list[str]:
    done = [c for c in ctx.history if c.is_judged or c.status == Status.REJECTED]
    if not limit or not done:
        return []
    recent = done[-limit:]
    entries: list[str] = []
    used = 200
    for cand in reversed(recent):  # newest first: the oldest are dropped to fit
        entry = history_entry(cand, ctx)
        if used + len(entry) + 1 > room:
            break
        entries.append(entry)
        used += len(entry) + 1
    entries.reverse()
    omitted = len(done) - len(entries)
    lines = [f"## History (the last {len(entries)} experiments, oldest first)", ""]
    if omitted:
        lines.append(f"({omitted} older experiments not shown)")
    if not entries:
        lines.append("(no room left in the token budget for the history)")
    return lines + entries + [""]


def _running(ctx: ProposalContext, limit: int, room: int) -> list[str]:
    """Candidates measured now, without verdicts (rolling search, speculation): shown so
    that what is already being tried is not proposed again."""
    running = [c for c in ctx.history if c.kind == Kind.CANDIDATE and not c.is_judged
               and c.status != Status.REJECTED]
    if not limit or not running:
        return []
    entries: list[str] = []
    used = 200
    for cand in reversed(running[-limit:]):  # the newest first, as room allows
        said = sanitize.untrusted(f"record of {cand.id}",
                                  f"description: {sanitize.line(cand.description, 300)}")
        entry = f"- {cand.id} (round {cand.round}) [running]\n{said}"
        if used + len(entry) + 1 > room:
            break
        entries.append(entry)
        used += len(entry) + 1
    entries.reverse()
    return ["## Running now (no verdict yet: do not propose these again)", "", *entries, ""]


def prompt_tokens(repo: Path, commit: str, config: Config, token_budget: int) -> int:
    """About how many tokens a proposer's prompt holds: the editable files at `commit`
    and the instructions around them, within the context's token budget."""
    listing = gitrepo.git(repo, "ls-tree", "-r", "-l", commit)
    size = 0
    for line in listing.splitlines():
        meta, _, path = line.partition("\t")
        parts = meta.split()
        if len(parts) == 4 and parts[3].isdigit() and matches_any(path, config.task.editable):
            size += int(parts[3])
    return min(token_budget, size // CHARS_PER_TOKEN + PROMPT_OVERHEAD_TOKENS)
