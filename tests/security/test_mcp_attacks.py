"""A hostile MCP client against `ratchet mcp` over a real stdio process (issue 37).

It tries every way out of the submission rules an LLM's edit is held to, paths no
checkout can hold, content no text file has, a flood of submissions, ids of no candidate
and another study's ids, commits and job ids. Every attempt must come back
as a tool error naming the field, nothing of it may be recorded (no rejected candidate
charged to the study), the server must print no traceback, the flood must stop at the
study's budget, and the study branch must move only through the judge.
"""

from __future__ import annotations

import json
import textwrap

import anyio
import pytest
from helpers import (
    SCORE_EVALUATOR,
    SCORE_SOLUTION,
    config_text,
    git,
    make_repo,
    ratchet,
    score_repo,
)
from mcp_kit import call, edited, over_stdio, refused

from ratchet.mcp.tools import StudyTools, ToolInputError
from ratchet.store.ledger import Ledger

BUDGET = 3

TASK = textwrap.dedent('''
    [task]
    name = "demo"
    editable = ["*.py", "lib/**"]
    protected = ["evaluate.py"]
    evaluate = "python evaluate.py"
    timeout = "60s"
    forbid = ["__import__"]
''')


def hostile_repo(path):
    """Wide globs (any top-level .py may change), so that shadowing a module the evaluator
    imports is a real risk the checks must catch, and a budget of BUDGET candidates."""
    return make_repo(path, {
        "ratchet.toml": config_text(task=TASK, search="", knobs="",
                                    budget=f"[budget]\ncandidates = {BUDGET}\n"),
        "evaluate.py": "import json\n" + SCORE_EVALUATOR,
        "solution.py": SCORE_SOLUTION,
        "lib/util.py": "HELP = 1\n",
    })


def other_study(path):
    """Another study beside the attacked one, further along: c0000 (its baseline) to
    c0005, judged. Its ids, commits and job ids are nothing to the attacked study."""
    repo = score_repo(path, search="", knobs="")
    tools = StudyTools(repo)
    source = (repo / "solution.py").read_text()
    ids = [tools.submit({"solution.py": source.replace("X = 3.0", f"X = {x}")}, f"x {x}")["id"]
           for x in (2.0, 1.5, 1.0, 0.5, 4.0)]
    assert tools.wait(ids, 200)["done"]
    return repo


