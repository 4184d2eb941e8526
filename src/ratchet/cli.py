"""The `ratchet` command line (typer + rich). Exit 0 on success, one clear line otherwise."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console, Group
from rich.text import Text

from ratchet import __version__, backends, proposers
from ratchet.core.candidate import Candidate
from ratchet.core.errors import UserError
from ratchet.core.vocab import Kind, Status
from ratchet.driver import budget, infra, opening, results, spend, views, words
from ratchet.driver.study import Progress, Study
from ratchet.driver.tally import Tally, sandboxes_text
from ratchet.job import gitrepo
from ratchet.store.ledger import Ledger
from ratchet.ui import audit, notify

if TYPE_CHECKING:
    from rich.live import Live

# Every string we print is literal text: help, errors, descriptions and reasons often
# hold brackets ("[prep] run", "[tune.knobs]") or colons that rich would read as markup
# or emoji codes. So no markup in help (plain click help) and none on our consoles.
# Wrapping: on a terminal rich wraps a long line at a space to the terminal's width (the
# terminal itself would cut it mid-word); piped, a line is never cut (soft wrap), so a log
# file or a grep sees each line whole.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
    help="Autoresearch that only moves forward: propose, verify, keep or revert.",
)
console = Console(markup=False, emoji=False, highlight=False)
err = Console(stderr=True, markup=False, emoji=False, highlight=False)
for _out in (console, err):
    _out.soft_wrap = not _out.is_terminal

RepoOption = Annotated[Path, typer.Option("--repo", "-C", help="research repository")]


def emit(out: Console, line: str) -> None:
    """One line of output. On a terminal narrower than the line it is wrapped at spaces,
    the rest indented under the line's own text, never cut mid-word (the terminal itself
    would cut `1.5625` into `1.5` and `625`); piped, it goes out whole."""
    if out.is_terminal and len(line) > out.width:
        lead = len(line) - len(line.lstrip(" "))
        line = "\n".join(textwrap.wrap(line, width=out.width,
                                       subsequent_indent=" " * min(lead + 4, out.width // 2),
                                       break_long_words=False, break_on_hyphens=False))
    out.print(line)


def emit_parts(out: Console, line: str, width: int = views.LINE_WIDTH) -> None:
    """A summary of `a; b; c` parts: one line where it fits `width`, else a line a part,
    the rest indented under the first."""
    if len(line) <= width:
        emit(out, line)
        return
    first, *rest = line.split("; ")
    emit(out, first)
    for part in rest:
        emit(out, f"  {part}")


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(Text.assemble(("error:", "bold red"), " ", message))
    raise typer.Exit(code)


def _print_version(value: bool) -> None:
    if value:
        console.print(f"ratchet {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="print the version and exit"
    )] = False,
) -> None:
    """Autoresearch that only moves forward: propose, verify, keep or revert."""


def open_study(repo: Path, **kwargs) -> Study:
    """The study of REPO (driver/opening.py), what it says on stderr; use it as
    `with open_study(repo) as study:`."""
    kwargs.setdefault("log", lambda m: err.print(m))
    kwargs.setdefault("watch", [notify.watcher])  # [notify], from outside the loop
    return opening.open_study(repo, **kwargs)


# ---------------------------------------------------------------------------------------


@app.command()
def init(
    template: Annotated[str, typer.Option(help="kernel | train | blank")] = "blank",
    repo: RepoOption = Path("."),
    force: Annotated[bool, typer.Option("--force", help="overwrite existing files")] = False,
) -> None:
    """Write ratchet.toml, program.md and a starter task into REPO (git init if needed)."""
    import shlex

    from ratchet.templates import init_repository, repository_root_or_none, write_template

    dest = repo.resolve()
    try:
        existing = repository_root_or_none(dest)
        written = write_template(template, dest, force=force)
        if existing is None:
            init_repository(dest)
    except (ValueError, FileExistsError) as exc:
        fail(str(exc))
    for path in written:
        console.print(f"wrote {path}")
    if existing is None:
        console.print(f"initialised an empty git repository in {dest}")
    # the next step is printed to be pasted as it is, from where the user stands
    cd = "" if dest == Path.cwd().resolve() else f"cd {shlex.quote(str(dest))} && "
    paths = " ".join(shlex.quote(str(p.relative_to(dest))) for p in written)
    console.print(f"next: {cd}git add {paths} && git commit -m 'ratchet task' && ratchet run")


@app.command()
def prep(
    repo: RepoOption = Path("."),
    force: Annotated[bool, typer.Option("--force", help="prepare again even if cached")] = False,
) -> None:
    """Run [prep] run once into the shared read-only cache ($RATCHET_DATA)."""
    with open_study(repo) as study:
        if study.config.prep is None:
            fail("ratchet.toml has no [prep] section "
                 "(add `[prep] run = \"python prepare.py\"`)")
        data = study.prepare(force=force)
    console.print(f"data ready at {data} (exposed to jobs as $RATCHET_DATA)")


PROGRESS_EVERY_S = 30.0
# The live area is redrawn at most this often, from the thread that runs the study
LIVE_REFRESH_S = 0.25
# `RATCHET_PROGRESS_PNG=0`: `ratchet run` ends without drawing progress.png, for scripted
# and CI runs that never look at it (the chart costs 0.2 CPU-s a run, 0.8 with matplotlib's
# import); `ratchet report` draws it whenever asked.
PROGRESS_PNG_ENV = "RATCHET_PROGRESS_PNG"


def progress_line(p: Progress, metric: str) -> str:
    """The live view in one line, for output that is not a terminal: the round, what
    runs (the longest-running job), what the study waits for, the best so far."""
    now = time.strftime("%H:%M:%S")
    what = f"{len(p.running)} job{'s' * (len(p.running) != 1)} running"
    if p.running:
        cand_id, _, elapsed, state = max(p.running, key=lambda r: r[2])
        what += f" (longest {cand_id} {state} {elapsed:.0f}s)"
    elif p.waiting:
        what = p.waiting
    best = "" if p.best is None else f", best {metric} {views.fmt(p.best)}"
    return f"{now} round {min(p.round, p.rounds)}/{p.rounds}: {what}{best}"


class RunView:
    """What `ratchet run` shows while it runs.

    In a terminal: a live area (one status line, the running jobs, backend trouble) that
    never wraps, so redrawing it leaves nothing behind; above it, each judged round stays
    on screen once, with every verdict. Elsewhere (a log file, a pipe): only the judged
    rounds and the trouble lines, each printed once.

    Rolling search has no rounds to wait for: each verdict is printed once it is made,
    without a round header (its ledger "round" counts keeps, not a budget of rounds).
    A study's log line (`keep c0003 ...`) is printed after the verdicts it follows.

    Only the study's thread writes to the terminal. rich's own refresh thread is off: its
    redraw could reach the terminal between a print's cursor move (the live area's last
    height) and the print's own text, and when the area's height had changed in between,
    a verdict line was drawn over or a copy of the area left behind (seen under load). A
    log line from another thread waits for the study's thread's next update.
    """

    def __init__(self) -> None:
        self.metric = ""
        self.goal = "minimize"
        self.hinted = False  # a crash's cause and fix said (once a run)
        self.live: Live | None = None
        self.study: Study | None = None
        self.next_round: int | None = None  # the first round not yet printed
        self.rounds = 0  # the study's target
        self.trouble = ""
        self.rolling = False
        self.printed: set[str] = set()  # rolling: the verdicts on screen
        # not on a terminal (a pipe, nohup, a log file): a progress line this often, so a
        # long round is not silent until it is judged
        self.every = float(os.environ.get("RATCHET_PROGRESS_EVERY", PROGRESS_EVERY_S))
        self.last_line = time.monotonic()
        self.drawn = 0.0  # when the live area was last redrawn
        self.owner = threading.get_ident()  # the thread that writes to the terminal
        self.pending: list[str] = []  # log lines from other threads, printed by the owner

    def attach(self, study: Study, rounds: int | None) -> None:
        self.study = study
        self.rounds = rounds or study.config.search.rounds
        self.metric = study.config.metric.name
        self.goal = study.config.metric.goal
        self.next_round = study.ledger.study().round or 1
        self.rolling = study.config.search.mode == "rolling"
        if self.rolling:  # a resumed study: what was judged before is not news
            self.printed = {c.id for c in study.ledger.candidates() if c.is_judged}

    def renderable(self, p: Progress) -> Group:
        parts: list = [Text(views.status_line(p.round, p.rounds, p.best, self.metric,
                                              p.counts), no_wrap=True, overflow="ellipsis")]
        if p.running:  # no job, no table: an empty table would leave a bare header
            from rich.table import Table  # here: the read-only commands start without it

            table = Table(show_edge=False, box=None, pad_edge=False)
            table.add_column("candidate", no_wrap=True)
            table.add_column("state", no_wrap=True)
            table.add_column("elapsed", justify="right", no_wrap=True)
            table.add_column("description", no_wrap=True, overflow="ellipsis")
            for cand_id, description, elapsed, state in p.running:
                table.add_row(cand_id, state, f"{elapsed:.1f}s", description)
            parts.append(table)
        if p.waiting:  # a proposer call in flight: what the study waits for, and how long
            parts.append(Text(p.waiting, style="cyan", no_wrap=True, overflow="ellipsis"))
        if p.message:  # infrastructure trouble being retried
            parts.append(Text(p.message, style="yellow", no_wrap=True, overflow="ellipsis"))
        return Group(*parts)

    def note(self, message: str) -> None:
        """The study's log lines. While the live area is up they go through its console,
        which prints them above it; a write to the terminal behind its back would leave
        copies of the live area on screen."""
        if threading.get_ident() != self.owner:
            self.pending.append(message)  # (list.append is atomic)
            return
        self.print_judged()  # the verdicts a line such as `keep c0003` speaks of come first
        for line in message.split("\n"):  # each line wrapped on its own
            emit(self.live.console if self.live is not None else err, line)

    def print_pending(self) -> None:
        while self.pending:
            self.note(self.pending.pop(0))

    def update(self, p: Progress) -> None:
        self.rounds = p.rounds or self.rounds
        if threading.get_ident() != self.owner:
            return  # the owner's next update draws it
        self.print_pending()
        self.print_judged(before=p.round)
        if self.live is not None:
            now = time.monotonic()
            due = now - self.drawn >= LIVE_REFRESH_S
            self.live.update(self.renderable(p), refresh=due)
            if due:
                self.drawn = now
            return
        if p.message != self.trouble:
            self.trouble = p.message
            if p.message:
                err.print(p.message)
        if time.monotonic() - self.last_line >= self.every:
            self.last_line = time.monotonic()
            emit(err, progress_line(p, self.metric))

    def print_judged(self, before: int | None = None) -> None:
        """Print every round that is fully judged and not printed yet."""
        if self.study is None or self.next_round is None:
            return
        if self.rolling:
            self._print_verdicts()
            return
        ledger = self.study.ledger
        last = (ledger.study().round or 1) if before is None else before - 1
        out = self.live.console if self.live is not None else console
        while self.next_round <= last:
            cands = ledger.candidates(round=self.next_round)
            if not cands or not all(c.is_judged for c in cands):
                return
            rounds = max(self.rounds, self.next_round)
            for line in words.round_lines(cands, self.next_round, rounds, self.metric,
                                          self.goal):
                emit(out, line)
            self.hint(cands, out)
            self.next_round += 1

    def hint(self, cands: list[Candidate], out: Console) -> None:
        """A crash's cause and fix where ratchet knows them (an import under `python -P`),
        said once a run."""
        from ratchet.driver.words import module_hint

        if self.hinted or self.study is None:
            return
        evaluate = self.study.config.task.evaluate
        for cand in cands:
            line = module_hint(cand.reasons, evaluate) if cand.status == Status.CRASH else None
            if line:
                emit(out, line)
                self.hinted = True
                return

    def _print_verdicts(self) -> None:
        """Rolling: every verdict not printed yet (those judged together: by id)."""
        assert self.study is not None
        out = self.live.console if self.live is not None else console
        fresh = [c for c in self.study.ledger.candidates()
                 if c.is_judged and c.id not in self.printed]
        for cand in fresh:  # the ledger's order: by id
            for line in words.round_lines([cand], cand.round, cand.round, self.metric,
                                          self.goal)[1:]:
                emit(out, line)  # [1:]: a verdict line without its round header
            self.printed.add(cand.id)
        self.hint(fresh, out)


@app.command()
def run(
    repo: RepoOption = Path("."),
    rounds: Annotated[int | None, typer.Option(min=1, help="total rounds for the study")] = None,
    parallel: Annotated[int | None, typer.Option(min=1, help="K: candidates per round")] = None,
    proposer: Annotated[str | None, typer.Option(help=proposers.names_help())] = None,
    backend: Annotated[str | None, typer.Option(help=backends.names_help())] = None,
) -> None:
    """Run (or resume) the study: rounds of K candidates, keep the best, revert the rest."""
    _start_over_if_changed(repo)
    view = RunView()
    study = open_study(repo, backend=backend, proposer=proposer, parallel=parallel,
                       progress=view.update, log=view.note)
    view.attach(study, rounds)
    if rounds is not None and (line := _rounds_done_note(study, rounds)):
        emit(err, line)
    stopped_by: list[int] = []  # the signals that stopped the study

    def on_signal(signum, frame) -> None:  # noqa: ARG001
        stopped_by.append(signum)
        study.stop.request()
        if study.stop.hard:
            view.note("stopping: cancelling running jobs and proposer calls…")
            # the calls in flight are billed off this handler (it may have interrupted a
            # write of the proposer's own), and the proposer stops waiting for them
            threading.Thread(target=study.interrupt, name="ratchet-interrupt",
                             daemon=True).start()
        else:
            view.note("stopping after the running jobs are judged (Ctrl-C again to cancel them)")

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    problem: str | None = None
    with study:
        if console.is_terminal:
            from rich.live import Live

            # auto_refresh off: only this thread draws (RunView says why)
            with Live(console=console, auto_refresh=False, transient=True) as live_view:
                view.live = live_view
                try:
                    study.run(rounds=rounds)
                except UserError as exc:
                    problem = str(exc)  # printed once the live area is gone, so it stays
                finally:
                    view.print_pending()
                    view.print_judged()  # the last round stays on screen
                    view.live = None
        else:
            try:
                study.run(rounds=rounds)
            except UserError as exc:
                problem = str(exc)
            finally:
                view.print_judged()
    if problem is not None:
        if study.stop.hard:
            err.print(Text.assemble(("error:", "bold red"), " ", problem))
            _leave_at_once(2)
        fail(problem)
    _print_summary(study)
    if os.environ.get(PROGRESS_PNG_ENV, "1") != "0":
        _write_progress(study)
    if stopped_by:
        err.print("stopped; run `ratchet run` again to resume")
        # the shell's convention for a command ended by a signal (130 after Ctrl-C), so a
        # script that runs `ratchet run && next-step` does not carry on after a stop
        if study.stop.hard:
            _leave_at_once(128 + stopped_by[0])
        raise typer.Exit(128 + stopped_by[0])


def _rounds_done_note(study: Study, rounds: int) -> str | None:
    """`--rounds N` is the study's total: at or below what is done, nothing runs, so say it."""
    if study.config.search.mode != "rounds":
        return None
    ledger = study.ledger
    done = ledger.rounds_done()
    if not done or rounds > done or any(
            not c.is_judged for c in ledger.candidates(round=done)):
        return None
    return (f"the study has run {done} rounds and --rounds {rounds} is the total: nothing "
            f"to run (--rounds {done + rounds} runs {rounds} more)")


