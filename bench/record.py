"""Recording a benchmark's figure (`--record`): bench/RESULTS.md keeps the latest run of
each benchmark, bench/HISTORY.md every earlier one, verbatim, newest first.

`record(benchmark, command, body)` writes a section `## <benchmark>, <UTC time>` with the
command and the machine at the top of RESULTS.md's sections. A section of the same
benchmark already there (its heading starts with `## <benchmark>`) moves to the top of
HISTORY.md's sections unchanged, so RESULTS.md never holds two figures of one benchmark
and nothing measured is lost.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "RESULTS.md"
HISTORY = BENCH / "HISTORY.md"


def machine() -> str:
    """The CPU model, its cores and the Python, as RESULTS.md names a machine."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def split(text: str) -> tuple[str, list[str]]:
    """A page's header (everything before its first `## ` heading) and its sections, each
    from its `## ` heading to the next one (`###` subsections stay inside; a heading
    inside a code fence is not one)."""
    header: list[str] = []
    sections: list[list[str]] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if line.startswith("## ") and not fenced:
            sections.append([])
        (sections[-1] if sections else header).append(line)
    return ("\n".join(header).rstrip("\n"),
            ["\n".join(lines).rstrip("\n") for lines in sections])


def join(header: str, sections: list[str]) -> str:
    return "\n\n".join([header, *sections]) + "\n"


def record(benchmark: str, command: str, body: str, *, results: Path = RESULTS,
           history: Path = HISTORY, now: float | None = None) -> str:
    """Put this run at the top of RESULTS.md, moving the one it replaces to HISTORY.md;
    returns the new section."""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(now))
    section = (f"## {benchmark}, {stamp}\n\nCommand: `{command}`\n\nMachine: {machine()}.\n\n"
               f"{body.strip()}")
    header, sections = split(results.read_text() if results.exists() else "# Bench results")
    older = [s for s in sections if s.startswith(f"## {benchmark}")]
    kept = [s for s in sections if not s.startswith(f"## {benchmark}")]
    if older:
        past_header, past = split(history.read_text() if history.exists()
                                  else "# Bench history")
        history.write_text(join(past_header, [*older, *past]))
    results.write_text(join(header, [section, *kept]))
    return section
