"""A real headless Chromium, driven over the DevTools protocol on a pipe (stdlib only).

`chromium --dump-dom` (tests/test_report.py) loads a page once; a live page must be
watched while it changes, without reloading it. `--remote-debugging-pipe` gives the
DevTools protocol on file descriptors 3 (commands in) and 4 (replies and events out),
NUL-terminated JSON, so no websocket client is needed: `Browser.goto` opens a page,
`Browser.eval` runs an expression in it and returns the value, `Browser.wait_for` polls
one until it holds, `Browser.screenshot` writes a PNG.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BASH = shutil.which("bash") or "/bin/bash"  # its redirections take fds above 9; dash's do not
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install chromium; .ci/run installs it)",
)


class BrowserError(AssertionError):
    pass


class Browser:
    def __init__(self, profile: Path, width: int = 1300, height: int = 1000) -> None:
        assert CHROMIUM is not None
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # far above 3 and 4, so the shell's redirections below never collide
        high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 50)
        high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 50)
        for fd in (to_child_r, from_child_w):
            os.close(fd)
        argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--disable-extensions",
                "--remote-debugging-pipe", f"--user-data-dir={profile}",
                f"--window-size={width},{height}", "about:blank"]
        self.proc = subprocess.Popen(
            [BASH, "-c", f'exec "$@" 3<&{high_r} 4>&{high_w} {high_r}<&- {high_w}>&-',
             "bash", *argv],
            pass_fds=(high_r, high_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(high_r)
        os.close(high_w)
        self._ids = itertools.count(1)
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self.console: list[str] = []  # console messages and exceptions the page logged
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.width, self.height = width, height
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target,
                                                           "flatten": True})["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(domain, session=True)
        self.call("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=True)

    # -- the protocol -------------------------------------------------------------------

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._replies[-1] = {"error": {"message": "chromium closed the pipe"}}
                    self._cond.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._cond:
                        self._replies[message["id"]] = message
                        self._cond.notify_all()
                elif message.get("method") == "Runtime.consoleAPICalled":
                    args = message["params"].get("args", [])
                    self.console.append(" ".join(str(a.get("value", "")) for a in args))
                elif message.get("method") == "Runtime.exceptionThrown":
                    self.console.append(json.dumps(message["params"].get("exceptionDetails", {})))
                elif message.get("method") == "Log.entryAdded":
                    self.console.append(message["params"]["entry"].get("text", ""))

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False,
             timeout: float = 30) -> dict[str, Any]:
        msg_id = next(self._ids)
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while msg_id not in self._replies and -1 not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrowserError(f"{method}: no reply in {timeout} s")
                self._cond.wait(left)
            reply = self._replies.pop(msg_id, None) or self._replies[-1]
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    # -- what a test does ---------------------------------------------------------------

    def goto(self, url: str, timeout: float = 30) -> None:
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'",
                      timeout=timeout)

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('text')} "
                               f"{result['exceptionDetails'].get('exception', {}).get('description', '')}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 30, interval: float = 0.1) -> Any:
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = self.eval(expression)
            if last:
                return last
            time.sleep(interval)
        raise BrowserError(f"{expression} still {last!r} after {timeout} s")

    def mouse(self, kind: str, x: float, y: float, held: bool = False) -> None:
        """A real mouse event at (x, y) of the viewport: mousePressed, mouseMoved (`held`:
        with the left button down) or mouseReleased, as a hand on a mouse sends them."""
        pressing = kind == "mousePressed" or held
        self.call("Input.dispatchMouseEvent", {
            "type": kind, "x": x, "y": y, "clickCount": 1,
            "button": "left" if kind != "mouseMoved" or held else "none",
            "buttons": 1 if pressing else 0}, session=True)

    def center(self, selector: str) -> tuple[float, float]:
        """The middle of the first element `selector` finds, scrolled into view."""
        rect = self.eval(f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
                         " el.scrollIntoView({block: 'center'}); const r = el.getBoundingClientRect();"
                         " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        return rect[0], rect[1]

    def click(self, selector: str) -> None:
        """Click the element `selector` finds, with the mouse, as a user would."""
        x, y = self.center(selector)
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y)
        self.mouse("mouseReleased", x, y)

    def drag(self, start: tuple[float, float], end: tuple[float, float], steps: int = 8) -> None:
        self.mouse("mouseMoved", *start)
        self.mouse("mousePressed", *start)
        for i in range(1, steps + 1):
            self.mouse("mouseMoved", start[0] + (end[0] - start[0]) * i / steps,
                       start[1] + (end[1] - start[1]) * i / steps, held=True)
        self.mouse("mouseReleased", *end)

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = min(int(self.eval("document.documentElement.scrollHeight")), 6000)
            params["clip"] = {"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", params, session=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(BrowserError):
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self._to_child)
        # the read end is closed only once its reader is gone: a read blocked on a closed
        # descriptor can be restarted on whatever takes the number next in this process
        # (another test's socket: ratchet/job/egress.py, Proxy.close); a helper of
        # chromium's still holding the pipe keeps it open until this process ends
        self._reader.join(timeout=5)
        if not self._reader.is_alive():
            with contextlib.suppress(OSError):
                os.close(self._from_child)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