def _leave_at_once(code: int) -> NoReturn:
    """Stopped at once (Ctrl-C twice): the study is recorded and closed, the proposer
    calls in flight billed as interrupted. A proposer thread may still wait on a reply
    nobody needs, and the interpreter would wait for it at exit: this exit does not."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _start_over_if_changed(repo: Path) -> None:
    """Until a candidate is judged, a committed change to ratchet.toml is taken: the study
    starts over from HEAD (driver/reset.py archives the old one)."""
    from ratchet.driver.reset import start_over_if_changed

    top = gitrepo.work_tree(repo.resolve()) if repo.is_dir() else None
    if top is not None:  # else open_study says what is wrong
        line = start_over_if_changed(top)
        if line:
            err.print(line)


@app.command()
def reset(repo: RepoOption = Path(".")) -> None:
    """Archive the study (ledger, jobs, refs) under a new name; the next run starts afresh."""
    from ratchet.driver.reset import reset_study

    top = gitrepo.work_tree(repo.resolve()) if repo.is_dir() else None
    if top is None:
        fail(f"{repo.resolve()}: not a git repository (check --repo / -C)")
    console.print(reset_study(top).line())


def _print_summary(study: Study) -> None:
    from ratchet.store.ledger import Ledger

    ledger = Ledger(study.state_dir / "ledger.db")
    # the same count, in the same words, as status, progress.png and the report (tally.py)
    tally = Tally.of(ledger)
    emit(console, f"study {study.name}: {tally.text()}")
    if tally.apart():
        emit(console, f"  {tally.apart()}")
    # pooled estimates with their intervals (views.headline), never one re-measure
    head = views.headline(ledger, study.config.metric.name, study.config.metric.goal,
                          study.config.acceptance.noise == "ignore")
    line = head.line()
    if line:
        emit(console, line)
        emit(console, f"  branch ratchet/{study.name} at {str(ledger.study().incumbent.commit)[:7]}")
    if head.noise_ignored:
        emit(console, "warning: acceptance.noise = \"ignore\": keeps rest on one measurement")
    emit_parts(console, spend.summary(ledger).line())  # every call and job, as recorded
    from ratchet.store.ledger import throughput

    shares = throughput(ledger.candidates(confirmations=True), study.busy_slots,
                        ledger.sessions()).shares_line()
    if shares:  # where the slots' time went: candidates, confirming keeps, idle
        emit(console, shares)
    stop = ledger.study().budget_stop
    if isinstance(stop, dict):  # a limit of [budget] stopped it: which one, how to go on
        emit(console, stop["line"])
    ledger.close()


@app.command()
def submit(
    rev: Annotated[str, typer.Argument(metavar="REV", help="commit to evaluate")] = "HEAD",
    message: Annotated[str | None, typer.Option("-m", metavar="TEXT", help="description")] = None,
    base: Annotated[
        str | None, typer.Option(help="where a new study starts (default: HEAD, or REV^ when REV is HEAD)")
    ] = None,
    repo: RepoOption = Path("."),
) -> None:
    """Evaluate REV as a candidate; print its id and return at once."""
    with open_study(repo) as study:
        made = study.submit_rev(rev, message, base)
    only_baseline = not any(cand.kind == Kind.CANDIDATE for cand in made)  # REV is the start
    for cand in made:
        if cand.kind == Kind.CANDIDATE or only_baseline:
            if cand.status == Status.REJECTED:
                err.print(f"{cand.id} rejected: {cand.reasons}", highlight=False)
            console.print(cand.id)
        else:
            err.print(f"{cand.id}: {cand.description} submitted too", highlight=False)


@app.command()
def wait(
    ids: Annotated[list[str], typer.Argument(metavar="ID", help="candidate ids from `ratchet submit`")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    repo: RepoOption = Path("."),
) -> None:
    """Wait for candidates, judge them like the loop does, promote the best improving one."""
    with open_study(repo) as study:
        judged = study.wait_ids(ids)
        metric = study.config.metric.name
        for cand in judged:
            if as_json:
                print(json.dumps(audit.verdict(cand, metric)))
            else:
                value = "—" if cand.metric is None else f"{cand.metric:.6g}"
                console.print(f"{cand.id} {cand.short} {cand.status:8} {metric}={value} "
                              f"{cand.description}  {cand.reasons or ''}", highlight=False)
        incumbent = study.ledger.study().incumbent.commit
        if not as_json:
            console.print(f"incumbent: {str(incumbent)[:7]} (branch ratchet/{study.name})")


@app.command()
def status(
    as_json: Annotated[bool, typer.Option(
        "--json", help="one JSON object: study, round, incumbent, counts, costs, sandbox"
    )] = False,
    repo: RepoOption = Path("."),
) -> None:
    """The study at a glance: incumbent, counts, running jobs, costs, sandbox."""
    with open_study(repo) as study:
        ledger = study.ledger
        metric = study.config.metric.name
        # aggregates in SQL (counts, sums, the evaluations of each commit): a study of
        # 10,000 candidates reads as fast as one of 50 (docs/watching.md)
        counts = ledger.status_counts(confirmations=False)
        # every call and job, as recorded (spend.py); wall time without idle gaps
        spent = spend.summary(ledger)
        # each row's, with its confirmation pairs' compute: all of them for --json, the
        # rows shown for the table
        shown = [] if as_json else ledger.last(30)
        by_row = spend.per_candidate(ledger, None if as_json else [c.id for c in shown])
        wall = spent.wall_hours * 3600
        hypotheses = ledger.count(Kind.CANDIDATE, judged=True)
        # duty cycle and the limit, from the ledger; the confirmation pairs' jobs held
        # slots too: their share is said apart
        busy = ledger.throughput(study.busy_slots)
        # every evaluation of every commit, read once: the headline and the table's rows
        groups = ledger.evaluations()
        head = views.headline(ledger, metric, study.config.metric.goal,
                              study.config.acceptance.noise == "ignore", groups)
        summary: dict[str, Any] = {
            "study": study.name,
            "started": study.started,
            "round": ledger.rounds_done(),  # run so far, not the next
            "incumbent": ledger.study().incumbent.commit,
            "incumbent_id": ledger.study().incumbent.id,
            "metric": metric,
            "goal": study.config.metric.goal,
            "incumbent_metric": ledger.study().incumbent.metric,
            # baseline -> incumbent as pooled estimates with 95% intervals (views.headline)
            "headline": head.as_dict(),
            "false_keep_rate": study.config.acceptance.rate,
            "counts": counts,
            # the candidates by who proposed them: `mcp` for an agent's MCP submissions
            "proposers": ledger.proposer_counts(),
            # candidates and their fates, as the end line, progress.png and the report
            # count them (tally.py): the baseline and re-measures apart
            "tally": Tally.of(ledger).as_dict(),
            "running": ledger.ids(Status.SUBMITTED),
            "job_hours": round(spent.slot_hours, 4),
            "cost_usd": round(spent.usd, 4),
            "tokens": spent.tokens,
            "spend": spent.as_dict(),  # proposer, compute and wasted, as recorded
            "spend_by_candidate": {i: row.as_dict() for i, row in by_row.items()},
            "budget": budget.status(study.config.budget, spent, ledger.made(), ledger),
            "wall_hours": round(spent.wall_hours, 4),
            "hypotheses_per_hour": round(hypotheses / (wall / 3600), 2) if wall > 0 else None,
            "duty_cycle": busy.duty,  # job time / (slots x wall time of the jobs)
            "limit_per_hour": busy.limit_per_hour,  # slots x 3600 / mean run time
            "confirming_share": busy.confirming_share,  # of slot time, confirmation pairs
            "idle_share": busy.idle_share,  # of slot time, no job (1 - duty)
            "sandbox": study.sandbox_status(),  # what a job started here now runs under
            "sandbox_ran": ledger.sandboxes(),  # {sandbox: jobs}: what the jobs ran under
            "network": study.network_status(),
            "agent_sandbox": study.agent_sandbox_status(),
            "backend": study.backend_kind,
        }
        if as_json:
            print(json.dumps(summary))
            return
        if not study.started:
            console.print(f"study {study.name}: not started (run `ratchet run`)")
            return
        # each row's own estimate (its commit's evaluations pooled), as results.tsv has it
        ests = {cand.id: results.estimate_of(cand, groups, head.noise) for cand in shown}
        rows = [(cand.id, str(cand.round), cand.short, cand.status,
                 views.fmt(est.mean) if (est := ests[cand.id]) is not None else "",
                 f"{by_row[cand.id].usd:.4f}", cand.proposer or "", cand.description or "")
                for cand in shown]
        if rows:
            from rich.table import Table

            table = Table(show_edge=False)
            # the short columns keep their width; the description takes the rest on one
            # line. A row's cost is its proposer calls' and its jobs' (`show` splits it);
            # `by` is its proposer (mcp: an agent's submission through `ratchet mcp`)
            for i, col in enumerate(("id", "round", "commit", "status", metric, "cost $",
                                     "by")):
                table.add_column(col, no_wrap=True,
                                 min_width=max([len(col), *(len(row[i]) for row in rows)]))
            table.add_column("description", no_wrap=True, overflow="ellipsis", ratio=1)
            for row in rows:
                table.add_row(*row)
            console.print(table)
        else:
            console.print("no candidates yet (`ratchet run` proposes them)")
        best = summary["incumbent_metric"]
        emit(console,
             f"study {study.name} round {summary['round']}: incumbent "
             f"{summary['incumbent_id'] or ''} {str(summary['incumbent'])[:7]} "
             f"{metric}={'—' if best is None else f'{best:.6g}'}")
        tally = Tally.of(ledger)
        emit(console, tally.text())
        if tally.apart():
            emit(console, f"  {tally.apart()}")
        if summary["proposers"]:
            emit(console, "by proposer: " + ", ".join(
                f"{name} {sum(n.values())} ({', '.join(f'{k} {v}' for k, v in n.items())})"
                for name, n in summary["proposers"].items()))
        line = head.line()
        if line:
            emit(console, line)
            # the spread of one evaluation, in the metric's units (words.noise)
            emit(console, f"  noise of one evaluation: {words.noise(head)}")
        if study.config.acceptance.noise == "ignore":
            emit(console, "warning: acceptance.noise = \"ignore\": a keep rests on one "
                 "measurement, not on a confirmation beyond the noise")
        emit_parts(console, spent.line())
        for line in budget.lines(summary["budget"]):
            emit(console, line)
        ran = sandboxes_text(summary["sandbox_ran"])
        if ran:  # the jobs' own word, which may differ from what this machine gives now
            emit(console, f"sandbox: the jobs ran under {ran}")
            emit(console, f"sandbox now: {summary['sandbox']}")
        else:
            emit(console, f"sandbox: {summary['sandbox']}")
        emit(console, f"network: {summary['network']}")
        if summary["agent_sandbox"]:
            emit(console, f"agents: {summary['agent_sandbox']}")
        if busy.duty is not None:
            # rows that ran (the baseline and re-measures too), not candidates judged: the
            # report's "candidates judged per hour" is the other count, so the unit is said
            emit(console, f"slots {busy.slots}: duty {busy.duty:.0%}, mean run "
                 f"{busy.mean_run_s:.1f} s, limit {busy.limit_per_hour:.0f} runs/h, "
                 f"achieved {busy.per_hour:.0f} runs/h (baseline and re-measures included)")
            emit(console, busy.shares_line())


@app.command()
def logs(
    candidate: Annotated[str, typer.Argument(metavar="ID", help="candidate id, job id or commit")],
    repo: RepoOption = Path("."),
) -> None:
    """Print a candidate's job logs (each phase, capped)."""
    with open_study(repo) as study:
        cand = study.ledger.find(candidate)
        if cand is None:
            fail(f"no candidate {candidate!r} in this study")
        if not cand.job_id:
            fail(f"{cand.id} never ran ({cand.status}: {cand.reasons or 'no job'})")
        text = without_result_lines(study.backend.logs(cand.job_id), cand.id)
        sys.stdout.write(text + ("\n" if text and not text.endswith("\n") else ""))


