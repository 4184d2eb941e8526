"""Keeps you can trust, measured: false keeps, power, cost and early stopping side by side.

    .venv/bin/python bench/keep_statistics.py            # every section, ~10-20 minutes
    .venv/bin/python bench/keep_statistics.py --quick    # fewer studies (a smoke run)

What is real and what is simulated:
- real: the judge (`judge.judge_group` with its screen, the sequential confirmation
  `judge.confirm` -> `stats.sequential`, the hold-out and staleness rules), the config
  parsing (`loads_config` of a ratchet.toml per policy), the noise pool
  (`stats.pooled_noise`) and the incumbent's pooled record (`ledger.Incumbent`), the
  early-stopping test (`stats.clearly_slower`);
- simulated: the evaluator (a commit's true value plus Gaussian noise of sd sigma, one
  number per evaluation) and the bookkeeping the scheduler does around the judge
  (`Loop.settle`: every judged evaluation joins its commit's pool; the winner becomes the
  incumbent), kept here in memory instead of jobs and a ledger, so that thousands of
  candidates take seconds. The last section runs a real study (real jobs, the CLI, the
  ledger) on an A/A evaluator as a check that the real loop does what the simulation does.

An "evaluation" is one run of the evaluator (one job): a candidate's own run, a co-run
reference, one side of a confirmation pair, or one of `repeats`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ratchet.core import stats  # noqa: E402
from ratchet.core.candidate import Incumbent  # noqa: E402
from ratchet.core.config import Config  # noqa: E402
from ratchet.core.vocab import Kind, Outcome  # noqa: E402
from ratchet.driver import judge  # noqa: E402
from ratchet.driver.config import loads_config  # noqa: E402
from ratchet.job.jobspec import JobResult  # noqa: E402

TOML = """
[task]
name = "sim"
editable = ["x.py"]
evaluate = "python evaluate.py"
[task.metric]
name = "score"
goal = "minimize"
[acceptance]
{acceptance}
"""


def config(acceptance: str = "") -> Config:
    return loads_config(TOML.format(acceptance=acceptance).encode())


# -- a study of the real judge on a simulated evaluator ---------------------------------------


@dataclass
class Tally:
    candidates: int = 0
    evaluations: int = 0
    keeps: int = 0
    false_keeps: int = 0  # kept with no real effect, or worse than the incumbent
    kept_effects: list[float] = field(default_factory=list)
    # rolling: candidates judged stale (made on an older incumbent) whose files are
    # exactly as good as the incumbent they are judged against, and those of them kept
    stale_null: int = 0
    stale_false_keeps: int = 0


class SimStudy:
    """One study: rounds of K (optionally with a co-run reference) or rolling, on the real
    judge. `effects(rng)` gives each candidate's true gain over the incumbent it starts
    from, in units of sigma (+ is better)."""

    def __init__(self, cfg: Config, rng: random.Random, sigma: float = 1.0,
                 drift: float = 0.0, look: int = 1) -> None:
        self.cfg, self.rng, self.sigma, self.drift = cfg, rng, sigma, drift
        self.look = look  # pairs a look takes after the first (grouped looks: K / 2)
        # far from zero: hundreds of 3-sigma keeps stay positive (noise pools relative)
        self.truth: dict[str, float] = {"c0": 1000.0}
        self.groups: dict[str, list[float]] = {}
        self.reported: list[tuple[float, float]] = []  # (sem, value)
        self.pairs: list[list[tuple[float, float]]] = []  # every confirmation's pairs
        self.tally = Tally()
        self.n = 0
        self.clock = 0  # evaluations so far: drift moves with it
        self.incumbent = Incumbent(commit="c0", id="c0")
        self.started = False

    def evaluate(self, commit: str) -> float:
        self.tally.evaluations += 1
        self.clock += 1
        wander = self.drift * self.sigma * math.sin(self.clock / 25.0)  # a slow drift
        return self.truth[commit] + wander + self.rng.gauss(0.0, self.sigma)

    def result(self, commit: str) -> JobResult:
        repeats = self.cfg.acceptance.repeats
        samples = [self.evaluate(commit) for _ in range(repeats)]
        return JobResult(job_id=commit, outcome=Outcome.OK, samples=samples,
                         metric=sorted(samples)[len(samples) // 2])

    def new_commit(self, effect: float, base: str) -> str:
        self.n += 1
        commit = f"c{self.n}"
        self.truth[commit] = self.truth[base] - effect * self.sigma  # minimize
        return commit

    def start(self) -> list[judge.Entry]:
        """The baseline, and the rest of the A/A floor (acceptance.noise_floor)."""
        self.started = True
        entries = [judge.Entry(id="c0", kind=Kind.BASELINE, seq=0, commit="c0",
                               result=self.result("c0"))]
        for i in range(self.cfg.acceptance.noise_floor - 1):
            entries.append(judge.Entry(id=f"floor{i}", kind=Kind.INCUMBENT, seq=0,
                                       commit="c0", result=self.result("c0")))
        return entries

    def judge(self, entries: list[judge.Entry]) -> judge.Decision:
        pairs: dict[str, list[tuple[float, float]]] = {}
        inc_commit = self.incumbent.commit

        def measure(entry: judge.Entry, need: int) -> list[tuple[float, float]]:
            got = pairs.setdefault(entry.id, [])
            while len(got) < need:  # side by side: the candidate, then the incumbent
                got.append((self.evaluate(entry.commit), self.evaluate(inc_commit)))
            return list(got)

        confirmation = judge.Confirmation(measure=measure, groups=dict(self.groups),
                                          reported=list(self.reported),
                                          pairs=[list(p) for p in self.pairs],
                                          next_look=lambda _id, _n: self.look)
        decision = judge.judge_group(self.cfg, entries, self.incumbent,
                                     holdout=lambda e: e.result, confirmation=confirmation)
        # Loop.settle's bookkeeping: every judged evaluation joins its commit's pool
        for entry in entries:
            verdict = decision.verdicts[entry.id]
            if verdict.status in ("keep", "discard", "reference") and entry.result.metric is not None:
                self.groups.setdefault(entry.commit, []).append(entry.result.metric)
            if len(entry.result.samples) > 1:
                self.reported.append((statistics.stdev(entry.result.samples)
                                      / math.sqrt(len(entry.result.samples)),
                                      entry.result.metric))
        for cand_id, got in pairs.items():
            self.pairs.append(list(got))
            commit = next(e.commit for e in entries if e.id == cand_id)
            self.groups.setdefault(commit, []).extend(c for c, _ in got)
            self.groups.setdefault(inc_commit, []).extend(i for _, i in got)
        for entry in entries:
            if entry.kind != Kind.CANDIDATE:
                continue
            self.tally.candidates += 1
            kept = decision.verdicts[entry.id].status == "keep"
            if entry.based_on_incumbent is False and \
                    self.truth[entry.commit] == self.truth[inc_commit]:
                self.tally.stale_null += 1
                self.tally.stale_false_keeps += kept
            if kept:
                effect = (self.truth[inc_commit] - self.truth[entry.commit]) / self.sigma
                self.tally.keeps += 1
                self.tally.kept_effects.append(effect)
                if effect <= 0:
                    self.tally.false_keeps += 1
        new = decision.incumbent
        values = self.groups.get(new.commit, [])
        self.incumbent = Incumbent(commit=new.commit, id=new.id,
                                   metric=statistics.fmean(values) if values else new.metric,
                                   samples=list(values) or new.samples, holdout=new.holdout)
        return decision

    def rounds(self, k: int, n_rounds: int, effects: Callable[[random.Random], float],
               co_run: bool = False, pair_slots: bool = False) -> Tally:
        """`pair_slots`: the rounds `ratchet run` makes (driver/rounds.py): the round after
        a keep holds K - 2 candidates (its pair had the other two slots), the rounds stop
        at n_rounds * K candidates instead of n_rounds rounds."""
        kept = False
        for _ in range(n_rounds * (k if pair_slots else 1)):
            if pair_slots and self.tally.candidates >= n_rounds * k:
                break
            size = max(1, k - 2) if pair_slots and kept else k
            entries = [] if self.started else self.start()
            if co_run and entries == []:
                entries.append(judge.Entry(id=f"ref{self.n}", kind=Kind.INCUMBENT, seq=0,
                                           commit=self.incumbent.commit,
                                           result=self.result(self.incumbent.commit)))
            base = self.incumbent.commit
            for i in range(size - (1 if entries and entries[0].kind == Kind.BASELINE else 0)):
                commit = self.new_commit(effects(self.rng), base)
                entries.append(judge.Entry(id=commit, kind=Kind.CANDIDATE, seq=i + 1,
                                           commit=commit, result=self.result(commit)))
            kept = self.judge(entries).incumbent.commit != base
        return self.tally

    def rolling(self, in_flight: int, total: int,
                effects: Callable[[random.Random], float]) -> Tally:
        """Candidates judged one at a time as they finish, `in_flight` at once; one that
        started from an older incumbent (stale) is confirmed as its own files against the
        incumbent of the time, as `judge.judge_group` does."""
        self.judge(self.start())
        flight: list[tuple[str, str, JobResult]] = []  # (commit, its base, result)
        made = 0
        while made < total or flight:
            while len(flight) < in_flight and made < total:
                base = self.incumbent.commit
                commit = self.new_commit(effects(self.rng), base)
                flight.append((commit, base, self.result(commit)))
                made += 1
            commit, base, result = flight.pop(0)
            self.judge([judge.Entry(id=commit, kind=Kind.CANDIDATE, seq=made, commit=commit,
                                    result=result,
                                    based_on_incumbent=base == self.incumbent.commit)])
        return self.tally


# -- the sections --------------------------------------------------------------------------


DEFAULTS = ""  # no [acceptance] keys: the defaults
LEGACY = 'noise = "ignore"'  # the old judge: one measurement, margins only
POLICIES = {
    "defaults (confirmation, 1%)": DEFAULTS,
    "old judge, repeats = 1": LEGACY,
    "old judge, repeats = 3": LEGACY + "\nrepeats = 3",
}


def null(_: random.Random) -> float:
    return 0.0


def aa_section(studies: int, per_study: int, seed: int) -> list[str]:
    lines = ["## A/A: false keeps (every candidate has no effect)", "",
             f"{studies} studies x {per_study} candidates per row; sigma = 1.", "",
             "| policy | schedule | co-run | candidates | false keeps | rate | evaluations/candidate |",
             "|---|---|---|---|---|---|---|"]
    schedules = [("K = 1", 1, False, 0.0, 1), ("K = 4", 4, False, 0.0, 1),
                 ("K = 4, looks of 2 pairs", 4, False, 0.0, 2),
                 # what `ratchet run` schedules today: a first look of 1 pair, later looks
                 # of 2 (settle.Confirming.next_look), and K - 2 in the round after a keep
                 ("K = 4 as run: K - 2 after a keep, looks of 1 then 2", 4, False, 0.0, -2),
                 ("K = 1", 1, True, 0.0, 1), ("K = 4", 4, True, 0.0, 1),
                 ("rolling, 4 in flight", 0, False, 0.0, 1),
                 ("K = 4, slow drift of 2 sigma", 4, False, 2.0, 1)]
    for name, acceptance in POLICIES.items():
        cfg = config(acceptance)
        for label, k, co_run, drift, look in schedules:
            if look != 1 and acceptance != DEFAULTS:
                continue  # grouped looks are the confirmation's: the old judge has none
            total = Tally()
            for s in range(studies):
                study = SimStudy(cfg, random.Random(f"{seed} {name} {label} {co_run} {s}"),
                                 drift=drift, look=abs(look))
                if k == 0:
                    tally = study.rolling(4, per_study, null)
                else:
                    tally = study.rounds(k, math.ceil(per_study / k), null, co_run=co_run,
                                         pair_slots=look < 0)
                total.candidates += tally.candidates
                total.evaluations += tally.evaluations
                total.false_keeps += tally.false_keeps
            rate = total.false_keeps / total.candidates
            lines.append(f"| {name} | {label} | {'yes' if co_run else 'no'} | "
                         f"{total.candidates} | {total.false_keeps} | {rate:.2%} | "
                         f"{total.evaluations / total.candidates:.2f} |")
        if acceptance == DEFAULTS:
            lines.append(stale_row(name, cfg, studies, per_study, seed))
    return lines


def better_fifth(rng: random.Random) -> float:
    return 3.0 if rng.random() < 0.2 else 0.0


def stale_row(name: str, cfg: Config, studies: int, per_study: int, seed: int) -> str:
    """Rolling with real keeps (20% of candidates better by 3 sigma): the incumbent moves
    while candidates run, and a stale one that was better by 3 sigma than the incumbent it
    was made on is exactly as good as the new incumbent, kept by the earlier 3-sigma
    winner. Such a stale candidate is confirmed against the new incumbent; its false keeps
    (it has no effect over it) are counted over those candidates alone: about one in ten
    of a study's, so the row runs four times the studies of the others."""
    total = Tally()
    for s in range(4 * studies):
        study = SimStudy(cfg, random.Random(f"{seed} {name} stale {s}"))
        tally = study.rolling(4, per_study, better_fifth)
        total.stale_null += tally.stale_null
        total.stale_false_keeps += tally.stale_false_keeps
        total.evaluations += tally.evaluations
        total.candidates += tally.candidates
    rate = total.stale_false_keeps / max(1, total.stale_null)
    return (f"| {name} | rolling, 4 in flight, 20% better by 3 sigma: the stale candidates "
            f"exactly as good as the incumbent they are judged against | no | "
            f"{total.stale_null} | {total.stale_false_keeps} | {rate:.2%} | "
            f"{total.evaluations / total.candidates:.2f} (all candidates) |")


