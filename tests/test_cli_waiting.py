"""The live view of `ratchet run` says what the study waits for: the proposer's kind and
how long its call has taken so far. A real loopback LLM server that takes its time, the
real CLI on a real pseudo-terminal."""

from __future__ import annotations

import os
import re
import sys

import pytest
from helpers import RATCHET, ROOT, make_repo
from llm_server import Answer, LLMServer
from terminal import CSI, run_on_tty, screen

TOML = """
[task]
name = "slow"
editable = ["solution.py"]
protected = ["evaluate.py"]
evaluate = "python evaluate.py"
timeout = "60s"

[task.metric]
name = "score"

[search]
proposer = "llm"
parallel = 2
rounds = 1

[context]
hardware = false

[llm]
timeout = 30
max_retries = 0
retries = 0
concurrency = 1

[[llm.models]]
provider = "openai"
model = "m"
base_url = "{url}"
api_key_env = "RATCHET_TEST_LLM_KEY"
"""


def edit(value: int) -> str:
    return (f"DESCRIPTION: set VALUE to {value}\n\nsolution.py\n<<<<<<< SEARCH\nVALUE = 10\n"
            f"=======\nVALUE = {value}\n>>>>>>> REPLACE\n")


def test_the_live_view_says_it_waits_for_the_proposer_and_for_how_long(tmp_path):
    with LLMServer() as server:
        # each reply takes 2.5 s: the round waits for the proposer, and the view must say so
        server.respond_with(lambda request: Answer(edit(5), delay=2.5))
        repo = make_repo(tmp_path / "r", {
            "ratchet.toml": TOML.format(url=server.openai_url),
            "solution.py": "VALUE = 10\n",
            "evaluate.py": "import solution\nprint(f'score: {solution.VALUE}')\n",
        })
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "RATCHET_TEST_LLM_KEY": "sk-x"}
        code, raw = run_on_tty([*RATCHET, "run"], env, repo, cols=120, timeout=240)
    assert code == 0, raw
    text = CSI.sub("", raw)
    seconds = [float(s) for s in re.findall(r"waiting for the proposer \(llm: (\d+\.\d) s\)",
                                            text)]
    assert seconds, text[-3000:]
    # it counts up while the call is in flight, and the call took the server's delay
    assert max(seconds) >= 1.5, seconds
    assert len(set(seconds)) >= 3, seconds
    # the view is live: gone once the run ends, the verdicts stay
    assert "waiting for the proposer" not in screen(raw, 120)[-1]


SLOW_AGENT = r'''
import pathlib, re, sys, time

prompt = pathlib.Path(sys.argv[1]).read_text()
attempt = int(re.search(r"attempt (\d+) of", prompt).group(1))
time.sleep(2.5)
path = pathlib.Path("solution.py")
path.write_text(path.read_text().replace("VALUE = 10", f"VALUE = {attempt}"))
print(f"DESCRIPTION: agent sets VALUE to {attempt}")
'''


def test_the_live_view_says_how_many_agents_run_and_for_how_long(tmp_path):
    from ratchet.driver.config import load_config
    from ratchet.proposers.agent import AgentProposer

    script = tmp_path / "agent.py"
    script.write_text(SLOW_AGENT)
    toml = TOML.replace('proposer = "llm"', 'proposer = "agent"').replace(
        "parallel = 2", "parallel = 3").split("[llm]")[0]
    toml += f'[agent]\ncommand = ["{sys.executable}", "{script}", "{{prompt_file}}"]\n'
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": toml, "solution.py": "VALUE = 10\n",
        "evaluate.py": "import solution\nprint(f'score: {solution.VALUE}')\n",
    })
    if not AgentProposer(load_config(repo), []).contained:
        pytest.skip("agents run one at a time on the loop's own thread on a machine where "
                    "no sandbox confines them (no bubblewrap, not root): no live view then")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    code, raw = run_on_tty([*RATCHET, "run"], env, repo, cols=120, timeout=240)
    assert code == 0, raw
    text = CSI.sub("", raw)
    # round 1: K = 3, the baseline beside two agents, both running at once
    seconds = [float(s) for s in re.findall(r"2 of 2 agents running \((\d+\.\d) s\)", text)]
    assert seconds and max(seconds) >= 1.5, text[-3000:]