def without_result_lines(text: str, cand_id: str) -> str:
    """A job's logs as a person reads them: the worker's sealed result (JSON and its MAC,
    the driver's to check) is said in a line, its numbers are `ratchet show`'s."""
    from ratchet.job.jobspec import RESULT_MARKER

    return "\n".join(
        f"(the worker reported its result: `ratchet show {cand_id}`)"
        if line.startswith(RESULT_MARKER) else line for line in text.split("\n"))


@app.command()
def cancel(
    candidate: Annotated[str, typer.Argument(metavar="ID", help="candidate id, job id or commit")],
    repo: RepoOption = Path("."),
) -> None:
    """Cancel a candidate's job; it is recorded as cancelled."""
    with open_study(repo) as study:
        cand = study.cancel(candidate)
        console.print(f"{cand.id} cancelled")


@app.command()
def show(
    candidate: Annotated[str, typer.Argument(metavar="ID", help="candidate id, job id or commit")],
    repo: RepoOption = Path("."),
) -> None:
    """The audit trail of one candidate: diff, phases, verdict and its reasons."""
    with open_study(repo) as study:
        lines, diff = audit.trail(study, audit.row_of(study, candidate))
        for line in lines:
            console.print(line, highlight=False, markup=False)
        if diff:
            console.print(diff, highlight=False, markup=False)


