"""The llm proposer through the real OpenAI and Anthropic SDKs against a loopback server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import context_for, edit, git, ledger_of, make_repo
from llm_server import Answer

from ratchet.core.candidate import Candidate
from ratchet.driver.config import load_config
from ratchet.driver.study import Study, StudyError
from ratchet.proposers import ProposerError
from ratchet.proposers.llm import LLMProposer


def llm_toml(server, provider: str = "openai", **settings) -> str:
    url = server.openai_url if provider == "openai" else server.anthropic_url
    values = {"timeout": 5, "max_retries": 0, "retries": 2, "backoff": 0.05, **settings}
    extra = "".join(f"{k} = {v}\n" for k, v in values.items())
    return f"""
[llm]
{extra}
[[llm.models]]
provider = "{provider}"
model = "m-{provider}"
base_url = "{url}"
temperature = 0.3
max_tokens = 800
price_per_mtok_in = 2.0
price_per_mtok_out = 10.0
"""


def by_attempt(replies: dict[int, str]):
    """Answer by which attempt the request is (K requests run concurrently)."""
    def respond(request) -> str:
        for n, text in replies.items():
            if f"attempt {n} of" in request.prompt:
                return text
        return "nothing"
    return respond


def test_openai_round_through_a_study(tmp_path, server):
    repo = make_repo(tmp_path / "r", "llm", llm_toml(server), parallel=3)
    server.respond_with(by_attempt({1: edit(4, "lower VALUE to 4"), 2: edit(20)}))
    study = Study(repo, backend="local")
    try:
        study.run(rounds=1)
    finally:
        study.close()
    rows = {c.description: c for c in ledger_of(repo).candidates()}
    assert rows["baseline"].status == "keep" and rows["baseline"].metric == 10
    kept, worse = rows["lower VALUE to 4"], rows["set VALUE to 20"]
    assert (kept.status, kept.metric, worse.status, worse.metric) == ("keep", 4, "discard", 20)
    assert kept.proposer == "llm"
    usage = kept.params["llm"]
    assert usage["model"] == "m-openai" and usage["input_tokens"] == 100
    assert usage["output_tokens"] == 50 and usage["calls"] == 1
    assert usage["cost_usd"] == pytest.approx((100 * 2.0 + 50 * 10.0) / 1e6)
    # the candidate's cost column is its compute (priced at 0 here); its request is a
    # call of its own in the ledger, linked to it, with its tokens and their price
    assert kept.cost_usd == 0 and rows["baseline"].cost_usd == 0
    [call] = [c for c in ledger_of(repo).calls() if c["candidate"] == kept.id]
    assert (call["outcome"], call["input_tokens"], call["output_tokens"]) == ("ok", 100, 50)
    assert call["cost_usd"] == pytest.approx(usage["cost_usd"])
    diff = git(repo, "diff", kept.parent, kept.commit_sha)
    assert "-VALUE = 10" in diff and "+VALUE = 4" in diff
    # the study branch moved to the kept candidate
    assert git(repo, "rev-parse", "ratchet/tiny") == kept.commit_sha
    # the context the model saw is saved and is exactly what was sent
    saved = Path(kept.context_path).read_text()
    request = next(r for r in server.requests if "attempt 1 of" in r.prompt)
    assert request.body["messages"][1]["content"] in saved
    for part in ("Make the score as low as possible", "def compute():", "minimize `score`",
                 "evaluate.py"):
        assert part in saved
    assert request.body["model"] == "m-openai" and request.body["temperature"] == 0.3
    assert request.body["max_tokens"] == 800
    assert request.headers["authorization"] == "Bearer sk-dummy"
    assert len(server.requests) == 2


def test_anthropic_repair_and_protected_file(tmp_path, server):
    repo = make_repo(tmp_path / "r", "llm", llm_toml(server, "anthropic", concurrency=1),
                     parallel=3)
    malformed = "DESCRIPTION: halve\nsolution.py\n<<<<<<< SEARCH\nVALUE = 10\n>>>>>>> REPLACE\n"
    protected = edit(1, "cheat", path="evaluate.py")
    server.script(malformed, edit(5, "halve VALUE"), protected, protected)
    study = Study(repo, backend="local")
    try:
        study.run(rounds=1)
    finally:
        study.close()
    rows = {c.description: c for c in ledger_of(repo).candidates()}
    repaired, cheat = rows["halve VALUE"], rows["cheat"]
    assert repaired.status == "keep" and repaired.metric == 5
    assert repaired.params["llm"]["repaired"] is True and repaired.params["llm"]["calls"] == 2
    assert repaired.params["llm"]["input_tokens"] == 200
    assert cheat.status == "rejected" and cheat.commit_sha is None
    assert "evaluate.py" in cheat.reasons and "protected" in cheat.reasons
    assert "even after one repair" in cheat.reasons
    assert [r.path for r in server.requests] == ["/v1/messages"] * 4
    # the repair request carries the first reply and says what failed
    repair = server.requests[1].body
    assert [m["role"] for m in repair["messages"]] == ["user", "assistant", "user"]
    assert repair["messages"][1]["content"] == malformed
    assert "has no '======='" in repair["messages"][2]["content"]
    assert "<<<<<<< SEARCH" in repair["system"]
    # the saved context of a failed proposal shows the whole exchange too
    assert "is a protected file" in Path(cheat.context_path).read_text()


def test_sdk_and_own_retries_on_429_5xx_and_timeouts(tmp_path, server):
    repo = make_repo(tmp_path / "r", "llm",
                     llm_toml(server, max_retries=1, timeout=0.4, retries=3))
    server.script(Answer(status=429, retry_after=0.05),  # SDK retries after 0.05 s
                  Answer(status=500),  # SDK gives up: our backoff
                  Answer(delay=1.5, text=edit(3)),  # past the client timeout: SDK retries
                  edit(3, "three"))
    proposer = LLMProposer(load_config(repo), [])
    start = time.monotonic()
    [proposal] = proposer.propose(1, context_for(repo))
    assert proposal.error is None and proposal.description == "three"
    assert proposal.files == {"solution.py": b"# the value the evaluator reports; lower is "
                              b"better\nVALUE = 3\n\n\ndef compute():\n    total = VALUE\n"
                              b"    return total\n"}
    assert len(server.requests) == 4
    assert time.monotonic() - start < 10


def test_a_failing_api_raises_after_bounded_backoff(tmp_path, server):
    repo = make_repo(tmp_path / "r", "llm", llm_toml(server, retries=2))
    server.respond_with(lambda request: Answer(status=503))
    proposer = LLMProposer(load_config(repo), [])
    with pytest.raises(ProposerError, match=r"still failing after 3 attempts.*HTTP 503"):
        proposer.propose(1, context_for(repo))
    assert len(server.requests) == 3


def test_unauthorised_is_not_retried(tmp_path, server):
    repo = make_repo(tmp_path / "r", "llm", llm_toml(server, retries=5))
    server.script(Answer(status=401))
    with pytest.raises(ProposerError, match="HTTP 401"):
        LLMProposer(load_config(repo), []).propose(1, context_for(repo))
    assert len(server.requests) == 1


def test_config_errors_are_one_line_and_name_the_key(tmp_path, monkeypatch, server):
    repo = make_repo(tmp_path / "r", "llm", """
