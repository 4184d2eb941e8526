"""An agent's private copy: its own home, and what is read back from it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import git, make_repo

from ratchet.proposers import scratch


def test_a_named_config_dir_is_copied_not_lent(tmp_path):
    codex = tmp_path / "user-codex"
    (codex / "sessions").mkdir(parents=True)
    (codex / "config.toml").write_text('model = "m"\n')
    (codex / "sessions" / "old.jsonl").write_text("{}\n")
    (tmp_path / "secret").write_text("not for the agent")
    (codex / "link").symlink_to(tmp_path / "secret")
    root = tmp_path / "agent"
    root.mkdir()
    env = scratch.private_home(root, {"CODEX_HOME": str(codex), "PATH": "/usr/bin"})
    home, tmp, copy = Path(env["HOME"]), Path(env["TMPDIR"]), Path(env["CODEX_HOME"])
    assert all(p.is_dir() and p.is_relative_to(root) for p in (home, tmp, copy))
    assert not home.is_relative_to(tmp)  # Codex refuses helpers under the temp dir
    assert sorted(os.listdir(copy)) == ["config.toml"]  # no sessions, no links
    (copy / "config.toml").write_text("changed by the agent")
    assert (codex / "config.toml").read_text() == 'model = "m"\n'  # the user's stays
    assert "CLAUDE_CONFIG_DIR" not in env  # only what the user named


def test_only_editable_regular_files_come_back(tmp_path):
    repo = make_repo(tmp_path / "r", "agent")
    head = git(repo, "rev-parse", "HEAD")
    copy = scratch.make(repo, head, "t", parent=tmp_path)
    try:
        tree = copy.tree
        assert (tree / ".git").is_dir() and not (tree / ".git").is_symlink()
        subprocess.run(["git", "-C", str(tree), "log", "--oneline"], check=True,
                       capture_output=True)  # a git of its own, with the incumbent
        (tree / "solution.py").write_text("VALUE = 1\n")
        (tree / "helpers").mkdir()
        (tree / "helpers" / "new.py").write_text("X = 1\n")  # added at an editable path
        (tree / "notes.txt").write_text("scratch notes\n")  # new, not editable: not read
        (tree / "program.md").write_text("changed\n")  # tracked, not editable: ignored
        (tree / ".aider.tags.cache.v4").mkdir()
        (tree / ".aider.tags.cache.v4" / "cache.db").write_bytes(b"x")
        (tree / "helpers" / "__pycache__").mkdir()
        (tree / "helpers" / "__pycache__" / "new.cpython-311.pyc").write_bytes(b"x")
        got = scratch.harvest(repo, head, tree, ["solution.py", "helpers/*.py"],
                              ["evaluate.py", "ratchet.toml"])
        assert got.problems == []
        assert got.files == {"solution.py": b"VALUE = 1\n", "helpers/new.py": b"X = 1\n"}
        assert got.ignored == ["program.md"]
        (tree / "evaluate.py").write_text("print('score: 0')\n")
        (tree / "helpers" / "new.py").unlink()
        (tree / "helpers" / "new.py").symlink_to("/etc/hostname")
        got = scratch.harvest(repo, head, tree, ["solution.py", "helpers/*.py"],
                              ["evaluate.py", "ratchet.toml"])
        assert "touches protected path evaluate.py" in got.problems
        assert "helpers/new.py is a symlink (not allowed in candidates)" in got.problems
    finally:
        copy.remove()
    assert not copy.root.exists()
