"""Throughput, side by side in one run: is every slot kept busy?

1. LLM latency hidden by speculation: the `llm` proposer (`search.ahead = true`, the
   next round asked while a round runs) against a fake OpenAI-compatible server on
   loopback (inside this process), K=4, evaluations of TASK_S seconds, 16 candidates
   (--llm-candidates); once answering at once, once after LLM_DELAY_S per reply. Target:
   within 3%. The fake model proposes settings that never beat the incumbent, so
   proposals made ahead are used as made (the case where the incumbent does not move;
   case 5 is the one where it does).
   The first round's reply has nothing to overlap but the study's own start-up, so it
   weighs 1 / rounds of the study; the line "beyond the first reply" is what the study
   failed to hide of the others. Then, in a fresh driver process (as `ratchet run`), the
   time to its first request.
2. Fan-out: the `tune` proposer, 16 candidates of TASK_S seconds, K=4 against K=1.
   Targets: ratio >= 3.9, overhead <= 0.05 s/candidate beyond the ideal schedule
   (K=1: the jobs' own time; K=4: per round, the slowest job), study start-up included.
3. Rolling vs rounds: 4 slots, 32 candidates whose run times are heavy-tailed
   (lognormal, drawn from the candidate's number, so both modes see the same times).
   Target: rolling >= 1.3x faster.
4. One GPU kept busy: one logical GPU slot (`gpus = ["0"]`, slots = 1), a 3 s build
   (CPU) and a 5 s run (GPU), 12 candidates; one at a time (the build in the GPU slot)
   against `task.build_on = "cpu"` with 2 build slots, rolling, 3 candidates in flight.
   GPU duty = time in the phases that use the GPU (run, evaluate) over wall time: from the
   first job's submission (the first build cannot overlap anything) and from the first
   GPU phase.
   Target: >= 0.95, against about 0.6 one at a time.
5. Research speed, the incumbent moving: a history-aware fake model (its next proposal
   is built on the incumbent it is shown, and steps further after the keeps it has seen
   in the history), K=4, 32 candidates of TASK_S seconds, score = X from 100, target
   X <= 60. Rounds as the practice defines them (each round sees the last one's
   verdicts), rounds with `search.ahead` (speculation), and rolling, each at 0 s and
   LLM_DELAY_S proposer latency, side by side in one run: wall time and candidates until
   the target was first kept, and the whole study's wall time.

Each study runs in this process (`Study.run`), timed from constructing the study to the
last verdict. The duty cycle is `ratchet.store.ledger.throughput`: job time over slots x wall.

    .venv/bin/python bench/throughput.py [--task-s 3] [--delay 1] [--record]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
# RATCHET_BENCH_SRC: the studies run another checkout's driver (e.g. main's src, for a
# side by side of two versions on the same tasks in one invocation)
sys.path.insert(0, os.environ.get("RATCHET_BENCH_SRC") or str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import synthetic  # noqa: E402  (bench/, next to this file)
from llm_server import Answer, LLMServer  # noqa: E402
from record import record  # noqa: E402

from ratchet.driver.config import load_config  # noqa: E402
from ratchet.driver.study import Study  # noqa: E402
from ratchet.store.ledger import Ledger, throughput  # noqa: E402


def make_repo(path: Path, *, k: int, rounds: int, sleep: float, proposer: str = "tune",
              extra: str = "", lognormal: bool = False, keeps: bool = False,
              noise: float = 0.0) -> Path:
    # by default never better than X = 10: no keeps, so proposals made ahead are used as
    # made; `keeps`: from X = 300 over 1..299, so a random setting is often better
    more = {"start": 300, "choices": range(1, 300)} if keeps else {}
    return synthetic.make_repo(path, name="tp", k=k, rounds=rounds, sleep=sleep,
                               proposer=proposer, sampler="random", extra=extra,
                               lognormal=lognormal, noise=noise, **more)


def speculate(repo: Path) -> None:
    """`search.ahead = true`: the next round is asked for while a round runs."""
    toml = (repo / "ratchet.toml").read_text().replace('mode = "rounds"\n',
                                                       'mode = "rounds"\nahead = true\n')
    (repo / "ratchet.toml").write_text(toml)
    synthetic.git(repo, "commit", "-qam", "speculate")


def timed_run(repo: Path, *, rolling: bool = False, candidates: int | None = None) -> dict:
    config = load_config(repo)
    if rolling:
        config = config.model_copy(update={"search": config.search.model_copy(
            update={"mode": "rolling"})})
    started, started_at = time.perf_counter(), time.time()
    study = Study(repo, config)
    try:
        study.run(candidates=candidates)
    finally:
        study.close()
    wall = time.perf_counter() - started
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    cands = ledger.candidates()
    # every job's own time, the confirmations' pairs and re-measures included: the ideal
    # schedule keeps each slot busy with them all (no barrier, no idle slot)
    jobs_s = sum(c.run_s or 0.0 for c in ledger.candidates(confirmations=True))
    ledger.close()
    own = {c.id: c.run_s or 0.0 for c in cands}
    per_round: dict[int, float] = {}
    for c in cands:
        per_round[c.round] = max(per_round.get(c.round, 0.0), own[c.id])
    tp = throughput(cands, config.search.parallel)
    first_phase = min((p["started_at"] for c in cands for p in c.phases or []),
                      default=started_at)
    keeps = sum(1 for c in cands if c.kind == "candidate" and c.status == "keep")
    return {"wall": wall, "n": len(cands), "critical": sum(per_round.values()),
            "packed": jobs_s / config.search.parallel,
            "made": sum(1 for c in cands if c.kind == "candidate"),
            "keeps": keeps, "best": ledger_best(repo),
            "start_up": first_phase - started_at,
            "duty": tp.duty, "limit": tp.limit_per_hour, "per_hour": tp.per_hour,
            "statuses": sorted({c.status for c in cands})}


def ledger_best(repo: Path) -> float | None:
    """The incumbent's pooled metric at the end (what the study kept)."""
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        return ledger.get("incumbent_metric")
    finally:
        ledger.close()


