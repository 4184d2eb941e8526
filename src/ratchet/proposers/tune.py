"""`proposer = "tune"`: Optuna (ask/tell) over the declared knobs. The offline default.

The ledger is the source of truth, not Optuna's storage: on start (and on resume) the
judged history is replayed into an in-memory study, and each round's sampler is seeded
from (seed, round), so a resumed study proposes exactly what an uninterrupted one would.

The tuner never proposes a candidate whose editable files are byte-identical to the
incumbent's or to any earlier candidate's (the baseline included): identity is decided
on the files' contents, not on the knob values a candidate was recorded with, because the
baseline and submitted commits carry no knob values at all.
"""

from __future__ import annotations

import hashlib
import logging
import math
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from ratchet.core.candidate import Candidate, Proposal
from ratchet.core.config import Config, Knob, matches_any
from ratchet.core.vocab import Kind, Status
from ratchet.job import gitrepo
from ratchet.proposers import ProposalContext, Proposer, ProposerError
from ratchet.proposers.knobs import KnobError, format_value, knob_values, set_knob

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

MAX_ASKS_PER_CANDIDATE = 40


def _optuna() -> ModuleType:
    """Optuna, imported when the tuner is built, not with its class: the class is loaded
    for its hooks (`ratchet status`), and Optuna's import is half a second."""
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    return optuna


def distribution(knob: Knob) -> BaseDistribution:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if knob.choices is not None:
        return CategoricalDistribution(knob.choices)
    assert knob.low is not None and knob.high is not None  # validated: a range has both ends
    if knob.is_int:
        step = int(knob.step or 1)
        return IntDistribution(int(knob.low), int(knob.high), log=knob.log, step=step)
    return FloatDistribution(knob.low, knob.high, log=knob.log, step=knob.step)


def _hashable(value: object) -> object:
    # type-tagged: True == 1 in Python, but `INPLACE = True` and `INPLACE = 1` differ
    return (type(value).__name__, round(value, 12) if isinstance(value, float) else value)


class EditableFiles:
    """The editable files of commits as {path: blob id}; cached, since commits never change.

    Two candidates with the same map are the same experiment, whatever produced them.
    """

    def __init__(self, repo: Path, globs: list[str]) -> None:
        self.repo = repo
        self.globs = globs
        self._cache: dict[str, dict[str, str]] = {}
        self._format: str | None = None

    def of(self, commit: str) -> dict[str, str]:
        if commit not in self._cache:
            listing = gitrepo.git_bytes(self.repo, "ls-tree", "-r", "-z", "--full-tree", commit)
            files = {}
            for entry in listing.decode("utf-8", "replace").split("\0"):
                meta, _, path = entry.partition("\t")
                if path and matches_any(path, self.globs):
                    files[path] = meta.split()[2]
            self._cache[commit] = files
        return self._cache[commit]

    def blob_id(self, content: bytes) -> str:
        """The id git gives these bytes (computed here: no process per proposal)."""
        if self._format is None:
            try:
                self._format = gitrepo.git(self.repo, "rev-parse", "--show-object-format")
            except gitrepo.GitError:
                self._format = "sha1"
        digest = hashlib.sha256 if self._format == "sha256" else hashlib.sha1
        return digest(b"blob %d\0" % len(content) + content).hexdigest()

    def signature(self, files: dict[str, str]) -> frozenset:
        return frozenset(files.items())

    def proposed(self, base: str, changed: dict[str, bytes]) -> frozenset:
        files = dict(self.of(base))
        files.update({path: self.blob_id(content) for path, content in changed.items()})
        return self.signature(files)


