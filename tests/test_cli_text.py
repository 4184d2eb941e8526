"""What the CLI prints is literal text: help, errors, descriptions (issue 12, items 13,
14, 16), through the real `ratchet` command."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers import RATCHET, ROOT, git, ratchet, score_repo

import ratchet as ratchet_pkg


def _commands() -> list[str]:
    from ratchet.cli import app

    return [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]


COMMANDS = _commands()  # every command, including ones added later


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
    return subprocess.run([*RATCHET, *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def test_help_keeps_bracketed_text():
    top = cli("--help")
    assert top.returncode == 0, top.stderr
    assert "Run [prep] run once into the shared read-only cache" in top.stdout
    assert "..." not in top.stdout.split("Commands:")[1]  # summaries whole, never cut
    prep = cli("prep", "--help")
    assert prep.returncode == 0, prep.stderr
    assert "Run [prep] run once into the shared read-only cache" in prep.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_help_of_every_command_has_no_bool_metavar_and_every_option_explained(command):
    proc = cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "<bool>" not in proc.stdout and "BOOLEAN" not in proc.stdout
    assert "--no-" not in proc.stdout  # flags are plain switches
    options = proc.stdout.split("Options:", 1)[1]
    for line in options.splitlines():
        if line.strip().startswith("-"):
            # every option line carries a help text after its name and metavar
            assert len(line.strip().split("  ")) > 1 or line.strip().startswith("--help"), line


def test_status_json_has_help_text():
    proc = cli("status", "--help")
    line = next(x for x in proc.stdout.splitlines() if x.strip().startswith("--json"))
    assert "JSON" in line


def test_version():
    proc = cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ratchet {ratchet_pkg.__version__}"


def test_error_keeps_bracketed_text(tmp_path):
    # the default proposer (tune) with no knobs: the error names the [tune.knobs] table
    repo = score_repo(tmp_path / "r", knobs="")
    proc = ratchet(repo, "run")
    assert proc.returncode == 2
    assert "needs at least one [tune.knobs] entry" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_misspelt_required_key_names_the_misspelling_first(tmp_path):
    repo = score_repo(tmp_path / "r")
    toml = repo / "ratchet.toml"
    toml.write_text(toml.read_text().replace("editable =", "editabel ="))
    git(repo, "commit", "-qam", "typo")
    proc = ratchet(repo, "run")
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ")
    assert "task.editabel: unknown key; did you mean 'editable'?" in error
    assert "required key is missing" not in error and "more problem" not in error
    assert not (repo / ".ratchet" / "ledger.db").exists()


def test_descriptions_and_reasons_print_literally(tmp_path):
    """A description full of rich markup and emoji codes comes back byte for byte."""
    repo = score_repo(tmp_path / "r")
    text = "[bold]X[/bold] = 1.0 [tune.knobs] :fire: [wip]"
    solution = (repo / "solution.py").read_text().replace("X = 3.0", "X = 1.0")
    (repo / "solution.py").write_text(solution)
    git(repo, "commit", "-qam", "x to one")
    submitted = ratchet(repo, "submit", "HEAD", "-m", text)
    assert submitted.returncode == 0, submitted.stderr
    cand_id = submitted.stdout.split()[-1]
    waited = ratchet(repo, "wait", cand_id)
    assert waited.returncode == 0, waited.stderr
    assert text in waited.stdout
    shown = ratchet(repo, "show", cand_id)
    assert shown.returncode == 0, shown.stderr
    assert f"{cand_id} candidate round" in shown.stdout and text in shown.stdout
    status = ratchet(repo, "status", "--json")
    assert json.loads(status.stdout)["counts"]
