"""Each agent's own home: fresh, writable, with copies of the config dirs the user names."""

from __future__ import annotations

import os
from pathlib import Path

from ratchet.proposers.agent_clis import private_home


def test_a_named_config_dir_is_copied_not_lent(tmp_path):
    codex = tmp_path / "user-codex"
    (codex / "sessions").mkdir(parents=True)
    (codex / "config.toml").write_text('model = "m"\n')
    (codex / "sessions" / "old.jsonl").write_text("{}\n")
    (tmp_path / "secret").write_text("not for the agent")
    (codex / "link").symlink_to(tmp_path / "secret")
    root = tmp_path / "agent"
    root.mkdir()
    env = private_home(root, {"CODEX_HOME": str(codex), "PATH": "/usr/bin"})
    home, tmp, copy = Path(env["HOME"]), Path(env["TMPDIR"]), Path(env["CODEX_HOME"])
    assert home.is_dir() and tmp.is_dir() and copy.is_dir()
    assert all(p.is_relative_to(root) for p in (home, tmp, copy))
    assert not home.is_relative_to(tmp)  # Codex refuses helpers under the temp dir
    assert sorted(os.listdir(copy)) == ["config.toml"]  # no sessions, no links
    assert (copy / "config.toml").read_text() == 'model = "m"\n'
    (copy / "config.toml").write_text("changed by the agent")
    assert (codex / "config.toml").read_text() == 'model = "m"\n'  # the user's stays
    assert "CLAUDE_CONFIG_DIR" not in env  # only what the user named


def test_without_named_dirs_only_home_and_tmp(tmp_path):
    env = private_home(tmp_path, {})
    assert set(env) == {"HOME", "TMPDIR"}
    assert os.listdir(env["HOME"]) == []
