"""ratchet and OpenEvolve side by side, in one run, on the same tasks and the same fake LLM.

OpenEvolve (its registry package, OPENEVOLVE_VERSION) is installed by this bench into a
scratch virtual environment of its own (--oe-venv, created when missing) and run there as
a subprocess through its Python API (`OpenEvolve(...).run(iterations=N)`, as its CLI
does); it is never imported here. ratchet runs as a subprocess too (`ratchet run`, from
this checkout's src), so both engines are timed alike: from spawning the process to the
end of its last evaluation (and to the process's exit).

The task, the same for both: a file `X = <int>` (lower is better); one evaluation is
`python evaluate.py <file>` (the same script for both: ratchet runs it as the task's
evaluate phase in its sandbox, OpenEvolve's evaluator function runs it as a subprocess),
which sleeps TASK_S seconds and prints `score: X` (times 1 + NOISE x N(0, 1) on the noisy
task). OpenEvolve maximises `combined_score`, so its evaluator returns -score.

The fake model (tests/llm_server.py, one loopback server for both) reads the current
program in each engine's prompt (ratchet: the incumbent's knob.py; OpenEvolve: the section
"# Current Program", its sampled parent) and answers in that engine's format: ratchet's
`DESCRIPTION:` line and a `knob.py` SEARCH/REPLACE block, OpenEvolve's bare SEARCH/REPLACE
diff (its default `diff_based_evolution`). Each engine's proposals come from its own
random stream with the same seed, so in a pair both draw the same sequence of values:
- deterministic task: X from 300, each proposal a fresh X drawn uniformly from 1..299
  (keeps happen, rarer as the best falls);
- noisy task (NOISE = 5%): X from 100, each proposal the parent's X plus a step drawn from
  -10..10 (not 0): real effects of 1-10% of X, under 5% noise per evaluation.
A ratchet repair request (re-apply a change on a moved incumbent) re-applies the same
value (deterministic) or the same step (noisy) and draws nothing.

What a "candidate" is: ratchet, a proposal committed and judged (its confirmation pairs,
the baseline and the noise floor are extra evaluations, counted apart); OpenEvolve, an
iteration (one LLM reply applied to a sampled parent and evaluated once; the initial
program's evaluation is extra). Both make CANDIDATES: ratchet by `[budget] candidates`,
OpenEvolve by `iterations`. Settings: ratchet's defaults (rounds, confirmation on), K =
`search.parallel`; OpenEvolve's defaults (5 islands, MAP-Elites) but for the LLM endpoint,
the iterations and K = `evaluator.parallel_evaluations` (its process pool).

1. Throughput, deterministic task, K = 4 and K = 1, --reps pairs each: candidates per
   hour (to the last evaluation; pooled over the pairs) and the ratio ratchet /
   OpenEvolve; 4 against 1 for each engine.
2. Noisy task, K = 4, --noisy-reps pairs: what each engine took as its best. ratchet: its
   keeps, in the order judged; OpenEvolve: its best-program history, as it logs it ("New
   best program A replaces B", "Updated best program tracking from A to B"). A take is
   *true* when the new program's true X is below the one it replaced, *false* otherwise;
   true improvements per hour (to the last evaluation), the final best's true X, and the
   true X gained per hour (a false take followed by a true one counts one of each, so
   the gain is what the takes amount to).

The runs are interleaved (ratchet, then OpenEvolve, per setting) on the same machine.

    .venv/bin/python bench/openevolve.py [--task-s 3] [--candidates 16] [--reps 2]
        [--noisy-reps 4] [--only throughput|noisy] [--quick] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(os.environ.get("RATCHET_BENCH_SRC") or ROOT / "src")
sys.path.insert(0, str(SRC))
sys.path.insert(0, str(ROOT / "tests"))

import synthetic  # noqa: E402  (bench/, next to this file)
from llm_server import Answer, LLMServer, Request  # noqa: E402
from record import record  # noqa: E402

from ratchet.store.ledger import Ledger  # noqa: E402

OPENEVOLVE_VERSION = "0.4.0"
DEFAULT_VENV = Path.home() / ".cache" / "ratchet-bench" / f"openevolve-{OPENEVOLVE_VERSION}"
RATCHET_MODEL, OE_MODEL = "fake-ratchet", "fake-openevolve"

# one evaluation, for both engines: the file's X, a sleep, the score
TASK = """\
import random, re, sys, time
path = sys.argv[1] if len(sys.argv) > 1 else "knob.py"
x = int(re.search(r"(?m)^X = (\\d+)", open(path).read()).group(1))
time.sleep({sleep})
print(f"score: {{x * (1.0 + {noise} * random.gauss(0.0, 1.0))}}")
"""

# OpenEvolve's evaluation file: the same script as a subprocess; each evaluation's times,
# true X and score go to a log this bench reads (the evaluator is OpenEvolve's trusted side)
OE_EVALUATOR = """\
import json, os, re, subprocess, sys, time

