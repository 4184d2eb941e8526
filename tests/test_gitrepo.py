"""Git plumbing that builds candidates and pins the start (real git, no checkout)."""

from __future__ import annotations

import os

from helpers import git, make_repo

from ratchet.driver.config import load_config
from ratchet.driver.integrity import pin_protected
from ratchet.job import gitrepo
from ratchet.job.jobspec import PinnedFile


def repo_with_modes(tmp_path):
    repo = make_repo(tmp_path / "r", {"a.py": "A = 1\n", "run.sh": "echo hi\n",
                                      "pkg/b.py": "B = 1\n", "notes.txt": "n\n"})
    os.chmod(repo / "run.sh", 0o755)
    os.symlink("notes.txt", repo / "link")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "modes")
    return repo, git(repo, "rev-parse", "HEAD")


def test_top_level_commits_match_the_index_route(tmp_path):
    """Files at the top go through `mktree`; the tree must be the one the index route
    (`read-tree` / `update-index` / `write-tree`, used for nested paths) builds."""
    repo, head = repo_with_modes(tmp_path)
    changes = [{"a.py": b"A = 2\n"}, {"run.sh": b"echo bye\n"}, {"new.py": b"N = 1\n"},
               {"notes.txt": None}, {"link": b"now a file\n"},
               {"a.py": b"A = 3\n", "new.py": b"N = 2\n", "notes.txt": None}]
    for files in changes:
        fast = gitrepo.commit_files(repo, head, files, "m")  # a full id: the mktree route
        slow = gitrepo.commit_files(repo, "HEAD", files, "m")  # a name: the index route
        assert gitrepo.tree_of(repo, fast) == gitrepo.tree_of(repo, slow), files
        assert git(repo, "rev-parse", f"{fast}^") == head
    fast = gitrepo.commit_files(repo, head, {"run.sh": b"echo x\n"}, "m")
    assert git(repo, "ls-tree", fast, "--", "run.sh").split()[0] == "100755"  # kept +x
    nested = gitrepo.commit_files(repo, head, {"pkg/b.py": b"B = 2\n"}, "m")
    assert gitrepo.show(repo, nested, "pkg/b.py") == b"B = 2\n"


def test_blobs_reads_many_in_one_call_and_show_remembers_full_ids(tmp_path):
    repo, head = repo_with_modes(tmp_path)
    ids = [git(repo, "rev-parse", f"{head}:{p}") for p in ("a.py", "run.sh", "link")]
    assert gitrepo.blobs(repo, ids) == [b"A = 1\n", b"echo hi\n", b"notes.txt"]
    assert gitrepo.blobs(repo, []) == []
    assert gitrepo.show(repo, head, "a.py") == b"A = 1\n"
    assert (str(repo), head, "a.py") in gitrepo._shown
    (repo / "a.py").write_text("A = 9\n")
    git(repo, "commit", "-qam", "nine")
    assert gitrepo.show(repo, "HEAD", "a.py") == b"A = 9\n"  # a name moves: never kept
    assert (str(repo), "HEAD", "a.py") not in gitrepo._shown


def test_work_tree(tmp_path):
    repo, _ = repo_with_modes(tmp_path)
    assert gitrepo.work_tree(repo / "pkg") == repo.resolve()
    assert gitrepo.work_tree(repo / ".git") is None
    plain = tmp_path / "plain"
    plain.mkdir()
    assert gitrepo.work_tree(plain) is None


def test_pins_read_content_and_mode_in_one_go(tmp_path):
    repo, head = repo_with_modes(tmp_path)
    (repo / "ratchet.toml").write_text(
        '[task]\nname = "t"\neditable = ["a.py"]\nprotected = ["run.sh", "pkg/*.py", '
        '"absent.py"]\nevaluate = "sh run.sh"\n[task.metric]\nname = "s"\n'
        '[tune.knobs]\n"a.py:A" = { choices = [1, 2] }\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "config")
    head = git(repo, "rev-parse", "HEAD")
    pins = pin_protected(repo, load_config(repo), head)
    assert set(pins) == {"run.sh", "pkg/b.py", "ratchet.toml", "absent.py"}
    assert PinnedFile(**pins["run.sh"]).content() == b"echo hi\n"
    assert pins["run.sh"]["mode"] == 0o755 and pins["pkg/b.py"]["mode"] == 0o644
    assert PinnedFile(**pins["ratchet.toml"]).content() == (repo / "ratchet.toml").read_bytes()
    assert PinnedFile(**pins["absent.py"]).content() is None  # must stay absent


def test_git_calls_run_no_hook_fsmonitor_or_signer_and_leak_no_secret(tmp_path, monkeypatch):
    """A proposer that got code into `.git` (hooks, core.fsmonitor, a signing program, an
    external diff) would run it as the driver, with its secrets, on ratchet's next git call.
    None of them runs, and git itself sees none of the driver's secrets."""
    repo, head = repo_with_modes(tmp_path)
    spy = tmp_path / "ran.txt"
    script = tmp_path / "evil.sh"
    script.write_text(f'#!/bin/sh\necho "$0 OPENAI_API_KEY=$OPENAI_API_KEY" >> {spy}\nexit 0\n')
    script.chmod(0o755)
    hooks = repo / ".git" / "hooks"
    for hook in ("post-commit", "pre-commit", "reference-transaction", "post-checkout",
                 "post-index-change"):
        (hooks / hook).write_text(script.read_text())
        (hooks / hook).chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(script))
    git(repo, "config", "commit.gpgSign", "true")
    git(repo, "config", "gpg.program", str(script))
    git(repo, "config", "diff.external", str(script))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-driver-secret")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))  # someone else's setting
    commit = gitrepo.commit_files(repo, head, {"pkg/b.py": b"B = 2\n"}, "candidate")
    gitrepo.update_ref(repo, "refs/ratchet/demo/c0001", commit)
    assert "B = 2" in gitrepo.diff_text(repo, head, commit)
    assert [c.path for c in gitrepo.diff_changes(repo, head, commit)] == ["pkg/b.py"]
    assert gitrepo.is_dirty(repo) is False
    assert not spy.exists(), spy.read_text()
    env = gitrepo.git_env()
    assert "OPENAI_API_KEY" not in env and "GIT_DIR" not in env
