"""`ratchet report`: one self-contained HTML page, a view of the ledger.

`.ratchet/report/index.html` holds everything inline (CSS, plots as PNG data URIs), so
it can be mailed, archived or opened from a job machine without a server. Like
`results.tsv` it is rebuilt whole from the ledger each time and never read back.

Every text a candidate controls (its description, i.e. a commit subject; the reasons
that quote its output; its diff; a dispatch.json in its tree) is untrusted: it is
HTML-escaped, and the page's Content-Security-Policy allows no script at all, so even
a slip in escaping could not run code. matplotlib is optional and imported only here:
without it the report is tables only and says how to get the plots.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ratchet.driver import views
from ratchet.driver.history import Share, kept_steps, success_shares
from ratchet.driver.ledger import Candidate, throughput
from ratchet.job import gitrepo
from ratchet.job.fingerprint import fingerprint_key, software_key

REPORT_DIR = "report"
DIFF_LIMIT = 200_000  # characters of the incumbent's diff shown; the rest is cut, and said so
# extra metrics that say how close a kernel is to its roofline bound, in percent
# (ratchet.evaluator.kernels' sweep prints `roofline_pct`; the others are common spellings)
ROOFLINE_KEYS = ("roofline_pct", "pct_of_roofline", "pct_of_bound", "roofline_percent")

# status -> colour; plots and table badges agree
COLORS = {
    "keep": "#2e7d32",
    "discard": "#9e9e9e",
    "crash": "#e65100",
    "rejected": "#c62828",
    "cancelled": "#bdbdbd",
    "reference": "#6a1b9a",
}
OPEN_COLOR = "#1565c0"  # proposed / submitted / running: not judged yet
PHASE_COLORS = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#5d4037"]

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #212121;
       margin: 0 auto; padding: 24px; max-width: 1400px; background: #fafafa; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.sub { color: #616161; margin-bottom: 16px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { background: #fff; border: 1px solid #e0e0e0; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card .v { font-size: 18px; font-weight: 600; } .card .k { color: #757575; font-size: 12px; }
table { border-collapse: collapse; background: #fff; font-size: 13px; }
th, td { border: 1px solid #e0e0e0; padding: 4px 8px; vertical-align: top; text-align: left; }
th { background: #f5f5f5; position: sticky; top: 0; }
table.kv th { position: static; font-weight: 600; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.text { max-width: 360px; overflow-wrap: anywhere; }
tr.keep td { background: #f1f8e9; }
.badge { display: inline-block; padding: 1px 7px; border-radius: 10px; color: #fff; font-size: 12px; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
pre { background: #fff; border: 1px solid #e0e0e0; padding: 10px; overflow-x: auto; white-space: pre; }
pre .add { color: #1b5e20; background: #e8f5e9; display: inline-block; min-width: 100%; }
pre .del { color: #b71c1c; background: #ffebee; display: inline-block; min-width: 100%; }
pre .hunk { color: #6a1b9a; }
.plot { background: #fff; border: 1px solid #e0e0e0; max-width: 100%; }
.note { color: #616161; font-style: italic; }
.warn { color: #b71c1c; font-weight: 600; }
h3 { font-size: 15px; margin: 14px 0 6px; }
.scroll { overflow-x: auto; }
"""

# No scripts, no remote anything: images are data URIs, styles inline.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def write_report(study: Any) -> Path:
    """Render the study's ledger to `.ratchet/report/index.html`; returns the path."""
    out_dir = Path(study.state_dir) / REPORT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    page = render(study)
    path = out_dir / "index.html"
    tmp = out_dir / f".index.html.{os.getpid()}.tmp"
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a page
    return path