@app.command()
def idea(
    text: Annotated[str, typer.Argument(metavar="TEXT", help="an idea for the next candidates")],
    repo: RepoOption = Path("."),
) -> None:
    """Queue an idea: the next candidates take pending ideas first, one each."""
    if not text.strip():
        fail("an idea needs some text, e.g. ratchet idea \"unroll the inner loop\"")
    with open_study(repo) as study:
        added = study.ledger.add_idea(text)
        console.print("queued" if added else "already queued")
        kind = study.proposer_kind
        known = proposers.proposer_kinds().get(kind)
        cls = known.load() if known is not None else None
        if cls is not None and not cls.takes_ideas:
            emit(err, f"note: the {kind} proposer does not read ideas; it stays pending "
                 "until the study runs with one that does (`--proposer llm` or `agent`)")


@app.command()
def mcp(
    print_config: Annotated[str | None, typer.Option(
        "--print-config", metavar="CLIENT",
        help="print how to register this server with CLIENT (claude, codex, cursor) and exit")] = None,
    http: Annotated[bool, typer.Option(
        "--http", help="streamable HTTP on 127.0.0.1 behind a bearer token, not stdio")] = False,
    port: Annotated[int, typer.Option("--port", help="the --http port (0: a free one)")] = 0,
    repo: RepoOption = Path("."),
) -> None:
    """Serve the study to a coding agent as MCP tools (stdio): study, files, submit, wait, history, show, idea."""
    from ratchet.mcp.config import Client, config_text, where

    if print_config is not None:
        try:
            client = Client(print_config)
        except ValueError:
            fail(f"--print-config: {print_config!r} is not a client; give one of "
                 f"{', '.join(c.value for c in Client)}")
        err.print(f"{client.value}: {where(client)}")
        print(config_text(client, repo))
        return
    with open_study(repo):  # a broken study is one line now, not an error in every tool
        pass
    if not http:
        from ratchet.mcp.server import serve_stdio

        serve_stdio(repo.resolve())
        return
    import secrets
    import socket

    from ratchet.mcp.server import serve_http

    token = os.environ.get("RATCHET_MCP_TOKEN") or secrets.token_urlsafe(24)
    if port == 0:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    serve_http(repo.resolve(), port, token, lambda line: err.print(line))


