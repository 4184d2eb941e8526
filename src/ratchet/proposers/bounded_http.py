"""An HTTP transport for the providers' SDKs that bounds each reply in size and in time.

The SDKs' `timeout` is per read: a server that drips one byte every 0.15 s never trips a
20 s timeout, and a 50 MB reply is read whole into memory. Under this transport every
response body is read through a counter that stops it
- at `max_bytes` (ReplyTooLarge: this request's proposal fails; retrying would fetch the
  same reply again), and
- at the request's total deadline, `deadline_s` after it was sent (a timeout, which the
  SDK and our backoff retry like any other).

It is also where each HTTP request is seen, the SDK's own retries included: inside
`with tap() as sent:` every request this thread sends is noted (when, how it ended, how
long it took), so the proposer can record each one as a call (spend.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

try:  # the SDKs moved to httpx2; older installs use httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed SDK
    import httpx  # type: ignore[no-redef]


@dataclass
class Sent:
    """One HTTP request as the transport saw it."""

    started: float  # time.monotonic()
    seconds: float  # until its response headers (or its failure); 0 while under way
    status: int | None  # None: no response (refused, timed out, dropped)
    error: str | None = None
    done: bool = True  # False from when it is sent until its headers or its failure


class Sends(list[Sent]):
    """The requests one `tap` saw. Once closed (a hard stop billed them), no more is
    sent through it: one that was not sent is not billed, so it must not be sent."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self._lock = threading.Lock()

    def add(self, one: Sent) -> None:
        with self._lock:
            if self.closed:
                raise NotSent("not sent: the study was stopped at once")
            self.append(one)

    def close(self) -> list[Sent]:
        """No more sends; those seen so far."""
        with self._lock:
            self.closed = True
            return list(self)


class NotSent(Exception):
    """A request refused by a closed tap: the study was stopped at once."""


_taps = threading.local()


@contextlib.contextmanager
def tap() -> Iterator[Sends]:
    """Note every request this thread sends meanwhile (the SDKs' sync clients send on
    the caller's thread), from the moment it is sent: one still under way (`done`
    False) can be billed by a hard stop that does not wait for it."""
    previous = getattr(_taps, "sent", None)
    sent = Sends()
    _taps.sent = sent
    try:
        yield sent
    finally:
        _taps.sent = previous


class ReplyTooLarge(Exception):
    """The server's reply passed the size limit."""


class _Bounded(httpx.SyncByteStream):
    def __init__(self, inner: Any, request: Any, max_bytes: int, deadline: float) -> None:
        self.inner, self.request, self.max_bytes, self.deadline = (
            inner, request, max_bytes, deadline)

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self.inner:
            seen += len(chunk)
            if seen > self.max_bytes:
                raise ReplyTooLarge(f"the reply passed {self.max_bytes} bytes")
            if time.monotonic() > self.deadline:
                raise httpx.ReadTimeout("the reply did not arrive within the request's "
                                        "total deadline", request=self.request)
            yield chunk

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close:
            close()


class BoundedTransport(httpx.HTTPTransport):
    def __init__(self, max_bytes: int, deadline_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_bytes, self.deadline_s = max_bytes, deadline_s

    def handle_request(self, request: Any) -> Any:
        started = time.monotonic()
        deadline = started + self.deadline_s
        sent: Sends | None = getattr(_taps, "sent", None)
        one = Sent(started, 0.0, None, done=False)
        if sent is not None:
            sent.add(one)
        try:
            response = super().handle_request(request)
        except Exception as exc:
            one.seconds, one.error = (time.monotonic() - started,
                                      f"{type(exc).__name__}: {str(exc)[:200]}")
            one.done = True
            raise
        one.seconds, one.status = time.monotonic() - started, response.status_code
        one.done = True
        response.stream = _Bounded(response.stream, request, self.max_bytes, deadline)
        return response


def client(max_bytes: int, deadline_s: float, timeout: float) -> Any:
    """An httpx client for an SDK's `http_client=`: bounded replies, per-read `timeout`."""
    return httpx.Client(transport=BoundedTransport(max_bytes, deadline_s),
                        timeout=httpx.Timeout(timeout), follow_redirects=True)


def too_large(exc: BaseException) -> ReplyTooLarge | None:
    """The ReplyTooLarge behind an SDK's wrapped error, if that is what it was."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, ReplyTooLarge):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