def power_section(studies: int, seed: int) -> list[str]:
    """A study of 20 null candidates (rolling, one at a time) with one real improvement
    of `delta` sigma as candidate 11: how often is it kept? And the same improvement as
    the study's very first candidate (nothing measured yet but the baseline)."""
    lines = ["## Power: a real improvement among null candidates", "",
             f"{studies} studies per cell; rolling K = 1; the improvement is one candidate, "
             "at position 11 of 20 (after 10 null ones) or first.", "",
             "| policy | improvement | kept (position 11) | kept (first candidate) |",
             "|---|---|---|---|"]
    policies = {**POLICIES, "confirm_pairs = 16": "confirm_pairs = 16",
                "noise_floor = 4": "noise_floor = 4"}
    for name in ("defaults (confirmation, 1%)", "noise_floor = 4", "confirm_pairs = 16",
                 "old judge, repeats = 1"):
        if name not in policies:  # --defaults-only: the old judge's row is left out
            continue
        cfg = config(policies[name])
        for delta in (3.0, 1.0):
            shares = []
            for position in (11, 1):
                kept = 0
                for s in range(studies):
                    rng = random.Random(f"{seed} {name} {delta} {position} {s}")
                    study = SimStudy(cfg, rng)
                    count = iter(range(1, 100))
                    study.rolling(1, 20, lambda _r, c=count, p=position, d=delta:
                                  d if next(c) == p else 0.0)
                    kept += any(abs(e - delta) < 1e-9 for e in study.tally.kept_effects)
                shares.append(kept / studies)
            lines.append(f"| {name} | {delta:g} sigma | {shares[0]:.0%} | {shares[1]:.0%} |")
    return lines