@app.command()
def report(repo: RepoOption = Path(".")) -> None:
    """Write the HTML report under .ratchet/report/."""
    from ratchet.ui.report import write_report

    with open_study(repo) as study:
        rows = study.ledger.rows_since(None)  # read once for the pages and the chart
        path = write_report(study, rows)
        console.print(f"wrote {path}")
        _write_progress(study, rows)


@app.command()
def serve(
    repo: RepoOption = Path("."),
    host: Annotated[str, typer.Option(
        help="address to listen on; other than loopback it needs --token")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: any free one)")] = 8765,
    token: Annotated[str | None, typer.Option(
        help="required to view the pages (default: $RATCHET_SERVE_TOKEN, else a random "
             "one on loopback; the printed address carries it); needed for any --host but "
             "loopback")] = None,
) -> None:
    """A live, read-only dashboard of the study in your browser (the report's views)."""

    from ratchet.ui.serve import TOKEN_ENV, check_bind, make_server, serve_forever, url_of

    repo = repo.resolve()
    top = gitrepo.work_tree(repo) if repo.is_dir() else None
    if top is None:
        fail(f"{repo}: not a git repository with a study (check --repo / -C)")
    token = token or os.environ.get(TOKEN_ENV) or None
    check_bind(host, token)  # a wrong address is said now, not once a study appears
    _wait_for_study(top)
    server, app = make_server(top, host, port, token)
    # the address on stdout (a script reads it); flushed: the server runs until stopped
    print(f"serving {url_of(app)} (read-only; Ctrl-C to stop)", flush=True)
    def stop(signum, frame) -> None:  # noqa: ARG001
        raise KeyboardInterrupt  # out of serve_forever, which closes the ledger

    signal.signal(signal.SIGTERM, stop)
    with contextlib.suppress(KeyboardInterrupt):
        serve_forever(server, app)


