"""`ratchet export NAME`: the kept steps as a reviewable branch, one commit per step.

The study's own history is not reviewable as it stands: candidates were committed on
top of whatever was the incumbent, with terse subjects, alongside many discarded
siblings. Export rebuilds the path that mattered: from the study's start commit, one
commit per kept step, in the order they were kept, each carrying the kept commit's
tree and a message that says what was measured (metric, gain over the previous step,
judge's margin and noise, hold-out) and who proposed it. With `--squash`, one commit
with the whole story. The last tree is the incumbent's, so the branch's diff against
the start is exactly what the study kept.

Only plumbing (`commit-tree`, `update-ref`): the user's branches, HEAD, index and
working tree are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ratchet.core.errors import UserError
from ratchet.core.vocab import Kind
from ratchet.driver.candidate import study_branch
from ratchet.job import gitrepo
from ratchet.job.fingerprint import fingerprint_key
from ratchet.store.ledger import Ledger
from ratchet.ui.history import Step, format_change, kept_steps

ZERO = "0" * 40  # update-ref's "must not exist yet"
RATCHET_IDENT = {"GIT_COMMITTER_NAME": "ratchet", "GIT_COMMITTER_EMAIL": "ratchet@localhost"}
SUBJECT_LIMIT = 72


class ExportError(UserError):
    """Why the branch was not written (phrased for the user)."""


@dataclass
class StudyView:
    """What export needs to know about the study (no driver, no backend)."""

    repo: Path
    ledger: Ledger
    name: str
    metric: str
    goal: str


@dataclass
class Exported:
    branch: str
    tip: str
    commits: list[str]
    steps: list[Step]
    replaced: str | None  # the commit NAME pointed at before --force moved it


def export(study: StudyView, name: str, squash: bool = False, force: bool = False) -> Exported:
    """Write branch `name`; returns what was written. Raises ExportError, never half-writes."""
    repo, ledger = study.repo, study.ledger
    ref = _branch_ref(repo, name)
    record = ledger.study()
    start = record.pinned
    if not start:
        raise ExportError("the study has not started: nothing to export (run `ratchet run`)")
    incumbent = record.incumbent_commit  # pinned with the start
    if ref == study_branch(study.name):
        raise ExportError(f"{name} is the study's own branch; choose another name")
    steps = kept_steps(ledger)
    if not steps:
        raise ExportError("nothing was kept yet: the incumbent is still the study start "
                          f"{start[:7]}")
    last = steps[-1].cand
    if last.commit_sha != incumbent:
        raise ExportError(f"the last kept candidate {last.id} ({last.short}) is not the "
                          f"incumbent {str(incumbent)[:7]}; run `ratchet run` once to let "
                          "the study repair its state")
    existing = gitrepo.try_rev_parse(repo, ref)
    if existing is not None and not force:
        raise ExportError(f"branch {name} already exists (at {existing[:7]}); pass --force "
                          "to replace it, or choose another name")
    if existing is not None and ref in _checked_out(repo):
        raise ExportError(f"branch {name} is checked out in a worktree; export never moves a "
                          "checked-out branch (choose another name)")

    committer = _committer_env(repo)
    if squash:
        tip = _commit(repo, gitrepo.tree_of(repo, incumbent), start,
                      squash_message(study, steps), committer)
        commits = [tip]
    else:
        commits, parent = [], start
        for i, step in enumerate(steps, 1):
            sha = step.cand.commit_sha
            if sha is None:  # a keep is a commit: a row without one is a broken ledger
                raise ExportError(f"kept candidate {step.cand.id} has no commit in the ledger")
            env = {**committer, **_author_env(repo, sha)}
            parent = _commit(repo, gitrepo.tree_of(repo, sha), parent,
                             step_message(study, step, i, len(steps)), env)
            commits.append(parent)
        tip = parent
    # the last step is the incumbent (checked above), so this holds; a branch that broke
    # the promise would be worse than no branch, so it is checked rather than assumed
    if gitrepo.tree_of(repo, tip) != gitrepo.tree_of(repo, incumbent):
        raise ExportError("internal error: the exported tree differs from the incumbent's")
    try:  # atomic: created only if absent (under --force: only if still where we saw it)
        gitrepo.update_ref(repo, ref, tip, old=existing or ZERO,
                           reason=f"ratchet export {study.name}")
    except gitrepo.GitError as exc:
        raise ExportError(f"branch {name} was not written (it changed meanwhile?): {exc}") from None
    return Exported(name, tip, commits, steps, existing)


# ---------------------------------------------------------------------------------------
# messages


def step_message(study: StudyView, step: Step, index: int, total: int) -> str:
    cand = step.cand
    lines = [_subject(cand.description or f"ratchet {cand.id}"), ""]
    body = _one_line(cand.description)
    if len(body) > SUBJECT_LIMIT:  # the subject was cut: keep the whole text in the body
        lines += [body, ""]
    lines.append(f"ratchet study {study.name}, kept step {index} of {total}: candidate "
                 f"{cand.id}, round {cand.round}")
    lines.append(f"proposed by: {cand.proposer or 'unknown'}")
    if cand.idea:
        lines.append(f"idea: {_one_line(cand.idea)}")
    if cand.params:
        lines.append("params: " + ", ".join(f"{k}={v}" for k, v in cand.params.items()))
    lines += _measurement(study, step)
    lines.append(f"original commit: {cand.commit_sha}")
    return "\n".join(lines) + "\n"


def _measurement(study: StudyView, step: Step) -> list[str]:
    cand, metric = step.cand, study.metric
    out = []
    if cand.metric is not None:
        before = ("" if step.previous_metric is None else
                  f" from {step.previous_metric:.6g} ({step.previous_id}): "
                  f"gain {format_change(step.change(study.goal))}")
        out.append(f"{metric}: {cand.metric:.6g} ({study.goal}){before}")
    judged = "judge: gain " + ("?" if cand.gain is None else f"{cand.gain:.4g}")
    if cand.margin is not None:
        judged += f" > margin {cand.margin:.4g}"
    judged += (f"; noise {cand.noise:.4g}" if cand.noise is not None else
               "; noise not measured (one sample each)")
    out.append(judged)
    if cand.samples and len(cand.samples) > 1:
        out.append("samples: " + ", ".join(f"{s:.6g}" for s in cand.samples))
    out.append(f"hold-out {metric}: " + (f"{cand.holdout:.6g}" if cand.holdout is not None
                                         else "none (no hold-out evaluator)"))
    fingerprint = (cand.result or {}).get("fingerprint")
    if fingerprint:
        out.append(f"measured on: {fingerprint_key(fingerprint)}")
    return out


def squash_message(study: StudyView, steps: list[Step]) -> str:
    first, last = steps[0], steps[-1].cand
    metric = study.metric
    if first.previous_metric is not None and last.metric is not None:
        total = Step(last, first.previous_metric, first.previous_id).change(study.goal)
        head = (f"ratchet {study.name}: {metric} {first.previous_metric:.6g} -> "
                f"{last.metric:.6g} in {len(steps)} kept step{'s' * (len(steps) != 1)}")
    else:
        total, head = None, f"ratchet {study.name}: {len(steps)} kept steps"
    lines = [_subject(head), ""]
    if total is not None:
        lines.append(f"Overall gain {format_change(total)} over the baseline "
                     f"({first.previous_id}), {study.goal} {metric}.")
        lines.append("")
    lines.append("Kept steps, in order:")
    for i, step in enumerate(steps, 1):
        lines.append("")
        lines.append(f"{i}. {step.cand.id}: {_one_line(step.cand.description)}")
        lines.append(f"   proposed by: {step.cand.proposer or 'unknown'}"
                     + (f"; idea: {_one_line(step.cand.idea)}" if step.cand.idea else ""))
        lines += [f"   {line}" for line in _measurement(study, step)]
        lines.append(f"   original commit: {step.cand.commit_sha}")
    counts: dict[str, int] = {}
    for cand in study.ledger.candidates():
        if cand.kind == Kind.CANDIDATE:
            counts[cand.status] = counts.get(cand.status, 0) + 1
    lines += ["", f"Candidates tried: {sum(counts.values())} ("
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ")"]
    return "\n".join(lines) + "\n"


def _subject(text: str) -> str:
    line = _one_line(text)
    return line if len(line) <= SUBJECT_LIMIT else line[: SUBJECT_LIMIT - 1] + "…"


def _one_line(text: str | None) -> str:
    return " ".join((text or "").replace("\0", " ").split())


# ---------------------------------------------------------------------------------------
# git


def _branch_ref(repo: Path, name: str) -> str:
    if name.startswith("refs/"):
        raise ExportError(f"{name!r}: give a branch name, not a ref (e.g. softmax-kept)")
    try:
        gitrepo.git(repo, "check-ref-format", "--branch", name)
    except gitrepo.GitError:
        raise ExportError(f"{name!r} is not a valid branch name") from None
    return f"refs/heads/{name}"


def _checked_out(repo: Path) -> set[str]:
    text = gitrepo.git(repo, "worktree", "list", "--porcelain")
    return {line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("branch ")}


def _committer_env(repo: Path) -> dict[str, str]:
    """The user's identity when git has one; ratchet's otherwise (commit-tree needs one)."""
    try:
        gitrepo.git(repo, "var", "GIT_COMMITTER_IDENT", user_config=True)
    except gitrepo.GitError:
        return dict(RATCHET_IDENT)
    return {}


def _author_env(repo: Path, commit: str) -> dict[str, str]:
    """Keep the kept commit's author: a person's or an agent's patch stays theirs."""
    name, email, date = gitrepo.git(repo, "log", "-1", "--format=%an%x00%ae%x00%ad",
                                    "--date=raw", commit).split("\0")
    return {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date}


def _commit(repo: Path, tree: str, parent: str, message: str, env: dict[str, str]) -> str:
    if "GIT_AUTHOR_NAME" not in env and env.get("GIT_COMMITTER_NAME"):
        env = {**env, "GIT_AUTHOR_NAME": env["GIT_COMMITTER_NAME"],
               "GIT_AUTHOR_EMAIL": env["GIT_COMMITTER_EMAIL"]}
    return gitrepo.git(repo, "commit-tree", tree, "-p", parent, input=message.encode(),
                       env=env, user_config=True)  # the user's own identity, as git has it
