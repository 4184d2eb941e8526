"""The proposer's latency is hidden where that changes nothing of the algorithm (issue 23),
through `ratchet run` with a slow loopback LLM:

- the baseline needs no proposal: its job starts while round 1 is being proposed;
- rolling asks for the next proposals on a would-be keep while it is confirmed, so the
  slots it frees start on it at once when it is kept.
"""

from __future__ import annotations

import threading
import time

import pytest
from conftest import ledger_of, make_repo, whole_file
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
        return Answer(whole_file(value), delay=self.delay)


def repo_for(tmp_path, url: str, search: str, evaluate_s: float, parallel: int = 2,
             baseline_s: float | None = None, pair_s: float | None = None,
             toml_edits: dict[str, str] | None = None):
    """The tiny task with `search` in place of `rounds = 1`, and each of `toml_edits`
    (old text: new text) made in ratchet.toml, in one commit. An evaluation sleeps
    `evaluate_s`; the baseline's `baseline_s`, a confirmation pair's (a row r....) `pair_s`."""
    sleep = (f"({baseline_s} if solution.VALUE == 10 else {evaluate_s})"
             if baseline_s is not None else f"{evaluate_s}")
    if pair_s is not None:
        sleep = (f"({pair_s} if os.environ.get('RATCHET_CANDIDATE', '').startswith('r') "
                 f"else {sleep})")
    repo = make_repo(tmp_path / "r", "llm", LLM.format(url=url), parallel=parallel, files={
        "evaluate.py": f"import os\nimport time\nimport solution\ntime.sleep({sleep})\n"
                       "print(f'score: {solution.compute()}')\n"})
    toml = (repo / "ratchet.toml").read_text().replace("rounds = 1\n", search)
    for old, new in (toml_edits or {}).items():
        toml = toml.replace(old, new)
    (repo / "ratchet.toml").write_text(toml)
    hgit(repo, "commit", "-qam", "study settings")
    return repo


def run_study(tmp_path, responder, search: str, timeout: float = 300, **repo_kw):
    """`ratchet run` on `repo_for`'s task against a loopback LLM answering with
    `responder`: (the repo, the finished process, the requests the server saw)."""
    with LLMServer() as server:
        server.respond_with(responder)
        repo = repo_for(tmp_path, server.openai_url, search, **repo_kw)
        proc = ratchet(repo, "run", timeout=timeout)
        requests = list(server.requests)
    return repo, proc, requests


def test_the_baseline_runs_while_the_first_proposals_are_made(tmp_path):
    model = Improving(delay=3.0)
    repo, proc, requests = run_study(tmp_path, model, "rounds = 1\nmode = \"rounds\"\n",
                                     evaluate_s=0.2, parallel=3)
    assert proc.returncode == 0, proc.stderr
    first_reply = min(r.at for r in requests) + model.delay
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


@pytest.mark.slow  # 30 s, mostly asleep: started first
def test_rolling_proposes_on_a_would_be_keep_while_it_is_confirmed(tmp_path):
    # replies take 3 s: a placement within one reply's latency of a keep is then one made
    # from a proposal asked before the verdict, with seconds to spare for a loaded
    # machine's driver (at 1 s, load broke it once); and a confirmation pair takes 4 s, a
    # window a loaded driver asks in (at 1.5 s, one asked 1.2 s after the verdict)
    model = Improving(delay=3.0)
    # the baseline runs longest: proposals made on it queue up meanwhile, and are
    # carried onto the first keep
    repo, proc, requests = run_study(tmp_path, model, 'mode = "rolling"\ncandidates = 8\n',
                                     evaluate_s=1.5, baseline_s=4.0, pair_s=4.0)
    assert proc.returncode == 0, proc.stderr
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