def _wait_for_study(top: Path) -> None:
    """Serving before the first `ratchet run`: wait for the study's ledger to appear
    (read-only: nothing is created here), saying so once."""
    from ratchet.store.ledger import Ledger, LedgerError

    db = top / ".ratchet" / "ledger.db"
    if not db.is_file() and not (top / "ratchet.toml").is_file():
        fail(f"{top}: no ratchet.toml here, so no study will appear to serve (`ratchet init` "
             "writes one; or -C the study's repository)")
    said = False
    while True:
        if db.is_file():
            ready = False
            with contextlib.suppress(LedgerError, sqlite3.Error):  # still being made
                ledger = Ledger.readonly(db)
                try:
                    ready = ledger.study().config is not None  # the study pinned its start
                finally:
                    ledger.close()
            if ready:
                return
        if not said:
            print(f"waiting for a study in {top} (start one with `ratchet run`; Ctrl-C "
                  "to stop)", flush=True)
            said = True
        time.sleep(SERVE_WAIT_S)


SERVE_WAIT_S = 0.5


# -- hand-off: progress.png, log, diff, export (logic in progress / history / export) ------


def _write_progress(study: Study, rows: list[Candidate] | None = None) -> None:
    """progress.png next to results.tsv (a view of the ledger, like results.tsv)."""
    from ratchet.store.ledger import Ledger
    from ratchet.ui.progress import write_progress_png

    ledger = Ledger(study.state_dir / "ledger.db")
    try:
        path = write_progress_png(study.repo, ledger, study.config.metric.name,
                                  study.config.metric.goal, rows)
    finally:
        ledger.close()
    if path is not None:
        err.print(f"wrote {path}")


