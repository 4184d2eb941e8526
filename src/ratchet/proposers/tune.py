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
    name = "tune"

    def __init__(self, config: Config, history: list[Candidate]) -> None:
        self.config = config
        self.knobs = dict(config.tune.knobs)
        self.distributions = {key: distribution(knob) for key, knob in self.knobs.items()}
        direction = "minimize" if config.metric.goal == "minimize" else "maximize"
        self.study = optuna.create_study(direction=direction)
        self.seen: set[tuple] = set()
        self.trial_of: dict[str, int] = {}
        for cand in history:
            if cand.params:
                self.seen.add(self._key(cand.params))
            if cand.is_judged:
                self.observe(cand)

    def _key(self, params: dict) -> tuple:
        return tuple(_hashable(params.get(k)) for k in sorted(self.knobs))

    def _sampler(self, round: int, k: int) -> optuna.samplers.BaseSampler:
        seed = self.config.search.seed * 1_000_003 + round
        if self.config.tune.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=min(10, max(4, 2 * k)), constant_liar=True
        )

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
        self.seen.add(self._key(current))
        self.study.sampler = self._sampler(ctx.round, k)
        proposals: list[Proposal] = []
        asks = 0
        while len(proposals) < k and asks < MAX_ASKS_PER_CANDIDATE * k:
            asks += 1
            trial = self.study.ask(self.distributions)
            params = dict(trial.params)
            key = self._key(params)
            if key in self.seen:
                self.study.tell(trial, state=TrialState.PRUNED)
                continue
            self.seen.add(key)
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
            self.trial_of[f"pending:{key}"] = trial.number
        return proposals

    def _rewrite(self, repo: Path, commit: str, params: dict) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        for key, value in params.items():
            file, _, name = key.rpartition(":")
            source = files.get(file) or gitrepo.show(repo, commit, file)
            files[file] = set_knob(source, name, value, file)
        return files

    def observe(self, cand: Candidate) -> None:
        if not cand.params or cand.id in self.trial_of:
            return
        params = {k: v for k, v in cand.params.items() if k in self.distributions}
        if len(params) != len(self.distributions):
            return
        ok = cand.metric is not None and math.isfinite(cand.metric) and cand.status in (
            "keep", "discard"
        )
        pending = self.trial_of.pop(f"pending:{self._key(params)}", None)
        if pending is not None:
            state = TrialState.COMPLETE if ok else TrialState.FAIL
            self.study.tell(pending, cand.metric if ok else None, state=state)
            self.trial_of[cand.id] = pending
            return
        try:
            trial = create_trial(
                params=params,
                distributions=self.distributions,
                value=cand.metric if ok else None,
                state=TrialState.COMPLETE if ok else TrialState.FAIL,
            )
            self.study.add_trial(trial)
        except ValueError:
            return  # a value outside today's knob ranges (config changed): skip it
        self.trial_of[cand.id] = len(self.study.trials) - 1
