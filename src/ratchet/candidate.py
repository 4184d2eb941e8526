"""A proposal becomes a candidate: a real git commit on top of the incumbent.

Also the first gate: a candidate whose diff reaches outside `editable`, touches a
protected path, adds a symlink or changes a file's mode, or matches a `forbid` rule is
rejected here, before anything runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ratchet import gitrepo
from ratchet.config import CONFIG_FILE, Config, matches_any


@dataclass
class Proposal:
    """What a proposer hands over: new file contents, or a commit it already made."""

    description: str
    files: dict[str, bytes | None] = field(default_factory=dict)
    commit: str | None = None
    params: dict | None = None
    idea: str | None = None
    context: str | None = None  # exactly what the proposer saw (saved with the candidate)
    error: str | None = None  # a proposal that failed to materialise (bad patch, ...)


def study_ref(study: str, cand_id: str) -> str:
    return f"refs/ratchet/{study}/{cand_id}"


def study_branch(study: str) -> str:
    return f"refs/heads/ratchet/{study}"


def make_commit(repo: Path, parent: str, proposal: Proposal, cand_id: str) -> str:
    message = f"ratchet {cand_id}: {proposal.description}".strip()
    if proposal.commit:
        return proposal.commit
    return gitrepo.commit_files(repo, parent, proposal.files, message)


def scope_violations(repo: Path, config: Config, parent: str, commit: str) -> list[str]:
    """Why this commit may not run, or [] if it may."""
    problems = []
    protected = [*config.task.protected, CONFIG_FILE]
    changes = gitrepo.diff_changes(repo, parent, commit)
    if not changes:
        problems.append("no change from the incumbent")
    for change in changes:
        if matches_any(change.path, protected):
            problems.append(f"touches protected path {change.path}")
        elif not matches_any(change.path, config.task.editable):
            problems.append(f"changes {change.path}, which is not in task.editable")
        if change.new_mode == "120000" or change.old_mode == "120000":
            problems.append(f"{change.path} is a symlink (not allowed in candidates)")
        elif change.status == "M" and change.old_mode != change.new_mode:
            problems.append(f"changes the mode of {change.path}")
        elif change.new_mode == "160000":
            problems.append(f"{change.path} is a submodule")
    if config.task.forbid and changes:
        added = _added_lines(gitrepo.diff_text(repo, parent, commit))
        for rule in config.task.forbid:
            match = re.search(rule, added, re.MULTILINE)
            if match:
                problems.append(f"matches forbid rule {rule!r}: {match.group(0).strip()[:80]!r}")
    return problems


def _added_lines(diff: str) -> str:
    return "\n".join(
        line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")
    )
