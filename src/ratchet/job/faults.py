"""Crash points for fault-injection tests: `RATCHET_FAULT=<label>:<n>[,<label>:<n>...]`.

`fault_point("label")` SIGKILLs this process the n-th time it reaches the named point,
exactly as `kill -9` from outside would land there. Without the variable it does
nothing (one dict lookup), so the points stay in production code at the places where a
crash is hardest to survive: between a decision and the record of it.
"""

from __future__ import annotations

import os
import signal

_reached: dict[str, int] = {}


def fault_point(label: str) -> None:
    spec = os.environ.get("RATCHET_FAULT")
    if not spec:
        return
    _reached[label] = _reached.get(label, 0) + 1
    for item in spec.split(","):
        name, _, nth = item.strip().partition(":")
        if name == label and _reached[label] == int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)