@app.command("log")
def log_(
    kept: Annotated[bool, typer.Option("--kept", help="only kept candidates")] = False,
    status: Annotated[str | None, typer.Option(
        "--status", help="only this status: keep, discard, crash, rejected, ...")] = None,
    round_: Annotated[int | None, typer.Option("--round", help="only this round")] = None,
    last: Annotated[int | None, typer.Option(
        "--last", min=1, help="only the last N candidates (after the other filters)")] = None,
    repo: RepoOption = Path("."),
) -> None:
    """One line per candidate, like git log --oneline: id, commit, status, metric, gain, cost, description."""
    from ratchet.ui.history import HistoryError, check_status, log_line

    with open_study(repo) as study:
        ledger = study.ledger
        try:
            check_status(status)
        except HistoryError as exc:
            fail(str(exc))
        if kept and status not in (None, Status.KEEP):
            return  # both filters must hold: nothing does
        status = Status.KEEP.value if kept else status
        metric = study.config.metric.name
        # each kept step's spend since the keep before it (spend.py), then the rows a page
        # at a time (SQL filters and order; `--last`: one page), each row's spend with it,
        # printed as they come: a study of 10,000 candidates starts printing at once
        steps, tail = spend.kept_steps(ledger)
        pages = ([ledger.last(last, status=status, round=round_)] if last is not None
                 else _log_pages(ledger, status, round_))
        for rows in pages:
            spent = spend.per_candidate(ledger, [c.id for c in rows])
            sys.stdout.write("".join(log_line(c, metric, spent.get(c.id), steps.get(c.id))
                                     + "\n" for c in rows))
            sys.stdout.flush()
        # the whole study's, on stderr like `diff`'s header: stdout stays a line a row
        emit(err, spend.summary(ledger).line())
        if tail.calls or tail.candidates:
            emit(err, f"since the last keep, not kept yet: {tail.text()}")


