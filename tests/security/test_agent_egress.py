"""Red team: a coding agent reaches its model, and nothing else (issue 34).

The agent (`[agent] command`, a script, through a real `ratchet run`) is handed its model's
address the way a user hands Claude Code one: `ANTHROPIC_BASE_URL` in `[agent] env`, here a
loopback server that answers the task's best value. Beside it on loopback runs the stand-in
for Ray's job server from test_network (it runs whatever is POSTed to it, as root). The
agent asks its model through the proxy it is given, then tries the job server every way it
can: through the proxy (plain HTTP and a CONNECT tunnel), straight to 127.0.0.1 with no
proxy, and its model straight too. Only the proxied model request may arrive; the study
keeps the model's answer; the stand-in sees nothing and runs nothing. Both sandbox levels.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
from helpers import git, ratchet, sandbox_env, score_repo

from ratchet.store.ledger import Ledger
from security.evidence import checkout_state, processes_in
from security.test_network import ANSWER, job_server

AGENT = r'''
import json, os, pathlib, socket, sys, urllib.request

other = int(sys.argv[1])
base = os.environ["ANTHROPIC_BASE_URL"]
seen = {}


def fetch(name, url, data=None, proxied=True):
    opener = urllib.request.build_opener(*([] if proxied else [urllib.request.ProxyHandler({})]))
    try:
        seen[name] = "ok: " + opener.open(urllib.request.Request(url, data=data), timeout=5).read().decode()
    except Exception as exc:
        seen[name] = f"refused: {type(exc).__name__}: {exc}"[:160]


def tunnel(name, target):
    if not os.environ.get("HTTPS_PROXY"):
        seen[name] = "no proxy given"
        return
    proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
    try:
        with socket.create_connection((proxy[0].split("//")[1], int(proxy[1])), timeout=5) as s:
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            seen[name] = s.recv(200).decode().splitlines()[0]
    except OSError as exc:
        seen[name] = f"refused: {exc}"


fetch("model", f"{base}/answer?phase=agent")
job = json.dumps({"entrypoint": "id > /tmp/agent-got-in"}).encode()
fetch("job server, proxied", f"http://127.0.0.1:{other}/api/jobs/?phase=proxied", job)
tunnel("job server, tunnel", f"127.0.0.1:{other}")
fetch("job server, direct", f"http://127.0.0.1:{other}/api/jobs/?phase=direct", job, proxied=False)
fetch("model, direct", f"{base}/answer?phase=direct", proxied=False)
print("EGRESS " + json.dumps(seen), flush=True)
answer = float(seen["model"].split(": ", 1)[1]) if seen["model"].startswith("ok") else 5.0
path = pathlib.Path("solution.py")
path.write_text(path.read_text().replace("X = 3.0", f"X = {answer}"))
print(f"DESCRIPTION: X = {answer}, as the model said")
'''


@pytest.mark.parametrize("level", ["bwrap", "pidns"])
def test_an_agent_reaches_its_model_and_nothing_else(tmp_path: Path, level: str) -> None:
    env = sandbox_env(level, tmp_path)
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    secret = f"sk-driver-{uuid.uuid4().hex}"
    with job_server(secret) as model, job_server(secret) as other:
        agent = (f'[agent]\ncommand = ["{sys.executable}", "{script}", "{other.port}"]\n'
                 'env = ["ANTHROPIC_BASE_URL"]\ntimeout = "60s"\n')
        repo = score_repo(tmp_path / "repo", knobs=agent,
                          search='[search]\nproposer = "agent"\nparallel = 1\nrounds = 2\n')
        before = checkout_state(repo)
        proc = ratchet(repo, "run", env={**env, "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{model.port}"},
                       timeout=200)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "Traceback" not in out, out
        ledger = Ledger(repo / ".ratchet" / "ledger.db")
        [row] = [c for c in ledger.candidates() if c.proposer == "agent"]
        ledger.close()
        log = Path(row.params["agent"]["log"]).read_text()
        seen = json.loads(log.split("EGRESS ", 1)[1].splitlines()[0])
        # its model, through the proxy, and only that way
        assert seen["model"] == f"ok: {ANSWER}", seen
        assert model.requests == [("GET", "/answer?phase=agent")], model.requests
        assert seen["model, direct"].startswith("refused"), seen
        # the job server: refused by the proxy (403), and no route without it
        assert "403" in seen["job server, proxied"], seen
        assert "403" in seen["job server, tunnel"], seen
        assert "ConnectionRefused" in seen["job server, direct"] \
            or "Errno 111" in seen["job server, direct"], seen
        assert other.requests == [] and other.jobs == [], other.requests
    assert row.params["agent"]["sandbox"] == level
    assert f"127.0.0.1:{other.port}" in row.params["agent"]["refused"]
    # the study went on with what the model said: kept, the checkout untouched
    assert row.status == "keep", (row.status, row.reasons)
    assert f"X = {ANSWER}" in git(repo, "show", f"{row.commit_sha}:solution.py")
    assert checkout_state(repo) == before
    assert processes_in(tmp_path) == {}