class FakeModel:
    """Replies with a new setting every time (never better than X = 10), after `delay`;
    notes when each request arrived."""

    def __init__(self) -> None:
        self.values = itertools.count(11)
        self.delay = 0.0
        self.arrivals: list[float] = []

    def __call__(self, _request) -> Answer:
        self.arrivals.append(time.time())
        value = next(self.values)
        return Answer(f"DESCRIPTION: set X to {value}\n\nknob.py\n<<<<<<< SEARCH\nX = 10\n"
                      f"=======\nX = {value}\n>>>>>>> REPLACE\n", delay=self.delay)


class HistoryModel:
    """A fake model that learns from what it is shown: it proposes X below the incumbent's
    value in the file it sees, by a step that grows with the keeps in the history it is
    shown (momentum) and shrinks after discards; some steps go the wrong way. Its choice
    is a function of what it saw (the file, the history and the candidates running, which
    of the K it is and the direction it is given), it does not propose a value it was
    shown tried or running unless all its steps were, and two
    studies that show it the same things get the same proposals. Asked to repair (re-apply
    a change made on an older incumbent), it applies the same step to the value it is
    shown, as a model re-applying "lower X by 4" would."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.lock = threading.Lock()
        self.requests = 0

    def __call__(self, request) -> Answer:
        with self.lock:
            self.requests += 1
        prompt = request.prompt
        x = int(re.search(r"(?m)^X = (\d+)\s*$", prompt).group(1))
        change = re.search(r"(?m)^-X = (\d+)\s*\n\+X = (\d+)\s*$", prompt)
        if "# Re-apply a change" in prompt and change:
            # asked to re-apply its change on a moved incumbent: the same step, from the
            # value it is shown now (the verdicts since are not in a repair's prompt)
            value = max(0, x - (int(change.group(1)) - int(change.group(2))))
            if value == x:
                value = x + 1
            return Answer(f"DESCRIPTION: move X from {x} to {value}\n\nknob.py\n"
                          f"<<<<<<< SEARCH\nX = {x}\n=======\nX = {value}\n"
                          ">>>>>>> REPLACE\n", delay=self.delay)
        attempt = int(re.search(r"attempt (\d+) of", prompt).group(1))
        verdicts = re.findall(r"\[(keep|discard|rejected|crash)\]", prompt)[-8:]
        keeps = verdicts.count("keep")
        # what it was shown last: asked again after more verdicts, it answers anew
        seen = max((int(n) for n in re.findall(r"- c(\d{4}) \(round", prompt)), default=0)
        # the direction it is given (rolling asks each request for new ones)
        direction = re.search(r"Your direction: (.+)", prompt)
        angle = zlib.crc32(direction.group(1).encode()) % 997 if direction else 0
        rng = random.Random(x * 100_003 + attempt * 1009 + keeps * 101 + seen
                            + angle * 7_919)
        # what it was shown tried or running ("move X from A to B"): as a model told
        # "do not propose these again" would, it takes another of its steps, and repeats
        # only when every step lands on something shown
        shown = {int(v) for v in re.findall(r"move X from \d+ to (\d+)", prompt)}
        steps = [-4, -2, 1, 2, 3, 5]
        rng.shuffle(steps)
        values = [max(0, x - round(step * (1 + 0.5 * keeps))) for step in steps]
        values = [v if v != x else x + 1 for v in values]
        value = next((v for v in values if v not in shown), values[0])
        text = (f"DESCRIPTION: move X from {x} to {value}\n\nknob.py\n<<<<<<< SEARCH\n"
                f"X = {x}\n=======\nX = {value}\n>>>>>>> REPLACE\n")
        return Answer(text, delay=self.delay)


def to_target(repo: Path, target: float, started_at: float) -> tuple[float | None, int | None]:
    """(seconds from the study's start until a candidate at or below `target` was kept,
    candidates made until then), or (None, None) when it never was."""
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    cands = ledger.candidates()
    ledger.close()
    hits = [c for c in cands if c.kind == "candidate" and c.status == "keep"
            and c.metric is not None and c.metric <= target and c.judged_at]
    if not hits:
        return None, None
    first = min(hits, key=lambda c: c.judged_at or 0.0)
    made = sum(1 for c in cands if c.kind == "candidate" and c.seq <= first.seq)
    return (first.judged_at or 0.0) - started_at, made


def research_speed(base: Path, task_s: float, delay: float, candidates: int = 32,
                   target: float = 60.0, reps: int = 1, only: str | None = None) -> list[str]:
    """Each (mode, latency) study `reps` times, the latencies interleaved (a drift of the
    machine's load falls on both alike); the medians are compared. A history-aware model
    takes a different path at each latency, so one pair of studies mixes the latency's
    cost with the path's (a keep more is a confirmation more): the repeats and the slots'
    duty (job seconds over K x wall, confirmation pairs included) tell them apart."""
    model = HistoryModel()
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench")
    modes = [m for m in (("rounds (each round sees the last one's verdicts)", "rounds", ""),
                         ("rounds, search.ahead = true (speculation)", "rounds", "ahead = true"),
                         ("rolling", "rolling", "")) if only is None or m[1] == only]
    rows = [f"**5. Research speed, the incumbent moving** (llm proposer, history-aware fake "
            f"model, K=4, {candidates} candidates of {task_s:g} s, score = X from 100, "
            f"target X <= {target:g}; {reps} studies per row, medians)",
            "| mode | proposer latency | to target: wall s | to target: candidates | "
            "study wall s (each) | slot duty | slots waiting for a reply | kept | requests |",
            "|---|---|---|---|---|---|---|---|---|"]
    walls: dict[tuple[str, float], list[float]] = {}
    shares: dict[tuple[str, float], list[float]] = {}
    later: dict[tuple[str, float], list[float]] = {}
    hidable: dict[tuple[str, float], list[float]] = {}
    duties: dict[tuple[str, float], list[float]] = {}
    with LLMServer() as server:
        server.respond_with(model)
        for name, mode, search in modes:
            cells: dict[float, list[dict]] = {0.0: [], delay: []}
            for rep in range(reps):
                for d in (0.0, delay) if rep % 2 == 0 else (delay, 0.0):
                    cells[d].append(research_study(base / f"research-{mode}-{bool(search)}-"
                                                   f"{d:g}-{rep}", server, model, d, mode,
                                                   search, candidates, task_s, target))
            for d, got in cells.items():
                walls[(name, d)] = [g["wall"] for g in got]
                duties[(name, d)] = [g["duty"] for g in got]
                shares[(name, d)] = [g["waited"] for g in got if g["waited"] is not None]
                later[(name, d)] = [g["later"] for g in got if g["later"] is not None]
                hidable[(name, d)] = [g["later"] - g["gated"] for g in got
                                      if g["later"] is not None]
                reached = [g["seconds"] for g in got if g["seconds"] is not None]
                made = [g["made"] for g in got if g["made"] is not None]
                to_s = (f"{median(reached):.2f}" + (f" ({len(reached)} of {reps})"
                                                    if len(reached) < reps else "")
                        if reached else "not reached")
                rows.append(f"| {name} | {d:g} s | {to_s} | "
                            f"{median(made) if made else '—'} | "
                            f"{median(walls[(name, d)]):.2f} ("
                            f"{', '.join(f'{w:.1f}' for w in walls[(name, d)])}) | "
                            f"{median([g['duty'] for g in got]):.2f} | "
                            f"{waited(got)} | "
                            f"{median([g['kept'] for g in got])} | "
                            f"{median([g['requests'] for g in got])} |")
    for name, _, _ in modes:
        rows.append(f"{name}: {delay:g} s of latency per reply costs "
                    f"{median(walls[(name, delay)]) / median(walls[(name, 0.0)]):.2f}x the "
                    "study's median wall time (rolling's target: <= 1.03x)")
        rows.append(f"{name}: slots idle for any reason (1 - duty), medians: "
                    f"{1 - median(duties[(name, delay)]):.1%} at {delay:g} s, "
                    f"{1 - median(duties[(name, 0.0)]):.1%} at 0 s")
        if shares.get((name, delay)) and shares.get((name, 0.0)):
            cost = median(shares[(name, delay)]) - median(shares[(name, 0.0)])
            rows.append(f"{name}: free slots waited for a reply {median(shares[(name, delay)]):.1%} "
                        f"of the slots' time at {delay:g} s, {median(shares[(name, 0.0)]):.1%} at "
                        f"0 s: {cost:.1%} of the slots' time more (counted only while a "
                        "request is in flight: a slot held for a verdict after a reply with "
                        "nothing new idles uncounted: the idle line counts every slot)")
            beyond = median(later[(name, delay)]) - median(later[(name, 0.0)])
            rows.append(f"{name}: beyond the first reply, {median(later[(name, delay)]):.1%} "
                        f"at {delay:g} s and {median(later[(name, 0.0)]):.1%} at 0 s: "
                        f"{beyond:.1%} of the slots' time")
            rest = median(hidable[(name, delay)]) - median(hidable[(name, 0.0)])
            rows.append(f"{name}: beyond the first reply and the replies asked only when a "
                        "verdict came in (the last reply on that code had nothing new), "
                        f"{median(hidable[(name, delay)]):.1%} at {delay:g} s and "
                        f"{median(hidable[(name, 0.0)]):.1%} at 0 s: {rest:.1%} of the slots' "
                        "time (what an earlier request could have hidden)")
    return rows


def waited(got: list[dict]) -> str:
    """The median share of the slots' time a free slot waited for a reply, and each study's
    (rolling counts it; rounds do not)."""
    shares = [g["waited"] for g in got if g["waited"] is not None]
    if not shares:
        return "—"
    return f"{median(shares):.1%} ({', '.join(f'{w:.1%}' for w in shares)})"


def research_study(path: Path, server: LLMServer, model: HistoryModel, delay: float,
                   mode: str, search: str, candidates: int, task_s: float,
                   target: float) -> dict:
    model.delay = delay
    before = model.requests
    llm = synthetic.llm_section(server.openai_url).replace("[llm]\n", "[llm]\nhistory = 8\n")
    # the baseline and candidates - 1 candidates in every mode (a round beside a keep's
    # confirmation holds fewer than K, so rounds alone would not fix the count)
    repo = synthetic.make_repo(path, name="rs", k=4, rounds=candidates, sleep=task_s,
                               proposer="llm", mode=mode, start=100,
                               extra=f"{llm}\n[budget]\ncandidates = {candidates - 1}\n")
    if search:
        toml = (repo / "ratchet.toml").read_text().replace(
            f'mode = "{mode}"\n', f'mode = "{mode}"\n{search}\n')
        (repo / "ratchet.toml").write_text(toml)
        synthetic.git(repo, "commit", "-qam", "speculate")
    started_at = time.time()
    r = timed_run(repo, rolling=mode == "rolling",
                  candidates=candidates - 1 if mode == "rolling" else None)
    seconds, made = to_target(repo, target, started_at)
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    rows = ledger.candidates(confirmations=True)
    # rolling's own count of the slot-seconds a free slot waited for a reply
    waits = [json.loads(e["data"]) for e in ledger.events() if e["kind"] == "proposer-wait"]
    ledger.close()
    kept = sum(1 for c in rows if c.kind == "candidate" and c.status == "keep")
    duty = throughput(rows, 4).duty or 0.0
    return {"wall": r["wall"], "seconds": seconds, "made": made, "kept": kept,
            "duty": duty, "requests": model.requests - before,
            "waited": waits[-1]["share"] if waits else None,
            # the part of it after the first reply (the first has only the baseline to
            # overlap: a start-up cost that weighs less as studies grow)
            "later": (waits[-1]["share"] - waits[-1]["first_share"]) if waits
            else None,
            # the part of that asked only when a verdict came in: the proposer's last reply
            # on that code had nothing new, so no earlier request could have hidden it
            "gated": waits[-1]["gated_share"] if waits else 0.0}


# a new driver process, as `ratchet run` is: every import and client is made anew
FRESH_DRIVER = """
import sys, time
started = time.time()
from ratchet.driver.study import Study
study = Study(sys.argv[1])
try:
    study.run(rounds=1)
finally:
    study.close()
print(started, time.time())
"""


def first_request(base: Path, server: LLMServer, model: FakeModel, repeats: int) -> list[str]:
    """How long a fresh driver takes to send its first request (K=4, no latency)."""
    waits, walls = [], []
    for rep in range(repeats):
        model.arrivals.clear()
        repo = make_repo(base / f"fresh-{rep}", k=4, rounds=1, sleep=0.5, proposer="llm",
                         extra=synthetic.llm_section(server.openai_url))
        out = subprocess.run([sys.executable, "-c", FRESH_DRIVER, str(repo)], check=True,
                             capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src")}).stdout
        started, ended = map(float, out.split()[-2:])
        waits.append(min(model.arrivals) - started)
        walls.append(ended - started)
    return [f"a fresh driver process (`ratchet run` as a new process; imports, SDK client "
            f"and the machine's description included): first request "
            f"{min(waits):.2f} s after it started (runs: "
            f"{', '.join(f'{w:.2f}' for w in waits)}); one round of 4 x 0.5 s: "
            f"{min(walls):.2f} s"]


def llm_latency(base: Path, task_s: float, delay: float, repeats: int,
                candidates: int) -> list[str]:
    model = FakeModel()
    rows = []
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench")
    with LLMServer() as server:
        server.respond_with(model)
        runs: dict[str, list[dict]] = {"no latency": [], f"{delay:g} s latency": []}
        for rep in range(repeats):  # alternating, so machine load hits both alike
            for name, d in (("no latency", 0.0), (f"{delay:g} s latency", delay)):
                model.delay = d
                repo = make_repo(base / f"llm-{d:g}-{rep}", k=4, rounds=candidates // 4,
                                 sleep=task_s, proposer="llm",
                                 extra=synthetic.llm_section(server.openai_url))
                speculate(repo)
                runs[name].append(timed_run(repo))
        model.delay = 0.0
        fresh = first_request(base, server, model, repeats)
    results = {name: min(rs, key=lambda r: r["wall"]) for name, rs in runs.items()}
    ratio = results[f"{delay:g} s latency"]["wall"] / results["no latency"]["wall"]
    rows.append("**1. LLM latency hidden by speculation** (llm proposer, search.ahead = true, "
                "loopback fake server, K=4, "
                f"{task_s:g} s tasks, {candidates} candidates)")
    rows.append(f"| LLM reply | wall s (best of {repeats}) | all runs s | duty | candidates |")
    rows.append("|---|---|---|---|---|")
    for name, r in results.items():
        every = ", ".join(f"{x['wall']:.2f}" for x in runs[name])
        rows.append(f"| {name} | {r['wall']:.2f} | {every} | {r['duty']} | {r['n']} |")
    rows.append(f"delayed / immediate wall time: **{ratio:.3f}** (target <= 1.03)")
    # the first round's proposals have nothing to overlap with: one reply's latency is
    # the floor; what is beyond it is latency the study failed to hide
    beyond = results[f"{delay:g} s latency"]["wall"] - results["no latency"]["wall"] - delay
    rows.append(f"beyond the first reply's {delay:g} s (which nothing can overlap): "
                f"{beyond:+.2f} s over the study")
    return rows + fresh


def fan_out(base: Path, task_s: float, noise: float = 0.0, keeps: bool = False) -> list[str]:
    """K=4 against K=1 on 16 candidates; with `keeps` the task improves often (and every
    keep is confirmed), with `noise` its metric has that relative noise."""
    results = {}
    for k in (1, 4):
        # 16 candidates whatever the rounds: a round beside a confirmation gives its
        # pairs' slots to them (driver/beside.py), so rounds alone would not fix the count
        repo = make_repo(base / f"fan-{k}-{noise:g}-{keeps}", k=k, rounds=40,
                         sleep=task_s, keeps=keeps, noise=noise,
                         extra="[budget]\ncandidates = 16\n")
        results[k] = timed_run(repo)
    what = (f", keeps happen, {noise:.0%} noise" if noise else ", keeps happen, deterministic"
            ) if keeps else ", no keeps"
    rows = [f"**2. Fan-out** (tune proposer, 16 candidates of {task_s:g} s{what})",
            "| K | candidates | wall s | ideal s | overhead s/candidate | duty | keeps | best |",
            "|---|---|---|---|---|---|---|---|"]
    # ideal: every job's own time (confirmation pairs and re-measures included) packed
    # into the K slots with none idle; the overhead is what the wall time has beyond it
    for k, r in results.items():
        rows.append(f"| {k} | {r['made']} | {r['wall']:.2f} | {r['packed']:.2f} | "
                    f"{(r['wall'] - r['packed']) / r['made']:.3f} | {r['duty']} | "
                    f"{r['keeps']} | {'—' if r['best'] is None else format(r['best'], '.6g')} |")
    rows.append(f"K=1 / K=4 wall time: **{results[1]['wall'] / results[4]['wall']:.2f}** "
                "(targets: 3.7 deterministic, 3.4 noisy; overhead <= 0.15 s/candidate, "
                "confirmation included)")
    # four evaluators starting at once on few cores stretch each round's slowest job: the
    # ratio of the jobs' own times is the ceiling no scheduler can pass on this machine
    rows.append(f"the jobs' own times alone (ideal s, K=1 / K=4): "
                f"{results[1]['packed'] / results[4]['packed']:.3f}, the ceiling here; "
                "less each study's start-up (to its first job's first phase: "
                f"K=1 {results[1]['start_up']:.2f} s, K=4 {results[4]['start_up']:.2f} s), the "
                "ratio would be "
                f"{(results[1]['wall'] - results[1]['start_up']) / (results[4]['wall'] - results[4]['start_up']):.2f}")
    return rows


def rolling_vs_rounds(base: Path, task_s: float) -> list[str]:
    mean = task_s / 3  # lognormal(0, 0.9) has mean ~1.5: keep the total comparable
    rounds = timed_run(make_repo(base / "rounds", k=4, rounds=8, sleep=mean, lognormal=True))
    rolling = timed_run(make_repo(base / "rolling", k=4, rounds=8, sleep=mean,
                                  lognormal=True), rolling=True, candidates=31)
    rows = ["**3. Rolling vs rounds** (4 slots, 32 candidates incl. the baseline, run time "
            f"{mean:g} s x lognormal(0, 0.9) by candidate number)",
            "| mode | wall s | duty | limit /h | achieved /h |", "|---|---|---|---|---|"]
    for name, r in (("rounds", rounds), ("rolling", rolling)):
        rows.append(f"| {name} | {r['wall']:.2f} | {r['duty']} | {r['limit']} | "
                    f"{r['per_hour']} |")
    rows.append(f"rounds / rolling wall time: **{rounds['wall'] / rolling['wall']:.2f}** "
                "(target >= 1.3)")
    return rows


def gpu_repo(path: Path, *, build_on: str, mode: str, k: int, rounds: int, build_s: float,
             run_s: float) -> Path:
    return synthetic.make_repo(
        path, name="tp", k=k, rounds=rounds, proposer="tune", mode=mode, sampler="random",
        backend_keys="slots = 1", extra='gpus = ["0"]\nbuild_slots = 2',
        protected=("build.py", "run.py", "evaluate.py"),
        phases=f'build = "python build.py"\nbuild_on = "{build_on}"\nrun = "python run.py"',
        files={"build.py": f"import time\ntime.sleep({build_s})\n"
                           "open('built.txt', 'w').write('ok')\n",
               "run.py": f"import os, time\nassert os.environ['CUDA_VISIBLE_DEVICES'] == '0'\n"
                         f"assert open('built.txt').read() == 'ok'\ntime.sleep({run_s})\n",
               "evaluate.py": "import knob\nprint(f'score: {knob.X}')\n"})


def gpu_duty(repo: Path) -> tuple[float, float, int]:
    """Time in the phases that use the GPU (all but the build, wherever it ran) over the
    study's job span, and over the GPU's own span (first GPU phase to the last)."""
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    cands = [c for c in ledger.candidates() if c.phases and c.submitted_at]
    ledger.close()
    on_gpu = [p for c in cands for p in c.phases if p["name"] != "build"]
    busy = sum(p["seconds"] for p in on_gpu)
    first_submit = min(c.submitted_at for c in cands)
    first_gpu = min(p["started_at"] for p in on_gpu)
    last = max(p["started_at"] + p["seconds"] for p in on_gpu)
    return busy / (last - first_submit), busy / (last - first_gpu), len(cands)


def one_gpu(base: Path, build_s: float = 3.0, run_s: float = 5.0, n: int = 12) -> list[str]:
    serial = gpu_repo(base / "gpu-serial", build_on="slot", mode="rounds", k=1, rounds=n,
                      build_s=build_s, run_s=run_s)
    piped = gpu_repo(base / "gpu-piped", build_on="cpu", mode="rolling", k=3, rounds=n,
                     build_s=build_s, run_s=run_s)
    rows = [f"**4. One GPU kept busy** (1 GPU slot, {build_s:g} s CPU build + {run_s:g} s GPU "
            f"run, {n} candidates)",
            "| schedule | wall s | GPU duty, from first submit | GPU duty, from first GPU "
            "phase | candidates |", "|---|---|---|---|---|"]
    for name, repo, kw in (("one at a time (build in the GPU slot)", serial, {}),
                           ("build_on = cpu, 2 build slots, rolling, 3 in flight", piped,
                            {"rolling": True, "candidates": n - 1})):
        r = timed_run(repo, **kw)
        study_duty, gpu_span_duty, count = gpu_duty(repo)
        rows.append(f"| {name} | {r['wall']:.2f} | {study_duty:.3f} | {gpu_span_duty:.3f} | "
                    f"{count} |")
    rows.append("target: GPU duty >= 0.95 (about 0.6 one at a time)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task-s", type=float, default=3.0)
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument("--only", choices=["llm", "fanout", "rolling", "gpu", "research"],
                        default=None)
    parser.add_argument("--repeats", type=int, default=2, help="LLM runs per setting")
    parser.add_argument("--llm-candidates", type=int, default=16,
                        help="candidates of the LLM case's study (a multiple of 4)")
    parser.add_argument("--research-reps", type=int, default=1,
                        help="studies per row of the research-speed case (medians)")
    parser.add_argument("--research-mode", choices=["rounds", "rolling"], default=None,
                        help="only this mode's rows of the research-speed case")
    parser.add_argument("--fanout", choices=["all", "none", "deterministic", "noise"],
                        default="all", help="the fan-out case's tasks: no keeps, keeps "
                        "on a deterministic metric, keeps under 5%% noise, or all three")
    parser.add_argument("--record", action="store_true", help="write to bench/RESULTS.md (the previous run moves to HISTORY.md)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ratchet-throughput-"))
    import ratchet

    lines = [f"{os.cpu_count()} cores (shared), Python {platform.python_version()}, "
             f"ratchet from {Path(ratchet.__file__).parents[1]}", ""]
    try:
        # warm-up (imports, git, the file cache), not measured
        timed_run(make_repo(base / "warm-up", k=2, rounds=1, sleep=0.1))
        if args.only in (None, "llm"):
            lines += llm_latency(base, args.task_s, args.delay, args.repeats,
                                 args.llm_candidates) + [""]
        if args.only in (None, "fanout"):
            if args.fanout in ("all", "none"):
                lines += fan_out(base, args.task_s) + [""]
            if args.fanout in ("all", "deterministic"):
                lines += fan_out(base, args.task_s, keeps=True) + [""]
            if args.fanout in ("all", "noise"):
                lines += fan_out(base, args.task_s, noise=0.05, keeps=True) + [""]
        if args.only in (None, "rolling"):
            lines += rolling_vs_rounds(base, args.task_s) + [""]
        if args.only in (None, "gpu"):
            lines += one_gpu(base) + [""]
        if args.only in (None, "research"):
            lines += research_speed(base, args.task_s, args.delay, reps=args.research_reps,
                                    only=args.research_mode)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    if args.record:
        only = f" --only {args.only}" if args.only else ""
        if args.research_reps != 1:
            only += f" --research-reps {args.research_reps}"
        if args.research_mode:
            only += f" --research-mode {args.research_mode}"
        if args.fanout != "all":
            only += f" --fanout {args.fanout}"
        record(f"Throughput (bench/throughput.py{only})",
               f".venv/bin/python bench/throughput.py --task-s {args.task_s:g} "
               f"--delay {args.delay:g} --llm-candidates {args.llm_candidates}{only} --record",
               text)


if __name__ == "__main__":
    main()
