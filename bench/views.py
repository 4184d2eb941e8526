"""The views at 10,000 candidates: `status`, `log`, the dashboard and the report, timed.

    .venv/bin/python bench/views.py [--rows 10000] [--grow 100] [--record]

A real study first (the tune proposer, K = 4, real jobs), then its ledger grown to
`--rows` rows through the ledger's own API (`Ledger.new_candidate`, `Ledger.update`): each
new row a copy of one of the study's judged rows under a new id, with a real commit (one
of the study's few distinct trees, made by `git fast-import`) and its ref
`refs/ratchet/<study>/<id>`, as the driver leaves them. Then each view is timed:

- `ratchet status`, `status --json`, `log --last 50` as a user runs them (a process each,
  Python's start and the CLI's import included);
- the dashboard (`ratchet serve`'s app on loopback): the overview and one candidates page
  (time and size of one GET), and the live page's update after one more verdict (the
  server time of the request the page makes);
- `ratchet report` from scratch, then again after `--grow` more candidates.
"""

from __future__ import annotations

import argparse
import http.client
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import record  # noqa: E402  (bench/, next to this file)

from ratchet.core.candidate import Candidate  # noqa: E402
from ratchet.core.vocab import Kind, Status  # noqa: E402
from ratchet.store.ledger import Ledger  # noqa: E402

LIMITS = {"status": 1.0, "status --json": 1.0, "log --last 50": 0.5, "overview": 1.0,
          "candidates page": 1.0, "live update": 0.3,
          "live update, candidates": 0.3, "live update, walking parts due": 1.0,
          "report (scratch)": 60.0,
          "report (+grow)": 5.0}
SIZE_LIMIT = 500_000

TOML = textwrap.dedent("""
    [task]
    name = "views"
    editable = ["solution.py"]
    protected = ["evaluate.py"]
    evaluate = "python evaluate.py"
    timeout = "60s"
    [task.metric]
    name = "score"
    goal = "minimize"
    [search]
    proposer = "tune"
    parallel = 4
    rounds = 3
    [tune.knobs]
    "solution.py:X" = { choices = [3.0, 2.0, 1.5, 1.0, 0.0, 5.0, 4.0, 2.5] }
    [backend]
    kind = "local"
    slots = 2
""").lstrip()
EVALUATOR = ("import random, solution\nprint('correct: true')\n"
             "print(f'score: {solution.score() + random.gauss(0, 0.01):.6f}')\n")
SOLUTION = "X = 3.0\n\n\ndef score():\n    return (X - 1.25) ** 2\n"
GIT_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid"}


def env() -> dict[str, str]:
    return {**os.environ, **GIT_ENV, "PYTHONPATH": str(ROOT / "src")}


def git(repo: Path, *args: str, data: str | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], input=data, capture_output=True,
                          text=True, env=env(), check=True).stdout.strip()


CPU: dict[str, float] = {}  # CPU seconds (user + system) of the last measurement


