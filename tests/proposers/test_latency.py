"""The proposer's latency is hidden where that changes nothing of the algorithm (issue 23),
through `ratchet run` with a slow loopback LLM:

- the baseline needs no proposal: its job starts while round 1 is being proposed;
- rolling asks for the next proposals on a would-be keep while it is confirmed, so the
  slots it frees start on it at once when it is kept.
"""

from __future__ import annotations

import threading

from conftest import ledger_of, make_repo
from helpers import git as hgit
from helpers import ratchet
from llm_server import Answer, LLMServer

LLM = """
[llm]
timeout = 30
max_retries = 0
retries = 0

[[llm.models]]
provider = "openai"
model = "m"
base_url = "{url}"
"""


class Improving:
    """Every reply rewrites solution.py whole, a little better than the last (it applies
    on any incumbent), after `delay` seconds; notes when each reply was sent."""

    def __init__(self, delay: float) -> None:
        self.delay, self.lock, self.value, self.replied = delay, threading.Lock(), 9, []

    def __call__(self, request) -> Answer:
        with self.lock:
            self.value -= 1
            value = self.value
        return Answer(f"DESCRIPTION: set VALUE to {value}\n\nsolution.py\n<<<<<<< FILE\n"
                      f"VALUE = {value}\n\n\ndef compute():\n    return VALUE\n"
                      ">>>>>>> FILE\n", delay=self.delay)


def repo_for(tmp_path, url: str, search: str, evaluate_s: float, parallel: int = 2,
             baseline_s: float | None = None):
    sleep = (f"({baseline_s} if solution.VALUE == 10 else {evaluate_s})"
             if baseline_s is not None else f"{evaluate_s}")
    repo = make_repo(tmp_path / "r", "llm", LLM.format(url=url), parallel=parallel, files={
        "evaluate.py": f"import time\nimport solution\ntime.sleep({sleep})\n"
                       "print(f'score: {solution.compute()}')\n"})
    toml = (repo / "ratchet.toml").read_text().replace("rounds = 1\n", search)
    (repo / "ratchet.toml").write_text(toml)
    hgit(repo, "commit", "-qam", "study settings")
    return repo


def test_the_baseline_runs_while_the_first_proposals_are_made(tmp_path):
    model = Improving(delay=3.0)
    with LLMServer() as server:
        server.respond_with(model)
        repo = repo_for(tmp_path, server.openai_url, "rounds = 1\nmode = \"rounds\"\n",
                        evaluate_s=0.2,
                        parallel=3)
        ratchet(repo, "run", check=True)
        first_reply = min(r.at for r in server.requests) + model.delay
    ledger = ledger_of(repo)
    cands = ledger.candidates()
    ledger.close()
    [baseline] = [c for c in cands if c.kind == "baseline"]
    proposed = [c for c in cands if c.kind == "candidate"]
    assert len(proposed) == 2 and baseline.status == "keep"
    # placed before the reply came back, and already measuring (its first phase began)
    assert baseline.submitted_at < first_reply - 1.0, (baseline.submitted_at, first_reply)
    assert min(p["started_at"] for p in baseline.phases) < first_reply
    assert all(c.submitted_at >= first_reply for c in proposed)
    # it is still one round: the baseline is judged with the proposals made beside it
    assert {c.round for c in cands} == {1}


def test_rolling_proposes_on_a_would_be_keep_while_it_is_confirmed(tmp_path):
    model = Improving(delay=1.0)
    with LLMServer() as server:
        server.respond_with(model)
        # the baseline runs longest: proposals made on it queue up meanwhile, and are
        # carried onto the first keep
        repo = repo_for(tmp_path, server.openai_url,
                        'mode = "rolling"\ncandidates = 8\n', evaluate_s=1.5,
                        baseline_s=4.0)
        ratchet(repo, "run", check=True, timeout=300)
        requests = list(server.requests)
    ledger = ledger_of(repo)
    cands = [c for c in ledger.candidates() if c.kind == "candidate"]
    calls = ledger.calls()
    ledger.close()
    # what was made on the old incumbent conflicts with the new one (every reply rewrites
    # the same line): it is repaired (billed `repaired`), and run or dropped; every call
    # the server saw is in the ledger, with its candidate or its fate
    repairs = [r for r in requests if "# Re-apply a change" in r.prompt]
    assert repairs and len(calls) == len(requests)
    assert sum(1 for c in calls if c["outcome"] == "repaired") == len(repairs)
    assert all(c["candidate"] or c["fate"] for c in calls)
    keeps = [c for c in cands if c.status == "keep"]
    assert keeps, [(c.id, c.status, c.reasons) for c in cands]
    for keep in keeps:
        on_it = [r for r in requests if f"your starting point): {keep.short}" in r.prompt]
        after = [c for c in cands if c.parent == keep.commit_sha]
        if not after:
            continue  # the study's budget ended with it
        # asked on it before its confirmation ended, not after
        assert on_it and min(r.at for r in on_it) < keep.judged_at, keep.id
        # so the first candidate on it was placed well within one reply's latency
        assert min(c.submitted_at for c in after) - keep.judged_at < model.delay, keep.id
