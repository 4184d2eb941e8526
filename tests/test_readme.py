"""The README a newcomer reads (issue 40): short, its links lead somewhere, and its
"Write your own task" is a task that really runs.

The three files of that section are taken out of README.md as written, put in a real git
repository and studied with the real CLI; the evaluator sketch is also run by hand, as the
README says it prints, and with a candidate whose call fails, which must be rejected.
(The tour has its own test: tests/test_tour.py.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from helpers import ROOT, git, make_repo, ratchet, results_tsv

README = ROOT / "README.md"
MAX_LINES = 200


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 3)
    return text[start:end if end >= 0 else len(text)]


def own_task_files() -> dict[str, str]:
    """File name -> text, from each fenced block's first line (`# ratchet.toml`,
    `# solution.py: ...`)."""
    files = {}
    for block in re.findall(r"^```\w+\n(.*?)^```", section("Write your own task"),
                            re.MULTILINE | re.DOTALL):
        first = block.split("\n", 1)[0]
        match = re.match(r"# ([\w.]+\.(?:toml|py))\b", first)
        assert match, f"a block of 'Write your own task' does not name its file: {first!r}"
        files[match.group(1)] = block
    assert set(files) == {"ratchet.toml", "solution.py", "evaluate.py"}, sorted(files)
    return files


def test_the_readme_has_at_most_200_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc (the docs site) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_every_relative_link_in_the_readme_resolves():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    relative = [link for link in links if not re.match(r"^[a-z]+:", link)]
    assert len(relative) >= 10, relative  # the docs site is reached from here
    broken = []
    for link in relative:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.MULTILINE)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(f"{link}: no heading with that anchor in {path}")
    assert broken == [], broken


@pytest.fixture
def own_task(tmp_path):
    return make_repo(tmp_path / "my-task", own_task_files())


def test_the_own_task_runs_as_a_study_and_keeps_a_better_x(own_task):
    proc = ratchet(own_task, "run", timeout=600)  # `ratchet run`, as the README says
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = results_tsv(own_task)
    baseline = rows[0]
    assert baseline["description"] == "baseline" and float(baseline["score"]) == 3.0625
    kept = [r for r in rows[1:] if r["status"] == "keep"]
    assert kept and all(float(r["score"]) < 3.0625 for r in kept), rows
    assert git(own_task, "rev-parse", "ratchet/my-task") != git(own_task, "rev-parse", "HEAD")


def test_the_evaluator_sketch_prints_the_score_the_readme_shows(own_task):
    shown = re.search(r"`(score: [\d.]+)`", section("Write your own task")).group(1)
    proc = subprocess.run([sys.executable, "-P", "evaluate.py"], cwd=own_task,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["correct: true", shown], proc.stdout


def test_a_candidate_the_sketch_reports_correct_false_is_rejected(own_task):
    git(own_task, "checkout", "-q", "-b", "broken")
    (own_task / "solution.py").write_text(
        "X = 3.0\n\n\ndef score():\n    raise ValueError('no score today')\n")
    git(own_task, "commit", "-qam", "score() fails")
    submitted = ratchet(own_task, "submit", "broken")
    assert submitted.returncode == 0, submitted.stderr
    cand = submitted.stdout.split()[-1]
    waited = ratchet(own_task, "wait", cand, "--json", timeout=300)
    assert waited.returncode == 0, waited.stderr
    (verdict,) = [json.loads(line) for line in waited.stdout.splitlines()]
    assert verdict["status"] == "rejected", verdict
    shown = ratchet(own_task, "show", cand)
    assert "no score today" in shown.stdout, shown.stdout
    # the study branch stays on the baseline: a rejected candidate is never kept
    assert git(own_task, "rev-parse", "ratchet/my-task") == git(own_task, "rev-parse", "main")
