"""The docs site (issue 40): the config and CLI references are generated from the code and
match it, `scripts/gen_reference.py --check` fails on a stale page, and the site builds
with `mkdocs build --strict`, which fails on a broken link."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

SCRIPT = ROOT / "scripts" / "gen_reference.py"
REFERENCE = ROOT / "docs" / "reference"
HAS_MKDOCS = importlib.util.find_spec("mkdocs") is not None and \
    importlib.util.find_spec("material") is not None


def gen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_the_committed_reference_pages_match_the_code():
    proc = gen("--check")
    assert proc.returncode == 0, f"{proc.stderr}run `python scripts/gen_reference.py`"


def test_every_key_and_every_command_is_in_the_reference():
    import typer.main

    from ratchet.cli import app
    from ratchet.core import config

    page = (REFERENCE / "config.md").read_text()
    for section, model in [("task", config.Task), ("acceptance", config.Acceptance),
                           ("search", config.Search), ("backend", config.Backend),
                           ("budget", config.Budget), ("notify", config.Notify)]:
        part = page[page.index(f"## `[{section}]`"):]
        part = part[:part.find("\n## ", 3)]
        for name, info in model.model_fields.items():
            if not info.exclude and name != "metric":
                assert f"| `{info.alias or name}` |" in part, f"{section}.{name} is missing"
    assert "| `timeout` | duration" in page and "| required |" in page
    cli = (REFERENCE / "cli.md").read_text()
    for name in typer.main.get_command(app).commands:  # type: ignore[attr-defined]
        assert f"## `ratchet {name}`" in cli, f"ratchet {name} is missing"
    assert "`--rounds <int range>` (option): total rounds for the study" in cli


def test_check_names_a_stale_page_and_a_rewrite_fixes_it(tmp_path):
    pages = tmp_path / "reference"
    shutil.copytree(REFERENCE, pages)
    config = pages / "config.md"
    fresh = config.read_text()
    # a key whose default changed in the code but not on the page
    config.write_text(fresh.replace("| `rounds` | integer | `4` |", "| `rounds` | integer | `5` |"))
    assert config.read_text() != fresh
    stale = gen("--check", "--out", str(pages))
    assert stale.returncode == 1
    assert f"{config}: stale" in stale.stderr and "cli.md" not in stale.stderr
    assert config.read_text() != fresh  # --check writes nothing
    assert gen("--out", str(pages)).returncode == 0
    assert config.read_text() == fresh
    assert gen("--check", "--out", str(pages)).returncode == 0


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(site)], cwd=root, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.mark.skipif(not HAS_MKDOCS, reason="mkdocs-material is not installed "
                    "(pip install -e '.[docs]', as `make install` does)")
def test_the_site_builds_strict(tmp_path):
    proc = mkdocs_build(ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    built = tmp_path / "site"
    assert (built / "reference" / "config.html").is_file()
    assert "Rolling" in (built / "benchmarks.html").read_text()  # bench/RESULTS.md included


@pytest.mark.skipif(not HAS_MKDOCS, reason="mkdocs-material is not installed "
                    "(pip install -e '.[docs]', as `make install` does)")
def test_a_broken_link_fails_the_strict_build(tmp_path):
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", root)
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copytree(ROOT / "bench", root / "bench", ignore=shutil.ignore_patterns("*.py"))
    page = root / "docs" / "testing.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    proc = mkdocs_build(root, tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stderr and "testing.md" in proc.stderr
