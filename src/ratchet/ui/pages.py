"""The study's views as HTML: one set of functions for two outputs.

`ratchet report` writes them to static files (`report.py`); `ratchet serve` sends them
live (`serve.py`). Both call the functions here with a `Site` that says how links are
made, so the static page and the live one can never disagree about a number.

Headline numbers are the pooled estimates (`views.headline`: every evaluation of a
commit with a 95% interval), never the latest re-measure.

Every text a proposer or a candidate controls (descriptions, reasons, ideas, params,
diffs, logs, the proposer's context, a dispatch.json in its tree) is untrusted: it goes
through `_e` (HTML-escaped, quotes too). The pages' Content-Security-Policy (no script
for the report; only the server's own nonce-tagged script for the live page) is the
second wall, should an escape ever be missed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ratchet.core.candidate import Candidate
from ratchet.core.vocab import OPEN, Kind, Status
from ratchet.driver import views
from ratchet.job import gitrepo, sandbox
from ratchet.job.fingerprint import fingerprint_key, software_key
from ratchet.ui import charts, compare, knobs, slots
from ratchet.ui.blocks import (
    COLORS,
    CONTEXT_LIMIT,
    CSS,
    KERNEL_KEYS,
    LOG_TAIL_BYTES,
    PHASE_COLORS,
    ROOFLINE_KEYS,
    Machines,
    Site,
    Snapshot,
    StudyLike,
    _badge,
    _e,
    _num,
    card,
    diff_html,
    diff_section,
    duration,
    kv_table,
    log_under,
    read_tail,
    table,
    td,
)
from ratchet.ui.history import Share, success_shares
from ratchet.ui.svg import Chart

if TYPE_CHECKING:
    pass

# ---------------------------------------------------------------------------------------
# overview


def header(study: StudyLike, snap: Snapshot, title: str) -> str:
    """The title line and the headline cards: pooled estimates, 95% intervals."""
    from ratchet.driver import words
    from ratchet.driver.tally import Tally

    ledger, metric, goal, head = study.ledger, snap.metric, snap.goal, snap.head
    inc = head.incumbent
    # proposed changes, as the end line, status and progress.png count them (tally.py)
    cards = [card("candidates", str(Tally.of(ledger).candidates), "candidates")]
    if head.baseline is not None:
        cards.append(card(f"baseline {metric}", _e(head.baseline.text()), "baseline"))
    cards.append(card(f"incumbent {metric} ({goal})", _e(inc.text()) if inc else "—",
                      "incumbent"))
    if head.change is not None:  # + is better, whatever the goal
        cards.append(card("change vs baseline", _e(words.change(head)), "change"))
    cards.append(card("noise (1 evaluation)", _e(words.noise(head)), "noise"))
    cards.append(card("false-keep rate", f"{study.config.acceptance.rate:.3g}"
                      + (' <b class="warn">noise ignored</b>' if head.noise_ignored else ""),
                      "rate"))
    incumbent = ledger.study().incumbent.commit
    if incumbent:
        cards.append(card("incumbent", f"{_e(ledger.study().incumbent.id or '')} "
                          f"<code>{_e(str(incumbent)[:7])}</code>", "incumbent-id"))
    return (
        f"<h1>{_e(title)}</h1>"
        f'<div class="sub">{_e(str(study.repo))} · metric <code>{_e(metric)}</code>, goal '
        f"{_e(goal)} · round {_e(views.rounds_done(ledger.study().round, snap.cands))} · "
        f"branch <code>ratchet/{_e(study.name)}</code></div>"
        f'<div class="cards">{"".join(cards)}</div>'
    )


def candidate_network(study: StudyLike) -> str:
    """What network candidates' code has: said as a warning when it is open."""
    text = sandbox.describe_network(study.config.task.network, study.config.backend.sandbox)
    kind = "warn" if text.startswith("OPEN") else "note"
    return f'<p class="{kind}" id="network">network: {_e(text)}</p>'


def agent_sandbox(study: StudyLike) -> str:
    """What confined the coding agents (said loudly when nothing did)."""
    describe = getattr(study, "agent_sandbox_status", None)
    text = describe() if describe else None
    if not text:
        return ""
    kind = "warn" if "UNSANDBOXED" in text else "note"
    return f'<p class="{kind}">agents: {_e(text)}</p>'


def tally(study: StudyLike) -> str:
    """The count the end line, `status` and progress.png give, in their words (tally.py),
    and the sandbox the jobs ran under (their own word)."""
    from ratchet.driver.tally import Tally, sandboxes_text

    ran = sandboxes_text(study.ledger.sandboxes())
    return (f'<p id="tally">{_e(Tally.of(study.ledger).line())}</p>'
            + (f'<p class="note" id="sandbox">the jobs ran under {_e(ran)}</p>' if ran else ""))


def counts(cands: list[Candidate]) -> str:
    by: dict[str, int] = {}
    for c in cands:
        by[c.status] = by.get(c.status, 0) + 1
    order = [s for s in COLORS if s in by] + sorted(s for s in by if s not in COLORS)
    if not order:
        return '<p class="note">no candidates yet: run `ratchet run` or `ratchet submit`.</p>'
    rows = [[td(_badge(s)), td(str(by[s]), "num")] for s in order]
    return "<h2>Counts by status</h2>" + table(["status", "candidates"], rows)