def test_a_hostile_client_gets_clean_errors_and_nothing_is_recorded(tmp_path):
    repo = hostile_repo(tmp_path / "r")
    start = git(repo, "rev-parse", "HEAD")
    ok = edited(repo, "X = 3.0", "X = 1.5")["solution.py"]
    # (field the error must name, files)
    bad_files = [
        ("files['../evil.py']", {"../evil.py": "x = 1\n"}),
        ("files['/etc/cron.d/x']", {"/etc/cron.d/x": "* * * * * root sh\n"}),
        ("files['.git/hooks/pre-commit']", {".git/hooks/pre-commit": "#!/bin/sh\n"}),
        ("files['lib/../../x.py']", {"lib/../../x.py": "x = 1\n"}),
        ("files['solution.py\\x00']", {"solution.py\0": ok}),
        ("files['notes.txt']", {"notes.txt": "not editable\n"}),
        ("files['evaluate.py']", {"evaluate.py": "print('score: 0')\n"}),
        ("files['ratchet.toml']", {"ratchet.toml": "[task]\n"}),
        ("files", {"json.py": "def dumps(x): return '0'\n"}),  # shadows the evaluator's json
        ("files", {"os.py": "x = 1\n"}),  # the standard library's
        ("files", {"solution.py": ok.replace("X = 1.5", "X = __import__('os').getpid()")}),
        ("files['lib/" + "d/" * 50, {"lib/" + "d/" * 70 + "x.py": "x = 1\n"}),  # too deep
        ("files['lib/" + "n" * 116 + "…']", {"lib/" + "n" * 300 + ".py": "x = 1\n"}),  # NAME_MAX
        ("files['lib']", {"lib": "x = 1\n"}),  # a directory of the incumbent
        ("files['lib/util.py/x.py']", {"lib/util.py/x.py": "x = 1\n"}),  # under a file
        ("files['solution.py']", {"solution.py": "x" * (9 << 20)}),  # over 8 MiB
        ("files['solution.py']", {"solution.py": "\x7fELF\x02\x01\x01\0\0\0"}),  # binary
        ("files", {}),
        ("files", {"solution.py": (repo / "solution.py").read_text()}),  # no change
    ]

    async def attack(client):
        errors = []
        for field, files in bad_files:
            errors.append((field, await refused(client, "submit", files=files,
                                                description="attack")))
        errors.append(("files", await refused(client, "submit", files=["solution.py"],
                                              description="files as a list")))
        errors.append(("description", await refused(client, "submit", files={
            "solution.py": ok}, description="")))
        errors.append(("description", await refused(client, "submit", files={
            "solution.py": ok}, description="d" * 100_000)))
        errors.append(("base", await refused(client, "submit", files={"solution.py": ok},
                                             description="on nothing", base="c0999")))
        errors.append(("ids[0]", await refused(client, "wait", ids=["c0999"])))
        errors.append(("ids[0]", await refused(client, "wait", ids=["../other/c0001"])))
        errors.append(("ids", await refused(client, "wait", ids=[])))
        errors.append(("timeout", await refused(client, "wait", ids=["c0000"],
                                                timeout=10**9)))
        errors.append(("id", await refused(client, "show", id="../../etc/passwd")))
        errors.append(("n", await refused(client, "history", n=0)))
        errors.append(("text", await refused(client, "idea", text="")))
        before = await call(client, "history", n=500)
        # a flood of good submissions: the budget takes BUDGET, then refuses
        taken, turned = [], []
        for x in range(10):
            result = await client.call_tool("submit", {
                "files": {"solution.py": ok.replace("X = 1.5", f"X = {x / 7:.4f}")},
                "description": f"flood {x}"})
            (turned if result.is_error else taken).append(result.content[0].text)
        ids = [json.loads(text)["id"] for text in taken]
        waited = await call(client, "wait", ids=ids, timeout=300)
        # another study's ids (c0004, c0005: none of ours), its commits and its job ids
        for ref in ("c0004", "c0005", *others_refs):
            errors.append(("ids[0]", await refused(client, "wait", ids=[ref])))
        errors.append(("ids[1]", await refused(client, "wait", ids=[ids[0], "c0005"])))
        return errors, before, turned, waited

    other = other_study(tmp_path / "other")
    others = Ledger(other / ".ratchet" / "ledger.db").candidates()
    others_refs = [others[-1].commit_sha, others[-1].job_id]
    with open(tmp_path / "server.log", "w+") as errlog:
        errors, before, turned, waited = over_stdio(repo, attack, errlog)
        errlog.seek(0)
        log = errlog.read()

    for field, text in errors:  # one line to the model, naming what was wrong
        assert field in text, (field, text)
        assert "Traceback" not in text and len(text) < 2000, text
        assert "\n" not in text and "pydantic" not in text, text
    assert "Traceback" not in log and "Unexpected" not in log, log[-3000:]
    # nothing of the attack was recorded: the study had not even started
    assert before["candidates"] == [] and before["incumbent"]["commit"] is None
    # the flood: BUDGET taken, the rest refused naming the limit
    assert len(waited["verdicts"]) == BUDGET and len(turned) == 10 - BUDGET
    assert all("budget.candidates" in text and "nothing was submitted" in text
               for text in turned)
    rows = json.loads(ratchet(repo, "status", "--json", check=True).stdout)
    assert sum(rows["counts"].values()) == BUDGET + 1  # and the baseline
    assert "rejected" not in rows["counts"]
    log_lines = ratchet(repo, "log", check=True).stdout.splitlines()
    assert len(log_lines) == BUDGET + 1
    # the branch moved only through the judge: to a kept candidate, or not at all
    kept = [v for v in waited["verdicts"] if v["status"] == "keep"]
    branch = git(repo, "rev-parse", "ratchet/demo")
    assert branch == (kept[-1]["commit"] if kept else start)
    assert git(repo, "rev-parse", "HEAD") == start and git(repo, "status", "--porcelain") == ""
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "x.py").exists()
    assert git(repo, "ls-tree", "-r", "--name-only", branch).split() == [
        "evaluate.py", "lib/util.py", "ratchet.toml", "solution.py"]
    # the other study is untouched: its rows are as its own wait left them
    assert Ledger(other / ".ratchet" / "ledger.db").candidates() == others


