"""Headlines tell the truth: the end-of-run line, `status --json` and the report's cards
all show baseline -> incumbent as the ledger's pooled estimates (every evaluation of each
commit, with an interval), never a single re-measure (issue 19)."""

from __future__ import annotations

import json
import statistics

from helpers import SCORE_SOLUTION, config_text, make_repo, ratchet

from ratchet.core import stats
from ratchet.driver import views
from ratchet.store.ledger import Ledger

# the score is a pure function of X plus a small reproducible noise (by job id): real
# gains are many noise standard deviations, so they are confirmed beside the incumbent
NOISY_SCORE = """
import hashlib, os, random
import solution
rng = random.Random(int(hashlib.sha256(os.environ["RATCHET_JOB_ID"].encode()).hexdigest(), 16))
print(f"score: {solution.score() + rng.gauss(0, 0.01):.6f}")
"""


def test_headlines_agree_with_the_ledgers_pooled_estimates(tmp_path):
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(
            search="[search]\nproposer = \"tune\"\nparallel = 2\nrounds = 3\n"
                   "[acceptance]\nnoise_floor = 2\n"),
        "evaluate.py": NOISY_SCORE, "solution.py": SCORE_SOLUTION})
    run = ratchet(repo, "run")
    assert run.returncode == 0, run.stderr
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    groups = ledger.evaluations()
    pinned, incumbent = ledger.get("pinned"), ledger.get("incumbent")
    assert incumbent != pinned, "a real gain many sigma wide is kept"
    assert len(groups[pinned]) >= 2  # the A/A floor: the baseline measured twice
    assert len(groups[incumbent]) >= 2  # its own run and its confirmation, at least
    noise = views.study_noise(ledger, "score", groups)
    assert noise.known
    base_est = stats.estimate(groups[pinned], noise)
    inc_est = stats.estimate(groups[incumbent], noise)
    assert inc_est.mean == statistics.fmean(groups[incumbent])

    status = json.loads(ratchet(repo, "status", "--json").stdout)
    head = status["headline"]
    assert head["incumbent"]["mean"] == inc_est.mean and head["incumbent"]["n"] == inc_est.n
    assert head["baseline"]["mean"] == base_est.mean and head["baseline"]["n"] == base_est.n
    assert head["incumbent"]["low"] < inc_est.mean < head["incumbent"]["high"]
    assert head["change"] > 0 and status["false_keep_rate"] == 0.01
    # the ledger's incumbent record is the same pooled mean
    assert ledger.incumbent().metric == inc_est.mean

    line = f"score: baseline {base_est.text()} -> incumbent {inc_est.text()}"
    assert line in run.stdout, run.stdout
    assert line in ratchet(repo, "status").stdout

    assert ratchet(repo, "report").returncode == 0
    page = (repo / ".ratchet" / "report" / "index.html").read_text()
    assert inc_est.text().replace("±", "&plusmn;") in page or inc_est.text() in page
    assert base_est.text() in page
    assert f"{head['change'] * 100:+.2f}% (better)" in page
    # best so far is the best pooled estimate of a kept commit: the incumbent's here
    assert views.best_so_far(ledger, "minimize") == min(
        statistics.fmean(groups[c.commit_sha]) for c in ledger.candidates(status="keep"))
    ledger.close()