def job_state(study: StudyLike, job_id: str | None) -> dict[str, Any]:
    """What the worker says of a running job (the local backend's state file): its phase
    and when that phase began; {} where the engine keeps no such file."""
    if not job_id or "/" in job_id or job_id.startswith("."):
        return {}
    try:
        data = json.loads((study.state_dir / "jobs" / job_id / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def slot_holders(study: StudyLike) -> dict[str, str]:
    """{job id: slot} from the local backend's slot lock files, each of which names the
    job that last leased it (read only: taking the lock would get in a job's way)."""
    holders = {}
    for lock in sorted((study.state_dir / "slots").glob("*.lock")):
        try:
            job_id = lock.read_text(errors="replace").split()[0]
        except (OSError, IndexError):
            continue
        holders[job_id] = lock.stem
    return holders


def running_now(study: StudyLike, snap: Snapshot, site: Site) -> str:
    """The jobs in flight (phase, time in it, elapsed, slot) and the proposer's work."""
    in_flight = [c for c in snap.everything if c.status in OPEN]
    out = ["<h2>Running now</h2>"]
    jobs = [c for c in in_flight if c.status in (Status.SUBMITTED, Status.FINISHED)]
    if jobs:
        rows = []
        holders = slot_holders(study)
        for c in jobs:
            state = job_state(study, c.job_id)
            phase = state.get("phase") if c.status == Status.SUBMITTED else "judging"
            since = state.get("t")
            in_phase = snap.now - since if isinstance(since, int | float) else None
            rows.append([
                td(f'<a href="{_e(site.candidate(c.id))}">{_e(c.id)}</a>'),
                td(_e(c.kind)),
                # no state file: the worker has not started here, or the job runs on
                # another machine, whose engine the ledger does not ask
                td(_e(phase or state.get("state") or "placed")),
                td(duration(in_phase), "num"),
                td(duration(snap.now - c.submitted_at) if c.submitted_at else "", "num"),
                td(_e(c.slot or holders.get(c.job_id or "", ""))),
                td(_e(c.description), "text"),
            ])
        out.append(table(["candidate", "kind", "phase", "in phase", "elapsed", "slot",
                          "description"], rows, table_id="running"))
    else:
        out.append('<p class="note" id="running-none">no job is running.</p>')
    proposing = [c for c in in_flight if c.status in (Status.PROPOSED, Status.COMMITTED,
                                                      Status.INTERRUPTED)]
    proposer = study.config.search.proposer
    if proposing:
        items = "".join(f"<li>{_e(c.id)} {_e(c.status)}: {_e(c.description)}</li>"
                        for c in proposing[:12])
        out.append(f"<p>proposer <code>{_e(proposer)}</code>: {len(proposing)} "
                   f"proposal{'s' * (len(proposing) != 1)} not placed yet</p><ul>{items}</ul>")
    else:
        out.append(f'<p class="note">proposer <code>{_e(proposer)}</code>: nothing waiting '
                   "to be placed.</p>")
    last = next(iter(study.ledger.db.execute(
        "SELECT t, candidate, kind FROM events ORDER BY id DESC LIMIT 1")), None)
    if last is not None:
        out.append(f'<p class="note">last event: {_e(last["kind"])} {_e(last["candidate"] or "")} '
                   f"{duration(max(0.0, snap.now - last['t']))} ago</p>")
    return "".join(out)


def judged_per_hour(study: StudyLike, snap: Snapshot) -> float | None:
    """Candidates judged per hour of the study's wall time (while a session or a job ran,
    not the idle gaps between sessions): the costs table's figure and the throughput
    chart's mean, one number."""
    wall_h = snap.spent(study.ledger).wall_hours
    judged = sum(1 for c in snap.cands if c.kind == Kind.CANDIDATE and c.is_judged)
    return judged / wall_h if wall_h > 0 else None


def costs(study: StudyLike, snap: Snapshot) -> str:
    """Job time, duty and its limit, spend (and against a budget, where one is set)."""
    cands = snap.cands
    spent = snap.spent(study.ledger)  # every proposer call and job, as recorded
    queue_s = sum(c.queue_s or 0.0 for c in cands)
    wall = spent.wall_hours * 3600  # while a session or a job ran, not the idle gaps
    per_hour = judged_per_hour(study, snap)
    slots = study.busy_slots
    facts = [
        ("job hours (GPU/CPU slot-hours)", f"{spent.slot_hours:.4f}"),
        ("queue hours", f"{queue_s / 3600:.4f}"),
        ("wall time", duration(wall) if wall > 0 else ""),
        ("candidates judged per hour", f"{per_hour:.1f}" if per_hour is not None else ""),
    ]
    # how busy the slots were (confirmation pairs included, and their share said apart)
    busy = study.ledger.throughput(slots)
    if busy.duty is not None:
        facts += [
            (f"duty cycle ({slots} slot{'s' * (slots != 1)})", f"{busy.duty:.0%}"),
            ("slot time confirming keeps", f"{busy.confirming_share or 0.0:.0%}"),
            ("slot time idle", f"{busy.idle_share or 0.0:.0%}"),
            ("limit: runs per hour at full duty", f"{busy.limit_per_hour:.0f}"),
        ]
    facts += spend_facts(study, snap)
    return "<h2>Costs</h2>" + kv_table(facts, "num")


def token_usage(cand: Candidate) -> dict[str, float]:
    """The proposal's model usage as the proposer recorded it (params.llm)."""
    usage = (cand.params or {}).get("llm") if isinstance(cand.params, dict) else None
    if not isinstance(usage, dict):
        return {}
    return {k: float(v) for k, v in usage.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def spend_facts(study: StudyLike, snap: Snapshot) -> list[tuple[str, str]]:
    """Spend as the ledger records it (driver/spend.py): proposer calls and tokens,
    compute, waste, and each [budget] limit against what is used of it."""
    from ratchet.driver import budget

    spent = snap.spent(study.ledger)
    facts = [
        ("cost (USD)", f"{spent.usd:.4f}"),
        ("proposer (USD)", f"{spent.proposer_usd:.4f} ({spent.calls} calls)"),
        ("model tokens in / out", f"{spent.input_tokens:,} / {spent.output_tokens:,}"),
        ("compute (USD)", f"{spent.compute_usd:.4f}"),
        ("wasted (USD): unused proposals, crashed and rejected candidates",
         f"{spent.wasted_usd:.4f} ({spent.unused_calls} unused calls)"),
    ]
    limits = getattr(study.config, "budget", None)
    if limits is not None:
        used = budget.used(spent, snap.cands)
        for name, allowed in limits.limits.items():
            facts.append((f"budget.{name}", f"{budget.show(name, used[name])} of "
                          f"{budget.show(name, allowed)} ({used[name] / allowed:.0%})"))
    return facts


def overview_sections(study: StudyLike, snap: Snapshot, site: Site) -> list[str]:
    """The overview page, for the report's index.html and the live "/" alike."""
    return [make() for _name, _walks, make in overview_parts(study, snap, site)]


def overview_parts(study: StudyLike, snap: Snapshot, site: Site
                   ) -> list[tuple[str, bool, Callable[[], str]]]:
    """The overview's parts in order: (name, whether it walks every row, how to make
    it). The live page makes a part that walks every row less often on a large study
    (serve.Parts); the others each time."""
    return [
        ("network", False, lambda: candidate_network(study)),
        ("agents", False, lambda: agent_sandbox(study)),
        ("machine-warning", True, lambda: machine_warning(snap.hosts)),
        ("chart", True, lambda: "<h2>Metric over candidates</h2>"
         + charts.overview_metric(snap, site)),
        ("tally", False, lambda: tally(study)),
        ("counts", False, lambda: counts(snap.cands)),
        ("running", False, lambda: running_now(study, snap, site)),
        ("costs", True, lambda: costs(study, snap)),
        ("tuner", True, lambda: knobs.tuner_view(study, snap, site)),
        ("training", False, lambda: training_view(study, snap)),
        ("kernel", True, lambda: kernel_view(study, snap)),
        ("shares", True, lambda: "<h2>Success shares</h2>" + shares(snap.cands)),
        ("roofline", True, lambda: roofline(study, snap)),
        ("timeline", True, lambda: slots.slot_timeline(snap, site)),
        ("throughput", True, lambda: slots.throughput_chart(snap, judged_per_hour(study, snap))),
        ("phases", True, lambda: "<h2>Phase durations</h2>" + charts.phase_chart(snap.cands, site)
         + phase_table(snap.cands)),
        ("incumbent", False, lambda: "<h2>Incumbent</h2>" + incumbent(study, snap)),
        ("machines", True, lambda: "<h2>Machines</h2>" + machines(snap.hosts)),
    ]


# ---------------------------------------------------------------------------------------
# the candidates table


PAGE_ROWS = 200  # the most rows one page of the candidates table shows


def candidate_table(study: StudyLike, snap: Snapshot, site: Site,
                    page: list[Candidate] | None = None) -> str:
    """The candidates' table: `page` (one page of it, Ledger.page), else every row."""
    cands = snap.cands if page is None else page
    if not cands:
        return '<p class="note">no candidates.</p>'
    from ratchet.driver.spend import RowSpend, per_candidate

    head = ["id", "round", "commit", "status", snap.metric, "gain", "margin", "noise",
            "hold-out", "phases", "proposer $", "compute $", "proposer", "idea",
            "description", "reasons", "machine"]
    # each row's calls, jobs and confirmation pairs (of the rows shown)
    spent = per_candidate(study.ledger, None if page is None else [c.id for c in cands])
    rows, classes = [], []
    for c in cands:
        mine = spent.get(c.id, RowSpend())
        desc = _e(c.description)
        if c.kind != Kind.CANDIDATE:
            desc = f"<b>{_e(c.kind)}</b>" + (f": {desc}" if desc and desc != _e(c.kind) else "")
        rows.append([
            td(f'<a href="{_e(site.candidate(c.id))}"><span id="{_e(c.id)}">{_e(c.id)}</span></a>',
               sort=c.seq),
            td(_e(c.round), "num"),
            td(f"<code>{_e(c.short)}</code>"),
            td(_badge(c.status), sort=c.status),
            td(_num(c.metric), "num", sort=c.metric if c.metric is not None else ""),
            td(_num(c.gain, ".4g"), "num", sort=c.gain if c.gain is not None else ""),
            td(_num(c.margin, ".4g"), "num", sort=c.margin if c.margin is not None else ""),
            td(_num(c.noise, ".4g"), "num", sort=c.noise if c.noise is not None else ""),
            td(_num(c.holdout), "num", sort=c.holdout if c.holdout is not None else ""),
            td(phase_cell(c, study.state_dir, site), sort=sum(
                float(p.get("seconds") or 0) for p in c.phases or [])),
            td(f"{mine.proposer_usd:.4f}", "num", sort=mine.proposer_usd),
            td(f"{mine.compute_usd:.4f}", "num", sort=mine.compute_usd),
            td(_e(c.proposer or "")),
            td(_e(c.idea or ""), "text"),
            td(desc, "text"),
            td(_e(c.reasons), "text"),
            td(snap.hosts.cell(c)),
        ])
        classes.append("keep" if c.status == Status.KEEP else "")
    return table(head, rows, classes, table_id="candidates", sortable=True)


def candidate_filters(snap: Snapshot) -> str:
    """The live table's filter controls (the live page's script reads them)."""
    statuses = sorted({c.status for c in snap.cands})
    options = "".join(f'<option value="{_e(s)}">{_e(s)}</option>' for s in statuses)
    return ('<div class="filters"><input id="filter-text" type="search" '
            'placeholder="filter: text in any column" size="36">'
            f'<select id="filter-status"><option value="">any status</option>{options}'
            "</select></div>")


def phase_cell(cand: Candidate, state_dir: Path, site: Site) -> str:
    parts = []
    for p in cand.phases or []:
        label = f"{p.get('name', '?')} {duration(p.get('seconds'))}"
        if p.get("timed_out"):
            label += " (timed out)"
        elif p.get("exit_code") not in (0, None):
            label += f" (exit {p.get('exit_code')})"
        href = site.log(cand, p, state_dir)
        parts.append(f'<a href="{_e(href)}">{_e(label)}</a>' if href else _e(label))
    return "<br>".join(parts)


# ---------------------------------------------------------------------------------------
# one candidate


def candidate_page(study: StudyLike, snap: Snapshot, cand: Candidate, site: Site,
                   against_incumbent: bool = True) -> str:
    """Everything about one candidate: verdict and every reason, numbers, diffs against
    its parent and the incumbent, phases with log tails, the proposer's context.
    `against_incumbent` False (the report's pages, written once): nothing that moves
    with the incumbent after the verdict (its diff, its training curve overlaid)."""
    metric = snap.metric
    est = snap.estimate(cand.commit_sha)
    usage = token_usage(cand)
    facts = [
        ("status", _badge(cand.status)),
        ("kind", _e(cand.kind)),
        ("round", _e(cand.round)),
        ("commit", f"<code>{_e(cand.commit_sha or 'none: the proposal was not applied')}</code>"),
        ("parent", f"<code>{_e(cand.parent or '')}</code>"),
        ("proposer", _e(cand.proposer or "")),
        ("idea", _e(cand.idea or "")),
        (metric, _num(cand.metric)),
        (f"{metric}, pooled over its commit's evaluations", _e(est.text()) if est else ""),
        ("samples", _e(views.fmt(cand.samples)) if cand.samples else ""),
        ("gain", _num(cand.gain, ".4g")),
        ("margin", _num(cand.margin, ".4g")),
        ("noise", _num(cand.noise, ".4g")),
        (f"hold-out {metric}", _num(cand.holdout)),
        ("slot", _e(cand.slot or "")),
        ("queued", duration(cand.queue_s)),
        ("ran", duration(cand.run_s)),
        ("compute cost (USD)", f"{cand.cost_usd:.4f}" if cand.cost_usd is not None else ""),
    ]
    from ratchet.driver.spend import candidate_lines

    # its proposer calls (each request, each agent run) and its compute, as recorded
    facts += [("spend", _e(line)) for line in candidate_lines(study.ledger, cand.id, snap.steps,
                                                              snap.row_spend)]
    if usage:
        facts.append(("model usage", _e(", ".join(f"{k} {views.fmt(v)}" for k, v in usage.items()))))
    if cand.confirms:
        facts.append(("confirms", f'<a href="{_e(site.candidate(cand.confirms))}">{_e(cand.confirms)}</a>'))
    params = {k: v for k, v in (cand.params or {}).items() if k != "llm"}
    if params:
        facts.append(("params", f"<code>{_e(json.dumps(params, default=str, sort_keys=True))}</code>"))
    out = [f"<h1>{_e(cand.id)} {_badge(cand.status)}</h1>",
           f'<p class="sub" id="description">{_e(cand.description)}</p>',
           compare.links(snap, cand, site),
           "<h2>Verdict</h2>", verdict(cand),
           kv_table([(k, v) for k, v in facts if v]),
           remeasures(snap, cand, site),
           extra_metrics(cand),
           shape_table(study, cand),
           "<h2>Diff against its parent</h2>",
           diff_section(study, cand.parent, cand.commit_sha, snap.diffs),
           "<h2>Diff against the incumbent</h2>",
           diff_section(study, study.ledger.study().incumbent.commit, cand.commit_sha, snap.diffs)
           if against_incumbent else
           f'<p class="note" id="against-incumbent">written once, at its verdict: what the '
           f'study kept since is on <a href="{_e(site.index())}">the overview</a> '
           f"(<code>git diff INCUMBENT {_e(cand.short)}</code>).</p>",
           "<h2>Phases</h2>", phases(study, cand, site),
           training_view(study, snap, only=cand, overlay=against_incumbent),
           "<h2>The context the proposer saw</h2>", context(study, cand)]
    return "".join(out)


def verdict(cand: Candidate) -> str:
    if not cand.is_judged:
        return f'<p id="verdict">not judged yet: {_e(cand.status)}</p>'
    reasons = [r.strip() for r in re.split(r";\s+", cand.reasons or "") if r.strip()]
    code = f" <code>{_e(cand.code)}</code>" if cand.code else ""
    items = "".join(f"<li>{_e(r)}</li>" for r in reasons) or "<li>no reason recorded</li>"
    return f'<div id="verdict"><p>{_badge(cand.status)}{code}</p><ul class="reasons">{items}</ul></div>'


def remeasures(snap: Snapshot, cand: Candidate, site: Site) -> str:
    """The confirmation pairs of this candidate, and every other measurement of its commit."""
    rows = snap.related(cand)
    if not rows:
        return ""
    body = [[td(f'<a href="{_e(site.candidate(r.id))}">{_e(r.id)}</a>'), td(_e(r.kind)),
             td(f"<code>{_e(r.short)}</code>"), td(_badge(r.status)), td(_num(r.metric), "num"),
             td(_e(r.description), "text")] for r in rows]
    return "<h3>Other measurements</h3>" + table(["id", "kind", "commit", "status", snap.metric,
                                                   "what"], body)


def extra_metrics(cand: Candidate) -> str:
    extra = {k: v for k, v in (cand.extra or {}).items() if not isinstance(v, dict | list)}
    if not extra:
        return ""
    return "<h3>Other metrics the evaluator reported</h3>" + kv_table(
        [(k, _e(views.fmt(v))) for k, v in sorted(extra.items())], "num")


def live_logs(study: StudyLike, job_id: str | None) -> list[Path]:
    """The phase logs a running job is writing (the local backend's job folder)."""
    if not job_id or "/" in job_id or job_id.startswith("."):
        return []
    return sorted((study.state_dir / "jobs" / job_id / "logs").glob("*.log"))


def phases(study: StudyLike, cand: Candidate, site: Site) -> str:
    if not cand.phases and cand.status == Status.SUBMITTED:
        logs = live_logs(study, cand.job_id)
        if not logs:
            return '<p class="note">running; no log written yet.</p>'
        out = ['<p class="note">running: the logs so far (their tails)</p>']
        for log in logs:
            tail, _ = read_tail(log, LOG_TAIL_BYTES)
            out.append(f'<h3>{_e(log.stem)} log</h3><pre class="log" data-phase="{_e(log.stem)}">'
                       f"{_e(tail) or '(empty)'}</pre>")
        return "".join(out)
    if not cand.phases:
        return '<p class="note">no phase has run.</p>'
    out = []
    rows = [[td(f"<code>{_e(p.get('name'))}</code>"), td(_e(p.get("exit_code")), "num"),
             td(duration(p.get("seconds")), "num"), td("yes" if p.get("timed_out") else ""),
             td(_e(p.get("command")), "text")] for p in cand.phases]
    out.append(table(["phase", "exit", "duration", "timed out", "command"], rows))
    for p in cand.phases:
        rel = log_under(p.get("log"), study.state_dir)
        name = _e(p.get("name"))
        if rel is None:
            out.append(f'<h3>{name}</h3><p class="note">no log under .ratchet/.</p>')
            continue
        tail, before = read_tail(study.state_dir / rel, LOG_TAIL_BYTES)
        href = site.log(cand, p, study.state_dir)
        more = (f'<p class="note">the last {LOG_TAIL_BYTES} bytes; {before} before them: '
                f'<a href="{_e(href)}">the whole log</a></p>' if before else "")
        out.append(f'<h3>{name} log</h3>{more}<pre class="log" data-phase="{name}">'
                   f"{_e(tail) or '(empty)'}</pre>")
    return "".join(out)


def context(study: StudyLike, cand: Candidate) -> str:
    """The context file the proposer was given (only one under .ratchet/ is read)."""
    rel = log_under(cand.context_path, study.state_dir)
    if rel is None:
        return '<p class="note">none recorded (tuner and submitted candidates have none).</p>'
    try:
        text = (study.state_dir / rel).read_text(errors="replace")
    except OSError as exc:
        return f'<p class="note">unreadable: {_e(exc)}</p>'
    cut = f"\n… {len(text) - CONTEXT_LIMIT} more characters" if len(text) > CONTEXT_LIMIT else ""
    return f'<pre class="log">{_e(text[:CONTEXT_LIMIT])}{_e(cut)}</pre>'


# ---------------------------------------------------------------------------------------
# research views: tuner, training, kernels (each shown only where its data exists)


CURVE_STEP = re.compile(r"\bstep\s*[:=]?\s*(\d+)", re.IGNORECASE)
CURVE_VALUES = re.compile(r"\b(loss|val_loss|train_loss|tok/s|tokens/s|tokens_per_s|tok_per_s)"
                          r"\s*[:=]?\s*([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)", re.IGNORECASE)


def run_curve(study: StudyLike, cand: Candidate) -> dict[str, list[tuple[float, float]]]:
    """The intermediate metrics a training run printed in its `run` log, per step:
    lines such as `step 100 | loss 3.21 | tok/s 51234`. These are the candidate's own
    output (shown, never judged), read from a log under .ratchet/ only."""
    run = next((p for p in cand.phases or [] if p.get("name") == "run"), None)
    rel = log_under(run.get("log") if run else None, study.state_dir)
    path = study.state_dir / rel if rel is not None else None
    if path is None and cand.status == Status.SUBMITTED:  # training now: its log so far
        path = next((p for p in live_logs(study, cand.job_id) if p.stem == "run"), None)
    if path is None:
        return {}
    text, _ = read_tail(path, 400_000)
    curves: dict[str, list[tuple[float, float]]] = {}
    for line in text.splitlines():
        step = CURVE_STEP.search(line)
        if not step:
            continue
        for name, value in CURVE_VALUES.findall(line):
            key = "tokens/s" if "/" in name or "per_s" in name else name.lower()
            curves.setdefault(key, []).append((float(step.group(1)), float(value)))
    return curves


def training_view(study: StudyLike, snap: Snapshot, only: Candidate | None = None,
                  overlay: bool = True) -> str:
    """Loss (and tokens/s) against step for each candidate, the incumbent's overlaid
    (unless not `overlay`)."""
    if not study.config.task.run:
        return ""
    inc_id = study.ledger.study().incumbent.id if overlay else None
    incumbent = snap.by_id(inc_id) if inc_id else None
    chosen = [only] if only is not None else [
        c for c in snap.cands if c.phases or c.status == Status.SUBMITTED][-8:]
    series = {c.id: run_curve(study, c) for c in chosen}
    if incumbent is not None and incumbent.id not in series:
        series[incumbent.id] = run_curve(study, incumbent)
    names = list(dict.fromkeys(k for curves in series.values() for k in curves))
    if not names:
        return ""
    out = ["<h2>Training: intermediate metrics per step</h2>",
           '<p class="note">as each run printed them in its run log (the candidate\'s own '
           "output, not a measurement of ratchet's); the incumbent dashed.</p>"]
    for name in names:
        chart = Chart(title=f"{name} against step", xlabel="step", ylabel=name, width=620,
                      height=280)
        for i, (cid, curves) in enumerate(series.items()):
            pts = curves.get(name)
            if not pts:
                continue
            is_inc = incumbent is not None and cid == incumbent.id
            cand = snap.by_id(cid)
            running = cand is not None and cand.status == Status.SUBMITTED
            chart.line([s for s, _ in pts], [v for _, v in pts],
                       COLORS["keep"] if is_inc else PHASE_COLORS[i % len(PHASE_COLORS)],
                       label=f"{cid}{' (incumbent)' if is_inc else ' (running)' if running else ''}",
                       dash=is_inc,
                       attrs={"data-id": cid, "data-series": name})
        out.append(f'<div style="display:inline-block;width:49%;min-width:420px">{chart.render()}</div>')
    return "".join(out)


# the columns of ratchet.kernels' SweepReport.table(), one whitespace-free token each
SHAPE_COLUMNS = ("shape", "dtype", "set", "ok", "base ms", "cand ms", "sem%", "speedup",
                 "%roof", "bound", "calls")


def shape_rows(study: StudyLike, cand: Candidate) -> list[dict[str, str]]:
    """The per-shape table a kernel evaluator printed (`SweepReport.table()`) in the
    candidate's evaluate log: one row per shape x dtype, with the guards that fired. As
    the evaluator printed it (the candidate's code runs in that process too): shown,
    never judged."""
    phase = next((p for p in cand.phases or [] if str(p.get("name", "")).startswith("evaluate")), None)
    rel = log_under(phase.get("log") if phase else None, study.state_dir)
    if rel is None:
        return []
    text, _ = read_tail(study.state_dir / rel, 400_000)
    rows: list[dict[str, str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:2] != ["shape", "dtype"] or i + 1 >= len(lines) \
                or not lines[i + 1].startswith("---"):
            continue
        rows = []  # the last table printed is the one that counts
        for row in lines[i + 2:]:
            if row.startswith("    ") and row.strip()[:1] in ("!", "?") and rows:
                rows[-1]["notes"] = (rows[-1].get("notes", "") + " " + row.strip()).strip()
                continue
            cells = row.split()
            if len(cells) != len(SHAPE_COLUMNS):
                break
            rows.append(dict(zip(SHAPE_COLUMNS, cells, strict=True)))
    return rows[:2000]


def shape_table(study: StudyLike, cand: Candidate) -> str:
    rows = shape_rows(study, cand)
    if not rows:
        return ""
    cols = [*SHAPE_COLUMNS, "notes"]
    numeric = {"base ms", "cand ms", "sem%", "speedup", "%roof", "calls"}
    body = [[td(_e(r.get(k, "")), "num" if k in numeric else "text") for k in cols] for r in rows]
    return (f"<h3>Per shape ({len(rows)} shape{'s' * (len(rows) != 1)}, as the evaluator "
            "printed them)</h3>" + table(cols, body, table_id=f"shapes-{cand.id}"))


def kernel_view(study: StudyLike, snap: Snapshot) -> str:
    """The incumbent's kernel figures (the kernel harness's sweep metrics), its per-shape
    table (from its evaluate log), and its dispatch choices (dispatch.json)."""
    inc_id = study.ledger.study().incumbent.id
    cand = snap.by_id(inc_id) if inc_id else None
    extra = (cand.extra or {}) if cand else {}
    figures = [(k, extra[k]) for k in KERNEL_KEYS if k in extra and k != snap.metric]
    shapes = shape_table(study, cand) if cand is not None else ""
    out = []
    if cand is not None and (len(figures) >= 2 or shapes):
        out.append(f"<h2>Kernel: the incumbent {_e(cand.id)}</h2>")
        if figures:
            out.append(kv_table([(k, _e(views.fmt(v))) for k, v in figures], "num"))
        out.append(shapes)
    out.append(dispatch(study))
    return "".join(out)


def dispatch(study: StudyLike) -> str:
    """dispatch.json from the incumbent's tree (else the repo root), as a table."""
    incumbent = study.ledger.study().incumbent.commit
    text, where = None, ""
    if incumbent:
        try:
            text = gitrepo.show(Path(study.repo), incumbent, "dispatch.json").decode("utf-8", "replace")
            where = f"dispatch.json in the incumbent {incumbent[:7]}"
        except gitrepo.GitError:
            text = None
    root = Path(study.repo) / "dispatch.json"
    if text is None and root.is_file():
        text, where = root.read_text(errors="replace"), "dispatch.json in the repository root"
    if text is None:
        return ""
    head = f"<h2>Dispatch table</h2><p>{_e(where)}</p>"
    try:
        data = json.loads(text)
        buckets = data["buckets"]
        rows = [[
            td(f"<code>{_e(key)}</code>"),
            td(_e(b.get("impl"))),
            td(_num(b.get("speedup"), ".3f"), "num"),
            td(_e(b.get("reason")), "text"),
        ] for key, b in buckets.items()]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return head + f'<p class="note">could not read it: {_e(type(exc).__name__)}: {_e(exc)}</p>'
    versions = data.get("versions") if isinstance(data.get("versions"), dict) else {}
    tags = (f"device {_e(data.get('device') or 'unspecified')}; baseline <code>{_e(data.get('baseline'))}</code>; "
            + ", ".join(f"{_e(k)} {_e(v)}" for k, v in versions.items()))
    return head + f"<p>{tags}</p>" + table(["bucket", "impl", "speedup", "reason"], rows)


# ---------------------------------------------------------------------------------------
# shares, roofline, phases, incumbent, machines


def machine_warning(hosts: Machines) -> str:
    if len(hosts.labels) < 2:
        return ""
    names = ", ".join(f"{label} ({key})" for key, label in hosts.labels.items())
    return (f'<p class="warn">Results from {len(hosts.labels)} different machines: {_e(names)}. '
            "A metric measured on other hardware than the baseline's is not comparable with it; "
            "those rows are flagged in the candidate table (see Machines).</p>")


def machines(hosts: Machines) -> str:
    if not hosts.fingerprints:
        return '<p class="note">no result records its machine (results from an older ratchet).</p>'
    variants: dict[tuple[str, str], list[str]] = {}
    for cand_id, fp in hosts.fingerprints.items():
        variants.setdefault((fingerprint_key(fp), software_key(fp)), []).append(cand_id)
    rows = []
    for (key, software), ids in sorted(variants.items(), key=lambda kv: (hosts.labels[kv[0][0]], kv[1][0])):
        shown = ", ".join(ids[:12]) + (f" … (+{len(ids) - 12})" if len(ids) > 12 else "")
        rows.append([
            td(_e(hosts.labels[key]) + (" (baseline's)" if key == hosts.reference else "")),
            td(_e(key), "text"),
            td(_e(software), "text"),
            td(str(len(ids)), "num"),
            td(_e(shown), "text"),
        ])
    out = table(["machine", "hardware", "driver and libraries", "results", "candidates"], rows)
    same_hw = {k for k, _ in variants}
    if len(variants) > len(same_hw):
        out += ('<p class="warn">Software versions changed during the study on the same hardware: '
                "a driver or library change can move timings by more than the noise.</p>")
    return out


def shares(cands: list[Candidate]) -> str:
    """Kept / discarded / crashed / rejected shares by proposer and by idea."""
    by_proposer = success_shares(cands, "proposer")
    if not by_proposer:
        return '<p class="note">no candidate proposed yet.</p>'
    out = ["<h3>By proposer</h3>", share_table("proposer", by_proposer)]
    by_idea = success_shares(cands, "idea")
    if any(s.name != "(no queued idea)" for s in by_idea):
        out += ["<h3>By idea</h3>", share_table("idea", by_idea)]
    else:
        out.append('<p class="note">no candidate came from a queued idea (ratchet idea, ideas.md).</p>')
    return "".join(out)


def share_table(name: str, rows_of: list[Share]) -> str:
    def cell(share: Share, status: str) -> str:
        n = share.counts.get(status, 0)
        return td(f"{n} ({share.share(status) * 100:.0f}%)" if share.judged else str(n), "num")

    rows = []
    for share in rows_of:
        reasons = sorted(share.reasons.items(), key=lambda kv: (-kv[1], kv[0]))
        rows.append([
            td(_e(share.name), "text"),
            td(str(sum(share.counts.values())), "num"),
            cell(share, "keep"), cell(share, "discard"), cell(share, "crash"), cell(share, "rejected"),
            td("<br>".join(f"{_e(r)} ×{n}" for r, n in reasons[:6]), "text"),
        ])
    return table([name, "candidates", "kept", "discarded", "crashed", "rejected",
                  "crash and rejection reasons"], rows)


def roofline_pct(cand: Candidate) -> float | None:
    """The candidate's % of roofline, from the first extra metric that reports it."""
    for key in ROOFLINE_KEYS:
        value = (cand.extra or {}).get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def roofline(study: StudyLike, snap: Snapshot) -> str:
    """The incumbent's % of roofline after each kept step: how far from the bound it is."""
    baseline = next((c for c in snap.cands if c.kind == Kind.BASELINE), None)
    keeps = sorted((c for c in snap.cands if c.status == Status.KEEP and c.kind != Kind.BASELINE),
                   key=lambda c: (c.judged_at or 0.0, c.seq))  # history.kept_steps' order
    path = ([baseline] if baseline is not None else []) + keeps
    path = [c for c in path if roofline_pct(c) is not None]
    if not path:
        return ""
    rows = []
    for c in path:
        pct = roofline_pct(c) or 0.0
        rows.append([
            td(_e(c.id) + (" (baseline)" if c.kind == Kind.BASELINE else "")),
            td(_num(c.metric), "num"),
            td(f"{pct:.1f}%", "num"),
            td(f"{100 / pct:.2f}×" if pct > 0 else "", "num"),
            td(_e(c.description), "text"),
        ])
    now = roofline_pct(path[-1]) or 0.0
    first = roofline_pct(path[0]) or 0.0
    summary = (f"The incumbent {_e(path[-1].id)} runs at <b>{now:.1f}%</b> of the roofline"
               + (f" (started at {first:.1f}%)" if len(path) > 1 else "")
               + (f": {100 / now:.2f}× from the bound." if now > 0 else "."))
    return ("<h2>Roofline</h2>" f"<p>{summary}</p>"
            + table(["step", snap.metric, "% of roofline", "distance to the bound", "description"], rows))


def phase_table(cands: list[Candidate]) -> str:
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for c in cands:
        for p in c.phases or []:
            by_phase.setdefault(str(p.get("name", "?")), []).append(p)
    if not by_phase:
        return '<p class="note">no phase has run yet.</p>'
    rows = []
    for name, runs in by_phase.items():
        secs = sorted(float(p.get("seconds") or 0.0) for p in runs)
        mid = len(secs) // 2
        median = secs[mid] if len(secs) % 2 else (secs[mid - 1] + secs[mid]) / 2
        failed = sum(1 for p in runs if p.get("exit_code") not in (0, None) and not p.get("timed_out"))
        rows.append([
            td(f"<code>{_e(name)}</code>"),
            td(str(len(runs)), "num"),
            td(duration(median), "num"),
            td(duration(sum(secs) / len(secs)), "num"),
            td(duration(secs[-1]), "num"),
            td(duration(sum(secs)), "num"),
            td(str(sum(1 for p in runs if p.get("timed_out"))), "num"),
            td(str(failed), "num"),
        ])
    return table(["phase", "runs", "median", "mean", "max", "total", "timed out", "failed"], rows)


def incumbent(study: StudyLike, snap: Snapshot) -> str:
    ledger = study.ledger
    commit, pinned = ledger.study().incumbent.commit, ledger.study().pinned
    if not commit:
        return '<p class="note">no incumbent yet.</p>'
    inc_id = ledger.study().incumbent.id
    cand = snap.by_id(inc_id) if inc_id else None
    est = snap.head.incumbent
    facts = [
        ("candidate", _e(inc_id or "")),
        ("commit", f"<code>{_e(commit)}</code>"),
        (f"{snap.metric} (pooled)", _e(est.text()) if est else ""),
        (f"hold-out {snap.metric}", _num(ledger.study().incumbent.holdout)),
        ("description", _e(cand.description if cand else "")),
        ("study start (pinned)", f"<code>{_e(pinned or '')}</code>"),
    ]
    out = [kv_table(facts)]
    if pinned and pinned != commit:
        out.append(f"<p>What the study kept: <code>git diff {_e(pinned[:7])} {_e(commit[:7])}</code></p>")
        try:
            out.append(diff_html(gitrepo.diff_text(Path(study.repo), pinned, commit)))
        except gitrepo.GitError as exc:
            out.append(f'<p class="note">diff unavailable: {_e(exc)}</p>')
    else:
        out.append('<p class="note">the incumbent is still the study start: nothing kept yet.</p>')
    return "".join(out)


# ---------------------------------------------------------------------------------------
# the page around the views


def nav(site: Site, live_state: str = "") -> str:
    more = (f'<a href="{_e(site.metric())}">metric chart</a><a href="/compare">compare</a>'
            if site.live else "")
    return (f'<nav><a href="{_e(site.index())}">overview</a>'
            f'<a href="{_e(site.candidates())}">candidates</a>{more}{live_state}</nav>')


def page(title: str, body: str, csp: str, head_extra: str = "") -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        f'<meta http-equiv="Content-Security-Policy" content="{_e(csp)}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta name="referrer" content="no-referrer">\n'
        f"<title>{_e(title)}</title>\n<style>{CSS}</style>{head_extra}</head>\n<body>\n"
        f"{body}\n</body></html>\n"
    )


Render = Callable[[StudyLike, Snapshot, Site], str]
