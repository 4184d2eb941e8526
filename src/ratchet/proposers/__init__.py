"""Proposers turn context into candidates. One small protocol, several plain kinds.

A proposer is told about every judged candidate (`observe`) and asked for up to k new
proposals from the incumbent (`propose`). It never runs anything it proposes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

from ratchet.core import plugins
from ratchet.core.candidate import Candidate, Proposal
from ratchet.core.config import CONFIG_FILE, Config
from ratchet.core.errors import UserError


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
    # one line for `--help` and the docs
    summary: ClassVar[str] = ""
    # the model of its `[<name>]` table (LLMSettings for `[llm]`); None: it has none
    settings_model: ClassVar[type[BaseModel] | None] = None
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

    # -- what the kind says before one is built (the study's preview, `ratchet status`,
    # `ratchet serve`): class methods, so no proposer is built just to answer them

    @classmethod
    def estimate(cls, config: Config, repo: Path, commit: str, k: int) -> Estimate | None:
        """What k proposals from `commit` are expected to cost before any ran (the
        preview line against `[budget]`); None: nothing per call (the default)."""
        return None

    @classmethod
    def sandbox_status(cls, config: Config) -> str | None:
        """What confines this kind's untrusted party here, in words (`ratchet status`,
        the report's "agents" line); None: nothing of it runs untrusted (the default)."""
        return None


@dataclass(frozen=True)
class Estimate:
    """A proposer's expected spend for a round (Proposer.estimate)."""

    usd: float
    note: str  # how it was reckoned: "4 requests x ~1,200 tokens in, ..."


P = TypeVar("P", bound="Proposer")


class ProposerError(UserError):
    """The proposer cannot produce candidates (bad config, service down after retries)."""


# -- one registry of proposer kinds ------------------------------------------------------
#
# name -> class -> the model of its config table. Every kind, the built-in ones included,
# is an entry point of group `ratchet.proposers` naming its Proposer subclass
# (ratchet.core.plugins); a class is imported only when its kind is used (optuna, the LLM SDKs
# and the agent CLIs' helpers are heavy). A class defined in-process registers with
# `register_proposer`. `search.proposer`'s accepted values and the CLI's `--proposer` help
# come from here, from names alone. A kind's table is `[<name>]` (`[llm]`, `[agent]`,
# `[mine]`): a plug-in's is checked against its `settings_model` when the config loads
# (driver/config.py's second pass), a built-in's when the kind is built, so a study that
# does not use a built-in kind is never stopped by its table.


@dataclass(frozen=True)
class ProposerKind:
    name: str
    where: str  # "module:Class" of the Proposer subclass, built as Class(config, history)

    def load(self) -> type[Proposer] | None:
        """Its class; None when its plug-in failed to load (warned once, in one line)."""
        registered = _CLASSES.get(self.name)
        if registered is not None:
            return registered
        found: type[Proposer] | None = plugins.load(plugins.Group.PROPOSERS, self.name,
                                                    _a_proposer)
        return found

    def settings_model(self) -> type[BaseModel] | None:
        """The pydantic model of its table (`[llm]` -> LLMSettings), if it has one."""
        cls = self.load()
        return cls.settings_model if cls is not None else None

    @property
    def summary(self) -> str:
        cls = self.load()
        return cls.summary if cls is not None else "(failed to load)"


def _a_proposer(name: str, found: object) -> tuple[str, str] | None:
    """What a proposer's entry point must name: a Proposer subclass."""
    if isinstance(found, type) and issubclass(found, Proposer):
        return None
    what = getattr(found, "__qualname__", type(found).__name__)
    return (f"{what} is not a subclass of ratchet.proposers.Proposer",
            f"make {name!r} name a class extending Proposer (docs/proposers.md, "
            "\"Writing a plug-in\")")


_CLASSES: dict[str, type[Proposer]] = {}  # kinds registered in-process, by class


def register_proposer(name: str, *, summary: str) -> Callable[[type[P]], type[P]]:
    """Register a Proposer subclass (built as cls(config, history)) under `name`, in this
    process only; a package declares an entry point instead (docs/proposers.md)."""

    def add(cls: type[P]) -> type[P]:
        cls.summary = summary
        _CLASSES[name] = cls
        return cls

    return add


def unregister_proposer(name: str) -> None:
    _CLASSES.pop(name, None)


def proposer_kinds() -> dict[str, ProposerKind]:
    """Every kind by name, the built-in ones first; nothing is imported."""
    kinds = {name: ProposerKind(name, point.value)
             for name, point in plugins.entry_points(plugins.Group.PROPOSERS).items()}
    for name, cls in _CLASSES.items():
        kinds[name] = ProposerKind(name, f"{cls.__module__}:{cls.__qualname__}")
    return kinds


def names_help() -> str:
    """`tune | llm | agent | patches` for the CLI's help text."""
    return " | ".join(proposer_kinds())


def proposer_class(kind: str) -> type[Proposer]:
    """The class of kind `kind` (its hooks answer for the kind before one is built)."""
    found = proposer_kinds().get(kind)
    cls = found.load() if found is not None else None
    if cls is None:
        broken = plugins.failure(plugins.Group.PROPOSERS, kind)
        raise ProposerError(broken or f"search.proposer: unknown proposer {kind!r} "
                                      f"(expected {names_help()})")
    return cls


def sandbox_status(kind: str, config: Config) -> str | None:
    """Kind `kind`'s own status line on its sandbox (Proposer.sandbox_status); None when
    it has none, or failed to load (said where it failed)."""
    try:
        return proposer_class(kind).sandbox_status(config)
    except ProposerError:
        return None


def make_proposer(kind: str, config: Config, history: list[Candidate]) -> Proposer:
    # every kind is built as Class(config, history); the base class itself has no such
    # constructor, so the class is not called through Proposer's type
    cls: Any = proposer_class(kind)
    return cls(config, history)


def plugin_settings(kind: str, config: Config) -> Any:
    """A plug-in kind's typed table (`[<kind>]`, checked when the config loaded), or its
    model's defaults when the file has none; a ProposerError names a required key."""
    if kind in config.tables:
        return config.tables[kind]
    model = proposer_class(kind).settings_model
    if model is None:
        return None
    from ratchet.core.config import SectionError, section

    try:
        return section(model, {}, kind, "docs/proposers.md")
    except SectionError as exc:
        raise ProposerError(f"{CONFIG_FILE}: {exc} (add a [{kind}] table)") from None
