"""A proposer kind defined only here, by one class and its registration, runs a study;
`search.proposer` accepts exactly the registered kinds."""

from __future__ import annotations

import pytest
from helpers import score_repo

from ratchet import proposers
from ratchet.core.candidate import Proposal
from ratchet.core.config import ConfigError
from ratchet.driver.config import load_config
from ratchet.driver.study import Study
from ratchet.proposers import ProposalContext, Proposer, register_proposer

BEST = b'"""Editable."""\n\nX = 1.25\nSLEEP = 0.0\n\n\ndef score():\n    return (X - 1.25) ** 2\n'


class OneIdea(Proposer):
    """Proposes the known optimum once, then nothing."""

    name = "one-idea"

    def __init__(self, config, history) -> None:  # noqa: ARG002 - the kinds' signature
        self.done = any(c.kind == "candidate" for c in history)

    def propose(self, k: int, ctx: ProposalContext) -> list[Proposal]:
        if self.done:
            return []
        self.done = True
        return [Proposal(description="X at the optimum", files={"solution.py": BEST})]


@pytest.fixture
def one_idea():
    register_proposer("one-idea", summary="test: the optimum, once")(OneIdea)
    yield
    proposers.unregister_proposer("one-idea")


def test_a_proposer_of_one_class_runs_a_study(tmp_path, one_idea):
    repo = score_repo(tmp_path / "r", knobs="",
                      search='[search]\nproposer = "one-idea"\nparallel = 1\nrounds = 2\n')
    with Study(repo) as study:
        study.run()
        cands = study.ledger.candidates()
    kept = [c for c in cands if c.kind == "candidate" and c.status == "keep"]
    assert [c.description for c in kept] == ["X at the optimum"]
    assert kept[0].metric == 0.0


def test_an_unknown_proposer_lists_the_registered_ones(tmp_path, one_idea):
    repo = score_repo(tmp_path / "r", search='[search]\nproposer = "one-ide"\n')
    with pytest.raises(ConfigError, match=r"search\.proposer: unknown proposer 'one-ide'; did "
                                          r"you mean 'one-idea'\? \(expected tune \| llm \| "
                                          r"agent \| patches \| one-idea\)"):
        load_config(repo)


def test_the_built_in_kinds_name_their_settings_models():
    from ratchet.proposers.llm import LLMSettings

    kinds = proposers.proposer_kinds()
    assert list(kinds)[:4] == ["tune", "llm", "agent", "patches"]
    assert kinds["llm"].settings_model() is LLMSettings
    assert kinds["tune"].settings_model() is None  # its knobs are [tune] in the config
    for kind in kinds.values():
        assert issubclass(kind.load(), Proposer)
