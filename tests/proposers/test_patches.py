"""The patches proposer with real patch files and git refs."""

from __future__ import annotations

from conftest import context_for, git, ledger_of, make_repo

from ratchet.driver.config import load_config
from ratchet.driver.study import Study
from ratchet.proposers.patches import PatchesProposer


def make_patch(repo, old: str, new: str, path: str = "solution.py") -> str:
    """A real `git diff` of one replacement, leaving the checkout as it was."""
    file = repo / path
    original = file.read_text()
    file.write_text(original.replace(old, new))
    diff = git(repo, "diff", "--", path) + "\n"
    file.write_text(original)
    return diff


def test_patch_files_and_refs_through_a_study(tmp_path):
    repo = make_repo(tmp_path / "r", "patches", """
[patches]
dir = "patches"
refs = ["try-branch", "old-branch"]
""", parallel=6)
    base = git(repo, "rev-parse", "HEAD")
    patches = repo / "patches"
    patches.mkdir()
    (patches / "a-good.patch").write_text(make_patch(repo, "VALUE = 10", "VALUE = 2"))
    (patches / "b-stale.diff").write_text(make_patch(repo, "VALUE = 10", "VALUE = 1").replace(
        "-VALUE = 10", "-VALUE = 11"))
    (patches / "c-protected.patch").write_text(
        make_patch(repo, "print(", "print('score: 0') or print(", path="evaluate.py"))
    (patches / "notes.txt").write_text("not a patch")
    # a branch on top of the study's start, and one based on an older commit (carried over)
    (repo / "program.md").write_text("# program.md\nnewer instructions\n")
    git(repo, "commit", "-qam", "newer program.md")  # main moves on; the study starts here
    git(repo, "checkout", "-q", "-b", "try-branch")
    (repo / "solution.py").write_text((repo / "solution.py").read_text().replace(
        "    total = VALUE", "    total = VALUE - 5"))
    git(repo, "commit", "-qam", "subtract five")
    git(repo, "checkout", "-q", "-b", "old-branch", base)
    (repo / "solution.py").write_text((repo / "solution.py").read_text().replace(
        "    return total", "    return total * 2"))
    git(repo, "commit", "-qam", "double it")
    git(repo, "checkout", "-q", "main")

    study = Study(repo, backend="local")
    try:
        study.run(rounds=1)
        rows = {c.description: c for c in study.ledger.candidates()}
    finally:
        study.close()
    assert set(rows) == {"baseline", "patch a-good.patch", "patch b-stale.diff",
                         "patch c-protected.patch", "ref try-branch: subtract five",
                         "ref old-branch: double it"}
    assert rows["patch a-good.patch"].status == "keep" and rows["patch a-good.patch"].metric == 2
    branch = rows["ref try-branch: subtract five"]
    assert branch.status == "discard" and branch.metric == 5 and "beaten by" in branch.reasons
    assert branch.commit_sha == git(repo, "rev-parse", "try-branch")  # used as it is
    stale = rows["patch b-stale.diff"]
    assert stale.status == "rejected" and "does not apply" in stale.reasons
    assert "patch failed" in stale.reasons or "does not match" in stale.reasons
    assert "touches protected path evaluate.py" in rows["patch c-protected.patch"].reasons
    old = rows["ref old-branch: double it"]
    assert old.status == "discard" and old.metric == 20
    assert git(repo, "rev-parse", f"{old.commit_sha}^") == old.parent  # rebased on the incumbent
    assert rows["patch a-good.patch"].params == {"patches": {"item": "patch:patches/a-good.patch"}}

    # every queued item is used once: the next round has nothing to do, so the study stops
    (patches / "d-new.patch").write_text(make_patch(repo, "VALUE = 10", "VALUE = 4"))
    study = Study(repo, backend="local")
    try:
        study.run(rounds=3)
    finally:
        study.close()
    later = [c for c in ledger_of(repo).candidates() if c.round > 1]
    assert [c.description for c in later] == ["patch d-new.patch"]


def test_format_patch_mail_and_missing_ref(tmp_path):
    repo = make_repo(tmp_path / "r", "patches", """
[patches]
dir = "queue"
refs = ["no-such-ref"]
""")
    git(repo, "checkout", "-q", "-b", "work")
    (repo / "solution.py").write_text((repo / "solution.py").read_text().replace("10", "8"))
    git(repo, "commit", "-qam", "eight is enough")
    mail = git(repo, "format-patch", "-1", "--stdout", "HEAD") + "\n"
    git(repo, "checkout", "-q", "main")
    (repo / "queue").mkdir()
    (repo / "queue" / "0001-eight.patch").write_text(mail)
    proposer = PatchesProposer(load_config(repo), [])
    ctx = context_for(repo)
    first, second = proposer.propose(5, ctx)
    assert first.description == "patch 0001-eight.patch: eight is enough" and first.commit
    assert "+VALUE = 8" in git(repo, "diff", ctx.incumbent, first.commit)
    assert second.error == "'no-such-ref' is not a commit"
    assert proposer.propose(5, ctx) == []  # both used
