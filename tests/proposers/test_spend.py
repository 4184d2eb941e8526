"""Every dollar and minute counted (issue 23), through `ratchet run` as a user runs it.

A loopback server speaking the OpenAI protocol counts every request it is sent and the
tokens it bills; the ledger's calls, `status --json` and `ratchet show` must agree with
it exactly, in rounds and in rolling mode, with rate limits (the SDK's retries and
ours), unusable replies that are repaired, and an incumbent that moves. A fake coding
agent reports its own cost, or is priced by the hour. Budgets stop a study at the limit,
and a higher limit resumes it.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path

import pytest
from conftest import ledger_of, make_repo, whole_file
from helpers import git as hgit
from helpers import ratchet
from llm_server import Answer, LLMServer

PRICE_IN, PRICE_OUT = 2.0, 10.0  # $ per million tokens


def llm_toml(url: str, *, rounds: int = 3, mode: str = "rounds", budget: str = "",
             search: str = "") -> tuple[str, str]:
    """The [llm] and [budget] sections, and the [search] lines."""
    return f"""
[llm]
timeout = 10
max_retries = 1
retries = 2
backoff = 0.01
concurrency = 2

[[llm.models]]
provider = "openai"
model = "m"
base_url = "{url}"
price_per_mtok_in = {PRICE_IN}
price_per_mtok_out = {PRICE_OUT}
{budget}
""", f'mode = "{mode}"\nrounds = {rounds}\n{search}'


class Billing:
    """The server's side of the bill: every request, and the tokens of every reply it
    sent. Replies improve (the incumbent moves), some requests are rate-limited (429)
    and some replies cannot be used (a repair request follows)."""

    def __init__(self, *, limit_every: int = 0, junk_every: int = 0,
                 tokens: tuple[int, int] | None = None, junk_repairs: bool = False) -> None:
        self.lock = threading.Lock()
        self.n = 0
        self.billed_in = self.billed_out = 0
        self.limited = 0
        self.value = 9
        self.limit_every, self.junk_every, self.tokens = limit_every, junk_every, tokens
        self.junk_repairs = junk_repairs  # a repair's reply makes no edit

    def __call__(self, request) -> Answer:
        with self.lock:
            self.n += 1
            n = self.n
            if self.limit_every and n % self.limit_every == 0:
                self.limited += 1
                return Answer(status=429, retry_after=0.01)
            tokens_in, tokens_out = self.tokens or (100 + n, 40 + n % 7)
            self.billed_in += tokens_in
            self.billed_out += tokens_out
            if (self.junk_every and n % self.junk_every == 0) or (
                    self.junk_repairs and "# Re-apply a change" in request.prompt):
                text = "I would rather not edit anything."  # no edit: asked to repair
            else:
                self.value -= 1
                text = whole_file(self.value)
        return Answer(text, input_tokens=tokens_in, output_tokens=tokens_out)

    @property
    def usd(self) -> float:
        return (self.billed_in * PRICE_IN + self.billed_out * PRICE_OUT) / 1e6


def study_repo(tmp_path: Path, url: str, parallel: int = 3, **kw) -> Path:
    llm, search = llm_toml(url, **kw)
    repo = make_repo(tmp_path / "r", "llm", llm, parallel=parallel)
    toml = (repo / "ratchet.toml").read_text()
    toml = toml.replace("rounds = 1\n", search)
    (repo / "ratchet.toml").write_text(toml)
    hgit(repo, "commit", "-qam", "study settings")
    return repo


def status_of(repo: Path) -> dict:
    proc = ratchet(repo, "status", "--json", check=True)
    return json.loads(proc.stdout)


def assert_bill_agrees(repo: Path, server: LLMServer, billing: Billing) -> None:
    """The ledger, `status --json` and the server count the same requests and tokens."""
    ledger = ledger_of(repo)
    calls = ledger.calls()
    ids = {c.id for c in ledger.candidates(confirmations=True)}
    ledger.close()
    assert len(calls) == len(server.requests)
    assert sum(c["input_tokens"] for c in calls) == billing.billed_in
    assert sum(c["output_tokens"] for c in calls) == billing.billed_out
    assert sum(1 for c in calls if c["outcome"] == "retried") == billing.limited
    assert all(c["candidate"] in ids for c in calls if c["candidate"])
    spend = status_of(repo)["spend"]
    assert spend["calls"] == len(server.requests)
    assert spend["input_tokens"] == billing.billed_in
    assert spend["output_tokens"] == billing.billed_out
    assert spend["proposer_usd"] == pytest.approx(billing.usd, abs=1e-9)


@pytest.mark.parametrize("mode", ["rounds", "rolling"])
def test_the_ledger_bills_what_the_server_billed(tmp_path, mode):
    billing = Billing(limit_every=5, junk_every=4)
    with LLMServer() as server:
        server.respond_with(billing)
        repo = study_repo(tmp_path, server.openai_url, mode=mode, rounds=3)
        proc = ratchet(repo, "run", check=True)
        requests = len(server.requests)
    assert billing.limited > 0 and requests > billing.limited
    assert_bill_agrees(repo, server, billing)
    ledger = ledger_of(repo)
    kept = [c for c in ledger.candidates() if c.status == "keep" and c.kind == "candidate"]
    ledger.close()
    assert kept, "the incumbent moved"
    # the run's last lines say what was spent, as status does
    assert f"{requests} calls" in proc.stdout
    shown = ratchet(repo, "show", kept[-1].id, check=True).stdout
    assert re.search(r"proposer: \d+ calls? \(", shown), shown


def test_status_and_show_split_spend_per_candidate(tmp_path):
    billing = Billing(tokens=(200, 50))
    with LLMServer() as server:
        server.respond_with(billing)
        repo = study_repo(tmp_path, server.openai_url, parallel=2, rounds=1)
        # compute is priced: each job's slot time at $36/h (a cent a second)
        toml = (repo / "ratchet.toml").read_text().replace(
            'kind = "local"\n', 'kind = "local"\ncpu_hourly_usd = 36.0\n')
        (repo / "ratchet.toml").write_text(toml)
        hgit(repo, "commit", "-qam", "priced")
        ratchet(repo, "run", check=True)
    ledger = ledger_of(repo)
    [cand] = [c for c in ledger.candidates() if c.kind == "candidate"]
    from ratchet.driver.spend import job_slot_seconds

    slot_s = job_slot_seconds(cand)
    ledger.close()
    assert cand.cost_usd == pytest.approx(slot_s * 0.01, abs=1e-5)
    status = status_of(repo)
    assert status["tokens"] == 250
    spend = status["spend"]
    assert spend["proposer_usd"] == pytest.approx((200 * PRICE_IN + 50 * PRICE_OUT) / 1e6)
    assert spend["compute_usd"] > cand.cost_usd  # the baseline's job is compute too
    assert status["cost_usd"] == round(spend["proposer_usd"] + spend["compute_usd"], 4)
    shown = ratchet(repo, "show", cand.id, check=True).stdout
    assert "proposer: 1 call (1 ok), 200 tokens in / 50 out, $0.0009" in shown
    assert f"compute: {slot_s:.1f} slot-s" in shown


# -- agents ------------------------------------------------------------------------------

FAKE_AGENT = r'''
import json, pathlib, re, sys, time
prompt = pathlib.Path(sys.argv[2]).read_text()
attempt = int(re.search(r"attempt (\d+) of", prompt).group(1))
time.sleep(0.3)
path = pathlib.Path("solution.py")
value = 100 + attempt  # never better: what matters here is the bill
path.write_text(re.sub(r"VALUE = \d+", f"VALUE = {value}", path.read_text()))
said = f"DESCRIPTION: agent sets VALUE to {value}"
if sys.argv[1] == "reports":  # as `claude -p --output-format json` prints its run
    print(json.dumps({"type": "result", "total_cost_usd": 0.25 * attempt,
                      "result": "Done.\n" + said,
                      "usage": {"input_tokens": 1000, "cache_read_input_tokens": 500,
                                "output_tokens": 70}}))
else:
    print(said)
'''


def agent_study(tmp_path: Path, code: str, *, args: str = "", timeout: str = "60s",
                hourly_usd: float = 3600.0, parallel: int = 3) -> Path:
    """A study whose proposer is the stand-in agent `code`, priced by the hour."""
    script = tmp_path / "agent.py"
    script.write_text(code)
    extra = f"""