[llm]
models = [{ provider = "openai", model = "gpt", api_key_env = "NO_SUCH_KEY_VAR" }]
""")
    with pytest.raises(ProposerError, match=r"llm\.models\[0\]\.api_key_env: .*NO_SUCH_KEY_VAR"):
        LLMProposer(load_config(repo), [])
    bad = make_repo(tmp_path / "b", "llm", """
[llm]
models = [{ provider = "openia", model = "gpt" }]
""")
    with pytest.raises(ProposerError, match=r"llm\.models\[0\]\.provider: ") as info:
        LLMProposer(load_config(bad), [])
    assert "\n" not in str(info.value)
    # the study refuses before anything runs: no baseline, no job
    monkeypatch.delenv("OPENAI_API_KEY")
    nokey = make_repo(tmp_path / "n", "llm", """
[llm]
models = [{ provider = "openai", model = "gpt" }]
""")
    study = Study(nokey, backend="local")
    try:
        with pytest.raises(ProposerError, match="OPENAI_API_KEY is not set"):
            study.run(rounds=1)
        assert study.ledger.candidates() == []
    finally:
        study.close()
    assert server.requests == []


def test_ideas_first_one_each_and_duplicates(tmp_path, server):
    repo = make_repo(tmp_path / "r", "llm", llm_toml(server), parallel=4,
                     files={"ideas.md": "# Ideas\n- try VALUE 2\n- make VALUE two\n"
                                            "- try VALUE 7\n  (it is odd)\n"})
    study = Study(repo, backend="local")
    study.ledger.add_idea("try VALUE 6")

    def respond(request):
        job = request.last_user.split("## Your job now", 1)[1]
        for v in (2, 6, 7):
            if f"try VALUE {v}" in job:
                return edit(v, f"idea {v}")
        return edit(2, "same as idea 2")

    server.respond_with(respond)
    try:
        study.run(rounds=1)
        rows = {c.description: c for c in study.ledger.candidates()}
        ideas = {row["text"]: row for row in study.ledger.ideas()}
    finally:
        study.close()
    assert rows["idea 6"].idea == "try VALUE 6"  # the CLI's idea came first (queued first)
    assert rows["idea 2"].idea == "try VALUE 2"
    assert rows["idea 2"].status == "keep"
    dup = rows["same as idea 2"]
    assert dup.status == "rejected" and "identical diff" in dup.reasons
    assert dup.idea == "make VALUE two" and dup.commit_sha is None
    # one idea was left for the next round: three proposals, three ideas taken
    assert ideas["make VALUE two"]["outcome"] == "rejected"
    assert ideas["try VALUE 2"]["status"] == "tried" and ideas["try VALUE 2"]["outcome"] == "keep"
    assert ideas["try VALUE 6"]["outcome"] == "discard"
    assert ideas["try VALUE 7 (it is odd)"]["status"] == "pending"
    assert ideas["try VALUE 2"]["source"] == "ideas.md"
    # each idea was shown to exactly one request, as that request's job
    jobs = [r.last_user.split("## Your job now", 1)[1] for r in server.requests]
    assert sum("try VALUE 2" in j for j in jobs) == 1
    assert sum("try VALUE 6" in j for j in jobs) == 1


def test_unreadable_ideas_file_is_one_clear_error(tmp_path, server):
    repo = make_repo(tmp_path / "r", "llm", llm_toml(server))
    (repo / "ideas.md").write_bytes(b"- caf\xe9\n")
    study = Study(repo, backend="local")
    try:
        with pytest.raises(StudyError, match=r"ideas\.md: cannot read the ideas file"):
            study.run(rounds=1)
    finally:
        study.close()


def test_cost_limit_stops_new_proposals(tmp_path, server):
    repo = make_repo(tmp_path / "r", "llm", llm_toml(server, max_cost_usd=0.5))
    spent = Candidate(id="c0001", seq=1, round=1, status="discard",
                      params={"llm": {"cost_usd": 0.6}})
    proposer = LLMProposer(load_config(repo), [spent])
    assert proposer.propose(2, context_for(repo, history=[spent])) == []
    assert server.requests == []


def test_weighted_ensemble_is_deterministic_per_round(tmp_path, server):
    repo = make_repo(tmp_path / "r", "llm", f"""
