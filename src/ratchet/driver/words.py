"""Verdicts and failures in plain words, for a person reading `ratchet run` in the morning.

The judge records its reasons with their numbers (`gain 0.012 within margin 0.021 (the
noise)`, `Z 2 < 3.88`); `ratchet show` prints them as recorded. Here the same verdict is
said as a researcher says it: "not kept: the gain (1.2%) is within the noise (±2.1%)".
Nothing here judges: each sentence is read off the verdict's code and the numbers the
judge stored with it (gain, margin, noise: in the metric's units, + = better).

A failure's reason is cut to fit a line keeping its informative end (the exception, not
the traceback's first `File "..."`), and a `ModuleNotFoundError` under `python -P` says
the cause and the fix.
"""

from __future__ import annotations

import re
import shlex

from ratchet.core.candidate import Candidate
from ratchet.core.vocab import Status
from ratchet.driver import views
from ratchet.driver.views import Headline, shorten

# an exception's line in a traceback's tail: `ModuleNotFoundError: No module named 'x'`
_EXCEPTION = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning))\b(:|$)")
_NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def pct(value: float) -> str:
    """0.01234 -> '1.23%'; small values keep two significant digits."""
    number = abs(value) * 100
    return f"{number:.2g}%" if number < 1 else f"{number:.3g}%" if number < 100 else \
        f"{number:.0f}%"


def _incumbent_at(cand: Candidate, goal: str) -> float | None:
    """The incumbent's value the judge compared with: the candidate's value less its gain."""
    if cand.metric is None or cand.gain is None:
        return None
    return cand.metric + cand.gain if goal == "minimize" else cand.metric - cand.gain


def _amount(value: float, reference: float | None) -> str:
    """A difference as a % of the incumbent where there is one, else in the metric's units."""
    if reference:
        return pct(value / abs(reference))
    return f"{abs(value):.4g}"


def verdict(cand: Candidate, goal: str) -> str | None:
    """The verdict of a judged candidate in one plain sentence, None where its recorded
    reason already is one (a crash's, a rejection's, a cancellation's)."""
    from ratchet.core.verdict import Reason

    code, gain, noise, margin = cand.code, cand.gain, cand.noise, cand.margin
    ref = _incumbent_at(cand, goal)
    if code == Reason.STOPPED_EARLY:
        return f"stopped early: {stopped(cand)}"
    if code == Reason.NO_GAIN and gain is not None:
        if gain == 0:
            return "not kept: no better than the incumbent"
        return f"not kept: {_amount(gain, ref)} worse than the incumbent"
    if code == Reason.WITHIN_MARGIN and gain is not None:
        if noise is not None and (margin is None or noise >= margin or "noise" in
                                  (cand.reasons or "")):
            return (f"not kept: the gain ({_amount(gain, ref)}) is within the noise "
                    f"(±{_amount(noise, ref)})")
        return (f"not kept: the gain ({_amount(gain, ref)}) is below min_improvement"
                + (f" ({_amount(margin, ref)})" if margin is not None else ""))
    if code == Reason.NOT_CONFIRMED and gain is not None:
        return f"not kept: the gain ({_amount(gain, ref)}) did not hold up on fresh pairs"
    if code == Reason.NO_NOISE:
        return "not kept: no noise estimate yet to confirm the gain against"
    if code == Reason.BEATEN:
        return f"not kept: {cand.reasons}" if cand.reasons else None
    if code == Reason.KEPT and gain is not None:
        beyond = f", beyond the noise (±{_amount(noise, ref)})" if noise else ""
        return f"kept: {_amount(gain, ref)} better than the incumbent{beyond}"
    return None


def stopped(cand: Candidate) -> str:
    """Why a run was stopped, with its numbers where the worker recorded them. The point
    is the run's own progress axis (a step, or seconds for a run on a time budget such
    as tinygpt's), so it is not called a step."""
    extra = cand.extra or {}
    x, value, level = (extra.get(k) for k in ("stopped_at_step", "stopped_value",
                                                "incumbent_value"))
    if all(isinstance(v, int | float) for v in (x, value, level)):
        return (f"clearly worse than the incumbent at the same point of the run "
                f"({value:.4g} vs {level:.4g} at {x:g})")
    return "clearly worse than the incumbent at the same point"