def mixed(rng: random.Random) -> float:
    return 3.0 if rng.random() < 0.2 else -rng.uniform(1.0, 3.0)


def cost_section(studies: int, per_study: int, seed: int) -> list[str]:
    lines = ["## Cost: 80% of candidates worse by 1-3 sigma, 20% better by 3 sigma", "",
             f"{studies} studies x {per_study} candidates per row.", "",
             "| policy | schedule | evaluations/candidate | keeps/study | false keeps | real gains kept |",
             "|---|---|---|---|---|---|"]
    base: dict[str, float] = {}
    for name, acceptance in POLICIES.items():
        cfg = config(acceptance)
        for label, k in (("K = 1", 1), ("K = 4", 4)):
            total = Tally()
            for s in range(studies):
                study = SimStudy(cfg, random.Random(f"{seed} cost {name} {k} {s}"))
                tally = study.rounds(k, math.ceil(per_study / k), mixed)
                total.candidates += tally.candidates
                total.evaluations += tally.evaluations
                total.keeps += tally.keeps
                total.false_keeps += tally.false_keeps
            per = total.evaluations / total.candidates
            base[(name, label)] = per
            lines.append(f"| {name} | {label} | {per:.2f} | {total.keeps / studies:.1f} | "
                         f"{total.false_keeps} | {total.keeps - total.false_keeps} |")
    lines.append("")
    for label in ("K = 1", "K = 4"):
        ours = base[("defaults (confirmation, 1%)", label)]
        lines.append(f"{label}: defaults / repeats = 1: **{ours / base[('old judge, repeats = 1', label)]:.2f}x** "
                     f"(target <= 2); defaults / repeats = 3: "
                     f"**{ours / base[('old judge, repeats = 3', label)]:.2f}x** (target <= 0.7)")
    return lines


