"""Two candidates side by side (the live app's `/compare?a=ID&b=ID`): their numbers, what
the difference between them is, their phases, their knobs and the diff from one to the
other. Reached from the nav, and from each candidate's page (with the incumbent, with its
parent). Every text is escaped: descriptions, params and diffs come from proposers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ratchet.core.candidate import Candidate
from ratchet.core.vocab import Kind
from ratchet.ui import blocks
from ratchet.ui.blocks import _badge, _e, _num, duration, table, td

if TYPE_CHECKING:
    from ratchet.ui.blocks import Site, Snapshot, StudyLike

CHOICES = 2000  # the most candidates each picker lists (the newest)


def links(snap: Snapshot, cand: Candidate, site: Site) -> str:
    """Links to `cand` side by side with the incumbent and with its parent's candidate
    (the first row that measured the parent commit: the candidate kept, or the baseline)."""
    if not site.live:  # the static report writes no page per pair
        return ""
    parent = next((c.id for c in snap.cands if cand.parent and c.commit_sha == cand.parent),
                  None)
    others = [("the incumbent", snap.head.incumbent_id), ("its parent", parent)]
    found = [f'<a href="{_e(href)}">{_e(name)} ({_e(other)})</a>' for name, other in others
             if other and other != cand.id and (href := site.compare(other, cand.id))]
    if not found:
        return ""
    return f'<p id="compare-with">compare side by side with {" · ".join(found)}</p>'


def pickers(snap: Snapshot, a: str | None, b: str | None) -> str:
    """Two lists of candidates; the live page's script opens the pair picked."""
    first, second = defaults(snap)
    a, b = a or first, b or second
    rows = sorted(snap.everything, key=lambda c: (c.kind == Kind.CONFIRM, -c.seq))[:CHOICES]

    def select(name: str, chosen: str | None) -> str:
        opts = "".join(f'<option value="{_e(c.id)}"{" selected" if c.id == chosen else ""}>'
                       f"{_e(c.id)} {_e(c.status)}: {_e(c.description[:60])}</option>"
                       for c in rows)
        return f'<label>{name.upper()} <select id="compare-{name}">{opts}</select></label>'

    return (f'<div class="filters" id="compare-pick">{select("a", a)}{select("b", b)}'
            '<span class="note">pick two: the page opens them side by side</span></div>')


def defaults(snap: Snapshot) -> tuple[str | None, str | None]:
    """With none asked: the baseline against the incumbent (what the study kept)."""
    base = next((c.id for c in snap.cands if c.kind == Kind.BASELINE), None)
    inc = snap.head.incumbent_id
    return base, inc if inc != base else next(
        (c.id for c in reversed(snap.cands) if c.id != base), None)


def page(study: StudyLike, snap: Snapshot, a_id: str, b_id: str, site: Site) -> str:
    a, b = snap.by_id(a_id), snap.by_id(b_id)
    if a is None or b is None:
        raise LookupError(a_id if a is None else b_id)
    ea, eb = snap.estimate(a.commit_sha), snap.estimate(b.commit_sha)

    def diff(va: float | None, vb: float | None) -> str:
        if va is None or vb is None:
            return ""
        change = f" ({(vb - va) / abs(va):+.2%})" if va else ""
        return f"{vb - va:+.6g}{change}"

    def link(c: Candidate) -> str:
        return f'<a href="{_e(site.candidate(c.id))}">{_e(c.id)}</a>'

    numbers: list[tuple[str, Callable[[Candidate], str], str]] = [
        ("candidate", link, ""),
        ("status", lambda c: _badge(c.status), ""),
        ("kind", lambda c: _e(c.kind), ""),
        ("round", lambda c: _e(c.round), ""),
        ("proposer", lambda c: _e(c.proposer or ""), ""),
        ("description", lambda c: _e(c.description), ""),
        ("commit", lambda c: f"<code>{_e(c.short)}</code>", ""),
        (snap.metric, lambda c: _num(c.metric), diff(a.metric, b.metric)),
        (f"{snap.metric}, pooled", lambda c: _e(e.text()) if (e := snap.estimate(c.commit_sha))
         else "", diff(ea.mean if ea else None, eb.mean if eb else None)),
        ("evaluations", lambda c: str(len(snap.groups.get(c.commit_sha or "", []))), ""),
        ("gain", lambda c: _num(c.gain, ".4g"), ""),
        ("noise", lambda c: _num(c.noise, ".4g"), ""),
        (f"hold-out {snap.metric}", lambda c: _num(c.holdout), diff(a.holdout, b.holdout)),
        ("ran", lambda c: duration(c.run_s), diff(a.run_s, b.run_s)),
        ("compute cost (USD)", lambda c: f"{c.cost_usd:.4f}" if c.cost_usd is not None else "",
         diff(a.cost_usd, b.cost_usd)),
        ("reasons", lambda c: _e(c.reasons or ""), ""),
    ]
    knobs = sorted(set(params(a)) | set(params(b)))
    numbers += [(f"knob {k}", knob_cell(k), "differs" if params(a).get(k) != params(b).get(k)
                 else "") for k in knobs]
    words = {"candidate", "status", "kind", "proposer", "description", "commit", "reasons"}

    def kind(name: str) -> str:  # words wrap; numbers line up on the right
        return "text" if name in words or name.startswith("knob ") else "num"

    rows = [[blocks.td(_e(name)), blocks.td(show(a), kind(name)), blocks.td(show(b), kind(name)),
             blocks.td(_e(change), "num")] for name, show, change in numbers]
    out = [f"<h1>{_e(a.id)} and {_e(b.id)} side by side</h1>",
           blocks.table(["", f"A: {a.id}", f"B: {b.id}", "B − A"], rows, table_id="compare-numbers"),
           "<h2>Phases</h2>", phase_rows(a, b),
           "<h2>Diff from A to B</h2>",
           blocks.diff_section(study, a.commit_sha, b.commit_sha, snap.diffs)]
    return "".join(out)


def knob_cell(key: str) -> Callable[[Candidate], str]:
    return lambda c: _e(json.dumps(params(c).get(key), default=str))


def params(cand: Candidate) -> dict[str, Any]:
    return {k: v for k, v in (cand.params or {}).items() if k != "llm"}


def phase_rows(a: Candidate, b: Candidate) -> str:
    def of(c: Candidate) -> dict[str, dict[str, Any]]:
        return {str(p.get("name", "?")): p for p in c.phases or []}

    pa, pb = of(a), of(b)
    names = list(dict.fromkeys([*pa, *pb]))
    if not names:
        return '<p class="note">neither ran a phase.</p>'

    def cell(p: dict[str, Any] | None) -> str:
        if p is None:
            return td("—")
        state = " (timed out)" if p.get("timed_out") else (
            f" (exit {p.get('exit_code')})" if p.get("exit_code") not in (0, None) else "")
        return td(_e(duration(p.get("seconds")) + state), "num", sort=p.get("seconds"))

    def change(x: dict[str, Any] | None, y: dict[str, Any] | None) -> str:
        if not x or not y or x.get("seconds") is None or y.get("seconds") is None:
            return td("")
        return td(f"{float(y['seconds']) - float(x['seconds']):+.2f} s", "num")

    rows = [[td(f"<code>{_e(n)}</code>"), cell(pa.get(n)), cell(pb.get(n)),
             change(pa.get(n), pb.get(n))] for n in names]
    return table(["phase", f"A: {a.id}", f"B: {b.id}", "B − A"], rows, table_id="compare-phases")