def evaluate(program_path):
    started = time.time()
    out = subprocess.run([sys.executable, {task!r}, program_path], check=True,
                         capture_output=True, text=True).stdout
    score = float(re.search(r"score: (\\S+)", out).group(1))
    x = int(re.search(r"(?m)^X = (\\d+)", open(program_path).read()).group(1))
    with open({log!r}, "a") as f:
        f.write(json.dumps({{"start": started, "end": time.time(), "x": x, "score": score,
                            "pid": os.getpid()}}) + "\\n")
    return {{"combined_score": -score, "score": score}}
"""

# run in OpenEvolve's venv: its Python API, as its CLI uses it; then every program it
# holds (id, true X, metrics) for the bench to read its best-program history against
OE_DRIVER = """\
import asyncio, json, re, sys
import openevolve
from openevolve import OpenEvolve
from openevolve.config import load_config
initial, evaluator, config_path, out_dir, iterations, dump = sys.argv[1:]
oe = OpenEvolve(initial_program_path=initial, evaluation_file=evaluator,
                config=load_config(config_path), output_dir=out_dir)
best = asyncio.run(oe.run(iterations=int(iterations)))
programs = {pid: {"x": int(re.search(r"(?m)^X = (\\d+)", p.code).group(1)),
                  "metrics": p.metrics, "iteration": p.iteration_found}
            for pid, p in oe.database.programs.items()}
json.dump({"version": openevolve.__version__, "best": best.id if best else None,
           "programs": programs}, open(dump, "w"))
"""

RATCHET_CLI = "import sys; from ratchet.cli import main; sys.argv[0] = 'ratchet'; main()"
# OpenEvolve's lines when its best program changes (database.py); the first gives the
# new best's combined_score
BEST_LINES = re.compile(r"New best program (\S+) replaces \S+ \(combined_score: \S+ → (\S+),|"
                        r"Updated best program tracking from (\S+) to (\S+)")


# -- OpenEvolve's scratch venv ----------------------------------------------------------

def openevolve_python(venv: Path) -> tuple[Path, str]:
    """The Python of a venv holding openevolve==OPENEVOLVE_VERSION (made here when
    missing), and the version it reports."""
    python = venv / "bin" / "python"
    probe = ["-c", "import importlib.metadata as m; print(m.version('openevolve'))"]
    found = subprocess.run([str(python), *probe], capture_output=True, text=True) \
        if python.exists() else None
    if found is None or found.returncode or found.stdout.strip() != OPENEVOLVE_VERSION:
        print(f"installing openevolve=={OPENEVOLVE_VERSION} into {venv} …", flush=True)
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q",
                        f"openevolve=={OPENEVOLVE_VERSION}"], check=True)
    version = subprocess.run([str(python), *probe], check=True, capture_output=True,
                             text=True).stdout.strip()
    if version != OPENEVOLVE_VERSION:
        sys.exit(f"{venv}: openevolve {version} installed, {OPENEVOLVE_VERSION} wanted; "
                 "remove the venv (or pass --oe-venv) and run again")
    return python, version


# -- the fake model ---------------------------------------------------------------------

@dataclass
class Stream:
    """One engine's proposals in one study: a seeded random stream, which, as a model
    shown what was tried would, proposes no program twice (ratchet refuses to run a
    repeat, OpenEvolve runs it again: neither is the comparison's point)."""

    noisy: bool
    rng: random.Random
    tried: set[int] = field(default_factory=set)
    requests: int = 0

    def propose(self, x: int) -> int:
        """A new X for a program at `x`: a fresh draw (deterministic task) or a step
        (noisy task); never `x` itself (both engines refuse an unchanged program), nor
        one proposed before while an untried one is left."""
        self.tried.add(x)
        steps = [max(1, x + s) for s in range(-10, 11) if s]
        values = steps if self.noisy else list(range(1, 300))
        fresh = [v for v in values if v not in self.tried] or [v for v in values if v != x]
        value = self.rng.choice(fresh)
        self.tried.add(value)
        return value


@dataclass
class FakeModel:
    """Answers each engine in its own format from its own stream."""

    streams: dict[str, Stream] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: Request) -> Answer:
        engine = request.body.get("model")
        with self.lock:
            stream = self.streams[str(engine)]
            stream.requests += 1
            if engine == OE_MODEL:
                # its sampled parent: the program under "# Current Program" (the history
                # and inspirations above it hold other programs)
                current = request.last_user.split("# Current Program\n", 1)[-1]
                x = int(re.search(r"(?m)^X = (\d+)", current).group(1))  # type: ignore[union-attr]
                value = stream.propose(x)
                return Answer(f"Try X = {value}.\n\n<<<<<<< SEARCH\nX = {x}\n=======\n"
                              f"X = {value}\n>>>>>>> REPLACE\n")
            prompt = request.prompt
            x = int(re.search(r"(?m)^X = (\d+)\s*$", prompt).group(1))  # type: ignore[union-attr]
            change = re.search(r"(?m)^-X = (\d+)\s*\n\+X = (\d+)\s*$", prompt)
            if "# Re-apply a change" in prompt and change:
                old, new = int(change.group(1)), int(change.group(2))
                value = max(1, x + new - old) if stream.noisy else new
                value = value if value != x else x + 1
            else:
                value = stream.propose(x)
        return Answer(f"DESCRIPTION: move X from {x} to {value}\n\nknob.py\n<<<<<<< SEARCH\n"
                      f"X = {x}\n=======\nX = {value}\n>>>>>>> REPLACE\n")