def early_stop_section(candidates: int, seed: int) -> list[str]:
    """A kernel sweep of 12 shapes, timed one after another; the evaluator knows the
    incumbent's per-shape times ($RATCHET_INCUMBENT_EXTRA) and may stop a candidate after
    each shape. Shape costs grow 1.35x from one to the next (0.5 ms to 13 ms)."""
    rng = random.Random(seed)
    noise = 0.05  # 5% per-shape timing noise (lognormal)
    factors = [rng.uniform(1.2, 1.5) if rng.random() < 0.8 else rng.uniform(0.85, 0.95)
               for _ in range(candidates)]
    lines = ["## Early stopping: a kernel sweep of 12 shapes", "",
             f"{candidates} candidates ({sum(f > 1 for f in factors)} slower by 20-50%, "
             f"{sum(f < 1 for f in factors)} faster by 5-15%); 5% timing noise per shape; "
             "shape costs 0.5 ms x 1.35^i; the evaluator stops a candidate once the shapes "
             "timed so far show it clearly slower (`stats.clearly_slower`, 1%, >= 3 shapes).",
             "",
             "| shape order | rule | time per candidate (ms) | candidates/hour vs full sweeps | stopped | faster ones stopped |",
             "|---|---|---|---|---|---|"]
    for order in ("smallest first", "shuffled"):
        shapes = [0.5 * 1.35 ** i for i in range(12)]
        if order == "shuffled":
            rng.shuffle(shapes)
        # the incumbent's per-shape times as its own run measured them
        measured = [base * math.exp(rng.gauss(0, noise)) for base in shapes]
        full = None
        for label, rule in (("full sweeps", None), ("paired t on log ratios (default)", "t"),
                            ("signed-rank (WilcoxonPruner-like)", "rank")):
            spent = stopped = good_stopped = 0
            for f in factors:
                times: list[float] = []
                for base in shapes:
                    t = base * f * math.exp(rng.gauss(0, noise))
                    spent += t
                    times.append(t)
                    if rule and stats.clearly_slower(times, measured[:len(times)],
                                                     method=rule) is not None:
                        stopped += 1
                        good_stopped += f < 1.0
                        break
            per = spent / candidates
            full = full or per
            lines.append(f"| {order} | {label} | {per:.2f} | {full / per:.2f}x | {stopped} | "
                         f"{good_stopped} |")
    return lines