def render(study: Any) -> str:
    """The whole page as a string."""
    ledger = study.ledger
    cands = ledger.candidates()
    metric = study.config.metric.name
    goal = study.config.metric.goal
    plots, plot_note = _plots(cands, metric, goal)
    hosts = Machines(cands)
    sections = [
        _header(study, cands, metric, goal),
        _agent_sandbox(study),
        _machine_warning(hosts),
        "<h2>Metric over candidates</h2>",
        plots.get("metric") or f'<p class="note">{_e(plot_note)}</p>',
        _counts(cands),
        "<h2>Success shares</h2>",
        _shares(cands),
        _roofline(study, cands, metric, goal),
        "<h2>Candidates</h2>",
        _candidate_table(cands, metric, Path(study.state_dir), hosts),
        "<h2>Phase durations</h2>",
        plots.get("phases", ""),
        _phase_table(cands),
        "<h2>Incumbent</h2>",
        _incumbent(study, cands, metric),
        "<h2>Machines</h2>",
        _machines(hosts),
        "<h2>Costs</h2>",
        _costs(cands, ledger.get("created"), study.busy_slots),
        _dispatch(study),
    ]
    title = f"ratchet report: {study.name}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)}</title>\n<style>{CSS}</style></head>\n<body>\n"
        + "\n".join(s for s in sections if s)
        + f'\n<p class="note">generated {_e(time.strftime("%Y-%m-%d %H:%M:%S"))} from '
        f"{_e(str(ledger.path))}</p>\n</body></html>\n"
    )


