"""The pages' building blocks (pages.py and its sections: charts, compare, knobs, slots):
the colours, a `Site` (how links are made) and a study's `Snapshot`, escaping (`_e`),
tables, the metric chart, a diff. Below every page module, so each reads them at import,
and none reaches back up to pages.py.

Every text a proposer or a candidate controls goes through `_e` (HTML-escaped, quotes
too) before it reaches a page.
"""

from __future__ import annotations

import html
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ratchet.core import stats
from ratchet.core.candidate import Candidate
from ratchet.core.vocab import Kind, Status
from ratchet.driver import views
from ratchet.job import gitrepo
from ratchet.job.fingerprint import fingerprint_key
from ratchet.store.ledger import Ledger
from ratchet.ui.svg import Axis, Chart

if TYPE_CHECKING:
    from ratchet.driver.spend import Spend

DIFF_LIMIT = 200_000  # characters of a diff shown; the rest is cut, and said so
LOG_TAIL_BYTES = 6_000  # the end of each phase's log shown on a candidate's page
CONTEXT_LIMIT = 40_000  # characters of the proposer's context shown
# extra metrics that say how close a kernel is to its roofline bound, in percent
# (ratchet.evaluator.kernels' sweep prints `roofline_pct`; the others are common spellings)
ROOFLINE_KEYS = ("roofline_pct", "pct_of_roofline", "pct_of_bound", "roofline_percent")
# extra metrics a kernel evaluator (ratchet.evaluator.kernels.sweep) reports, in display order
KERNEL_KEYS = ("speedup", "time_ms", "min_speedup", "max_speedup", "roofline_pct",
               "public_speedup", "holdout_speedup", "shapes", "shapes_failed",
               "host_overhead_us", "timing_precise")

# status -> colour; charts and table badges agree
COLORS = {
    "keep": "#2e7d32",
    "discard": "#9e9e9e",
    "crash": "#e65100",
    "rejected": "#c62828",
    "cancelled": "#bdbdbd",
    "reference": "#6a1b9a",
}
OPEN_COLOR = "#1565c0"  # proposed / submitted / running: not judged yet
REMEASURE_COLOR = "#5d4037"
PHASE_COLORS = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#5d4037"]

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #212121;
       margin: 0 auto; padding: 20px 24px; max-width: 1400px; background: #fafafa; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 26px 0 8px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
