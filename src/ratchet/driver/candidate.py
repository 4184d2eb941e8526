"""A proposal becomes a candidate: a real git commit on top of the incumbent.

Also the first gate: a candidate whose diff reaches outside `editable`, touches a
protected path, adds a symlink or changes a file's mode, or matches a `forbid` rule is
rejected here, before anything runs.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from ratchet.core import paths, sanitize
from ratchet.core.candidate import Proposal
from ratchet.core.config import CONFIG_FILE, Config
from ratchet.core.vocab import Status
from ratchet.driver import infra
from ratchet.job import gitrepo

# what a proposer saw is saved with its candidate; a prompt is bounded by the token budget,
# so anything past this is a reply grown out of bounds, not context worth keeping
MAX_CONTEXT_CHARS = 2_000_000


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
    added = [c.path for c in changes if c.status == "A"]
    imported = evaluator_imports(repo, config, parent) if added else set()
    for change in changes:
        why = paths.unsafe(change.path)
        if why:
            problems.append(f"path {change.path!r} {why}")
            continue
        if paths.protected_by(change.path, protected):
            problems.append(f"touches protected path {change.path}")
        elif not paths.matches_any(change.path, config.task.editable):
            problems.append(f"changes {change.path}, which is not in task.editable")
        elif change.status == "A" and (module := paths.shadows(
                change.path, paths.evaluator_dirs(protected), imported)):
            problems.append(f"adds {change.path}, which would shadow the module {module!r} "
                            "the evaluator imports")
        if change.new_mode == "120000" or change.old_mode == "120000":
            problems.append(f"{change.path} is a symlink (not allowed in candidates)")
        elif change.status == "M" and change.old_mode != change.new_mode:
            problems.append(f"changes the mode of {change.path}")
        elif change.new_mode == "160000":
            problems.append(f"{change.path} is a submodule")
    if config.task.forbid and changes:
        added_text = _added_lines(gitrepo.diff_text(repo, parent, commit))
        for rule in config.task.forbid:
            match = re.search(rule, added_text, re.MULTILINE)
            if match:
                problems.append(f"matches forbid rule {rule!r}: {match.group(0).strip()[:80]!r}")
    return problems


def evaluator_imports(repo: Path, config: Config, commit: str) -> set[str]:
    """Top-level modules the protected Python files (the evaluator) import at `commit`."""
    listing = gitrepo.git_bytes(repo, "ls-tree", "-r", "-z", "--name-only", commit)
    names = [p for p in listing.decode("utf-8", "replace").split("\0")
             if p.endswith(".py") and paths.protected_by(p, config.task.protected)]
    sources = []
    for name in names[:50]:
        try:
            sources.append(gitrepo.show(repo, commit, name).decode("utf-8", "replace"))
        except gitrepo.GitError:
            continue
    return paths.imported_names(sources)


def _added_lines(diff: str) -> str:
    return "\n".join(
        line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")
    )


def materialise(repo: Path, state_dir: Path, config: Config, proposal: Proposal,
                incumbent: str, cand_id: str, proposer: str,
                checked: dict[tuple[str, str], list[str]] | None = None) -> dict:
    """The ledger fields of a new candidate: its commit on the incumbent, or why not.

    Everything here is git plumbing (content-addressed, no checkout), so candidates of a
    round can be built side by side. `checked`: scope checks already made, by
    (parent, commit) (a proposal built ahead of time).
    """
    fields = dict(parent=incumbent, description=sanitize.line(proposal.description, 200),
                  proposer=proposer, params=proposal.params, idea=proposal.idea,
                  calls=list(proposal.calls))
    if proposal.context is not None:
        ctx_dir = state_dir / "contexts"
        path = ctx_dir / f"{cand_id}.md"
        try:
            ctx_dir.mkdir(exist_ok=True)
            path.write_text(proposal.context[:MAX_CONTEXT_CHARS])
        except OSError as exc:  # the machine's fault: nothing is recorded, resume redoes it
            raise infra.os_fault(exc, str(path)) from None
        fields["context_path"] = str(path)
    if proposal.error:
        return {**fields, "status": Status.REJECTED, "reasons": sanitize.line(proposal.error, 2000)}
    try:
        commit = make_commit(repo, incumbent, proposal, cand_id)
    except gitrepo.GitError as exc:
        # a full disk or a read-only .git is not the proposal's fault
        fault = infra.git_fault(".git", str(exc)) or _object_store_fault(repo)
        if fault is not None:
            raise fault from None
        return {**fields, "status": Status.REJECTED, "reasons": f"could not commit: {exc}"}
    known = (checked or {}).get((incumbent, commit))
    problems = known if known is not None else scope_violations(repo, config, incumbent, commit)
    if problems:
        return {**fields, "commit_sha": commit, "status": Status.REJECTED,
                "reasons": "; ".join(problems)}
    return {**fields, "commit_sha": commit, "status": Status.COMMITTED}


def _object_store_fault(repo: Path) -> infra.InfraFault | None:
    try:
        objects = Path(gitrepo.git(repo, "rev-parse", "--path-format=absolute",
                                   "--git-path", "objects"))
    except gitrepo.GitError:
        return None
    return infra.probe_writable(objects, ".git/objects")


def rebase(repo: Path, proposal: Proposal, old_base: str, new_base: str) -> Proposal | None:
    """A proposal made on `old_base`, carried onto `new_base` by a three-way merge of its
    change; None when the change conflicts with what moved the incumbent.

    Used for proposals made ahead of time: the incumbent may move while they wait.
    """
    if old_base == new_base or proposal.error:
        return proposal
    try:
        mine = make_commit(repo, old_base, proposal, "ahead")
        tree = gitrepo.git(repo, "merge-tree", "--write-tree", "--no-messages",
                           new_base, mine).splitlines()[0]
        commit = gitrepo.commit_tree(repo, tree, new_base,
                                     f"ratchet: {proposal.description}".strip())
    except gitrepo.GitError:
        return None  # conflicts (merge-tree exits 1) or the base is gone
    return replace(proposal, files={}, commit=commit)
