"""Proposers turn context into candidates. One small protocol, several plain kinds.

A proposer is told about every judged candidate (`observe`) and asked for up to k new
proposals from the incumbent (`propose`). It never runs anything it proposes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ratchet.driver.candidate import Proposal
from ratchet.driver.config import Config
from ratchet.driver.ledger import Candidate
from ratchet.errors import UserError


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
    # Set for a proposer that is not `contained`: runs one untrusted step (one agent) with
    # nothing else running, checks the study's state around it, and returns (its result,
    # whether the state was tampered with meanwhile). Called on the thread of `propose`.
    alone: Callable[[Callable[[], Any]], tuple[Any, bool]] | None = None


class Proposer:
    """The base of every proposer kind: the study calls these methods and nothing else.

    `propose` is the one a kind must write; the others are hooks with a default.
    All of them run on the proposer's own thread, never on the loop that polls jobs.
    """

    name: str = "proposer"
    # Can it write what the driver trusts (ledger, refs, .git)? Only a proposer that runs
    # untrusted code outside a filesystem sandbox can; its proposals are then never made
    # while candidates run, and are checked in a window of their own (driver/proposals.py).
    contained: bool = True
    # Does it read people's ideas (`ratchet idea`, ideas.md) from `ctx.ideas`? One that
    # does not leaves them pending, and `ratchet idea` says so.
    takes_ideas: bool = True

    def warm_up(self) -> None:
        """Called once, first, while the study starts its workers and pins its start:
        load what the first `propose` would otherwise wait for (SDK clients, the machine's
        description). Default: nothing."""

    def unreachable(self, repo: Path, state_dir: Path) -> str | None:
        """Before the first proposal: why the sandbox could not start this proposer's
        untrusted party (an agent CLI) as its uid, in one line, or None. Default: None,
        nothing of it runs sandboxed."""
        return None

    def propose(self, k: int, ctx: ProposalContext) -> list[Proposal]:
        """Up to k new proposals from `ctx.incumbent`; [] when there is nothing new."""
        raise NotImplementedError

    def repair(self, proposal: Proposal, diff: str, ctx: ProposalContext) -> Proposal | None:
        """Re-apply `proposal`, made on an older incumbent, on `ctx.incumbent`, where git
        could not merge it: `diff` is its change against the commit it was made on. The
        repaired proposal's files are on `ctx.incumbent` and its `calls` include the
        repair's own (outcome `repaired`); one with `error` set failed (it is dropped,
        billed). Default: None, this kind does not repair (the proposal is handled as
        a conflict: asked again, or recorded as conflicting)."""
        return None

    def observe(self, candidate: Candidate) -> None:
        """Told of every judged candidate. Default: nothing (the next context carries the
        whole history)."""

    def activity(self) -> str | None:
        """What a `propose` in flight is doing, for the live view ("2 of 4 agents
        running"); called from the driver's loop, so it only reads. Default: None (the
        view says the proposer's kind and how long it has been at it)."""
        return None


P = TypeVar("P", bound="Proposer")


class ProposerError(UserError):
    """The proposer cannot produce candidates (bad config, service down after retries)."""


# -- one registry of proposer kinds ------------------------------------------------------
#
# name -> class -> the model of its config section. The built-in kinds are named here and
# imported only when used (optuna, the LLM SDKs and the agent CLIs' helpers are heavy);
# another kind registers its class with `register_proposer`. `search.proposer`'s accepted
# values and the CLI's `--proposer` help come from here. A kind reads its own section
# (`[llm]`, `[agent]`, ...) when it is built, so a study that does not use a kind is never
# stopped by that kind's section.


@dataclass(frozen=True)
class ProposerKind:
    name: str
    where: str  # "module:Class" of the Proposer subclass, built as Class(config, history)
    settings: str | None  # "module:Model" of its section's settings, None: none of its own
    summary: str

    def load(self) -> type[Proposer]:
        return _attr(self.where)

    def settings_model(self) -> type | None:
        """The pydantic model of its section (`[llm]` -> LLMSettings), if it has one."""
        return _attr(self.settings) if self.settings else None


_KINDS: dict[str, ProposerKind] = {
    kind.name: kind for kind in (
        ProposerKind("tune", "ratchet.proposers.tune:TuneProposer", None,
                     "Optuna over the declared [tune.knobs] (offline)"),
        ProposerKind("llm", "ratchet.proposers.llm:LLMProposer",
                     "ratchet.proposers.llm:LLMSettings", "API models writing SEARCH/REPLACE edits"),
        ProposerKind("agent", "ratchet.proposers.agent:AgentProposer",
                     "ratchet.proposers.agent:AgentSettings", "a coding-agent CLI in a sandbox"),
        ProposerKind("patches", "ratchet.proposers.patches:PatchesProposer",
                     "ratchet.proposers.patches:PatchesSettings",
                     "queued patches and branches, each tried once"),
    )
}
_CLASSES: dict[str, type[Proposer]] = {}  # kinds registered by class (plug-ins)


def register_proposer(name: str, *, summary: str) -> Callable[[type[P]], type[P]]:
    """Register a Proposer subclass (built as cls(config, history)) under `name`."""

    def add(cls: type[P]) -> type[P]:
        _KINDS[name] = ProposerKind(name, f"{cls.__module__}:{cls.__qualname__}", None, summary)
        _CLASSES[name] = cls
        return cls

    return add


def proposer_kinds() -> dict[str, ProposerKind]:
    return dict(_KINDS)


def names_help() -> str:
    """`tune | llm | agent | patches` for the CLI's help text."""
    return " | ".join(_KINDS)


def make_proposer(kind: str, config: Config, history: list[Candidate]) -> Proposer:
    found = _KINDS.get(kind)
    if found is None:
        raise ProposerError(f"search.proposer: unknown proposer {kind!r} "
                            f"(expected {names_help()})")
    # every kind is built as Class(config, history); the base class itself has no such
    # constructor, so the class is not called through Proposer's type
    cls: Any = _CLASSES.get(kind) or found.load()
    return cls(config, history)


def _attr(where: str) -> Any:
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)
