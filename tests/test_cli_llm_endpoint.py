"""An LLM endpoint that answers 200 with something that is not a reply (an HTML page from
a proxy or a wrong base_url; JSON without `choices`): `ratchet run` stops with one line
naming the endpoint and what to check, exit 2, before any candidate is blamed (it used
to be a traceback, or every candidate rejected as "the reply was empty" and exit 0)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import ratchet, score_repo

from ratchet.driver.study import Study

BODIES = {
    "html": (b"<html><head><title>Welcome</title></head><body>It works!</body></html>",
             "text/html", "an HTML page"),
    "no-choices": (json.dumps({"id": "x", "object": "chat.completion",
                               "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode(),
                   "application/json", "JSON without 'choices'"),
}


@pytest.fixture
def endpoint(request) -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on loopback answering every POST with one fixed 200 body."""
    body, content_type, _ = BODIES[request.param]
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("content-length") or 0))
            seen.append(self.path)
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("endpoint", list(BODIES), indirect=True)
def test_a_reply_that_is_not_a_completion_stops_the_study_in_one_line(tmp_path, endpoint,
                                                                      request):
    pytest.importorskip("openai")
    url, seen = endpoint
    _, _, found = BODIES[request.node.callspec.params["endpoint"]]
    llm = (f'[llm]\ntimeout = 10\nmax_retries = 0\nretries = 0\n'
           f'models = [{{ provider = "openai", model = "m", base_url = "{url}" }}]\n')
    repo = score_repo(tmp_path / "r", knobs=llm,
                      search='[search]\nproposer = "llm"\nparallel = 2\nrounds = 2\n')
    proc = ratchet(repo, "run", env={"OPENAI_API_KEY": "dummy"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert f"the endpoint answered {found}" in errors[0], errors[0]
    assert f"base_url '{url}'" in errors[0]
    assert "the reply was empty" not in proc.stdout + proc.stderr
    assert seen, "the endpoint was never asked"
    with Study(repo) as study:  # no candidate was blamed for the endpoint
        assert not [c for c in study.ledger.candidates() if c.status == "rejected"]
