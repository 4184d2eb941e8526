"""The evaluator's side of the trusted metric channel.

The worker gives each trusted evaluate / hold-out phase the write end of a pipe and names
its file descriptor in `RATCHET_METRICS_FD`; no other phase gets one. An evaluator reports
with `report({...})`: one JSON object per call, written to that pipe, numbered
(`ratchet:seq`) and saying whether it was also printed (`ratchet:echo`). The worker takes its
metrics from the pipe, and treats any stdout or `$RATCHET_RESULT` value that disagrees
with it as tampering, so a candidate that prints `time_ms: 0.001` after the evaluator's
own lines, or registers an `atexit` handler that does, is caught. So is a line someone
else wrote into the pipe: the worker rejects a channel that overflowed or was cut off,
whose lines are not numbered 1..n, or whose metrics were echoed but are missing from the
printed output (a candidate that floods the log to push the echo out of it).

The descriptor is taken once, at import: the variable leaves `os.environ` (children
started afterwards never learn it), the descriptor stops being inherited across exec, and
the process becomes non-dumpable so that a child running as the same (non-root) user
cannot reopen it through `/proc/<pid>/fd/N`. Non-dumpable does not bind root: a
candidate child running as root without a PID namespace can still write into the pipe,
which is why the worker checks what it carries, and why `ratchet.evaluator.isolate` runs the child
in its own PID namespace as an unprivileged user where the machine allows it. Import this module before starting any
candidate process. Code running inside the evaluator's own process (an imported
candidate module) is out of its reach: that needs a second process (see the kernels
harness).

Run by hand, with no worker around, `report` only prints.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import sys
import threading
from collections.abc import Mapping

ENV_VAR = "RATCHET_METRICS_FD"
PR_SET_DUMPABLE = 4

# Control keys on each line (metric names cannot hold ':', so these never clash with one):
# the line's number among this evaluator's reports (1, 2, ...) and whether its metrics were
# also printed. The worker rejects a channel whose lines do not number 1..n, that was cut
# off or overflowed, or whose printed echo is missing from the phase's log (a flooded log
# drops its middle): each means a line reached the pipe that this module did not write.
SEQ_KEY = "ratchet:seq"
ECHO_KEY = "ratchet:echo"

_lock = threading.Lock()
_taken = False
_fd: int | None = None
_seq = 0

Value = float | int | bool | str


def _make_nondumpable() -> None:
    """Best effort: /proc/<pid>/fd and /proc/<pid>/mem become root-only (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _take() -> int | None:
    """Claim the channel's descriptor once; later calls return the same one (or None)."""
    global _taken, _fd
    with _lock:
        if _taken:
            return _fd
        _taken = True
        raw = os.environ.pop(ENV_VAR, None)
        if raw is None:
            return None
        try:
            fd = int(raw)
            os.fstat(fd)
        except (ValueError, OSError):
            return None  # a stale or bogus name: behave as if run by hand
        with contextlib.suppress(OSError):
            os.set_inheritable(fd, False)
        _make_nondumpable()
        _fd = fd
        return fd


def available() -> bool:
    """True when a worker is listening (the metrics reach it through the channel)."""
    return _take() is not None


def _plain(value: object) -> Value:
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    # numpy / torch scalars and the like: keep the number, not its repr
    with contextlib.suppress(TypeError, ValueError):
        number = float(value)  # type: ignore[arg-type]
        return number
    return str(value)


def _format(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):  # one line per metric: text cannot forge a second line
        return " ".join(value.splitlines())
    return str(value)  # repr-exact for floats, so the printed line matches the channel


def report(metrics: Mapping[str, Value], *, echo: bool = True) -> None:
    """Send `metrics` to the worker; with `echo`, also print `name: value` lines."""
    clean: dict[str, Value] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name or any(c.isspace() for c in name) or ":" in name:
            raise ValueError(f"metric names are single words without ':': {name!r}")
        clean[name] = _plain(value)
    fd = _take()
    if fd is not None:
        global _seq
        with _lock:
            _seq += 1
            line = (json.dumps({**clean, SEQ_KEY: _seq, ECHO_KEY: echo}, allow_nan=True) + "\n").encode()
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                view = view[written:]
    if echo:
        for name, value in clean.items():
            print(f"{name}: {_format(value)}")
        sys.stdout.flush()


_take()  # at import: before the evaluator can start a child that would inherit the name
