"""Proposers turn context into candidates. One small protocol, several plain kinds.

A proposer is told about every judged candidate (`observe`) and asked for up to k new
proposals from the incumbent (`propose`). It never runs anything it proposes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ratchet.candidate import Proposal
from ratchet.config import Config
from ratchet.errors import UserError
from ratchet.ledger import Candidate


@dataclass
class ProposalContext:
    repo: Path
    state_dir: Path
    config: Config
    study: str
    round: int
    incumbent: str  # commit sha
    incumbent_metric: float | None
    history: list[Candidate] = field(default_factory=list)
    ideas: list[str] = field(default_factory=list)


class Proposer:
    """The base of every proposer kind: the study calls these methods and nothing else.

    `propose` is the one a kind must write; the others are hooks with a default.
    All of them run on the proposer's own thread, never on the loop that polls jobs.
    """

    name: str = "proposer"

    def warm_up(self) -> None:
        """Called once, first, while the study starts its workers and pins its start:
        load what the first `propose` would otherwise wait for (SDK clients, the machine's
        description). Default: nothing."""

    def propose(self, k: int, ctx: ProposalContext) -> list[Proposal]:
        """Up to k new proposals from `ctx.incumbent`; [] when there is nothing new."""
        raise NotImplementedError

    def observe(self, candidate: Candidate) -> None:
        """Told of every judged candidate. Default: nothing (the next context carries the
        whole history)."""


class ProposerError(UserError):
    """The proposer cannot produce candidates (bad config, service down after retries)."""


def make_proposer(kind: str, config: Config, history: list[Candidate]) -> Proposer:
    if kind == "tune":
        from ratchet.proposers.tune import TuneProposer

        return TuneProposer(config, history)
    if kind == "llm":
        from ratchet.proposers.llm import LLMProposer

        return LLMProposer(config, history)
    if kind == "agent":
        from ratchet.proposers.agent import AgentProposer

        return AgentProposer(config, history)
    if kind == "patches":
        from ratchet.proposers.patches import PatchesProposer

        return PatchesProposer(config, history)
    raise ProposerError(f"search.proposer: unknown proposer {kind!r}")
