"""Rolling search keeps the guarantees of rounds: write-ahead records, the incumbent each
candidate started from, and tamper checks while other candidates keep running."""

from __future__ import annotations

from common import ledger, start_run
from helpers import config_text, git, make_repo

CHEAT = '''
import json, os, sqlite3, subprocess, time
MODE = "base"


def score():
    if MODE == "cheat":  # rewrites the study's state from inside (no sandbox)
        repo = os.path.abspath(os.path.join(os.environ["RATCHET_WORKDIR"], *[".."] * 4))
        me = subprocess.run(["git", "-C", repo, "rev-parse", "refs/ratchet/demo/"
                             + os.environ["RATCHET_CANDIDATE"]], capture_output=True,
                            text=True).stdout.strip()
        db = sqlite3.connect(os.path.join(repo, ".ratchet", "ledger.db"), timeout=30)
        db.execute("UPDATE meta SET value = ? WHERE key = 'incumbent'", (json.dumps(me),))
        db.execute("UPDATE meta SET value = '0.0001' WHERE key = 'incumbent_metric'")
        db.commit()
        subprocess.run(["git", "-C", repo, "update-ref", "refs/heads/ratchet/demo", me])
        return 5.0
    time.sleep(0.3 if MODE == "base" else 0.6)
    return {"base": 1.0, "good": 0.5, "meh": 0.8}[MODE]
'''


def test_rolling_tampering_is_undone_and_rejected(tmp_path):
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(
            search='[search]\nproposer = "tune"\nparallel = 2\nrounds = 2\n',
            knobs='[tune]\nsampler = "random"\n[tune.knobs]\n'
                  '"solution.py:MODE" = { choices = ["cheat", "good"] }\n',
            backend='[backend]\nkind = "local"\nslots = 2\nsandbox = "none"\n'),
        "solution.py": CHEAT,
        "evaluate.py": "import solution\nprint(f'score: {solution.score()}')\n",
    })
    proc = start_run(repo, rolling=True, RATCHET_TEST_CANDIDATES="2")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    db = ledger(repo)
    try:
        cheat = next(c for c in db.candidates()
                     if (c.params or {}).get("solution.py:MODE") == "cheat")
        assert cheat.status == "rejected" and "tampering" in cheat.reasons
        assert db.get("incumbent_metric") in (1.0, 0.5, 0.8)  # restored, then judged
        incumbent = db.get("incumbent")
        assert incumbent != cheat.commit_sha
        assert git(repo, "rev-parse", "ratchet/demo") == incumbent
        kept = {c.commit_sha for c in db.candidates() if c.status == "keep"}
        assert incumbent in kept
        assert "tampering" in err
    finally:
        db.close()


def test_rolling_records_the_incumbent_each_candidate_started_from(tmp_path):
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(
            search='[search]\nproposer = "tune"\nparallel = 2\nrounds = 2\n',
            knobs='[tune]\nsampler = "random"\n[tune.knobs]\n'
                  '"solution.py:MODE" = { choices = ["good", "meh"] }\n'),
        "solution.py": CHEAT,
        "evaluate.py": "import solution\nprint(f'score: {solution.score()}')\n",
    })
    proc = start_run(repo, rolling=True, RATCHET_TEST_CANDIDATES="2")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    db = ledger(repo)
    try:
        cands = db.candidates()
        assert [c.kind for c in cands] == ["baseline", "candidate", "candidate"]
        assert all(c.is_judged for c in cands)
        start = cands[0].commit_sha
        for cand in cands[1:]:
            # started from the incumbent of its time (the start, or the keep before it)
            assert cand.parent in {start} | {c.commit_sha for c in cands
                                             if c.status == "keep"}
            assert git(repo, "rev-parse", f"{cand.commit_sha}^") == cand.parent
        # both start from the baseline; the first to finish is judged first, and the
        # other one, if it does not descend from it (stale), is confirmed as its own files
        # against it: kept when better, so no candidate measured better than the
        # incumbent the study ends with
        best = db.candidate(db.get("incumbent_id"))
        assert best.status == "keep" and best.metric in (0.5, 0.8)
        for cand in cands[1:]:
            assert cand.metric >= best.metric
    finally:
        db.close()