def _agent_sandbox(study: Any) -> str:
    """What confined the coding agents (said loudly when nothing did)."""
    describe = getattr(study, "agent_sandbox_status", None)
    text = describe() if describe else None
    if not text:
        return ""
    kind = "warn" if "UNSANDBOXED" in text else "note"
    return f'<p class="{kind}">agents: {_e(text)}</p>'


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


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], classes: Sequence[str] = ()) -> str:
    """Cells are HTML already (callers escape); head is plain text."""
    out = ['<div class="scroll"><table><thead><tr>']
    out += [f"<th>{_e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        cls = f' class="{_e(classes[i])}"' if i < len(classes) and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(row) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _kv_table(facts: Iterable[tuple[str, str]], kind: str = "text") -> str:
    """Two columns, no header: a plain-text name, then a cell that is HTML already."""
    rows = "".join(f"<tr><th>{_e(k)}</th>{_td(v, kind)}</tr>" for k, v in facts)
    return f'<div class="scroll"><table class="kv"><tbody>{rows}</tbody></table></div>'


def _td(text: Any, kind: str = "") -> str:
    return f'<td class="{kind}">{text}</td>' if kind else f"<td>{text}</td>"


def running_best(cands: Sequence[Candidate]) -> list[tuple[int, float]]:
    """(seq, metric) of every keep, in order: the incumbent's value from then on."""
    return [(c.seq, c.metric) for c in cands if c.status == "keep" and c.metric is not None]


# ---------------------------------------------------------------------------------------
# sections


def _header(study: Any, cands: list[Candidate], metric: str, goal: str) -> str:
    ledger = study.ledger
    # pooled estimates with 95% intervals (views.headline): the same numbers as the
    # end-of-run line and `status --json`
    head = views.headline(ledger, metric, goal, study.config.acceptance.noise == "ignore")
    inc = head.incumbent
    cards = [("candidates", str(len(cands))),
             (f"{metric} ({goal})", _e(inc.text()) if inc else "—")]
    if head.baseline is not None and inc is not None:
        cards.insert(1, (f"baseline {metric}", _e(head.baseline.text())))
        if head.change is not None:  # + is better, whatever the goal
            cards.append(("change vs baseline", f"{head.change * 100:+.2f}% "
                          f"({'better' if head.change >= 0 else 'worse'})"))
    noise = head.noise
    cards.append(("noise (1 evaluation)",
                  "not measured" if not noise.known else f"σ {noise.sigma:.3g} ({_e(noise.source)})"))
    cards.append(("false-keep rate", f"{study.config.acceptance.rate:.3g}"
                  + (' <b class="warn">noise ignored</b>' if head.noise_ignored else "")))
    incumbent = ledger.get("incumbent")
    if incumbent:
        cards.append(("incumbent", f"{_e(ledger.get('incumbent_id') or '')} <code>{_e(str(incumbent)[:7])}</code>"))
    card_html = "".join(f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{v}</div></div>' for k, v in cards)
    return (
        f"<h1>ratchet report: {_e(study.name)}</h1>"
        f'<div class="sub">{_e(str(study.repo))} · metric <code>{_e(metric)}</code>, goal {_e(goal)} · '
        # rounds run so far, as `ratchet status` says (the ledger's counter is the next one)
        f"round {_e(views.rounds_done(ledger.get('round'), cands))} · "
        f"branch <code>ratchet/{_e(study.name)}</code></div>"
        f'<div class="cards">{card_html}</div>'
    )


def _counts(cands: list[Candidate]) -> str:
    counts: dict[str, int] = {}
    for c in cands:
        counts[c.status] = counts.get(c.status, 0) + 1
    order = [s for s in COLORS if s in counts] + sorted(s for s in counts if s not in COLORS)
    if not order:
        return '<p class="note">no candidates yet: run `ratchet run` or `ratchet submit`.</p>'
    rows = [[_td(_badge(s)), _td(str(counts[s]), "num")] for s in order]
    return "<h2>Counts by status</h2>" + _table(["status", "candidates"], rows)


def _phase_cell(cand: Candidate, state_dir: Path) -> str:
    parts = []
    for p in cand.phases or []:
        label = f"{p.get('name', '?')} {_duration(p.get('seconds'))}"
        if p.get("timed_out"):
            label += " (timed out)"
        elif p.get("exit_code") not in (0, None):
            label += f" (exit {p.get('exit_code')})"
        href = _log_href(p.get("log"), state_dir)
        parts.append(f'<a href="{_e(href)}">{_e(label)}</a>' if href else _e(label))
    return "<br>".join(parts)


def _log_href(log: Any, state_dir: Path) -> str | None:
    """A relative link to a phase log, only for files under .ratchet/ (never elsewhere)."""
    if not isinstance(log, str) or not log:
        return None
    try:
        rel = Path(os.path.realpath(log)).relative_to(Path(os.path.realpath(state_dir)))
    except ValueError:
        return None
    return "../" + "/".join(rel.parts)


def _candidate_table(cands: list[Candidate], metric: str, state_dir: Path,
                     hosts: Machines) -> str:
    if not cands:
        return '<p class="note">no candidates.</p>'
    head = ["id", "round", "commit", "status", metric, "gain", "margin", "noise", "hold-out",
            "phases", "description", "reasons", "machine"]
    rows, classes = [], []
    for c in cands:
        desc = _e(c.description)
        if c.kind != "candidate":
            desc = f"<b>{_e(c.kind)}</b>" + (f": {desc}" if desc and desc != _e(c.kind) else "")
        rows.append([
            _td(f'<span id="{_e(c.id)}">{_e(c.id)}</span>'),
            _td(_e(c.round), "num"),
            _td(f"<code>{_e(c.short)}</code>"),
            _td(_badge(c.status)),
            _td(_num(c.metric), "num"),
            _td(_num(c.gain, ".4g"), "num"),
            _td(_num(c.margin, ".4g"), "num"),
            _td(_num(c.noise, ".4g"), "num"),
            _td(_num(c.holdout), "num"),
            _td(_phase_cell(c, state_dir)),
            _td(desc, "text"),
            _td(_e(c.reasons), "text"),
            _td(hosts.cell(c)),
        ])
        classes.append("keep" if c.status == "keep" else "")
    return _table(head, rows, classes)


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
        order = sorted(cands, key=lambda c: (c.kind != "baseline", c.seq))
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


def _machine_warning(hosts: Machines) -> str:
    if len(hosts.labels) < 2:
        return ""
    names = ", ".join(f"{label} ({key})" for key, label in hosts.labels.items())
    return (f'<p class="warn">Results from {len(hosts.labels)} different machines: {_e(names)}. '
            "A metric measured on other hardware than the baseline's is not comparable with it; "
            "those rows are flagged in the candidate table (see Machines).</p>")


def _machines(hosts: Machines) -> str:
    if not hosts.fingerprints:
        return '<p class="note">no result records its machine (results from an older ratchet).</p>'
    variants: dict[tuple[str, str], list[str]] = {}
    for cand_id, fp in hosts.fingerprints.items():
        variants.setdefault((fingerprint_key(fp), software_key(fp)), []).append(cand_id)
    rows = []
    for (key, software), ids in sorted(variants.items(), key=lambda kv: (hosts.labels[kv[0][0]], kv[1][0])):
        shown = ", ".join(ids[:12]) + (f" … (+{len(ids) - 12})" if len(ids) > 12 else "")
        rows.append([
            _td(_e(hosts.labels[key]) + (" (baseline's)" if key == hosts.reference else "")),
            _td(_e(key), "text"),
            _td(_e(software), "text"),
            _td(str(len(ids)), "num"),
            _td(_e(shown), "text"),
        ])
    out = _table(["machine", "hardware", "driver and libraries", "results", "candidates"], rows)
    same_hw = {k for k, _ in variants}
    if len(variants) > len(same_hw):
        out += ('<p class="warn">Software versions changed during the study on the same hardware: '
                "a driver or library change can move timings by more than the noise.</p>")
    return out


def _shares(cands: list[Candidate]) -> str:
    """Kept / discarded / crashed / rejected shares by proposer and by idea."""
    by_proposer = success_shares(cands, "proposer")
    if not by_proposer:
        return '<p class="note">no candidate proposed yet.</p>'
    out = ["<h3>By proposer</h3>", _share_table("proposer", by_proposer)]
    by_idea = success_shares(cands, "idea")
    if any(s.name != "(no queued idea)" for s in by_idea):
        out += ["<h3>By idea</h3>", _share_table("idea", by_idea)]
    else:
        out.append('<p class="note">no candidate came from a queued idea (ratchet idea, ideas.md).</p>')
    return "".join(out)


def _share_table(name: str, shares: list[Share]) -> str:
    def cell(share: Share, status: str) -> str:
        n = share.counts.get(status, 0)
        return _td(f"{n} ({share.share(status) * 100:.0f}%)" if share.judged else str(n), "num")

    rows = []
    for share in shares:
        reasons = sorted(share.reasons.items(), key=lambda kv: (-kv[1], kv[0]))
        rows.append([
            _td(_e(share.name), "text"),
            _td(str(sum(share.counts.values())), "num"),
            cell(share, "keep"), cell(share, "discard"), cell(share, "crash"), cell(share, "rejected"),
            _td("<br>".join(f"{_e(r)} ×{n}" for r, n in reasons[:6]), "text"),
        ])
    return _table([name, "candidates", "kept", "discarded", "crashed", "rejected",
                   "crash and rejection reasons"], rows)


def roofline_pct(cand: Candidate) -> float | None:
    """The candidate's % of roofline, from the first extra metric that reports it."""
    for key in ROOFLINE_KEYS:
        value = (cand.extra or {}).get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def _roofline(study: Any, cands: list[Candidate], metric: str, goal: str) -> str:
    """The incumbent's % of roofline after each kept step: how far from the bound it is."""
    baseline = next((c for c in cands if c.kind == "baseline"), None)
    path = ([baseline] if baseline is not None else []) + [s.cand for s in kept_steps(study.ledger)]
    path = [c for c in path if roofline_pct(c) is not None]
    if not path:
        return ""
    rows = []
    for c in path:
        pct = roofline_pct(c) or 0.0
        rows.append([
            _td(_e(c.id) + (" (baseline)" if c.kind == "baseline" else "")),
            _td(_num(c.metric), "num"),
            _td(f"{pct:.1f}%", "num"),
            _td(f"{100 / pct:.2f}×" if pct > 0 else "", "num"),
            _td(_e(c.description), "text"),
        ])
    now = roofline_pct(path[-1]) or 0.0
    first = roofline_pct(path[0]) or 0.0
    summary = (f"The incumbent {_e(path[-1].id)} runs at <b>{now:.1f}%</b> of the roofline"
               + (f" (started at {first:.1f}%)" if len(path) > 1 else "")
               + (f": {100 / now:.2f}× from the bound." if now > 0 else "."))
    return ("<h2>Roofline</h2>" f"<p>{summary}</p>"
            + _table(["step", metric, "% of roofline", "distance to the bound", "description"], rows))


def _phase_table(cands: list[Candidate]) -> str:
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for c in cands:
        for p in c.phases or []:
            by_phase.setdefault(str(p.get("name", "?")), []).append(p)
    if not by_phase:
        return '<p class="note">no phase has run yet.</p>'
    rows = []
    for name, runs in by_phase.items():
        secs = sorted(float(p.get("seconds") or 0.0) for p in runs)
        median = secs[len(secs) // 2] if len(secs) % 2 else (secs[len(secs) // 2 - 1] + secs[len(secs) // 2]) / 2
        failed = sum(1 for p in runs if p.get("exit_code") not in (0, None) and not p.get("timed_out"))
        rows.append([
            _td(f"<code>{_e(name)}</code>"),
            _td(str(len(runs)), "num"),
            _td(_duration(median), "num"),
            _td(_duration(sum(secs) / len(secs)), "num"),
            _td(_duration(secs[-1]), "num"),
            _td(_duration(sum(secs)), "num"),
            _td(str(sum(1 for p in runs if p.get("timed_out"))), "num"),
            _td(str(failed), "num"),
        ])
    return _table(["phase", "runs", "median", "mean", "max", "total", "timed out", "failed"], rows)


def _incumbent(study: Any, cands: list[Candidate], metric: str) -> str:
    ledger = study.ledger
    incumbent, pinned = ledger.get("incumbent"), ledger.get("pinned")
    if not incumbent:
        return '<p class="note">no incumbent yet.</p>'
    inc_id = ledger.get("incumbent_id")
    cand = next((c for c in cands if c.id == inc_id), None)
    facts = [
        ("candidate", _e(inc_id or "")),
        ("commit", f"<code>{_e(incumbent)}</code>"),
        (metric, _num(ledger.get("incumbent_metric"))),
        (f"hold-out {metric}", _num(ledger.get("incumbent_holdout"))),
        ("description", _e(cand.description if cand else "")),
        ("study start (pinned)", f"<code>{_e(pinned or '')}</code>"),
    ]
    out = [_kv_table(facts)]
    if pinned and pinned != incumbent:
        try:
            diff = gitrepo.diff_text(Path(study.repo), pinned, incumbent)
        except gitrepo.GitError as exc:
            out.append(f'<p class="note">diff unavailable: {_e(exc)}</p>')
        else:
            out.append(f"<p>What the study kept: <code>git diff {_e(pinned[:7])} {_e(incumbent[:7])}</code></p>")
            out.append(_diff_html(diff))
    else:
        out.append('<p class="note">the incumbent is still the study start: nothing kept yet.</p>')
    return "".join(out)


def _diff_html(diff: str) -> str:
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
    return f'<pre class="diff">{chr(10).join(lines)}{_e(cut)}</pre>' if lines else '<p class="note">empty diff.</p>'


def _costs(cands: list[Candidate], created: float | None, slots: int) -> str:
    run_s = sum(c.run_s or 0.0 for c in cands)
    queue_s = sum(c.queue_s or 0.0 for c in cands)
    cost = sum(c.cost_usd or 0.0 for c in cands)
    finished = [c.finished_at for c in cands if c.finished_at]
    wall = max(finished) - created if finished and created else None
    judged = sum(1 for c in cands if c.kind == "candidate" and c.is_judged)
    facts = [
        ("job hours", f"{run_s / 3600:.4f}"),
        ("queue hours", f"{queue_s / 3600:.4f}"),
        ("cost (USD)", f"{cost:.2f}"),
        ("wall time", _duration(wall) if wall and wall > 0 else ""),
        ("candidates judged per hour", f"{judged / (wall / 3600):.1f}" if wall and wall > 0 else ""),
    ]
    busy = throughput(cands, slots)  # how busy the slots were, and the most they could do
    if busy.duty is not None:
        facts += [
            (f"duty cycle ({slots} slot{'s' * (slots != 1)})", f"{busy.duty:.0%}"),
            ("limit: candidates per hour at full duty", f"{busy.limit_per_hour:.0f}"),
        ]
    return _kv_table(facts, "num")


def _dispatch(study: Any) -> str:
    """dispatch.json from the incumbent's tree (else the repo root), as a table."""
    incumbent = study.ledger.get("incumbent")
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
        table = json.loads(text)
        buckets = table["buckets"]
        rows = [[
            _td(f"<code>{_e(key)}</code>"),
            _td(_e(b.get("impl"))),
            _td(_num(b.get("speedup"), ".3f"), "num"),
            _td(_e(b.get("reason")), "text"),
        ] for key, b in buckets.items()]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return head + f'<p class="note">could not read it: {_e(type(exc).__name__)}: {_e(exc)}</p>'
    versions = table.get("versions") if isinstance(table.get("versions"), dict) else {}
    tags = (f"device {_e(table.get('device') or 'unspecified')}; baseline <code>{_e(table.get('baseline'))}</code>; "
            + ", ".join(f"{_e(k)} {_e(v)}" for k, v in versions.items()))
    return head + f"<p>{tags}</p>" + _table(["bucket", "impl", "speedup", "reason"], rows)


# ---------------------------------------------------------------------------------------
# plots (matplotlib, optional)


def _plots(cands: list[Candidate], metric: str, goal: str) -> tuple[dict[str, str], str]:
    """{name: <img> html} and, when there are none, a note saying why."""
    try:
        from matplotlib.figure import Figure  # lazy: the report works without it
    except ImportError:
        return {}, "plots need matplotlib: pip install matplotlib (the tables below are complete)"
    plots = {}
    if any(c.metric is not None for c in cands):
        plots["metric"] = _img(_metric_figure(Figure, cands, metric, goal), f"{metric} over candidates")
    if any(c.phases for c in cands):
        plots["phases"] = _img(_phase_figure(Figure, cands), "phase durations per candidate")
    return plots, "no candidate has a metric yet"


def _img(fig: Any, alt: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img class="plot" alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _metric_figure(Figure: Any, cands: list[Candidate], metric: str, goal: str) -> Any:
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax = fig.add_subplot()
    seqs = [c.seq for c in cands]
    statuses = list(dict.fromkeys(c.status for c in cands))
    for status in statuses:
        pts = [(c.seq, c.metric) for c in cands if c.status == status and c.metric is not None]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=42, color=COLORS.get(status, OPEN_COLOR),
                       label=f"{status} ({len(pts)})", zorder=3, edgecolors="white", linewidths=0.6)
    # candidates with no metric (crashed, rejected before running): marks along the bottom
    missing = [c for c in cands if c.metric is None]
    if missing:
        trans = ax.get_xaxis_transform()
        for status in dict.fromkeys(c.status for c in missing):
            xs = [c.seq for c in missing if c.status == status]
            ax.scatter(xs, [0.03] * len(xs), transform=trans, marker="x", s=40, color=COLORS.get(status, OPEN_COLOR),
                       label=f"{status}, no {metric} ({len(xs)})", zorder=3)
    best = running_best(cands)
    if best:
        xs = [b[0] for b in best] + [max(seqs)]
        ys = [b[1] for b in best] + [best[-1][1]]
        ax.step(xs, ys, where="post", color=COLORS["keep"], linewidth=2, alpha=0.8, label="incumbent (best kept)", zorder=2)
    rounds = sorted({c.round for c in cands})
    for i, r in enumerate(rounds):  # every other round shaded, so rounds read as bands
        members = [c.seq for c in cands if c.round == r]
        if i % 2:
            ax.axvspan(min(members) - 0.5, max(members) + 0.5, color="#f0f0f0", zorder=0)
    ax.set_xlim(min(seqs) - 0.6, max(seqs) + 0.6)
    ax.set_xlabel("candidate, in the order proposed (shaded bands: alternate rounds)")
    ax.set_ylabel(f"{metric} ({'lower' if goal == 'minimize' else 'higher'} is better)")
    values = [c.metric for c in cands if c.metric is not None]
    if values and min(values) > 0 and max(values) / min(values) > 20:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=9, framealpha=0.9)
    if len(seqs) <= 40:
        ax.set_xticks(seqs)
        ax.set_xticklabels([c.id for c in cands], rotation=60, fontsize=8)
    return fig


def _phase_figure(Figure: Any, cands: list[Candidate]) -> Any:
    with_phases = [c for c in cands if c.phases]
    names = list(dict.fromkeys(str(p.get("name", "?")) for c in with_phases for p in c.phases or []))
    fig = Figure(figsize=(11, 2.8), layout="constrained")
    ax = fig.add_subplot()
    xs = list(range(len(with_phases)))
    bottom = [0.0] * len(with_phases)
    for i, name in enumerate(names):
        heights = [sum(float(p.get("seconds") or 0) for p in c.phases or [] if str(p.get("name")) == name) for c in with_phases]
        ax.bar(xs, heights, bottom=bottom, color=PHASE_COLORS[i % len(PHASE_COLORS)], label=name, width=0.7)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("seconds")
    step = max(1, math.ceil(len(xs) / 40))  # at most ~40 labels
    ax.set_xticks(xs[::step])
    ax.set_xticklabels([c.id for c in with_phases][::step], rotation=60, fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    return fig
