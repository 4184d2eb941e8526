"""`proposer = "patches"`: evaluate what people queued by hand — patch files and git refs.

    [patches]
    dir = "patches/"             # *.patch / *.diff (plain diffs or `git format-patch` mails)
    refs = ["try-fused", "a1b2c3d"]

Each queued item becomes one candidate, once: the item is recorded in the candidate's
params (`{"patches": {"item": "patch:patches/x.patch"}}`) and skipped from then on, so a
resumed study never runs it twice. Patch files are applied with `git apply` onto the
incumbent in a private index (the user's checkout is never touched); a ref that does not
descend from the incumbent is carried over the same way, as the diff from its merge base.
A patch that does not apply becomes a rejected candidate with git's message. The
directory is read again every round, so patches can be queued while a study runs.
When the queue is empty the study stops. Ideas are for the llm and agent proposers.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from ratchet.core.candidate import Candidate, Proposal
from ratchet.core.config import Config
from ratchet.core.errors import RatchetError
from ratchet.job import gitrepo
from ratchet.proposers import ProposalContext, Proposer, ProposerError
from ratchet.proposers.context import validate_section

PATCH_SUFFIXES = (".patch", ".diff")


class PatchesSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    dir: str | None = None  # a directory of *.patch / *.diff files
    refs: list[str] = []  # git refs, each tried once as a candidate

    @model_validator(mode="after")
    def _something_queued(self) -> PatchesSettings:
        if not self.dir and not self.refs:
            raise ValueError("give dir = \"patches/\" and/or refs = [\"branch\", ...]")
        return self


def item_of(cand: Candidate) -> str | None:
    params = cand.params if isinstance(cand.params, dict) else {}
    patches = params.get("patches")
    return patches.get("item") if isinstance(patches, dict) else None


class PatchesProposer(Proposer):
    name = "patches"
    summary = "queued patches and branches, each tried once"
    settings_model = PatchesSettings
    takes_ideas = False  # it tries the queued patches and branches, never text

    def __init__(self, config: Config, history: list[Candidate]) -> None:
        self.config = config
        self.settings = validate_section(PatchesSettings, config.patches or {}, "patches")
        self.used = {item for c in history if (item := item_of(c))}

    def observe(self, candidate: Candidate) -> None:
        if item := item_of(candidate):
            self.used.add(item)

    def queue(self, repo: Path) -> list[str]:
        items = []
        if self.settings.dir:
            folder = repo / self.settings.dir
            if not folder.is_dir():
                raise ProposerError(f"patches.dir: {self.settings.dir} is not a directory in "
                                    f"{repo}")
            for path in sorted(folder.iterdir()):
                if path.is_file() and path.suffix in PATCH_SUFFIXES:
                    items.append(f"patch:{path.relative_to(repo).as_posix()}")
        items += [f"ref:{ref}" for ref in self.settings.refs]
        return items

    def propose(self, k: int, ctx: ProposalContext) -> list[Proposal]:
        self.used |= {item for c in ctx.history if (item := item_of(c))}
        todo = [item for item in self.queue(ctx.repo) if item not in self.used][:k]
        proposals = []
        for item in todo:
            self.used.add(item)
            kind, _, name = item.partition(":")
            fetch = self._from_patch if kind == "patch" else self._from_ref
            proposal = fetch(ctx, name)
            proposal.params = {"patches": {"item": item}}
            proposals.append(proposal)
        return proposals

    def _from_patch(self, ctx: ProposalContext, name: str) -> Proposal:
        path = ctx.repo / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            return Proposal(description=f"patch {name}",
                            error=f"cannot read {name}: {exc.strerror or exc}")
        description = f"patch {path.name}" + (f": {s}" if (s := _subject(data)) else "")
        try:
            commit = apply_onto(ctx.repo, ctx.incumbent, data, description)
        except PatchError as exc:
            return Proposal(description=description, error=f"{name} does not apply: {exc}")
        return Proposal(description=description, commit=commit)

    def _from_ref(self, ctx: ProposalContext, ref: str) -> Proposal:
        commit = gitrepo.try_rev_parse(ctx.repo, ref)
        if commit is None:
            return Proposal(description=f"ref {ref}", error=f"{ref!r} is not a commit")
        subject = gitrepo.git(ctx.repo, "log", "-1", "--format=%s", commit)
        description = f"ref {ref}: {subject}"
        if commit == ctx.incumbent:
            return Proposal(description=description, error=f"{ref} is the incumbent itself")
        if _is_ancestor(ctx.repo, ctx.incumbent, commit):
            return Proposal(description=description, commit=commit)
        # based on an older commit: carry its own changes over onto the incumbent
        try:
            base = gitrepo.git(ctx.repo, "merge-base", ctx.incumbent, commit)
            diff = gitrepo.git_bytes(ctx.repo, "diff", "--binary", "--no-color", "--no-ext-diff", base, commit)
            new = apply_onto(ctx.repo, ctx.incumbent, diff, description)
        except (PatchError, gitrepo.GitError) as exc:
            return Proposal(description=description,
                            error=f"{ref} does not apply onto the incumbent: {exc}")
        return Proposal(description=description, commit=new)


class PatchError(RatchetError):
    pass


def apply_onto(repo: Path, parent: str, patch: bytes, message: str) -> str:
    """Commit `parent` + `patch` without touching the checkout; PatchError with git's words."""
    if not patch.strip():
        raise PatchError("the patch is empty")
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        gitrepo.git(repo, "read-tree", parent, env=env)
        patch_file = Path(tmp) / "change.patch"
        patch_file.write_bytes(patch)
        proc = subprocess.run(
            gitrepo.git_argv(repo, "apply", "--cached", "--whitespace=nowarn", str(patch_file)),
            capture_output=True,
            env=gitrepo.git_env(env),
        )
        if proc.returncode != 0:
            lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise PatchError("; ".join(lines[-3:]) or f"git apply exited {proc.returncode}")
        tree = gitrepo.git(repo, "write-tree", env=env)
    if tree == gitrepo.tree_of(repo, parent):
        raise PatchError("it changes nothing (already applied?)")
    return gitrepo.commit_tree(repo, tree, parent, message)


def _subject(patch: bytes) -> str | None:
    """The subject of a `git format-patch` mail, without the [PATCH n/m] prefix."""
    head = patch[:4096].decode("utf-8", "replace")
    match = re.search(r"^Subject:\s*(?:\[[^\]]*\]\s*)?(.+)$", head, re.MULTILINE)
    return match.group(1).strip() if match else None


def _is_ancestor(repo: Path, ancestor: str, commit: str) -> bool:
    proc = subprocess.run(
        gitrepo.git_argv(repo, "merge-base", "--is-ancestor", ancestor, commit),
        capture_output=True, env=gitrepo.git_env(),
    )
    return proc.returncode == 0
