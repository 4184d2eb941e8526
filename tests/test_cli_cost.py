"""`ratchet status` shows the whole bill (issue 12, item 8): the tokens of proposals that
were rejected before they ran, duplicates included, through `ratchet run` against a real
loopback server speaking the OpenAI protocol."""

from __future__ import annotations

import json
import os

from helpers import make_repo, ratchet
from llm_server import LLMServer

from ratchet.store.ledger import Ledger

TOML = """
[task]
name = "tiny"
editable = ["solution.py"]
protected = ["evaluate.py"]
evaluate = "python evaluate.py"
timeout = "60s"

[task.metric]
name = "score"

[search]
proposer = "llm"
parallel = 4
rounds = 1

[context]
hardware = false

[llm]
timeout = 20
max_retries = 0
retries = 1
concurrency = 1

[[llm.models]]
provider = "openai"
model = "m"
base_url = "{url}"
api_key_env = "RATCHET_TEST_LLM_KEY"
price_per_mtok_in = 2.0
price_per_mtok_out = 10.0
"""

EDIT = ("DESCRIPTION: set VALUE to 5\n\nsolution.py\n<<<<<<< SEARCH\nVALUE = 10\n=======\n"
        "VALUE = 5\n>>>>>>> REPLACE\n")


def test_status_cost_counts_proposals_that_never_ran(tmp_path):
    with LLMServer() as server:
        # three proposals: one runs, one is an identical diff (a duplicate), one never
        # applies (and its repair request fails too): four requests in all
        server.script(EDIT, EDIT, "no edit here", "still no edit")
        repo = make_repo(tmp_path / "r", {
            "ratchet.toml": TOML.format(url=server.openai_url),
            "solution.py": "VALUE = 10\n",
            "evaluate.py": "import solution\nprint(f'score: {solution.VALUE}')\n",
        })
        proc = ratchet(repo, "run", env={"RATCHET_TEST_LLM_KEY": "sk-dummy"})
        assert proc.returncode == 0, proc.stderr
        requests = len(server.requests)
    assert requests == 4
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    statuses = sorted(c.status for c in ledger.candidates() if c.kind == "candidate")
    ledger.close()
    assert statuses == ["keep", "rejected", "rejected"]
    # every request: 100 tokens in at $2/M, 50 out at $10/M
    spent = requests * (100 * 2.0 + 50 * 10.0) / 1e6
    status = json.loads(ratchet(repo, "status", "--json").stdout)
    assert status["cost_usd"] == round(spent, 4)
    assert "RATCHET_TEST_LLM_KEY" not in os.environ  # the key stayed with the subprocess