# -- one study per engine ---------------------------------------------------------------

@dataclass
class Outcome:
    engine: str
    k: int
    candidates: int  # proposals evaluated and judged (see the docstring)
    evaluations: int  # every evaluation, extra ones included
    to_first_eval: float  # spawn to the first evaluation's start
    to_last_eval: float  # spawn to the last evaluation's end
    wall: float  # spawn to the process's exit
    takes: list[tuple[int, int]]  # (true X replaced, true X taken), in order
    final_x: int  # the true X of what the engine ends with as its best
    requests: int
    withdrawn: int = 0  # ratchet: run, then withdrawn (proposed on a keep refused)
    slots: str = "—"  # ratchet: where its slot time went, as its end line says

    @property
    def judged(self) -> str:
        return f"{self.candidates}" + (f" (+{self.withdrawn} withdrawn)" if self.withdrawn
                                       else "")

    @property
    def per_hour(self) -> float:
        return self.candidates / self.to_last_eval * 3600

    @property
    def true_takes(self) -> int:
        return sum(1 for old, new in self.takes if new < old)

    @property
    def false_takes(self) -> int:
        return len(self.takes) - self.true_takes


def run_ratchet(base: Path, server: LLMServer, model: FakeModel, *, k: int, n: int,
                task_s: float, noise: float, seed: int, start: int) -> Outcome:
    model.streams[RATCHET_MODEL] = Stream(noise > 0, random.Random(seed))
    repo = synthetic.make_repo(
        # rounds to spare: the budget of candidates is what ends the study (at K = 1 the
        # baseline takes round 1)
        base / "ratchet", name="oe", k=k, rounds=2 * n + 2, proposer="llm", start=start,
        extra=synthetic.llm_section(server.openai_url, RATCHET_MODEL)
        + f"\n[budget]\ncandidates = {n}\n",
        files={"evaluate.py": TASK.format(sleep=task_s, noise=noise)})
    env = {**os.environ, "PYTHONPATH": str(SRC), "OPENAI_API_KEY": "sk-bench"}
    with open(base / "ratchet.log", "w") as log:
        spawned = time.time()
        subprocess.run([sys.executable, "-c", RATCHET_CLI, "run", "--repo", str(repo)],
                       check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
        wall = time.time() - spawned
    shares = re.search(r"slot time \(\d+ slots?\): (.+)", (base / "ratchet.log").read_text())
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    rows = ledger.candidates(confirmations=True)
    ledger.close()
    evals = [p for c in rows for p in c.phases or [] if p["name"] == "evaluate"]
    judged = [c for c in rows if c.kind == "candidate" and c.status in
              ("keep", "discard", "crash", "rejected")]
    keeps = sorted((c for c in judged if c.status == "keep"), key=lambda c: c.judged_at or 0)
    takes, incumbent = [], start
    for c in keeps:
        x = true_x(repo, c.commit_sha or "")
        takes.append((incumbent, x))
        incumbent = x
    return Outcome("ratchet", k, len(judged), len(evals),
                   min(p["started_at"] for p in evals) - spawned,
                   max(p["started_at"] + p["seconds"] for p in evals) - spawned, wall,
                   takes, incumbent, model.streams[RATCHET_MODEL].requests,
                   sum(1 for c in rows if c.kind == "candidate" and c.status == "cancelled"),
                   shares.group(1).strip() if shares else "—")


def true_x(repo: Path, sha: str) -> int:
    text = subprocess.run(["git", "-C", str(repo), "show", f"{sha}:knob.py"], check=True,
                          capture_output=True, text=True).stdout
    return int(re.search(r"(?m)^X = (\d+)", text).group(1))  # type: ignore[union-attr]


def run_openevolve(base: Path, python: Path, server: LLMServer, model: FakeModel, *, k: int,
                   n: int, task_s: float, noise: float, seed: int, start: int) -> Outcome:
    model.streams[OE_MODEL] = Stream(noise > 0, random.Random(seed))
    work = base / "openevolve"
    work.mkdir(parents=True)
    (work / "evaluate.py").write_text(TASK.format(sleep=task_s, noise=noise))
    (work / "initial.py").write_text(f"X = {start}\n")
    evals_log = work / "evaluations.jsonl"
    (work / "evaluator.py").write_text(OE_EVALUATOR.format(task=str(work / "evaluate.py"),
                                                           log=str(evals_log)))
    # its defaults, but for the endpoint, the iterations and the process pool (JSON is
    # YAML); no checkpoint within the run, as none would be within 16 iterations
    config = {"max_iterations": n, "checkpoint_interval": 100_000, "random_seed": seed,
              "llm": {"api_base": server.openai_url, "api_key": "sk-bench", "timeout": 30,
                      "retries": 0, "models": [{"name": OE_MODEL, "weight": 1.0}]},
              "evaluator": {"parallel_evaluations": k}}
    (work / "config.yaml").write_text(json.dumps(config))
    dump = work / "programs.json"
    with open(base / "openevolve.log", "w") as log:
        spawned = time.time()
        subprocess.run([str(python), "-c", OE_DRIVER, str(work / "initial.py"),
                        str(work / "evaluator.py"), str(work / "config.yaml"),
                        str(work / "out"), str(n), str(dump)], check=True, stdout=log,
                       stderr=subprocess.STDOUT, cwd=work,
                       env={**os.environ, "OPENAI_API_KEY": "sk-bench"})
        wall = time.time() - spawned
    evals = sorted((json.loads(line) for line in evals_log.read_text().splitlines()),
                   key=lambda e: e["start"])
    takes, best = openevolve_takes(work, evals, start)
    return Outcome("OpenEvolve", k, len(evals) - 1, len(evals),
                   evals[0]["start"] - spawned, max(e["end"] for e in evals) - spawned, wall,
                   takes, best, model.streams[OE_MODEL].requests)


def openevolve_takes(work: Path, evals: list[dict], start: int) -> tuple[list[tuple[int, int]],
                                                                        int]:
    """OpenEvolve's best-program history as its log tells it, in true X: ((X replaced, X
    taken), ...) and the final best's X. A program is known by its id in the database at
    the end, or, when the database dropped it since (MAP-Elites replaces a cell's program
    by a better one), by the score the log line gives, in the evaluations' log."""
    got = json.loads((work / "programs.json").read_text())
    xs = {pid: p["x"] for pid, p in got["programs"].items()}
    by_score = {f"{-e['score']:.4f}": e["x"] for e in evals}
    text = "\n".join(p.read_text() for p in sorted((work / "out" / "logs").glob("*.log")))
    takes, best = [], start
    for m in BEST_LINES.finditer(text):
        new = m.group(1) or m.group(4)
        x = xs.get(new, by_score.get(m.group(2) or ""))
        if x is None:
            sys.exit(f"{work}: the true X of OpenEvolve's best program {new} is unknown "
                     "(neither in its database nor by score in evaluations.jsonl)")
        if m.group(3) != "None":  # tracking set from none: the first best, not a take
            takes.append((best, x))
        best = x
    if got["best"] in xs and xs[got["best"]] != best:
        sys.exit(f"{work}: OpenEvolve's final best has X = {xs[got['best']]}, its logged "
                 f"history ends at X = {best}")
    return takes, best


# -- the cases --------------------------------------------------------------------------

def study_pair(base: Path, python: Path, server: LLMServer, model: FakeModel, *, k: int,
               n: int, task_s: float, noise: float, seed: int,
               oe_first: bool = False) -> list[Outcome]:
    """ratchet and OpenEvolve on the same task and seed, one after the other (OpenEvolve
    first with `oe_first`, so a drift of the machine's load falls on both alike)."""
    start = 100 if noise else 300
    kw: dict[str, Any] = {"k": k, "n": n, "task_s": task_s, "noise": noise, "seed": seed, "start": start}
    name = f"{'noisy' if noise else 'det'}-k{k}-s{seed}"
    runs = [lambda: run_ratchet(base / name, server, model, **kw),
            lambda: run_openevolve(base / name, python, server, model, **kw)]
    got = [run() for run in (runs[::-1] if oe_first else runs)]
    return sorted(got, key=lambda o: o.engine != "ratchet")


def pooled(got: list[Outcome]) -> float:
    """Candidates per hour over several studies: all candidates over all their time."""
    return sum(o.candidates for o in got) / sum(o.to_last_eval for o in got) * 3600


def throughput(base: Path, python: Path, server: LLMServer, model: FakeModel, n: int,
               task_s: float, reps: int) -> list[str]:
    got: dict[tuple[str, int], list[Outcome]] = {}
    for rep in range(reps):
        for k in (4, 1):
            for o in study_pair(base, python, server, model, k=k, n=n, task_s=task_s,
                                noise=0.0, seed=10 * k + rep, oe_first=rep % 2 == 1):
                got.setdefault((o.engine, k), []).append(o)
    rows = [f"**1. Throughput, deterministic task** ({n} candidates of {task_s:g} s each, "
            f"X from 300, fresh draws; {reps} pairs per K, the engines' order alternating; "
            "the clock runs from spawning each engine's process)",
            "| engine | K | candidates | evaluations (all) | to first evaluation s | "
            "to last evaluation s | process exit s | candidates/h | kept / new bests | "
            "final X | LLM requests | slot time (ratchet's end line) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in (4, 1):
        for engine in ("ratchet", "OpenEvolve"):
            for o in got[(engine, k)]:
                rows.append(f"| {o.engine} | {o.k} | {o.judged} | {o.evaluations} | "
                            f"{o.to_first_eval:.2f} | {o.to_last_eval:.2f} | {o.wall:.2f} | "
                            f"{o.per_hour:.0f} | {len(o.takes)} | {o.final_x} | "
                            f"{o.requests} | {o.slots} |")
    for k in (4, 1):
        ours, theirs = pooled(got[("ratchet", k)]), pooled(got[("OpenEvolve", k)])
        rows.append(f"K = {k}: ratchet {ours:.0f} candidates/h, OpenEvolve {theirs:.0f} "
                    f"(pooled over the pairs): ratchet / OpenEvolve **{ours / theirs:.2f}**"
                    + (" (target >= 1)" if k == 4 else ""))
    for engine in ("ratchet", "OpenEvolve"):
        rows.append(f"{engine}: K = 4 against K = 1, candidates per hour: "
                    f"{pooled(got[(engine, 4)]) / pooled(got[(engine, 1)]):.2f}")
    return rows


def noisy(base: Path, python: Path, server: LLMServer, model: FakeModel, n: int,
          task_s: float, reps: int, noise: float = 0.05, k: int = 4) -> list[str]:
    rows = [f"**2. Noisy task** ({noise:.0%} relative noise per evaluation, X from 100, "
            f"steps of -10..10, K = {k}, {n} candidates of {task_s:g} s, {reps} pairs with "
            "seeds 1..; a take is a keep (ratchet) or a new best program (OpenEvolve); "
            "true when its true X is below the one it replaced)",
            "| engine | seed | candidates | evaluations (all) | to last evaluation s | "
            "takes: true / false | takes (true X replaced → taken) | final X | slot time "
            "(ratchet's end line) |", "|---|---|---|---|---|---|---|---|---|"]
    totals: dict[str, list[Outcome]] = {"ratchet": [], "OpenEvolve": []}
    for seed in range(1, reps + 1):
        for o in study_pair(base, python, server, model, k=k, n=n, task_s=task_s,
                            noise=noise, seed=100 + seed):
            totals[o.engine].append(o)
            shown = ", ".join(f"{a}→{b}" for a, b in o.takes) or "—"
            rows.append(f"| {o.engine} | {seed} | {o.judged} | {o.evaluations} | "
                        f"{o.to_last_eval:.2f} | {o.true_takes} / {o.false_takes} | "
                        f"{shown} | {o.final_x} | {o.slots} |")
    for engine, got in totals.items():
        hours = sum(o.to_last_eval for o in got) / 3600
        true, false = sum(o.true_takes for o in got), sum(o.false_takes for o in got)
        gained = sum(100 - o.final_x for o in got)
        rows.append(f"{engine}: **{true / hours:.0f} true improvements kept per hour**, "
                    f"{false} false of {true + false} takes; final true X "
                    f"{', '.join(str(o.final_x) for o in got)} (from 100): {gained / hours:.0f} "
                    f"of true X gained per hour, over {hours * 3600:.1f} s to the last "
                    "evaluations")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task-s", type=float, default=3.0, help="seconds per evaluation")
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--reps", type=int, default=2,
                        help="pairs per K on the deterministic task")
    parser.add_argument("--noisy-reps", type=int, default=4, help="pairs on the noisy task")
    parser.add_argument("--only", choices=["throughput", "noisy"], default=None)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 8 candidates of 0.5 s, one noisy pair")
    parser.add_argument("--oe-venv", type=Path, default=DEFAULT_VENV,
                        help="OpenEvolve's scratch venv (created when missing)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--record", action="store_true",
                        help="write to bench/RESULTS.md (the previous run moves to HISTORY.md)")
    args = parser.parse_args()
    if args.quick:
        args.task_s, args.candidates, args.reps, args.noisy_reps = 0.5, 8, 1, 1
    python, version = openevolve_python(args.oe_venv)
    base = Path(tempfile.mkdtemp(prefix="ratchet-openevolve-"))
    load = os.getloadavg()
    lines = [f"OpenEvolve {version} (PyPI, scratch venv {args.oe_venv}), ratchet from {SRC}; "
             f"load average at the start {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} "
             f"({os.cpu_count()} cores, shared)", "",
             "A candidate: for ratchet, a proposal committed, run in its sandbox and judged "
             "(its confirmation pairs, the baseline and the noise floor are extra "
             "evaluations); for OpenEvolve, an iteration (an LLM reply applied to a sampled "
             "parent, evaluated once, in its worker, unisolated; the initial program's "
             "evaluation is extra). Both run as fresh processes, timed from the spawn to the "
             "end of their last evaluation; the same evaluation script, the same fake model "
             "(its own random stream per engine, same seed), each engine's defaults but for "
             "K, the endpoint and the count of candidates.", ""]
    model = FakeModel()
    try:
        with LLMServer() as server:
            server.respond_with(model)
            if args.only in (None, "throughput"):
                lines += throughput(base, python, server, model, args.candidates,
                                    args.task_s, args.reps) + [""]
            if args.only in (None, "noisy"):
                lines += noisy(base, python, server, model, args.candidates, args.task_s,
                               args.noisy_reps) + [""]
    finally:
        if args.keep:
            print(f"work directory kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    load = os.getloadavg()
    lines.append(f"load average at the end {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")
    text = "\n".join(lines)
    print(text)
    if args.record:
        only = f" --only {args.only}" if args.only else ""
        record(f"ratchet and OpenEvolve side by side (bench/openevolve.py{only})",
               f".venv/bin/python bench/openevolve.py --task-s {args.task_s:g} --candidates "
               f"{args.candidates} --reps {args.reps} --noisy-reps {args.noisy_reps}{only} "
               "--record", text)


if __name__ == "__main__":
    main()