# -- a real study, end to end ---------------------------------------------------------------


AA_EVALUATE = """
import os, random
import solution  # the knob changes nothing: an A/A study
SALT = {salt!r}  # one per study: each study its own noise; "" is the first study's
rng = random.Random(os.environ["RATCHET_JOB_ID"] + SALT)  # every job its own noise
print(f"score: {{1.0 + rng.gauss(0.0, 0.05):.6f}}")
"""


def real_study(tmp: Path, rounds: int, salt: str) -> tuple[dict[str, int], str, float] | str:
    """One real A/A study through the CLI: (verdict counts, end-of-run line, wall s) or an error."""
    repo = tmp / f"aa{salt}"
    repo.mkdir()
    (repo / "solution.py").write_text("X = 0\n")
    (repo / "evaluate.py").write_text(AA_EVALUATE.format(salt=salt))
    (repo / "ratchet.toml").write_text(
        '[task]\nname = "aa"\neditable = ["solution.py"]\nprotected = ["evaluate.py"]\n'
        'evaluate = "python evaluate.py"\ntimeout = "60s"\n'
        '[task.metric]\nname = "score"\ngoal = "minimize"\n'
        f'[search]\nproposer = "tune"\nparallel = 2\nrounds = {rounds}\n'
        '[tune.knobs]\n"solution.py:X" = { choices = ' + str(list(range(200))) + ' }\n'
        '[backend]\nkind = "local"\nslots = 2\n')
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@b", "PATH": "/usr/bin:/bin"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "start"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    ratchet = [sys.executable, "-m", "ratchet.cli"]
    started = time.monotonic()
    run = subprocess.run([*ratchet, "run", "--repo", str(repo)], capture_output=True, text=True)
    wall = time.monotonic() - started
    status = subprocess.run([*ratchet, "status", "--json", "--repo", str(repo)],
                            capture_output=True, text=True)
    if run.returncode or status.returncode:
        return f"failed: {run.stderr[-500:]}{status.stderr[-300:]}"
    last = [line for line in run.stdout.splitlines() if "baseline" in line and "->" in line]
    return json.loads(status.stdout)["counts"], last[-1] if last else "(none)", wall