def ratchet(repo: Path, *args: str, timeout: float | None = None) -> tuple[float, str]:
    """Seconds a `ratchet ARGS` process took (inf past `timeout`), and what it printed;
    its CPU seconds in CPU["last"] (the machine may be shared: wall time is not all)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "ratchet.cli", *args, "--repo",
                               str(repo)], capture_output=True, text=True, env=env(),
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        CPU["last"] = float("nan")  # a killed child's time is not in RUSAGE_CHILDREN
        return float("inf"), ""
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU["last"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"ratchet {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return took, proc.stdout


def real_study(repo: Path) -> None:
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "ratchet.toml").write_text(TOML)
    (repo / "evaluate.py").write_text(EVALUATOR)
    (repo / "solution.py").write_text(SOLUTION)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "task")
    ratchet(repo, "run")


def grow(repo: Path, rows: int) -> int:
    """Copies of the study's judged rows under new ids until the ledger holds `rows` rows
    (confirmation rows included); returns how many were added."""
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        have = ledger.db.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
        need = max(0, rows - have)
        if not need:
            return 0
        # the real study's rows come first (the copies repeat them): the first 200 only,
        # not 10,000 rows decoded and a git call each
        templates = [c for c in ledger.page(0, 200)[0]
                     if c.kind == Kind.CANDIDATE and c.commit_sha
                     and c.status in (Status.DISCARD, Status.CRASH, Status.REJECTED)][:64]
        study = "views"  # [task] name in TOML
        trees = {c.commit_sha: git(repo, "rev-parse", f"{c.commit_sha}^{{tree}}")
                 for c in templates}
        files = {tree: git(repo, "ls-tree", "-r", tree).splitlines() for tree in set(trees.values())}
        first = ledger.db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM candidates"
                                  ).fetchone()[0]
        # one fast-import stream: a commit per new row, on its ref, with its template's tree
        stream, made = [], []
        for i in range(need):
            tpl = templates[i % len(templates)]
            cand_id = f"c{first + i:04d}"
            # numbered by the row, not by this call: a second growth makes new commits
            message = f"{tpl.description} (copy {first + i})"
            stream += [f"commit refs/ratchet/{study}/{cand_id}", f"mark :{i + 1}",
                       f"committer bench <bench@example.invalid> {1_700_000_000 + first + i} "
                       "+0000",
                       f"data {len(message.encode())}", message, f"from {tpl.parent}",
                       "deleteall"]
            for line in files[trees[tpl.commit_sha or ""]]:
                meta, path = line.split("\t", 1)
                mode, _kind, blob = meta.split()
                stream.append(f"M {mode} {blob} {path}")
            stream.append("")
            made.append((cand_id, tpl))
        marks = Path(tempfile.mkstemp(suffix=".marks")[1])
        git(repo, "fast-import", "--quiet", f"--export-marks={marks}",
            data="\n".join(stream) + "\n")
        sha = {int(m[1:]): s for m, s in (line.split() for line in marks.read_text().splitlines())}
        marks.unlink()
        keep = ("round", "kind", "parent", "proposer", "params", "idea", "status", "job_id",
                "attempt", "metric", "samples", "extra", "holdout", "phases", "reasons",
                "failed_stage", "slot", "gain", "margin", "noise", "queue_s", "run_s",
                "cost_usd", "submitted_at", "finished_at", "judged_at", "result", "code",
                "extra_slot_s")
        shift = time.time() - min(t.created_at for t in templates)
        with ledger.transaction():  # one commit: the driver's fsync per row is not the point
            for i, (cand_id, tpl) in enumerate(made):
                fields = {k: getattr(tpl, k) for k in keep}
                for k in ("submitted_at", "finished_at", "judged_at"):
                    if fields[k] is not None:
                        fields[k] += shift + i  # later rows are later, one a second
                cand = ledger.new_candidate(fields.pop("round"), fields.pop("kind"),
                                            Status.PROPOSED,
                                            description=f"{tpl.description} (copy {first + i})")
                assert cand.id == cand_id, (cand.id, cand_id)
                ledger.update(cand.id, event="judged", commit_sha=sha[i + 1], **fields)
        return need
    finally:
        ledger.close()


def one_verdict(repo: Path) -> str:
    """One more judged candidate, as `grow` makes them; its id."""
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        have = ledger.db.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
    finally:
        ledger.close()
    grow(repo, have + 1)
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        last: Candidate = ledger.last(1)[0]
        return last.id
    finally:
        ledger.close()


class Dashboard:
    """`ratchet serve`'s app on loopback, in this process (a thread serves it)."""

    def __init__(self, repo: Path) -> None:
        from ratchet.ui.serve import make_server

        self.server, self.app = make_server(repo, "127.0.0.1", 0, "x" * 24)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def get(self, path: str) -> tuple[float, bytes, dict[str, str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.app.port, timeout=600)
        cpu = time.process_time()  # this process: the server's thread and this client
        start = time.perf_counter()
        conn.request("GET", path, headers={"Authorization": "Bearer " + "x" * 24})
        reply = conn.getresponse()
        body = reply.read()
        took = time.perf_counter() - start
        CPU["last"] = time.process_time() - cpu
        if reply.status != 200:
            raise SystemExit(f"GET {path}: {reply.status} {body[:300]!r}")
        headers = {k.lower(): v for k, v in reply.getheaders()}
        conn.close()
        return took, body, headers

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.app.study.close()


def live_paths(headers: dict[str, str], page: bytes) -> str | None:
    """The path the live page asks for after a change (its script reads it from the page:
    data-delta on <body>), None where it refetches the whole fragment."""
    text = page.decode("utf-8", "replace")
    key = 'data-delta="'
    at = text.find(key)
    if at < 0:
        return None
    import html

    return html.unescape(text[at + len(key):text.index('"', at + len(key))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--grow", type=int, default=100)
    parser.add_argument("--report-timeout", type=float, default=900,
                        help="seconds `report` from scratch may take before it is stopped")
    parser.add_argument("--keep", type=Path, help="leave the study here (for a look)")
    parser.add_argument("--record", action="store_true",
                        help="write to bench/RESULTS.md (the previous run moves to HISTORY.md)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-views-"))
    repo = (args.keep or tmp) / "study"
    figures: dict[str, tuple[float, int | None, float]] = {}
    try:
        start = time.perf_counter()
        real_study(repo)
        real = time.perf_counter() - start
        added = grow(repo, args.rows)
        built = time.perf_counter() - start
        print(f"study: real part {real:.1f} s, grown by {added} rows, {built:.1f} s in all",
              flush=True)
        for name, cli in (("status", ["status"]), ("status --json", ["status", "--json"]),
                          ("log --last 50", ["log", "--last", "50"])):
            took, out = ratchet(repo, *cli)
            figures[name] = (took, len(out.encode()), CPU["last"])
            print(f"{name}: {took:.2f} s, {len(out.encode())} bytes", flush=True)
        board = Dashboard(repo)
        try:
            for name, path in (("overview", "/"), ("candidates page", "/candidates")):
                took, body, headers = board.get(path)
                figures[name] = (took, len(body), CPU["last"])
                print(f"{name}: {took:.2f} s, {len(body)} bytes", flush=True)
            _, page, headers = board.get("/")
            since = headers.get("x-ratchet-render", "")  # the render the page holds
            delta = live_paths(headers, page)
            one_verdict(repo)
            path = (delta.replace("{since}", since) if delta else "/?fragment=1")
            took, body, _ = board.get(path)
            figures["live update"] = (took, len(body), CPU["last"])
            print(f"live update ({path.split('?')[0]}): {took:.3f} s, {len(body)} bytes",
                  flush=True)
            due = board.app.parts.due  # the parts that walk every row, owed a new making
            if delta and due is not None:
                time.sleep(max(0.0, due - time.monotonic()))
                render = str(board.app.parts.renders)
                took, body, _ = board.get(delta.replace("{since}", render))
                figures["live update, walking parts due"] = (took, len(body), CPU["last"])
                print(f"live update, walking parts due: {took:.3f} s, {len(body)} bytes",
                      flush=True)
            one_verdict(repo)
            took, body, _ = board.get("/candidates?fragment=1")
            figures["live update, candidates"] = (took, len(body), CPU["last"])
            print(f"live update (/candidates): {took:.3f} s, {len(body)} bytes", flush=True)
        finally:
            board.close()
        shutil.rmtree(repo / ".ratchet" / "report", ignore_errors=True)
        took, _ = ratchet(repo, "report", timeout=args.report_timeout)
        figures["report (scratch)"] = (took, None, CPU["last"])
        print(f"report from scratch: {took:.1f} s", flush=True)
        if took == float("inf"):
            return _table(args, figures)  # the next report would start from scratch too
        have = Ledger(repo / ".ratchet" / "ledger.db")
        rows = have.db.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
        have.close()
        grow(repo, rows + args.grow)
        took, _ = ratchet(repo, "report")
        figures["report (+grow)"] = (took, None, CPU["last"])
        print(f"report after {args.grow} more: {took:.1f} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    _table(args, figures)


def _table(args: argparse.Namespace,
           figures: dict[str, tuple[float, int | None, float]]) -> None:
    lines = [f"A real study (tune, K = 4, 3 rounds) grown to {args.rows:,} ledger rows "
             f"through the ledger's API (real commits and refs); report again after "
             f"{args.grow} more. Limits from issue 38.", "",
             "Wall time on a shared machine (other work ran beside it), and the CPU "
             "seconds of the process (or of the server's request).", "",
             "| view | wall | CPU | size | limit | within (wall) |",
             "|---|---|---|---|---|---|"]
    for name, (took, size, cpu) in figures.items():
        limit = LIMITS[name]
        ok = took <= limit and (size is None or name not in ("overview", "candidates page")
                                or size <= SIZE_LIMIT)
        size_text = "" if size is None else f"{size / 1000:.1f} kB"
        lines.append(f"| {name} | {'stopped at ' if took == float('inf') else ''}"
                     f"{args.report_timeout if took == float('inf') else took:.2f} s | {cpu:.2f} s | {size_text} | {limit:g} s"
                     f"{' / 500 kB' if name in ('overview', 'candidates page') else ''} | "
                     f"{'yes' if ok else '**no**'} |")
    text = "\n".join(lines)
    print(text)
    if args.record:
        record(f"Views at {args.rows:,} candidates (bench/views.py)",
               f".venv/bin/python bench/views.py --rows {args.rows} --grow {args.grow} --record",
               text)


if __name__ == "__main__":
    main()