[agent]
command = ["{sys.executable}", "{script}", {args}"{{prompt_file}}"]
timeout = "{timeout}"
hourly_usd = {hourly_usd}
"""
    return make_repo(tmp_path / "r", "agent", extra, parallel=parallel)


@pytest.mark.parametrize("mode", ["reports", "silent"])
def test_every_agent_run_is_billed_with_its_time(tmp_path, mode):
    repo = agent_study(tmp_path, FAKE_AGENT, args=f'"{mode}", ')
    toml = (repo / "ratchet.toml").read_text().replace("rounds = 1\n", "rounds = 2\n")
    (repo / "ratchet.toml").write_text(toml)
    hgit(repo, "commit", "-qam", "two rounds")
    ratchet(repo, "run", check=True)
    ledger = ledger_of(repo)
    calls = ledger.calls()
    cands = [c for c in ledger.candidates() if c.kind == "candidate"]
    ledger.close()
    runs = sum(1 for d in (tmp_path / "r" / ".ratchet" / "agents").iterdir()
               if (d / "agent.log").exists())
    assert len(calls) == runs == 2 + 3  # round 1: K-1 beside the baseline; round 2: K
    assert all(c["proposer"] == "agent" and c["outcome"] == "ok" for c in calls)
    assert all(c["seconds"] >= 0.3 for c in calls)
    assert {c["candidate"] for c in calls} == {c.id for c in cands}
    # the description is found in the CLI's JSON result too
    assert all(re.fullmatch(r"agent sets VALUE to 10\d", c.description) for c in cands)
    if mode == "reports":  # the CLI's own figure wins over the hourly price
        assert sorted(c["cost_usd"] for c in calls) == pytest.approx(
            sorted([0.25, 0.5, 0.25, 0.5, 0.75]))
        assert all(c["input_tokens"] == 1500 and c["output_tokens"] == 70 for c in calls)
    else:  # $3600/h: a dollar a second of the agent's time
        assert all(c["cost_usd"] == pytest.approx(c["seconds"], abs=0.01) for c in calls)
    status = status_of(repo)
    assert status["spend"]["calls"] == 5
    assert status["spend"]["proposer_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls))


# -- a round sees the last round's verdicts; speculation is billed -----------------------


def test_each_round_is_proposed_from_the_last_rounds_verdicts(tmp_path):
    billing = Billing(tokens=(100, 50))
    with LLMServer() as server:
        server.respond_with(billing)
        repo = study_repo(tmp_path, server.openai_url, parallel=3, rounds=3)
        ratchet(repo, "run", check=True)
        prompts = [r.prompt for r in server.requests]
    ledger = ledger_of(repo)
    cands = [c for c in ledger.candidates() if c.kind == "candidate"]
    calls = ledger.calls()
    ledger.close()
    # K = 3 a round (the baseline takes one slot of round 1); a round run beside a keep's
    # confirmation has the one slot its first look's pair left free
    kept = {c.round for c in cands if c.status == "keep"}
    for r in (1, 2, 3):
        n = sum(1 for c in cands if c.round == r)
        assert n == 3 - (r == 1) - 2 * (r - 1 in kept), (r, n)
    assert len(calls) == len(prompts) == len(cands)  # nothing asked ahead, nothing dropped
    assert all(c["candidate"] for c in calls)
    by_id = {c.id: c for c in cands}
    for call, prompt in zip(calls, prompts, strict=True):
        mine = by_id[call["candidate"]]
        # every candidate of every earlier round is in its prompt with its verdict
        for earlier in (c for c in cands if c.round < mine.round):
            assert f"- {earlier.id} (round {earlier.round}) [{earlier.status}]" in prompt


@pytest.mark.parametrize("repair", ["applies", "fails"])
def test_speculation_repairs_a_conflicting_proposal_before_it_drops_it(tmp_path, repair):
    """Every reply improves, so the incumbent moves every round and round 2 and 3's
    speculative proposals conflict with it. Each is first repaired (one request with its
    diff and the new incumbent's file, billed `repaired`) and run; only when the repair
    fails is it dropped, billed, and the proposer asked again."""
    billing = Billing(tokens=(100, 50), junk_repairs=repair == "fails")
    with LLMServer() as server:
        server.respond_with(billing)
        repo = study_repo(tmp_path, server.openai_url, parallel=3, rounds=3,
                          search="ahead = true\n")
        ratchet(repo, "run", check=True)
        requests = len(server.requests)
        asked_to_repair = [r for r in server.requests if "# Re-apply a change" in r.prompt]
    assert_bill_agrees(repo, server, billing)
    ledger = ledger_of(repo)
    calls = ledger.calls()
    cands = {c.id: c for c in ledger.candidates() if c.kind == "candidate"}
    ledger.close()
    repaired = [c for c in calls if c["outcome"] == "repaired"]
    assert asked_to_repair and len(repaired) == len(asked_to_repair)
    # the repair saw the change and the new incumbent's file, not the whole context
    assert all("+VALUE = " in r.prompt and "## History" not in r.prompt
               for r in asked_to_repair)
    dropped = [c for c in calls if (c["fate"] or "").startswith("dropped")]
    status = status_of(repo)
    unused = [c for c in calls if c["candidate"] is None]
    assert status["spend"]["unused_calls"] == len(unused)
    if repair == "applies":
        # repaired, then run on the incumbent it was repaired onto: nothing dropped
        assert not dropped and not unused
        for call in repaired:
            cand = cands[call["candidate"]]
            assert cand.status in ("keep", "discard"), (cand.status, cand.reasons)
            assert cand.description.startswith("set VALUE to")
        assert requests == len(calls) > len(cands)
    else:
        # the repair's reply had no edit: the proposal is dropped with its calls (its own
        # request and the repair's), and the proposer is asked again on the incumbent
        assert dropped and all(c["candidate"] is None for c in dropped)
        assert all("the repair did not apply" in c["fate"] for c in dropped)
        assert {c["id"] for c in repaired} <= {c["id"] for c in dropped}
        assert len(dropped) == 2 * len(repaired)
        assert status["spend"]["unused_usd"] == pytest.approx(
            len(unused) * (100 * PRICE_IN + 50 * PRICE_OUT) / 1e6)
        assert status["spend"]["wasted_usd"] >= status["spend"]["unused_usd"]
        assert sum(1 for c in cands.values() if c.round == 3) == 3  # still K a round


# -- budgets -------------------------------------------------------------------------------

PER_REQUEST = {"tokens": 150, "usd": (100 * PRICE_IN + 50 * PRICE_OUT) / 1e6}


@pytest.mark.parametrize("limit", ["tokens", "usd"])
def test_a_budget_stops_the_study_and_a_higher_one_resumes_it(tmp_path, limit):
    one = PER_REQUEST[limit]
    # K=2: round 1 is the baseline and one proposal, then two a round. After round 2,
    # 3 requests are spent and a round costs 2 more: 5 would cross 3.5
    billing = Billing(tokens=(100, 50))
    with LLMServer() as server:
        server.respond_with(billing)
        allowed = 3.5 * one
        value = f"{allowed:g}" if limit == "usd" else str(int(allowed))
        repo = study_repo(tmp_path, server.openai_url, parallel=2, rounds=10,
                          budget=f"[budget]\n{limit} = {value}\n")
        first = ratchet(repo, "run")
        assert first.returncode == 0, first.stderr
        assert len(server.requests) == 3
        assert f"stopped at budget.{limit}: " in first.stdout
        assert "raise budget." + limit in first.stdout
        status = status_of(repo)
        assert status["budget"]["stopped"]["limit"] == f"budget.{limit}"
        assert status["budget"]["limits"][limit]["used"] == pytest.approx(3 * one)
        ledger = ledger_of(repo)
        cands = ledger.candidates()
        ledger.close()
        assert all(c.is_judged for c in cands)  # what ran was finished and judged
        assert [c.round for c in cands if c.kind == "candidate"] == [1, 2, 2]
        # the same limit again: nothing new is asked for
        again = ratchet(repo, "run", check=True)
        assert len(server.requests) == 3 and f"stopped at budget.{limit}" in again.stdout
        # a higher limit in ratchet.toml (not committed: a limit is not an experiment)
        raised = 5.5 * one
        value = f"{raised:g}" if limit == "usd" else str(int(raised))
        toml = (repo / "ratchet.toml").read_text()
        (repo / "ratchet.toml").write_text(re.sub(rf"(?m)^{limit} = .*$",
                                                  f"{limit} = {value}", toml))
        resumed = ratchet(repo, "run", check=True)
        assert "budget from ratchet.toml as it is now" in resumed.stderr
        assert len(server.requests) == 5
        assert f"stopped at budget.{limit}" in resumed.stdout
    ledger = ledger_of(repo)
    rounds = [c.round for c in ledger.candidates() if c.kind == "candidate"]
    ledger.close()
    assert rounds == [1, 2, 2, 3, 3]
    assert_bill_agrees(repo, server, billing)


def test_budget_candidates_cuts_the_last_round(tmp_path):
    billing = Billing(tokens=(100, 50))
    with LLMServer() as server:
        server.respond_with(billing)
        repo = study_repo(tmp_path, server.openai_url, parallel=3, rounds=10,
                          budget="[budget]\ncandidates = 4\n")
        proc = ratchet(repo, "run", check=True)
        assert len(server.requests) == 4
    ledger = ledger_of(repo)
    rounds = [c.round for c in ledger.candidates() if c.kind == "candidate"]
    ledger.close()
    # the last round cut to what was left (a round beside a keep's confirmation holds
    # fewer than K, so which round is last depends on the keeps)
    assert len(rounds) == 4 and rounds == sorted(rounds) and rounds[:2] == [1, 1]
    assert "stopped at budget.candidates: 4 candidates made of 4 candidates" in proc.stdout


def test_rolling_stops_at_the_budget_and_bills_the_request_in_flight(tmp_path):
    billing = Billing(tokens=(100, 50))
    with LLMServer() as server:
        server.respond_with(billing)
        repo = study_repo(tmp_path, server.openai_url, parallel=2, rounds=10,
                          mode="rolling", budget="[budget]\ntokens = 900\n")
        proc = ratchet(repo, "run", check=True)
        assert "stopped at budget.tokens" in proc.stdout
        requests = len(server.requests)
        ledger = ledger_of(repo)
        cands = ledger.candidates()
        ledger.close()
        assert all(c.is_judged for c in cands)
        made = sum(1 for c in cands if c.kind == "candidate")
        # a candidate that beat the incumbent but was made on an older one runs again,
        # carried onto the new one, with no request: only the others are a request's
        again = sum(1 for c in cands if c.description.endswith("(again, on the new incumbent)"))
        # one request is always in flight, and none is sent that would cross the limit:
        # at the stop the last one is waited for and billed
        assert made - again <= requests and 150 * requests <= 900
        assert_bill_agrees(repo, server, billing)
        toml = (repo / "ratchet.toml").read_text().replace("tokens = 900", "tokens = 1800")
        (repo / "ratchet.toml").write_text(toml)
        ratchet(repo, "run", check=True)
        ledger = ledger_of(repo)
        more = sum(1 for c in ledger.candidates() if c.kind == "candidate")
        ledger.close()
        assert more > made
        assert_bill_agrees(repo, server, billing)


# -- Ctrl-C twice: the request in flight is billed, and the driver does not wait for it --


def prompt_estimate(request) -> int:
    """The prompt's tokens as the proposer estimates them (4 characters a token), from
    what the server received: the server never answered, so nobody counted them."""
    chars = sum(len(str(m.get("content", ""))) for m in request.body["messages"])
    return -(-chars // 4)


@pytest.mark.parametrize("mode", ["rounds", "rolling"])
def test_a_second_ctrl_c_bills_the_request_in_flight(tmp_path, mode):
    import os
    import signal
    import subprocess
    import time

    from helpers import RATCHET, ROOT

    slow = threading.Event()  # once set, every reply takes a minute

    def answer(request) -> Answer:
        if slow.is_set():
            return Answer(whole_file(3), delay=60.0)
        slow.set()  # the first proposal is answered at once; the rest hang
        return Answer(whole_file(5), input_tokens=120, output_tokens=30)

    with LLMServer() as server:
        server.respond_with(answer)
        repo = study_repo(tmp_path, server.openai_url, parallel=2, rounds=3, mode=mode)
        toml = (repo / "ratchet.toml").read_text().replace("timeout = 10\n", "timeout = 120\n")
        (repo / "ratchet.toml").write_text(toml)  # no client timeout cuts the wait short
        hgit(repo, "commit", "-qam", "patient client")
        proc = subprocess.Popen([*RATCHET, "run", "--repo", str(repo)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        deadline = time.monotonic() + 90
        while len(server.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # a request hangs at the server
        assert len(server.requests) >= 2, proc.communicate(timeout=30)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        out, err = proc.communicate(timeout=60)
        stopped_after = time.monotonic() - signalled
        requests = list(server.requests)
    hanging = requests[1:]  # all but the first were never answered
    assert proc.returncode == 130, err
    assert stopped_after < 30, stopped_after  # at once: not after the minute-long reply
    assert "Traceback" not in err and "error:" not in err, err
    ledger = ledger_of(repo)
    calls = [dict(c) for c in ledger.calls()]
    ledger.close()
    # every request the server saw is billed: the one answered, and those in flight
    assert len(calls) == len(requests)
    answered = [c for c in calls if c["outcome"] == "ok"]
    assert [(c["input_tokens"], c["output_tokens"]) for c in answered] == [(120, 30)]
    cut = [c for c in calls if c["outcome"] == "interrupted"]
    assert len(cut) == len(hanging) >= 1
    assert sorted(c["input_tokens"] for c in cut) == sorted(map(prompt_estimate, hanging))
    for call in cut:
        assert call["output_tokens"] == 0 and call["candidate"] is None
        assert call["cost_usd"] == pytest.approx(call["input_tokens"] * PRICE_IN / 1e6)
        assert 1.0 <= call["seconds"] < 1.0 + 0.3 + stopped_after + 5
        assert call["fate"].startswith("interrupted")
    spend = status_of(repo)["spend"]
    assert spend["calls"] == len(requests)
    assert spend["interrupted_calls"] == len(cut)
    assert spend["input_tokens"] == sum(c["input_tokens"] for c in calls)
    assert spend["proposer_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls), abs=1e-6)
    text = ratchet(repo, "status", check=True).stdout
    assert f"{len(cut)} interrupted" in text


def test_a_second_ctrl_c_bills_the_agent_run_in_flight_by_its_time(tmp_path):
    import os
    import signal
    import subprocess
    import time

    from helpers import RATCHET, ROOT

    repo = agent_study(tmp_path, "import time\ntime.sleep(120)\n",  # a long think
                       timeout="10m", hourly_usd=36.0, parallel=2)
    script = tmp_path / "agent.py"  # the stand-in agent agent_study wrote
    proc = subprocess.Popen([*RATCHET, "run", "--repo", str(repo)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    agents = repo / ".ratchet" / "agents"
    deadline = time.monotonic() + 90
    while not list(agents.glob("*/prompt.md")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.5)  # it runs
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    out, err = proc.communicate(timeout=60)
    stopped_after = time.monotonic() - signalled
    assert proc.returncode == 130, err
    assert stopped_after < 30 and "Traceback" not in err, err
    ledger = ledger_of(repo)
    calls = [dict(c) for c in ledger.calls()]
    ledger.close()
    [call] = calls
    assert call["proposer"] == "agent" and call["outcome"] == "interrupted"
    assert 1.5 <= call["seconds"] < 1.5 + 0.3 + stopped_after + 5
    assert call["cost_usd"] == pytest.approx(call["seconds"] * 0.01, abs=1e-3)  # $36/h
    assert status_of(repo)["spend"]["proposer_usd"] == pytest.approx(call["cost_usd"], abs=1e-6)
    # the agent's sandbox was ended with the driver: nothing of it runs on
    time.sleep(1.0)
    import psutil

    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(script) in " ".join(p.info["cmdline"] or [])]


# -- the views: status, show, log, results.tsv and the report, per candidate and in all --


def priced_study(tmp_path: Path, server: LLMServer, **kw) -> Path:
    """An llm study whose jobs are priced too: a cent a slot-second."""
    repo = study_repo(tmp_path, server.openai_url, **kw)
    toml = (repo / "ratchet.toml").read_text().replace(
        'kind = "local"\n', 'kind = "local"\ncpu_hourly_usd = 36.0\n')
    (repo / "ratchet.toml").write_text(toml)
    hgit(repo, "commit", "-qam", "priced")
    return repo


def own_spend(ledger) -> dict[str, tuple[float, float]]:
    """{id: (proposer $, compute $)} from the ledger's rows: a row's calls; its jobs, and
    its confirmation pairs' (both sides measure it)."""
    out = {c.id: [0.0, c.cost_usd or 0.0] for c in ledger.candidates()}
    for row in ledger.candidates(confirmations=True):
        if row.kind == "confirm":
            out[row.confirms][1] += row.cost_usd or 0.0
    for call in ledger.calls():
        if call["candidate"]:
            out[call["candidate"]][0] += call["cost_usd"]
    return {k: (p, c) for k, (p, c) in out.items()}


STEP = re.compile(r"\[to get here: \$([\d.]+) = proposer \$([\d.]+) \+ compute \$([\d.]+), "
                  r"(\d+) candidates? since (.+?)\]$")


def test_log_says_what_each_kept_step_cost_and_every_view_splits_spend(tmp_path):
    billing = Billing(tokens=(200, 50))  # each reply improves: a keep every round
    with LLMServer() as server:
        server.respond_with(billing)
        repo = priced_study(tmp_path, server, parallel=2, rounds=3)
        ratchet(repo, "run", check=True)
    ledger = ledger_of(repo)
    cands = ledger.candidates()
    rows = ledger.candidates(confirmations=True)
    mine = own_spend(ledger)
    calls = ledger.calls()
    ledger.close()
    kept = [c for c in cands if c.status == "keep" and c.kind == "candidate"]
    assert [c.round for c in kept] == [1, 2, 3]
    status = status_of(repo)
    total = status["spend"]

    # ratchet log: each row's cost; each kept step what it cost since the keep before it
    proc = ratchet(repo, "log", check=True)
    lines = proc.stdout.splitlines()
    assert len(lines) == len(cands)
    for line, cand in zip(lines, cands, strict=True):
        assert line.split()[5] == f"cost=${sum(mine[cand.id]):.4f}", line
    steps = {}
    for line in lines:
        found = STEP.search(line)
        if found:
            steps[line.split()[0]] = found.groups()
    assert list(steps) == [c.id for c in kept]
    previous = "the start"
    for keep in kept:  # rounds mode: a step is its round (the baseline in the first)
        usd, proposer, compute, n, since = steps[keep.id]
        assert since == previous
        spent_p = sum(call["cost_usd"] for call in calls
                      if any(c.id == call["candidate"] and c.round == keep.round for c in cands))
        spent_c = sum(r.cost_usd or 0.0 for r in rows if r.round == keep.round)
        assert float(proposer) == pytest.approx(spent_p, abs=6e-5)
        assert float(compute) == pytest.approx(spent_c, abs=6e-5)
        assert float(usd) == pytest.approx(spent_p + spent_c, abs=6e-5)
        assert int(n) == sum(1 for c in cands if c.round == keep.round and c.kind == "candidate")
        previous = keep.id
    assert sum(float(s[0]) for s in steps.values()) == pytest.approx(total["usd"], abs=2e-4)
    # and the study's total, on stderr (stdout stays a line a candidate)
    assert f"spent ${total['usd']:.4f}: proposer ${total['proposer_usd']:.4f}" in proc.stderr
    kept_only = ratchet(repo, "log", "--kept", check=True).stdout.splitlines()
    assert [line for line in kept_only if STEP.search(line)] == [
        line for line in lines if STEP.search(line)]

    # ratchet status: a cost column per row, the split in --json
    table = ratchet(repo, "status", check=True).stdout
    assert "cost $" in table
    for cand in cands:
        row = next(line for line in table.splitlines() if line.split("│")[0].strip() == cand.id)
        assert f"{sum(mine[cand.id]):.4f}" in row
        split = status["spend_by_candidate"][cand.id]
        assert split["proposer_usd"] == pytest.approx(mine[cand.id][0], abs=1e-6)
        assert split["compute_usd"] == pytest.approx(mine[cand.id][1], abs=1e-6)
    assert sum(s["usd"] for s in status["spend_by_candidate"].values()) == pytest.approx(
        total["usd"], abs=1e-5)  # every call made a candidate, every job is a row's

    # ratchet show: the split, and for a keep what it cost to get there
    shown = ratchet(repo, "show", kept[1].id, check=True).stdout
    p, c = mine[kept[1].id]
    assert f"spend: ${p + c:.4f} = proposer ${p:.4f} + compute ${c:.4f}" in shown
    assert f"to get here: ${float(steps[kept[1].id][0]):.4f} = " in shown
    assert "its confirmation pairs" in shown  # a keep is confirmed on fresh pairs

    # results.tsv: the split beside cost_usd
    from helpers import results_tsv

    by_commit = {c.short: c for c in cands}
    for entry in results_tsv(repo):
        cand = by_commit[entry["commit"]]
        assert float(entry["proposer_usd"]) == pytest.approx(mine[cand.id][0], abs=1e-6)
        assert float(entry["compute_usd"]) == pytest.approx(mine[cand.id][1], abs=1e-6)
        assert float(entry["cost_usd"]) == pytest.approx(sum(mine[cand.id]), abs=2e-6)

    # the report: the split per candidate in its table, the totals in its costs
    ratchet(repo, "report", check=True)
    html = (repo / ".ratchet" / "report" / "index.html").read_text()
    assert "<th>proposer $</th>" in html.replace(' class="num"', "") or "proposer $" in html
    for cand in cands:
        p, c = mine[cand.id]
        assert f">{p:.4f}</td>" in html and f">{c:.4f}</td>" in html
    assert f"{total['proposer_usd']:.4f} ({total['calls']} calls)" in html


def test_show_and_log_call_a_failed_candidates_spend_wasted(tmp_path):
    def answer(request) -> Answer:  # a change that breaks the evaluator: a crash
        return Answer("DESCRIPTION: break it\n\nsolution.py\n<<<<<<< FILE\nVALUE = 1\n\n\n"
                      "def compute():\n    raise SystemExit(3)\n>>>>>>> FILE\n",
                      input_tokens=300, output_tokens=20)

    with LLMServer() as server:
        server.respond_with(answer)
        repo = priced_study(tmp_path, server, parallel=2, rounds=1)
        ratchet(repo, "run", check=True)
    ledger = ledger_of(repo)
    [crashed] = [c for c in ledger.candidates() if c.kind == "candidate"]
    mine = own_spend(ledger)[crashed.id]
    ledger.close()
    assert crashed.status == "crash"
    shown = ratchet(repo, "show", crashed.id, check=True).stdout
    assert (f"spend: ${sum(mine):.4f} = proposer ${mine[0]:.4f} + compute ${mine[1]:.4f}; "
            "all of it wasted (crash: it measured nothing)") in shown
    spend = status_of(repo)["spend"]
    assert spend["wasted_usd"] == pytest.approx(sum(mine), abs=1e-6)
    proc = ratchet(repo, "log", check=True)
    assert f"wasted ${spend['wasted_usd']:.4f}" in proc.stderr
    # nothing kept: what was spent since the start is said as not kept yet
    assert "since the last keep, not kept yet: $" in proc.stderr


IMPROVING_AGENT = r'''
import pathlib, re, sys, time
prompt = pathlib.Path(sys.argv[1]).read_text()
asked = re.search(r"attempt (\d+) of", prompt)
time.sleep(0.3)
if asked is None:  # asked to repair a change onto a moved incumbent: it cannot, so the
    sys.exit("this agent does not repair")  # proposal is dropped, both runs billed
attempt = int(asked.group(1))
path = pathlib.Path("solution.py")
text = path.read_text()
value = int(re.search(r"VALUE = (\d+)", text).group(1)) - attempt  # better each time
path.write_text(re.sub(r"VALUE = \d+", f"VALUE = {value}", text))
print(f"DESCRIPTION: agent sets VALUE to {value}")
'''


def test_agent_runs_made_ahead_and_dropped_are_billed_with_their_time(tmp_path):
    repo = agent_study(tmp_path, IMPROVING_AGENT)
    toml = (repo / "ratchet.toml").read_text().replace("rounds = 1\n",
                                                       "rounds = 2\nahead = true\n")
    (repo / "ratchet.toml").write_text(toml)
    hgit(repo, "commit", "-qam", "two rounds, speculating")
    ratchet(repo, "run", check=True)
    ledger = ledger_of(repo)
    calls = ledger.calls()
    cands = [c for c in ledger.candidates() if c.kind == "candidate"]
    ledger.close()
    # every run keeps its own record, a round asked again included
    runs = [d for d in (repo / ".ratchet" / "agents").iterdir() if (d / "agent.log").exists()]
    assert len(calls) == len(runs) > len(cands)
    dropped = [c for c in calls if (c["fate"] or "").startswith("dropped")]
    assert dropped and all(c["candidate"] is None for c in dropped)  # conflicted: re-asked
    assert all(c["proposer"] == "agent" and c["seconds"] >= 0.3 for c in calls), [(c["proposer"], c["seconds"], c["outcome"], c["fate"]) for c in calls]
    assert all(c["cost_usd"] == pytest.approx(c["seconds"], abs=0.01) for c in calls)
    spend = status_of(repo)["spend"]
    assert spend["calls"] == len(runs)
    assert spend["unused_calls"] == len(calls) - sum(1 for c in calls if c["candidate"])
    assert spend["proposer_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls), abs=1e-5)
