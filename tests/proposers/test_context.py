"""Context assembly (budget, history, error tails, context files) and ideas.md parsing."""

from __future__ import annotations

import pytest
from conftest import context_for, make_repo

from ratchet.core.candidate import Candidate
from ratchet.driver.config import load_config
from ratchet.driver.ideas import IdeasError, parse_ideas, read_ideas_file
from ratchet.proposers import ProposerError
from ratchet.proposers.context import build_context, context_settings, hardware_text


def history(n: int, tmp_path) -> list[Candidate]:
    cands = []
    for i in range(n):
        cands.append(Candidate(id=f"c{i:04d}", seq=i, round=i + 1, status="discard",
                               metric=10.0 + i, description=f"experiment number {i} " + "x" * 80,
                               reasons="no gain"))
    log = tmp_path / "evaluate.log"
    log.write_text("line 1\n" + "noise\n" * 40 + "Traceback (most recent call last):\n"
                   "ZeroDivisionError: division by zero\n")
    cands.append(Candidate(id="c9999", seq=n, round=n + 1, status="crash",
                           description="divide by the block size", reasons="evaluate failed",
                           phases=[{"name": "evaluate", "exit_code": 1, "timed_out": False,
                                    "log": str(log)}]))
    return cands


def test_context_has_every_part_and_the_crash_tail(tmp_path):
    repo = make_repo(tmp_path / "r", "llm", context='files = ["model.md"]',
                     files={"model.md": "# Model\nrows are 4096 wide\n"})
    config = load_config(repo)
    ctx = context_for(repo, ideas=["use a lookup table"], history=history(3, tmp_path))
    out = build_context(ctx, context_settings(config))
    for part in ("Make the score as low", "minimize `score`", "protected (a change touching "
                 "them is rejected): evaluate.py, ratchet.toml", "What not to do",
                 "rows are 4096 wide", "VALUE = 10", "use a lookup table",
                 "c0002 (round 3) [discard] score=12 (+20.00% vs the incumbent, worse)",
                 "ZeroDivisionError: division by zero", "[evaluate phase]"):
        assert part in out, part
    assert "line 1" not in out  # only the tail of a crash log
    assert out.index("c0000") < out.index("c0002") < out.index("c9999")


def test_budget_drops_the_oldest_history_first(tmp_path):
    repo = make_repo(tmp_path / "r", "llm")
    ctx = context_for(repo, history=history(40, tmp_path))
    settings = context_settings(ctx.config, history=30, token_budget=1200)
    out = build_context(ctx, settings)
    assert len(out) <= 1200 * 4 + 200
    assert "c9999" in out and "c0039" in out  # the newest are kept
    assert "c0000" not in out and "c0010" not in out  # the oldest are dropped
    assert "older experiments not shown" in out
    assert "VALUE = 10" in out  # editable files are never cut


def test_missing_context_file_is_a_clear_error(tmp_path):
    repo = make_repo(tmp_path / "r", "llm")
    ctx = context_for(repo)
    settings = context_settings(ctx.config).model_copy(update={"files": ["nope.md"]})
    with pytest.raises(ProposerError, match=r"context\.files\[0\]: nope\.md"):
        build_context(ctx, settings)


def test_hardware_context_describes_this_machine():
    text = hardware_text()
    assert text.startswith("## Hardware") and "cache" in text.lower()


def test_parse_ideas():
    text = ("# Ideas\n\nSome prose.\n- first idea\n* second idea\n  continued here\n"
            "- [x] a done checkbox idea\n-not a bullet\n")
    assert parse_ideas(text) == ["first idea", "second idea continued here",
                                 "a done checkbox idea"]


def test_unreadable_ideas_file(tmp_path):
    assert read_ideas_file(tmp_path / "ideas.md") == []
    (tmp_path / "ideas.md").mkdir()
    with pytest.raises(IdeasError, match="cannot read the ideas file"):
        read_ideas_file(tmp_path / "ideas.md")