def _log_pages(ledger: Ledger, status: str | None, round_: int | None,
               size: int = 500) -> Iterator[list[Candidate]]:
    """Every row under the filters, `size` at a time, in order."""
    offset = 0
    while True:
        rows, _ = ledger.page(offset, size, status=status, round=round_)
        if not rows:
            return
        yield rows
        offset += len(rows)


@app.command("diff")
def diff_(
    a: Annotated[str, typer.Argument(help="candidate id or commit, `incumbent` or `baseline`")],
    b: Annotated[str, typer.Argument(help="candidate id or commit, `incumbent` or `baseline`")],
    repo: RepoOption = Path("."),
) -> None:
    """The diff from A to B: two candidates, or a candidate and the incumbent or baseline."""
    from ratchet.ui.history import HistoryError, diff

    with open_study(repo) as study:
        try:
            rev_a, rev_b, text = diff(study.repo, study.ledger, a, b)
        except HistoryError as exc:
            fail(str(exc))
        err.print(f"diff {rev_a.label} {rev_a.commit[:7]} -> {rev_b.label} {rev_b.commit[:7]}"
                  + ("" if text else ": no difference"))
        if text:
            sys.stdout.write(text + "\n")


@app.command("export")
def export_(
    name: Annotated[str, typer.Argument(help="the branch to create")],
    squash: Annotated[bool, typer.Option("--squash", help="one commit with the whole story")] = False,
    force: Annotated[bool, typer.Option("--force", help="replace an existing branch NAME")] = False,
    repo: RepoOption = Path("."),
) -> None:
    """Create branch NAME from the study start: one commit per kept step (HEAD untouched)."""
    from ratchet.ui.export import ExportError, StudyView, export

    with open_study(repo) as study:
        view = StudyView(study.repo, study.ledger, study.name, study.config.metric.name,
                         study.config.metric.goal)
        try:
            done = export(view, name, squash=squash, force=force)
        except ExportError as exc:
            fail(str(exc))
        steps = f"{len(done.steps)} kept step{'s' * (len(done.steps) != 1)}"
        how = "squashed into 1 commit" if squash else f"{len(done.commits)} commit(s)"
        console.print(f"branch {name} at {done.tip[:7]}: {steps}, {how}, on the study start "
                      f"{str(study.ledger.study().pinned)[:7]}; its tree is the incumbent's"
                      + (f" (replaced {done.replaced[:7]})" if done.replaced else ""))


# -- profile: the model under its workload (logic in ratchet.evaluator.kernels.profile) -----


@app.command("profile")
def profile_(
    workload: Annotated[Path, typer.Argument(help="the workload TOML: model module, serving-mix points, dtype, mode")],
    out: Annotated[Path, typer.Option("--out", "-o", help="where workload.json goes")] = Path("workload.json"),
    holdout_dir: Annotated[Path | None, typer.Option(
        "--holdout-dir", help="the full profile goes here, --out gets it without the hold-out shapes")] = None,
    model_md: Annotated[Path | None, typer.Option("--model-md", help="also write model.md for proposers")] = None,
    skip_peaks: Annotated[bool, typer.Option(
        "--skip-peaks", help="leave the roofline columns empty (no peak measurement)")] = False,
) -> None:
    """Profile a model under a declared workload: workload.json, the ranked table, model.md."""
    from ratchet.evaluator.kernels.profile import write_profile

    try:
        _, lines = write_profile(workload, out=out, holdout_dir=holdout_dir, model_md=model_md, roofline=not skip_peaks,
                                 log=lambda line: err.print(line))
    except UserError as exc:
        fail(str(exc))
    for line in lines:
        console.print(line)


def _whole_summaries() -> None:
    """`ratchet --help` lists each command with its docstring's first sentence, whole:
    click would cut it to fit ("keep the..."). Runs after every command is defined."""
    for info in app.registered_commands:
        doc = info.callback.__doc__ if info.callback else None
        if info.short_help is None and doc:
            info.short_help = " ".join(doc.strip().split("\n\n")[0].split())


_whole_summaries()  # keep this after the last command


def _by_ctrl_c(exc: BaseException) -> bool:
    """A KeyboardInterrupt somewhere in the chain of causes (not `ratchet run`'s own stop,
    which says what it stopped and exits 130 itself)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def main() -> None:
    """The `ratchet` command: a user error or a fault of this machine (OSError), from any
    command, is one line and exit 2; anything else is a bug and keeps its traceback."""
    try:
        app()
    except SystemExit as exc:
        if exc.code == 130 and _by_ctrl_c(exc):  # typer turned Ctrl-C into a silent exit
            err.print("interrupted (Ctrl-C): what was recorded stays; run the command "
                      "again to go on")
        raise
    except UserError as exc:
        err.print(Text.assemble(("error:", "bold red"), " ", str(exc)))
        sys.exit(2)
    except (sqlite3.Error, OSError) as exc:  # this machine's fault, not the study's
        fault = infra.as_fault(exc)  # ledger locked or corrupted, disk full, read-only
        if fault is not None:
            err.print(Text.assemble(("error:", "bold red"), " ", str(fault)))
            sys.exit(2)
        if not isinstance(exc, OSError):
            raise
        err.print(Text.assemble(("error:", "bold red"), " ", f"{exc} (fix it on this "
                                "machine, then run the command again: what is recorded "
                                "stays)"))
        sys.exit(2)


if __name__ == "__main__":
    main()