def test_a_flood_from_several_servers_at_once_stops_at_the_budget(tmp_path):
    """Three agents, each with its own `ratchet mcp` process, each sending 4 submissions at
    once: the budget's check and the record are one step across processes, so BUDGET are
    taken in all, the study starts once, and the rest are refused naming the limit."""
    from mcp import Client
    from mcp.client.stdio import stdio_client
    from mcp_kit import stdio_server

    repo = hostile_repo(tmp_path / "r")
    source = (repo / "solution.py").read_text()
    answers: list[tuple[bool, str]] = []

    async def agent(k: int) -> None:
        with open(tmp_path / f"server{k}.log", "w") as errlog:
            async with Client(stdio_client(stdio_server(repo), errlog=errlog)) as client:
                async def submit(x: int) -> None:
                    result = await client.call_tool("submit", {
                        "files": {"solution.py": source.replace("X = 3.0", f"X = {k}.{x}1")},
                        "description": f"agent {k} try {x}"})
                    answers.append((result.is_error, result.content[0].text))

                async with anyio.create_task_group() as tasks:
                    for x in range(4):
                        tasks.start_soon(submit, x)

    async def main() -> None:
        async with anyio.create_task_group() as agents:
            for k in range(3):
                agents.start_soon(agent, k)

    anyio.run(main)
    taken = [json.loads(text)["id"] for error, text in answers if not error]
    turned = [text for error, text in answers if error]
    assert len(answers) == 12 and len(taken) == BUDGET, answers
    assert all("budget.candidates reached, nothing was submitted" in text for text in turned)
    logs = "".join((tmp_path / f"server{k}.log").read_text() for k in range(3))
    assert "Traceback" not in logs, logs[-3000:]
    rows = Ledger(repo / ".ratchet" / "ledger.db").candidates()
    assert sorted(c.id for c in rows if c.kind == "candidate") == sorted(taken)
    assert [c.kind for c in rows].count("baseline") == 1  # started once
    assert StudyTools(repo).wait(taken, 300)["done"]


def test_text_that_is_no_unicode_at_all_is_refused_before_the_study(tmp_path):
    """JSON's \\ud800 escape decodes to a lone surrogate, which no file, git argument or
    ledger row can hold. Over stdio the SDK drops such a line before any tool (and a line
    of no JSON at all): the server goes on answering, records nothing, prints no
    traceback. Called directly (another front, a future transport), every tool refuses
    it naming the field, never a crash in git or the ledger."""
    from mcp_kit import raw_stdio

    repo = hostile_repo(tmp_path / "r")
    ok = edited(repo, "X = 3.0", "X = 1.5")["solution.py"]
    with open(tmp_path / "server.log", "w+") as errlog:
        with raw_stdio(repo, errlog) as raw:
            raw.send('{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": '
                     '"submit", "arguments": {"files": {"solution.py": "a\\ud800"}, '
                     '"description": "d"}}}')
            raw.send("this is no JSON")
            raw.send('{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": '
                     '"idea", "arguments": {"text": "x\\udfff"}}}')
            raw.request(3, "tools/call", {"name": "history", "arguments": {"n": 5}})
            history = json.loads(raw.answer(3)["result"]["content"][0]["text"])
        errlog.seek(0)
        log = errlog.read()
    assert history["candidates"] == [] and "Traceback" not in log, log[-3000:]
    tools = StudyTools(repo)
    cases = [  # (the error's start, the call)
        ("files['solution.py']: is not valid UTF-8",
         lambda: tools.submit({"solution.py": "a\ud800b"}, "d")),
        ("files['lib/\\ud800.py']: the path is not valid UTF-8",
         lambda: tools.submit({"lib/\ud800.py": "x = 1\n"}, "d")),
        ("description: is not valid UTF-8", lambda: tools.submit({"solution.py": ok}, "d\ud800")),
        ("base: 'c\\ud800' is not an id",
         lambda: tools.submit({"solution.py": ok}, "d", base="c\ud800")),
        ("paths[0]: 'lib/\\ud800.py' is not valid UTF-8", lambda: tools.files(["lib/\ud800.py"])),
        ("ids[0]: 'c\\ud800' is not an id", lambda: tools.wait(["c\ud800"], 1)),
        ("id: 'c\\ud800' is not an id", lambda: tools.show("c\ud800")),
        ("text: is not valid UTF-8", lambda: tools.idea("x\ud800")),
    ]
    for start, attempt in cases:
        with pytest.raises(ToolInputError) as refused_with:
            attempt()
        assert str(refused_with.value).startswith(start), (start, str(refused_with.value))
    assert not (repo / ".ratchet" / "ledger.db").exists() or not Ledger(
        repo / ".ratchet" / "ledger.db").candidates()