[[llm.models]]
provider = "openai"
model = "a"
base_url = "{server.openai_url}"

[[llm.models]]
provider = "anthropic"
model = "b"
base_url = "{server.anthropic_url}"
weight = 3
""")
    proposer = LLMProposer(load_config(repo), [])
    plans = [[a.spec_index for a in proposer.plan(8, context_for(repo, round=r))]
             for r in (1, 1, 2)]
    assert plans[0] == plans[1] and plans[0] != plans[2]
    assert set(plans[0]) | set(plans[2]) == {0, 1}


def test_cli_reports_a_missing_key_in_one_line(tmp_path):
    repo = make_repo(tmp_path / "r", "llm", """
[[llm.models]]
provider = "anthropic"
model = "claude"
""")
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    proc = subprocess.run([sys.executable, "-m", "ratchet.cli", "run", "-C", str(repo)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert "llm.models[0].api_key_env: environment variable ANTHROPIC_API_KEY is not set" \
        in proc.stderr
    assert "\n" not in proc.stderr.strip()
    assert not (repo / ".ratchet" / "jobs").exists()  # nothing ran


def test_a_fresh_driver_asks_its_first_round_early_and_never_loads_torch(tmp_path, server):
    """`ratchet run` in a new process: the SDK and the machine's description are loaded
    while the study starts, and the driver describes the GPU without torch (whose import
    cost seconds before the first request and whose CUDA context would hold GPU memory)."""
    repo = make_repo(tmp_path / "r", "llm", llm_toml(server), parallel=2)
    toml = (repo / "ratchet.toml").read_text().replace("hardware = false", "hardware = true")
    (repo / "ratchet.toml").write_text(toml)
    git(repo, "commit", "-qam", "hardware in the context")
    server.respond_with(lambda request: edit(4, "lower VALUE to 4"))
    script = (
        "import sys, json\n"
        "from ratchet.driver.study import Study\n"
        f"study = Study({str(repo)!r})\n"
        "try:\n"
        "    study.run(rounds=1)\n"
        "finally:\n"
        "    study.close()\n"
        "print(json.dumps({'torch': 'torch' in sys.modules}))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OPENAI_API_KEY": "sk-dummy"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["torch"] is False
    (request,) = server.requests
    assert "## Hardware" in request.prompt and "## CPU" in request.prompt
    rows = {c.description: c for c in ledger_of(repo).candidates()}
    assert rows["lower VALUE to 4"].status == "keep"


def test_warm_up_loads_every_client_once(tmp_path, server):
    repo = make_repo(tmp_path / "r", "llm", llm_toml(server))
    proposer = LLMProposer(load_config(repo), [])
    proposer.warm_up()
    client = proposer._client(0)
    proposer.warm_up()  # again: the same client, nothing rebuilt
    assert proposer._client(0) is client
    assert type(client).__module__.startswith("openai")


def test_rolling_never_hands_one_idea_to_two_candidates(tmp_path, server):
    """Rolling keeps proposals made ahead in a queue; the next ask must not get the ideas
    those queued (not yet recorded) proposals already carry."""
    repo = make_repo(tmp_path / "r", "llm", llm_toml(server), parallel=2,
                     files={"ideas.md": "# Ideas\n- try VALUE 3\n- try VALUE 5\n"
                                            "- try VALUE 7\n- try VALUE 9\n",
                            # the baseline (VALUE = 10) still runs when the first
                            # proposals are back: one is taken, one waits
                            "evaluate.py": "import time\nimport solution\n"
                                           "if solution.VALUE == 10:\n"
                                           "    time.sleep(3)\n"
                                           "print(f'score: {solution.compute()}')\n"})
    toml = (repo / "ratchet.toml").read_text().replace(
        "rounds = 1", 'rounds = 1\nmode = "rolling"\ncandidates = 4')
    (repo / "ratchet.toml").write_text(toml)
    git(repo, "commit", "-qam", "rolling")

    def respond(request):
        if "## Your job now" not in request.last_user:
            return edit(11, "a repair")  # its edits missed a moved incumbent: asked again
        if "# Re-apply a change" in request.last_user:  # the incumbent moved: re-applied
            now = re.search(r"(?m)^VALUE = (\d+)$", request.last_user).group(1)
            value = re.search(r"(?m)^\+VALUE = (\d+)$", request.last_user).group(1)
            return (f"DESCRIPTION: re-applied\n\nsolution.py\n<<<<<<< SEARCH\n"
                    f"VALUE = {now}\n=======\nVALUE = {value}\n>>>>>>> REPLACE\n")
        job = request.last_user.split("## Your job now", 1)[1]
        for v in (3, 5, 7, 9):
            if f"try VALUE {v}" in job:
                return edit(v, f"idea {v}")
        return edit(11, "no idea")

    server.respond_with(respond)
    study = Study(repo, backend="local")
    try:
        study.run()
        cands = [c for c in study.ledger.candidates() if c.kind == "candidate"]
    finally:
        study.close()
    ideas = [c.idea for c in cands if c.idea]
    # each of the four ideas went to one candidate; the budget counts candidates that
    # ran, and one whose edits did not apply is recorded, unrun, on top (this fake
    # model's edits without an idea never apply on a moved incumbent: the study ends
    # after as many such as the budget)
    assert sorted(ideas) == [f"try VALUE {v}" for v in (3, 5, 7, 9)], \
        [(c.id, c.idea, c.status, c.reasons) for c in cands]
    assert len([c for c in cands if c.job_id is not None]) <= 4
    assert all(c.status == "rejected" for c in cands if c.job_id is None)
    jobs = [r.last_user.split("## Your job now", 1)[1] for r in server.requests
            if "## Your job now" in r.last_user]
    for v in (3, 5, 7, 9):
        assert sum(f"try VALUE {v}" in j for j in jobs) <= 1
