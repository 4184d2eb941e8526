"""One real small study shared by the hand-off tests (export, log, diff, progress.png, report).

A real git repo, a real `ratchet run` through the CLI with the agent proposer, where
a small executable stands in for the coding agent and carries out the ideas queued
with `ratchet idea`. One candidate a round (so the order is known) gives the story:

    baseline (round 1), then one idea a round: set X to 2.0 (keep), set X to 5.0
    (discard), set X to 1.5 (keep), edit the evaluator (rejected: protected path),
    set X to 1.4 (keep), make it crash (crash), and with no idea left the agent's own
    X = 3.5 (discard).

The study is built once per test session (it costs a few seconds of CPU) and only
read afterwards; tests that write (export) use their own branch names.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from helpers import config_text, git, make_repo, ratchet

from ratchet.core.candidate import Candidate
from ratchet.store.ledger import Ledger

EVALUATOR = '''
import sys
import solution
print("correct: true")
value = solution.score()
print(f"score: {value:.6f}")
print(f"roofline_pct: {100.0 / (1.0 + 10.0 * value):.3f}")
'''

SOLUTION = '''
"""Editable."""

X = 3.0  # the knob


def score():
    return (X - 1.25) ** 2
'''

# The stand-in coding agent: does what the idea in its prompt says, in its worktree.
FAKE_AGENT = r'''
import pathlib, re, sys

prompt = pathlib.Path(sys.argv[1]).read_text()
found = re.search(r"as well as you can: (.+)", prompt)
idea = found.group(1).strip() if found else "set X to 3.5"  # its own (poor) idea
solution = pathlib.Path("solution.py")
text = solution.read_text()
if idea.startswith("set X to "):
    value = idea.removeprefix("set X to ")
    solution.write_text(re.sub(r"^X = .*$", f"X = {value}  # the knob", text, flags=re.M))
    print(f"DESCRIPTION: X = {value}: closer to the optimum")
elif idea == "edit the evaluator":
    pathlib.Path("evaluate.py").write_text('print("score: 0")\n')
    print("DESCRIPTION: report a perfect score")
elif idea == "make it crash":
    solution.write_text(text + "\nraise RuntimeError('boom')\n")
    print("DESCRIPTION: an unfinished refactor")
'''

IDEAS = ["set X to 2.0", "set X to 5.0", "set X to 1.5", "edit the evaluator",
         "set X to 1.4", "make it crash"]
KEPT = ["set X to 2.0", "set X to 1.5", "set X to 1.4"]  # in the order they were kept

TASK = textwrap.dedent('''
    [task]
    name = "demo"
    editable = ["solution.py"]
    protected = ["evaluate.py"]
    evaluate = "python evaluate.py"
    holdout = "python evaluate.py --holdout"
    timeout = "60s"
''')


@dataclass
class HandoffStudy:
    repo: Path
    main_head: str  # the user's branch, before and (it must stay) after

    def ledger(self) -> list[Candidate]:
        ledger = Ledger(self.repo / ".ratchet" / "ledger.db")
        try:
            return ledger.candidates()
        finally:
            ledger.close()

    def meta(self, key: str):
        ledger = Ledger(self.repo / ".ratchet" / "ledger.db")
        try:
            return ledger.get(key)
        finally:
            ledger.close()

    def by_idea(self) -> dict[str, Candidate]:
        return {c.idea: c for c in self.ledger() if c.idea}


_BUILT: dict[str, HandoffStudy] = {}


def handoff_study(tmp_path_factory) -> HandoffStudy:
    """The shared study (built on first use in this test session)."""
    if "study" not in _BUILT:
        _BUILT["study"] = _build(tmp_path_factory.mktemp("handoff"))
    return _BUILT["study"]


def _build(root: Path) -> HandoffStudy:
    agent = root / "fake_agent.py"
    agent.write_text(FAKE_AGENT)
    agent_section = (f'[agent]\ncommand = ["{sys.executable}", "{agent}", "{{prompt_file}}"]\n'
                     'timeout = "60s"\n\n[context]\nhardware = false\n')
    repo = make_repo(root / "r", {
        "ratchet.toml": config_text(
            task=TASK,
            search='[search]\nproposer = "agent"\nparallel = 1\nrounds = 8\n',
            knobs=agent_section,
        ),
        "evaluate.py": EVALUATOR,
        "solution.py": SOLUTION,
        "program.md": "# program\nMake the score as low as possible.\n",
    })
    for idea in IDEAS:
        ratchet(repo, "idea", idea, check=True)
    ratchet(repo, "run", check=True, timeout=600,
            env={"RATCHET_PROGRESS_PNG": "1"})  # its chart is tested (test_history)
    (repo / "notes.txt").write_text("the user's own uncommitted work\n")
    git(repo, "add", "notes.txt")  # staged, not committed: export must leave it so
    return HandoffStudy(repo, git(repo, "rev-parse", "HEAD"))
