"""An HTTP transport for the providers' SDKs that bounds each reply in size and in time.

The SDKs' `timeout` is per read: a server that drips one byte every 0.15 s never trips a
20 s timeout, and a 50 MB reply is read whole into memory. Under this transport every
response body is read through a counter that stops it
- at `max_bytes` (ReplyTooLarge: this request's proposal fails; retrying would fetch the
  same reply again), and
- at the request's total deadline, `deadline_s` after it was sent (a timeout, which the
  SDK and our backoff retry like any other).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

try:  # the SDKs moved to httpx2; older installs use httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed SDK
    import httpx  # type: ignore[no-redef]


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
        deadline = time.monotonic() + self.deadline_s
        response = super().handle_request(request)
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