def test_slots_a_confirmation_leaves_free_take_new_candidates(tmp_path):
    """A would-be keep's confirmation pairs take two of the four slots; the other two do
    not idle until its verdict: they take candidates proposed on the would-be keep (on the
    incumbent if it is kept; one made on the incumbent of the time would run stale)."""
    repo, proc, _ = run_study(tmp_path, Improving(delay=0.2),
                              'mode = "rolling"\ncandidates = 10\n', evaluate_s=1.5,
                              parallel=4)
    assert proc.returncode == 0, proc.stderr
    ledger = ledger_of(repo)
    rows = ledger.candidates(confirmations=True)
    ledger.close()
    cands = [c for c in rows if c.kind == "candidate"]
    pairs = [c for c in rows if c.kind == "confirm"]
    assert pairs, [(c.id, c.status, c.reasons) for c in cands]
    beside = []
    for cand in cands:
        measured = [p for p in pairs if p.confirms == cand.id]
        if not measured:
            continue
        first_pair = min(p.submitted_at for p in measured)
        placed = [c for c in cands if c.submitted_at and first_pair < c.submitted_at
                  < cand.judged_at]
        # placed while the pairs ran: on the would-be keep, none on the incumbent of the time
        assert all(c.parent == cand.commit_sha for c in placed), \
            [(c.id, c.parent, cand.id) for c in placed]
        beside += placed
    assert beside, [(c.id, c.status, c.submitted_at, c.judged_at) for c in rows]
    # each was judged like any other candidate
    assert all(c.status in ("keep", "discard") for c in beside), \
        [(c.id, c.status, c.reasons) for c in beside]


CHEAT = """\
import json, os, sqlite3

VALUE = {value}


def compute():
    # no sandbox: from inside its job, it claims a score for the incumbent no run measured
    repo = os.path.abspath(os.path.join(os.environ["RATCHET_WORKDIR"], *[".."] * 4))
    db = sqlite3.connect(os.path.join(repo, ".ratchet", "ledger.db"), timeout=30)
    db.execute("UPDATE meta SET value = '0.0001' WHERE key = 'incumbent_metric'")
    db.commit()
    return VALUE
"""


class CheatsBeside:
    """The first request's first reply is an honest improvement (sent after 1 s), the
    others of that request fail to parse (recorded, never run); every later reply is a
    cheat, sent only once the honest one's confirmation pairs run, so that it starts in a
    slot the pairs leave free."""

    def __init__(self, repo) -> None:
        self.repo, self.lock, self.n = repo, threading.Lock(), 0
        self.first_sent = threading.Event()

    def pairs_running(self) -> bool:
        try:
            db = ledger_of(self.repo)
        except Exception:
            return False
        try:
            return any(c.kind == "confirm" and c.status == "submitted"
                       for c in db.candidates(confirmations=True))
        finally:
            db.close()

    def __call__(self, request) -> Answer:
        with self.lock:
            self.n += 1
            n = self.n
        if n == 1:
            time.sleep(1.0)
            self.first_sent.set()
            return Answer(whole_file(5))
        if not self.first_sent.is_set():  # the rest of the first request
            return Answer("I would rather not.")
        deadline = time.time() + 60
        while not self.pairs_running() and time.time() < deadline:
            time.sleep(0.05)
        return Answer(f"DESCRIPTION: a cheat\n\nsolution.py\n<<<<<<< FILE\n"
                      f"{CHEAT.format(value=9 + n / 100)}>>>>>>> FILE\n")


def test_a_candidate_started_beside_a_confirmation_that_tampers_is_caught(tmp_path):
    """Without a sandbox, a candidate started in a slot a confirmation leaves free writes
    the ledger while the pairs run: the pairs' check finds it, restores the state and
    rejects every candidate that ran then (the one confirmed among them: its code ran
    too); nothing is kept on the tampered state."""
    repo, proc, _ = run_study(tmp_path, CheatsBeside(tmp_path / "r"),
                              'mode = "rolling"\ncandidates = 3\n', evaluate_s=2.0,
                              parallel=3,
                              toml_edits={"slots = 2\n": 'slots = 3\nsandbox = "none"\n'})
    assert proc.returncode == 0, proc.stderr
    ledger = ledger_of(repo)
    rows = ledger.candidates(confirmations=True)
    metric = ledger.get("incumbent_metric")
    ledger.close()
    honest = next(c for c in rows if c.description == "set VALUE to 5")
    cheats = [c for c in rows if c.description == "a cheat" and c.job_id]
    pairs = [c for c in rows if c.confirms == honest.id]
    assert cheats and pairs, [(c.id, c.kind, c.status, c.reasons) for c in rows]
    first_pair = min(p.submitted_at for p in pairs)
    beside = [c for c in cheats if first_pair < c.submitted_at < honest.judged_at]
    assert beside, [(c.id, c.submitted_at, first_pair, honest.judged_at) for c in cheats]
    assert all(c.status == "rejected" and "tampering" in c.reasons for c in beside)
    assert honest.status == "rejected" and "tampering" in honest.reasons
    assert metric != 0.0001  # restored: the baseline's own measurement
    assert "tampering" in proc.stdout + proc.stderr