def real_section(rounds: int, studies: int) -> list[str]:
    lines = ["## A real A/A study (the CLI, real jobs, the ledger)", "",
             f"`ratchet run` on an evaluator printing `score: 1 + gauss(0, 0.05)` whatever the "
             f"candidate; K = 2, {rounds} rounds; {studies} studies, each with its own noise.", "",
             "| study | wall s | verdicts | kept beyond the baseline | end-of-run line |",
             "|---|---|---|---|---|"]
    candidates = false_keeps = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(studies):
            done = real_study(Path(tmp), rounds, "" if i == 0 else f" {i}")
            if isinstance(done, str):
                return [*lines, "", done]
            counts, last, wall = done
            kept = counts.get("keep", 0) - 1  # the baseline's own row is a keep
            candidates += sum(counts.values()) - 1
            false_keeps += kept
            lines.append(f"| {i + 1} | {wall:.0f} | {json.dumps(counts)} | {kept} | `{last}` |")
    return [*lines, "", f"false keeps: **{false_keeps} of {candidates}** candidates"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer studies (a smoke run)")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--no-real", action="store_true", help="skip the real A/A study")
    parser.add_argument("--only", choices=["aa", "power"], help="one section alone")
    parser.add_argument("--defaults-only", action="store_true",
                        help="only the policy ratchet runs by default (no old-judge rows)")
    args = parser.parse_args()
    scale = 0.1 if args.quick else 1.0
    if args.defaults_only:
        POLICIES.clear()
        POLICIES["defaults (confirmation, 1%)"] = DEFAULTS
    started = time.monotonic()
    def show(lines: list[str]) -> None:  # each section as it is done: a long run loses none
        print("\n".join([*lines, ""]), flush=True)

    show([f"# bench/keep_statistics.py (seed {args.seed}{', quick' if args.quick else ''})"])
    # 50 studies x 200 per A/A row: at a true rate of 0.6% a row of 2000 goes over 1% about
    # once in 50 rows, one of 10000 about once in 10^5, so a row reads as the rate it measures
    if args.only in (None, "aa"):
        show(aa_section(max(2, int(50 * scale)), 200, args.seed))
    # 1000 studies per power cell: a standard error of 1.6 points at 50%
    if args.only in (None, "power"):
        show(power_section(max(20, int(1000 * scale)), args.seed))
    if args.only:
        print(f"({time.monotonic() - started:.0f} s)")
        return
    show(cost_section(max(2, int(10 * scale)), 200, args.seed))
    show(early_stop_section(max(50, int(1000 * scale)), args.seed))
    if not args.no_real:
        show(real_section(rounds=4 if args.quick else 10, studies=1 if args.quick else 5))
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