class TuneProposer(Proposer):
    """Each round rebuilds its Optuna study from the ledger's history.

    Nothing of Optuna's lives across rounds, so a driver that was killed and resumed
    proposes exactly what an uninterrupted one would: same history, same seed, same asks.
    """

    name = "tune"
    summary = "Optuna over the declared [tune.knobs] (offline)"
    takes_ideas = False  # it proposes from its own search space, never from text

    def __init__(self, config: Config, history: list[Candidate]) -> None:  # noqa: ARG002
        if not config.tune.knobs:
            raise ProposerError("search.proposer = 'tune' needs at least one [tune.knobs] "
                                'entry, e.g. "kernel.py:BLOCK" = { choices = [32, 64] }')
        self.config = config
        self.knobs = dict(config.tune.knobs)
        self.distributions = {key: distribution(knob) for key, knob in self.knobs.items()}
        self._files: EditableFiles | None = None
        self._values_cache: dict[str, dict[str, object] | None] = {}

    def _key(self, params: dict) -> tuple:
        return tuple(_hashable(params.get(k)) for k in sorted(self.knobs))

    def _sampler(self, round: int, k: int) -> optuna.samplers.BaseSampler:
        optuna = _optuna()
        seed = self.config.search.seed * 1_000_003 + round
        if self.config.tune.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=min(10, max(4, 2 * k)), constant_liar=True
        )

    def _params_of(self, repo: Path, cand: Candidate) -> dict[str, object] | None:
        """The knob values a candidate ran with: recorded, or read from its commit (the
        baseline and submitted commits have none recorded)."""
        if cand.params:
            return cand.params
        if cand.kind not in (Kind.BASELINE, Kind.CANDIDATE) or not cand.commit_sha:
            return None
        if cand.commit_sha not in self._values_cache:
            try:
                values = self.current_values(repo, cand.commit_sha)
            except ProposerError:
                values = None  # a commit without the knobs: it says nothing about them
            self._values_cache[cand.commit_sha] = values
        return self._values_cache[cand.commit_sha]

    def _study(self, repo: Path, history: list[Candidate], sampler) -> optuna.Study:
        direction: Literal["minimize", "maximize"] = (
            "minimize" if self.config.metric.goal == "minimize" else "maximize")
        from optuna.trial import TrialState, create_trial

        study = _optuna().create_study(direction=direction, sampler=sampler)
        for cand in sorted(history, key=lambda c: c.seq):
            if not cand.is_judged:
                continue
            recorded = self._params_of(repo, cand)
            if not recorded:
                continue
            params = {k: v for k, v in recorded.items() if k in self.distributions}
            if len(params) != len(self.distributions):
                continue
            ok = (cand.metric is not None and math.isfinite(cand.metric)
                  and cand.status in (Status.KEEP, Status.DISCARD))
            try:
                study.add_trial(create_trial(
                    params=params,
                    distributions=self.distributions,
                    value=cand.metric if ok else None,
                    state=TrialState.COMPLETE if ok else TrialState.FAIL,
                ))
            except ValueError:
                continue  # a value outside today's knob ranges (the config changed)
        return study

    def current_values(self, repo: Path, commit: str) -> dict[str, object]:
        try:
            return knob_values(repo, commit, self.knobs)
        except KnobError as exc:
            raise ProposerError(str(exc)) from None

    def propose(self, k: int, ctx: ProposalContext) -> list[Proposal]:
        if self._files is None:
            self._files = EditableFiles(ctx.repo, list(self.config.task.editable))
        current = self.current_values(ctx.repo, ctx.incumbent)
        seen = {self._key(p) for c in ctx.history if (p := self._params_of(ctx.repo, c))}
        seen.add(self._key(current))
        # every experiment so far, by content: the incumbent, the baseline, every
        # candidate that got a commit (kept, discarded, crashed or rejected)
        tried = {self._files.signature(self._files.of(ctx.incumbent))}
        tried.update(self._files.signature(self._files.of(c.commit_sha))
                     for c in ctx.history if c.commit_sha)
        from optuna.trial import TrialState

        study = self._study(ctx.repo, ctx.history, self._sampler(ctx.round, k))
        proposals: list[Proposal] = []
        asks = 0
        while len(proposals) < k and asks < MAX_ASKS_PER_CANDIDATE * k:
            asks += 1
            trial = study.ask(self.distributions)
            params = dict(trial.params)
            key = self._key(params)
            if key in seen:
                study.tell(trial, state=TrialState.PRUNED)
                continue
            seen.add(key)
            files = self._rewrite(ctx.repo, ctx.incumbent, params)
            signature = self._files.proposed(ctx.incumbent, files)
            if signature in tried:  # same bytes as an earlier experiment: not new
                study.tell(trial, state=TrialState.PRUNED)
                continue
            tried.add(signature)
            changed = {
                name: value for name, value in params.items()
                if _hashable(value) != _hashable(current.get(name))
            }
            description = ", ".join(
                f"{name.rpartition(':')[2]}={format_value(value)}" for name, value in changed.items()
            )
            proposals.append(
                Proposal(description=f"tune: {description}",
                         files=dict[str, bytes | None](files), params=params)
            )
        return proposals

    def _rewrite(self, repo: Path, commit: str, params: dict) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        for key, value in params.items():
            file, _, name = key.rpartition(":")
            source = files.get(file) or gitrepo.show(repo, commit, file)
            files[file] = set_knob(source, name, value, file)
        return files
