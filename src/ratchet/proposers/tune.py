"""`proposer = "tune"`: Optuna (ask/tell) over the declared knobs. The offline default.

The ledger is the source of truth, not Optuna's storage: on start (and on resume) the
judged history is replayed into an in-memory study, and each round's sampler is seeded
from (seed, round), so a resumed study proposes exactly what an uninterrupted one would.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState, create_trial

from ratchet import gitrepo
from ratchet.candidate import Proposal
from ratchet.config import Config, Knob
from ratchet.ledger import Candidate
from ratchet.proposers import ProposalContext, ProposerError
from ratchet.proposers.knobs import KnobError, find_knob, format_value, set_knob

optuna.logging.set_verbosity(logging.WARNING)
MAX_ASKS_PER_CANDIDATE = 40


def distribution(knob: Knob) -> BaseDistribution:
    if knob.choices is not None:
        return CategoricalDistribution(knob.choices)
    if knob.is_int:
        step = int(knob.step or 1)
        return IntDistribution(int(knob.low), int(knob.high), log=knob.log, step=step)
    return FloatDistribution(knob.low, knob.high, log=knob.log, step=knob.step)


def _hashable(value: object) -> object:
    return round(value, 12) if isinstance(value, float) else value


class TuneProposer:
    """Each round rebuilds its Optuna study from the ledger's history.

    Nothing of Optuna's lives across rounds, so a driver that was killed and resumed
    proposes exactly what an uninterrupted one would: same history, same seed, same asks.
    """

    name = "tune"

    def __init__(self, config: Config, history: list[Candidate]) -> None:  # noqa: ARG002
        self.config = config
        self.knobs = dict(config.tune.knobs)
        self.distributions = {key: distribution(knob) for key, knob in self.knobs.items()}

    def _key(self, params: dict) -> tuple:
        return tuple(_hashable(params.get(k)) for k in sorted(self.knobs))

    def _sampler(self, round: int, k: int) -> optuna.samplers.BaseSampler:
        seed = self.config.search.seed * 1_000_003 + round
        if self.config.tune.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=min(10, max(4, 2 * k)), constant_liar=True
        )

    def _study(self, history: list[Candidate], sampler) -> optuna.Study:
        direction = "minimize" if self.config.metric.goal == "minimize" else "maximize"
        study = optuna.create_study(direction=direction, sampler=sampler)
        for cand in sorted(history, key=lambda c: c.seq):
            if not cand.params or not cand.is_judged:
                continue
            params = {k: v for k, v in cand.params.items() if k in self.distributions}
            if len(params) != len(self.distributions):
                continue
            ok = (cand.metric is not None and math.isfinite(cand.metric)
                  and cand.status in ("keep", "discard"))
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
        values = {}
        for key in self.knobs:
            file, _, name = key.rpartition(":")
            try:
                source = gitrepo.show(repo, commit, file)
            except gitrepo.GitError:
                raise ProposerError(f"tune.knobs: {key!r}: {file} does not exist") from None
            try:
                values[key] = find_knob(source, name, file).value
            except KnobError as exc:
                raise ProposerError(f"tune.knobs: {key!r}: {exc}") from None
        return values

    def propose(self, k: int, ctx: ProposalContext) -> list[Proposal]:
        current = self.current_values(ctx.repo, ctx.incumbent)
        seen = {self._key(c.params) for c in ctx.history if c.params}
        seen.add(self._key(current))
        study = self._study(ctx.history, self._sampler(ctx.round, k))
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
            changed = {
                name: value for name, value in params.items()
                if _hashable(value) != _hashable(current.get(name))
            }
            description = ", ".join(
                f"{name.rpartition(':')[2]}={format_value(value)}" for name, value in changed.items()
            )
            proposals.append(
                Proposal(description=f"tune: {description}", files=files, params=params)
            )
        return proposals

    def _rewrite(self, repo: Path, commit: str, params: dict) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        for key, value in params.items():
            file, _, name = key.rpartition(":")
            source = files.get(file) or gitrepo.show(repo, commit, file)
            files[file] = set_knob(source, name, value, file)
        return files

    def observe(self, cand: Candidate) -> None:
        """Nothing to do: the next round reads the verdict from the ledger."""
