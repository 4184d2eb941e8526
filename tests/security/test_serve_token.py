"""Red team: `ratchet serve` read from inside a candidate (issue 34, attack 2).

As seen: on loopback the dashboard needed no token, so a candidate's code fetched
`/api/summary` and another candidate's evaluate log. Here the baseline's evaluation prints
a private note (where the best knob value is); a later candidate, worse on its own, asks
the dashboard the study runs under for the incumbent and every one of its logs, and
would use the note. The task sets `network = true`, so the candidate does reach the
server: the token is what must stop it. Without the network (the default) it could not
even connect (tests/security/test_network.py).
"""

from __future__ import annotations

import uuid

import pytest
from helpers import config_text, git, make_repo, ratchet, sandbox_env, submit_and_wait
from web.test_serve import base_of, bearer, fetch, serving

from security.evidence import checkout_state, files_holding, processes_in

EVALUATOR = '''
import solution
print("correct: true")
print(f"score: {solution.score():.6f}")
'''

BASELINE = '''
X = 3.0
print("private note: {note}; the best X is 1.25")


def score():
    return (X - 1.25) ** 2
'''

# worse on its own (X = 5); the best there is if the dashboard tells it the note
ATTACK = '''
import http.client
import json
import re

X = 5.0


def get(path):
    conn = http.client.HTTPConnection("127.0.0.1", {port}, timeout=5)
    conn.request("GET", path, headers={{"Host": "127.0.0.1"}})
    reply = conn.getresponse()
    return reply.status, reply.read().decode()


status, body = get("/api/summary")
print("summary:", status, body[:200])
ids = [json.loads(body)["incumbent_id"]] if status == 200 else ["c0000", "c0001"]
for cand in ids:
    for index in range(4):
        status, body = get(f"/log/{{cand}}/{{index}}")
        print("log", cand, index, status, body[:300])
        found = re.search(r"the best X is ([0-9.]+)", body)
        if found:
            X = float(found.group(1))


def score():
    return (X - 1.25) ** 2
'''


@pytest.mark.parametrize("level", ["bwrap", "pidns"])
def test_a_candidate_cannot_read_the_dashboard(tmp_path, level):
    env = sandbox_env(level, tmp_path)
    note = f"note-{uuid.uuid4().hex}"
    task = config_text().split("[task.metric]")[0] + "network = true\n"
    repo = make_repo(tmp_path / "repo", {"ratchet.toml": config_text(task=task),
                                         "evaluate.py": EVALUATOR,
                                         "solution.py": BASELINE.format(note=note)})
    base = submit_and_wait(repo, "HEAD", env=env)  # the study and its baseline's log
    assert base["metric"] == pytest.approx(3.0625), base
    with serving(repo) as url:
        port = int(base_of(url).rsplit(":", 1)[1].strip("/"))
        git(repo, "checkout", "-q", "-b", "attack")
        (repo / "solution.py").write_text(ATTACK.format(port=port))
        git(repo, "commit", "-qam", "X = 5, or what the dashboard says")
        git(repo, "checkout", "-q", "main")
        before = checkout_state(repo)
        cand = submit_and_wait(repo, "attack", env=env)
        logs = "".join(p.read_text() for p in
                       (repo / ".ratchet" / "jobs").glob(f"*-{cand['id']}-*/logs/*.log"))
        # it connected (the task has the network) and was turned away with nothing
        assert "summary: 401" in logs, logs
        assert f"log {base['id']} 0 401" in logs and "incumbent_id" not in logs
        # nothing forged is kept: measured as what it is, X = 5
        assert cand["status"] != "keep", cand
        assert cand["metric"] == pytest.approx((5.0 - 1.25) ** 2)
        # the dashboard itself still answers whoever holds the printed address
        status, _, body = fetch(base_of(url) + "api/summary", bearer(url))
        assert status == 200 and base["id"] in body

    # the baseline's note stays in the baseline's own log: not in the ledger, nor the
    # attacker's logs, nor the results
    holding = files_holding(repo / ".ratchet", note)
    assert holding and all(f"-{base['id']}-" in str(p) for p in holding), holding
    assert note not in (repo / "results.tsv").read_text()
    assert checkout_state(repo) == before
    assert processes_in(repo) == {}
    assert ratchet(repo, "status", env=env).returncode == 0