nav { margin: 0 0 14px; display: flex; gap: 16px; align-items: baseline; }
nav a { color: #1565c0; text-decoration: none; font-weight: 600; }
#live-state { color: #616161; font-size: 12px; margin-left: auto; }
.sub { color: #616161; margin-bottom: 16px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { background: #fff; border: 1px solid #e0e0e0; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card .v { font-size: 18px; font-weight: 600; } .card .k { color: #757575; font-size: 12px; }
table { border-collapse: collapse; background: #fff; font-size: 13px; }
th, td { border: 1px solid #e0e0e0; padding: 4px 8px; vertical-align: top; text-align: left; }
th { background: #f5f5f5; position: sticky; top: 0; }
th.sortable { cursor: pointer; } th.sorted-asc::after { content: " ▲"; } th.sorted-desc::after { content: " ▼"; }
table.kv th { position: static; font-weight: 600; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.text { max-width: 360px; overflow-wrap: anywhere; }
tr.keep td { background: #f1f8e9; }
.badge { display: inline-block; padding: 1px 7px; border-radius: 10px; color: #fff; font-size: 12px; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
pre { background: #fff; border: 1px solid #e0e0e0; padding: 10px; overflow-x: auto; white-space: pre; max-height: 520px; }
pre.log { white-space: pre-wrap; overflow-wrap: anywhere; }
pre .add { color: #1b5e20; background: #e8f5e9; display: inline-block; min-width: 100%; }
pre .del { color: #b71c1c; background: #ffebee; display: inline-block; min-width: 100%; }
pre .hunk { color: #6a1b9a; }
svg.chart { background: #fff; border: 1px solid #e0e0e0; max-width: 100%; height: auto; }
svg .tick { font-size: 11px; fill: #616161; } svg .axis { font-size: 12px; fill: #424242; }
svg .legend { font-size: 11px; fill: #424242; }
svg rect.job { stroke: #fff; stroke-width: 0.5; }
.note { color: #616161; font-style: italic; }
.warn { color: #b71c1c; font-weight: 600; }
.scroll { overflow-x: auto; }
.filters { margin: 6px 0 10px; display: flex; gap: 10px; align-items: baseline; }
.filters input[type=number] { width: 6em; }
.scale-switch:checked ~ .linear-chart, .scale-switch:not(:checked) ~ .log-chart { display: none; }
ul.reasons { margin: 4px 0; padding-left: 20px; }
"""


class StudyLike(Protocol):
    """What the views read: a running `Study`, or serve's read-only view of one."""

    repo: Path
    name: str
    state_dir: Path
    ledger: Ledger

    @property
    def config(self) -> Any: ...

    @property
    def busy_slots(self) -> int: ...

    def agent_sandbox_status(self) -> str | None: ...


@dataclass(frozen=True)
class Site:
    """How the views link: the live app's paths, or the static report's files.

    `root` is the way from the page being written back to the report's folder ("" on
    index.html, "../" on a candidate's page); the live app's paths are absolute.
    """

    live: bool
    root: str = ""

    def index(self) -> str:
        return "/" if self.live else f"{self.root}index.html"

    def candidates(self) -> str:
        return "/candidates" if self.live else f"{self.root}index.html#candidates"

    def candidate(self, cand_id: str) -> str:
        return f"/c/{cand_id}" if self.live else f"{self.root}c/{cand_id}.html"

    def compare(self, a: str, b: str) -> str | None:
        """Two candidates side by side: a page of the live app only (it is asked for any
        pair; the static report writes no page per pair)."""
        return f"/compare?a={a}&b={b}" if self.live else None

    def metric(self) -> str | None:
        """The metric chart with its log-scale switch and zoom (the live app's)."""
        return "/metric" if self.live else None

    def log(self, cand: Candidate, phase: dict[str, Any], state_dir: Path) -> str | None:
        """A link to a phase's whole log, only for a file under .ratchet/ (never elsewhere)."""
        rel = log_under(phase.get("log"), state_dir)
        if rel is None:
            return None
        if self.live:
            return f"/log/{cand.id}/{phase_index(cand, phase)}"
        return f"{self.root}../" + "/".join(rel.parts)


LIVE = Site(live=True)


def log_under(log: Any, state_dir: Path) -> Path | None:
    """`log` relative to the study's state folder, or None when it lies elsewhere (a
    phase record names its log; only files under .ratchet/ are ever shown)."""
    if not isinstance(log, str) or not log:
        return None
    try:
        return Path(os.path.realpath(log)).relative_to(Path(os.path.realpath(state_dir)))
    except ValueError:
        return None


def phase_index(cand: Candidate, phase: dict[str, Any]) -> int:
    return next(i for i, p in enumerate(cand.phases or []) if p is phase)


# ---------------------------------------------------------------------------------------
# the data every view reads: one look at the ledger


@dataclass
class Snapshot:
    cands: list[Candidate]  # candidates, baseline and co-runs, by seq (no confirmation rows)
    everything: list[Candidate]  # with the confirmation rows
    head: views.Headline
    groups: dict[str, list[float]]  # every judged evaluation, by commit
    metric: str
    goal: str
    now: float = field(default_factory=time.time)
    _estimates: dict[str, stats.Estimate | None] = field(default_factory=dict)
    _ids: dict[str, Candidate] = field(default_factory=dict)
    _spent: list[Spend] = field(default_factory=list)
    _related: dict[str, list[Candidate]] = field(default_factory=dict)
    # (base, head) -> diff text or its error, asked of git in batches before the pages
    # are made (the report: gitrepo.diff_texts); a pair not here is asked alone
    diffs: dict[tuple[str, str], str | Exception] = field(default_factory=dict)
    # spend.kept_steps and spend.per_candidate of every row, where a caller showing many
    # candidates' pages read them once (the report); None: each page reads its own
    steps: dict[str, Any] | None = None
    row_spend: dict[str, Any] | None = None
    _hosts: list[Machines] = field(default_factory=list)

    @property
    def hosts(self) -> Machines:
        """The machines that measured the rows, made when a view first asks (a walk over
        every row: the live overview's cheap parts do without it)."""
        if not self._hosts:
            self._hosts.append(Machines(self.cands))
        return self._hosts[0]

    def spent(self, ledger: Ledger) -> Spend:
        """The study's spend (spend.summary), read once per look."""
        if not self._spent:
            from ratchet.driver.spend import summary

            self._spent.append(summary(ledger))
        return self._spent[0]

    def estimate(self, commit: str | None) -> stats.Estimate | None:
        """The pooled estimate of a commit: all its evaluations, with a 95% interval."""
        key = commit or ""
        if key not in self._estimates:  # one per commit: the t quantile is not free
            self._estimates[key] = stats.estimate(self.groups.get(key, []), self.head.noise)
        return self._estimates[key]

    def by_id(self, cand_id: str) -> Candidate | None:
        if not self._ids:  # an index, made once: a page looks up many rows
            self._ids.update((c.id, c) for c in self.everything)
        return self._ids.get(cand_id)

    def related(self, cand: Candidate) -> list[Candidate]:
        """The other rows that measure what `cand` measured: its confirmation pairs and
        every other evaluation of its commit, by seq (an index made once: a report asks
        for each of 10,000 rows)."""
        if not self._related:
            for r in self.everything:
                if r.confirms:
                    self._related.setdefault(f"confirms:{r.confirms}", []).append(r)
                if r.commit_sha:
                    self._related.setdefault(f"commit:{r.commit_sha}", []).append(r)
            self._related.setdefault("", [])  # built, even for a study of no rows
        rows = {r.id: r for r in self._related.get(f"confirms:{cand.id}", [])}
        if cand.commit_sha:
            rows.update((r.id, r) for r in self._related.get(f"commit:{cand.commit_sha}", []))
        rows.pop(cand.id, None)
        return sorted(rows.values(), key=lambda r: r.seq)


def snapshot(study: StudyLike, rows: list[Candidate] | None = None) -> Snapshot:
    """One look at the ledger; `rows`: every row (confirmations too, by seq) where the
    caller keeps them in memory (`ratchet serve`), else read here."""
    ledger = study.ledger
    metric, goal = study.config.metric.name, study.config.metric.goal
    everything = rows if rows is not None else ledger.candidates(confirmations=True)
    cands = [c for c in everything if c.kind != Kind.CONFIRM]
    groups = ledger.evaluations()
    head = views.headline(ledger, metric, goal, study.config.acceptance.noise == "ignore",
                          groups)
    return Snapshot(cands, everything, head, groups, metric, goal)


# ---------------------------------------------------------------------------------------
# small helpers


def _e(text: Any) -> str:
    """HTML-escape anything (quotes too, so it is safe inside attributes)."""
    return html.escape("" if text is None else str(text), quote=True)


def _num(value: float | None, fmt: str = ".6g") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    try:
        return format(float(value), fmt)
    except (TypeError, ValueError):
        return _e(value)


def _badge(status: str) -> str:
    color = COLORS.get(status, OPEN_COLOR)
    return f'<span class="badge" style="background:{color}">{_e(status)}</span>'


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def table(head: Sequence[str], rows: Iterable[Sequence[str]], classes: Sequence[str] = (),
          table_id: str = "", sortable: bool = False) -> str:
    """Cells are HTML already (callers escape); head is plain text."""
    tid = f' id="{_e(table_id)}"' if table_id else ""
    th = ' class="sortable"' if sortable else ""
    out = [f'<div class="scroll"><table{tid}><thead><tr>']
    out += [f"<th{th}>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        cls = f' class="{_e(classes[i])}"' if i < len(classes) and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(row) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def kv_table(facts: Iterable[tuple[str, str]], kind: str = "text") -> str:
    """Two columns, no header: a plain-text name, then a cell that is HTML already."""
    rows = "".join(f"<tr><th>{_e(k)}</th>{td(v, kind)}</tr>" for k, v in facts)
    return f'<div class="scroll"><table class="kv"><tbody>{rows}</tbody></table></div>'


def td(text: Any, kind: str = "", sort: Any = None) -> str:
    key = "" if sort is None else f' data-sort="{_e(sort)}"'
    return f'<td class="{kind}"{key}>{text}</td>' if kind else f"<td{key}>{text}</td>"


def card(key: str, value_html: str, name: str) -> str:
    return (f'<div class="card" data-card="{_e(name)}"><div class="k">{_e(key)}</div>'
            f'<div class="v">{value_html}</div></div>')


def running_best(cands: Sequence[Candidate]) -> list[tuple[int, float]]:
    """(seq, metric) of every keep, in order: the incumbent's value from then on."""
    return [(c.seq, c.metric) for c in cands if c.status == Status.KEEP and c.metric is not None]


CHART_POINTS = 500  # about the most points a chart draws (its SVG stays small)
SMALL_CHART_POINTS = 250  # the tuner's and the phases' charts


def thin(rows: Sequence[Candidate], value: Callable[[Candidate], float],
         keep: Callable[[Candidate], bool] = lambda _c: False,
         limit: int | None = None) -> list[Candidate]:
    """At most about `limit` of `rows` (in order) for a chart, all of them when they fit:
    every row `keep` says must stay (the keeps), and of the rest, in runs of equal length,
    the lowest and the highest `value` of each run: the envelope of the cloud, its shape,
    at a bounded size (CHART_POINTS unless given). The whole data is the candidates
    table's."""
    limit = limit or CHART_POINTS
    if len(rows) <= limit:
        return list(rows)
    must = {id(c) for c in rows if keep(c)}
    rest = [c for c in rows if id(c) not in must]
    runs = max(1, (limit - len(must)) // 2)
    size = -(-len(rest) // runs)
    chosen = set(must)
    for i in range(0, len(rest), size):
        run = rest[i:i + size]
        chosen.add(id(min(run, key=value)))
        chosen.add(id(max(run, key=value)))
    return [c for c in rows if id(c) in chosen]


def shown_note(drawn: int, total: int, site: Site) -> str:
    """Said under a chart that drew a downsample."""
    if drawn >= total:
        return ""
    return (f'<p class="note" data-thinned="{drawn}">{drawn:,} of {total:,} points drawn: '
            "every keep and re-measure, and the lowest and highest of each run of the "
            f'rest; every candidate is in <a href="{_e(site.candidates())}">the '
            "candidates table</a>.</p>")


def read_tail(path: Path, limit: int) -> tuple[str, int]:
    """The last `limit` bytes of a file as text, and how many bytes came before them."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read(limit)
    except OSError:
        return "", 0
    return data.decode("utf-8", "replace"), max(0, size - limit)


def metric_chart(snap: Snapshot, site: Site = LIVE, log_y: bool | None = None,
                 limits: tuple[float, float] | None = None) -> str:
    """The metric of every candidate in proposal order; each commit's pooled 95% interval;
    re-measures (co-runs, the A/A floor, confirmation pairs) as hollow diamonds at the
    candidate whose commit they measured again; the running incumbent as a step line of
    pooled estimates. Each point links to its candidate's page. `log_y`: a log axis
    (None: when the values span more than 20x); `limits`: the candidates shown (a zoom)."""
    cands, metric = snap.cands, snap.metric
    everyone = [c for c in cands if c.metric is not None]
    if not everyone:
        return '<p class="note">no candidate has a metric yet.</p>'
    if limits is not None:  # zoomed: thinned within the range, so a zoom shows more points
        everyone = [c for c in everyone if limits[0] <= c.seq <= limits[1]] or everyone
    values = [c.metric for c in everyone if c.metric is not None]
    # a bounded number of points: every keep and the baseline, the envelope of the rest
    measured = thin(everyone, lambda c: c.metric or 0.0,
                    lambda c: c.status == Status.KEEP or c.kind != Kind.CANDIDATE)
    if log_y is None:
        log_y = min(values) > 0 and max(values) / min(values) > 20
    chart = Chart(title=f"{metric} over candidates", xlabel="candidate, in the order proposed",
                  ylabel=f"{metric} ({'lower' if snap.goal == 'minimize' else 'higher'} is better)",
                  log_y=log_y and min(values) > 0, x=Axis(integer=True, limits=limits))
    first_at: dict[str, int] = {}
    for c in cands:
        if c.commit_sha:
            first_at.setdefault(c.commit_sha, c.seq)
    bars = [(c.seq, e) for c in measured if c.kind != Kind.INCUMBENT
            and (e := snap.estimate(c.commit_sha)) is not None and e.low is not None]
    if bars:
        chart.intervals([x for x, _ in bars], [e.low or 0.0 for _, e in bars],
                        [e.high or 0.0 for _, e in bars], "#90a4ae")
    again = [r for r in snap.everything if r.metric is not None and r.commit_sha in first_at
             and (r.kind == Kind.CONFIRM or r.kind == Kind.INCUMBENT)]
    if again:
        chart.points([first_at[r.commit_sha or ""] for r in again], [r.metric or 0.0 for r in again],
                     REMEASURE_COLOR, shape="diamond", hollow=True, size=4,
                     label=f"re-measured ({len(again)})",
                     titles=[f"{r.id} {r.kind} of {r.confirms or r.commit_sha and r.short}: "
                             f"{metric} {r.metric:.6g}" for r in again],
                     attrs=[{"data-id": r.id, "data-remeasure": "1"} for r in again],
                     links=[site.candidate(r.id) for r in again])
    for status in dict.fromkeys(c.status for c in measured if c.kind != Kind.INCUMBENT):
        pts = [c for c in measured if c.status == status and c.kind != Kind.INCUMBENT]
        n = sum(1 for c in everyone if c.status == status and c.kind != Kind.INCUMBENT)
        chart.points([c.seq for c in pts], [c.metric or 0.0 for c in pts],
                     COLORS.get(status, OPEN_COLOR), label=f"{status} ({n})",
                     size=6 if status == Status.KEEP else 4.5,
                     titles=[f"{c.id} {c.status}: {metric} {c.metric:.6g} — {c.description}"
                             for c in pts],
                     attrs=[{"data-id": c.id, "data-metric": repr(c.metric)} for c in pts],
                     links=[site.candidate(c.id) for c in pts])
    missing = [c for c in cands if c.metric is None and c.is_judged]
    all_missing = len(missing)
    missing = missing[::-(-len(missing) // CHART_POINTS)] if missing else missing
    if missing:
        chart.floor([c.seq for c in missing], COLORS["crash"], label=f"no {metric} ({all_missing})",
                    titles=[f"{c.id} {c.status}: {c.reasons or ''}" for c in missing],
                    attrs=[{"data-id": c.id} for c in missing],
                    links=[site.candidate(c.id) for c in missing])
    path = incumbent_path(snap)
    if path:
        last = max(c.seq for c in cands)
        chart.step([x for x, _ in path] + [last], [y for _, y in path] + [path[-1][1]],
                   COLORS["keep"], label="incumbent (pooled estimate)")
    return chart.render() + shown_note(len(measured), len(everyone), site)


def incumbent_path(snap: Snapshot) -> list[tuple[int, float]]:
    """(seq, pooled mean) of the start and of every keep since: the running incumbent."""
    out = []
    for c in snap.cands:
        if c.kind == Kind.BASELINE or (c.status == Status.KEEP and c.kind == Kind.CANDIDATE):
            est = snap.estimate(c.commit_sha)
            value = est.mean if est is not None else c.metric
            if value is not None:
                out.append((c.seq, value))
    return out


def diff_section(study: StudyLike, base: str | None, head: str | None,
                 known: dict[tuple[str, str], str | Exception] | None = None) -> str:
    """`git diff BASE HEAD`, escaped; from `known` (asked in a batch) where it is there."""
    if not base or not head:
        return '<p class="note">no commit to compare.</p>'
    if base == head:
        return '<p class="note">the same commit: no difference.</p>'
    found = (known or {}).get((base, head))
    try:
        if isinstance(found, Exception):
            raise found
        text = found if found is not None else gitrepo.diff_text(Path(study.repo), base, head)
    except gitrepo.GitError as exc:
        return f'<p class="note">diff unavailable: {_e(exc)}</p>'
    return (f"<p><code>git diff {_e(base[:7])} {_e(head[:7])}</code></p>" + diff_html(text))


def diff_html(diff: str) -> str:
    cut = ""
    if len(diff) > DIFF_LIMIT:
        cut = f"\n… {len(diff) - DIFF_LIMIT} more characters not shown (see git diff)"
        diff = diff[:DIFF_LIMIT]
    lines = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            lines.append(f"<b>{_e(line)}</b>")
        elif line.startswith("+"):
            lines.append(f'<span class="add">{_e(line)}</span>')
        elif line.startswith("-"):
            lines.append(f'<span class="del">{_e(line)}</span>')
        elif line.startswith("@@"):
            lines.append(f'<span class="hunk">{_e(line)}</span>')
        else:
            lines.append(_e(line))
    if not lines:
        return '<p class="note">empty diff.</p>'
    return f'<pre class="diff">{chr(10).join(lines)}{_e(cut)}</pre>'


class Machines:
    """Which machine measured each result, by hardware (`fingerprint_key`).

    The baseline's machine is M1, the reference: a result measured on other hardware
    is flagged wherever it is shown, because its metric is not comparable with the
    baseline's or the incumbent's.
    """

    def __init__(self, cands: list[Candidate]) -> None:
        self.fingerprints: dict[str, dict[str, str]] = {}
        for c in cands:
            fp = (c.result or {}).get("fingerprint")
            if isinstance(fp, dict) and fp:
                self.fingerprints[c.id] = {str(k): str(v) for k, v in fp.items()}
        order = sorted(cands, key=lambda c: (c.kind != Kind.BASELINE, c.seq))
        keys = [fingerprint_key(self.fingerprints[c.id]) for c in order if c.id in self.fingerprints]
        self.labels = {key: f"M{i}" for i, key in enumerate(dict.fromkeys(keys), 1)}
        self.reference = keys[0] if keys else None

    def key(self, cand: Candidate) -> str | None:
        fp = self.fingerprints.get(cand.id)
        return fingerprint_key(fp) if fp else None

    def elsewhere(self, cand: Candidate) -> bool:
        """Measured on hardware other than the baseline's."""
        key = self.key(cand)
        return key is not None and key != self.reference

    def cell(self, cand: Candidate) -> str:
        key = self.key(cand)
        if key is None:
            return ""
        label = f'<span title="{_e(key)}">{_e(self.labels[key])}</span>'
        if self.elsewhere(cand):
            label += ' <b class="warn">other hardware than the baseline: not comparable</b>'
        return label