def reason(cand: Candidate, goal: str, width: int) -> str:
    """What to print after a verdict: its plain sentence, else its recorded reason cut to
    `width` keeping the informative end."""
    plain = verdict(cand, goal)
    if plain is not None:
        return shorten(plain, width)
    if cand.status in (Status.KEEP, Status.REFERENCE) or not cand.reasons:
        return ""  # a keep says it above; a re-measure's reason repeats its value
    return gist(cand.reasons, width)


def gist(text: str, width: int) -> str:
    """`text` on one line in at most `width` characters. A failure's reason ends in its
    log's last lines: where it is too long, the exception line is kept (`evaluate failed:
    exit code 1: … ModuleNotFoundError: No module named 'model'`), not the traceback's
    `File "..."` it starts with."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    parts = text.split(" | ")
    last = next((p for p in reversed(parts) if _EXCEPTION.search(p)), None)
    if last is None or len(parts) < 2:
        return shorten(text, width)
    match = _EXCEPTION.search(last)
    assert match is not None
    last = last[match.start():]  # from the exception's name: `Traceback ... ` is noise
    # the head: what failed and how (`evaluate failed: exit code 1`), before the log's tail
    head_parts = parts[0].split(": ")
    head = ": ".join(head_parts[:2]) if len(head_parts) > 2 else parts[0]
    room = width - len(last) - 4
    if len(head) > room:  # `evaluate failed`, without how (the exception says it)
        head = head_parts[0]
    if len(head) > room:
        return shorten(last, width)
    return f"{head}: … {last}"


def module_hint(reasons: str | None, evaluate: str | None) -> str | None:
    """The cause and the fix of a `ModuleNotFoundError` in an evaluator run as
    `python -P`: -P keeps the script's directory (the candidate's tree) off sys.path, so
    `import model` finds nothing. None for any other failure."""
    match = _NO_MODULE.search(reasons or "")
    if match is None or not evaluate:
        return None
    try:
        words = shlex.split(evaluate)
    except ValueError:
        return None
    if not words or "python" not in words[0] or "-P" not in words[1:]:
        return None
    name = match.group(1)
    return (f"hint: no module {name!r} because the evaluator runs as `{evaluate}`: -P "
            "keeps the candidate's directory off sys.path, so nothing there can replace the "
            "evaluator's own modules. Call the candidate's code in a sandboxed child: "
            f"`with CandidateProcess(\"{name.split('.')[0]}.py\") as cand: cand.call(...)` "
            "(docs/evaluator-imports.md)")


def nothing_kept(head: Headline) -> bool:
    """The incumbent is still the study's start (its estimate is the baseline's)."""
    return head.baseline is not None and head.baseline == head.incumbent


def change(head: Headline) -> str:
    """The headline change: '+23.7% (better)', or that nothing was kept (never -0.00%)."""
    if head.change is None:
        return "—"
    if nothing_kept(head):
        return "nothing kept yet"
    return f"{head.change * 100:+.2f}% ({'better' if head.change >= 0 else 'worse'})"


def noise(head: Headline) -> str:
    """The spread of one evaluation in the metric's units, and as a % where the study
    pools it relative to the value (a time, a loss): 'σ 2.1% of the value (≈ 0.31
    time_ms at the incumbent), relative (repeated measurements)'."""
    n = head.noise
    if not n.known or n.sigma is None:
        return "not measured"
    at = head.incumbent.mean if head.incumbent is not None else None
    if n.relative:
        units = f" (≈ {n.sigma * abs(at):.3g} {head.metric} at the incumbent)" if at else ""
        return f"σ {pct(n.sigma)} of the value{units}, relative ({n.source})"
    share = f" ({pct(n.sigma / at)} of the incumbent)" if at else ""
    return f"σ {n.sigma:.3g} {head.metric}{share} ({n.source})"


def round_lines(cands: list, round_no: int, rounds: int, metric: str,
                goal: str = "minimize") -> list[str]:
    """A judged round as it stays on screen: its number once, then one line per verdict
    and, under it, why in plain words, each within 80 columns."""
    lines = [f"round {round_no}/{max(rounds, round_no)}"]
    width = max((len(c.id) for c in cands), default=5)
    for cand in cands:
        what = cand.description or cand.kind
        value = f"{metric} {views.fmt(cand.metric)}" if cand.metric is not None else ""
        line = f"  {cand.id:<{width}} {cand.status:<9} {value:<18} {views.clean(what)}"
        lines.append(views.fit(line, views.LINE_WIDTH))
        why = reason(cand, goal, views.LINE_WIDTH - width - 5)
        if why:
            lines.append(f"  {'':<{width}}   {why}")
    return lines
