"""Training research through the real CLI: the architecture is free, the evaluator is not fooled.

A temporary git repository holds the tinygpt example with a 2-second budget. Three candidate
commits go through `ratchet submit` and one `ratchet wait --json`, as an agent would send
them: two architecture changes the old evaluator could not score honestly (one of them with
a train.py that would betray any import of candidate Python by the evaluator), and a model
that looks ahead. Real worker processes, real training, real exported programs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import git, ratchet, results_tsv

pytest.importorskip("torch")
# Six training jobs (three candidates, the baseline twice for its noise floor, its hold-out):
# a few minutes on a loaded 2-core machine, all in the module fixture's setup.
pytestmark = pytest.mark.timeout(900)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tinygpt"
FILES = ("prepare.py", "train.py", "evaluate.py", "ratchet.toml", "program.md", ".gitignore")

# Imported instead of run, this train.py says so and fails: an evaluator that imported it
# would crash the candidate. Run, it leaves decoy numpy.py / torch.py modules beside the
# evaluator, which do the same if anything imports them from the candidate's directory.
TRAP = '''import sys as _sys

if __name__ != "__main__":
    print("TRAIN_PY_WAS_IMPORTED", flush=True)
    _sys.exit(1)
'''
DECOYS = '''for decoy in ("numpy.py", "torch.py"):  # left after training, beside the evaluator
        Path(decoy).write_text('print("DECOY_WAS_IMPORTED", flush=True)\\nraise SystemExit(1)\\n')
    print("saved: model.pt2")'''


TRAP_EDITS = [('"""Train a tiny', TRAP + '"""Train a tiny'), ('print("saved: model.pt2")', DECOYS)]
# The ReLU candidate also carries the trap: one job fewer, and a trapped candidate whose
# score must still come out.
CANDIDATES = {
    "narrow": ("MLP 2x instead of 4x", [("4 * n_embd", "2 * n_embd")]),
    "relu": ("ReLU instead of GELU", [("F.gelu(self.fc(x))", "F.relu(self.fc(x))"), *TRAP_EDITS]),
    "lookahead": ("attention sees the future", [("is_causal=True", "is_causal=False")]),
}


def commit_variant(repo: Path, name: str, message: str, edits: list[tuple[str, str]]) -> str:
    git(repo, "checkout", "-q", "-b", name, "main")
    path = repo / "train.py"
    text = path.read_text()
    for old, new in edits:
        assert old in text, (name, old)
        text = text.replace(old, new)
    path.write_text(text)
    git(repo, "commit", "-q", "-am", message)
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return sha


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("tinygpt-study")
    for name in FILES:
        shutil.copy(EXAMPLE / name, repo / name)
    train = repo / "train.py"
    train.write_text(train.read_text().replace("\nTIME_BUDGET = 30\n", "\nTIME_BUDGET = 2\n"))
    # 16 KiB scored instead of 128: the scoring is the same code on fewer windows, and a
    # 2-second model's evaluation took 20 of its job's 85 seconds on a loaded machine
    evaluator = repo / "evaluate.py"
    text = evaluator.read_text()
    assert "\nEVAL_BYTES = 128 * 1024\n" in text
    evaluator.write_text(text.replace("\nEVAL_BYTES = 128 * 1024\n", "\nEVAL_BYTES = 16 * 1024\n"))
    # No would-be keep: what is asked here is how a change is scored, not whether it is
    # confirmed (tests/test_confirm_*.py). A 2-second model's gain is far under 90%, so
    # no hold-out run and no confirmation pairs follow (they were 3-9 of its training jobs)
    config = repo / "ratchet.toml"
    text = config.read_text()
    assert "\n[acceptance]\n" in text
    config.write_text(text.replace("\n[acceptance]\n", '\n[acceptance]\nmin_improvement = "90%"\n'))
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "tinygpt, 2 s budget")
    shas = {name: commit_variant(repo, name, msg, edits) for name, (msg, edits) in CANDIDATES.items()}

    ids = {}
    for name, sha in shas.items():
        proc = ratchet(repo, "submit", sha, "-m", name, check=True)
        ids[name] = proc.stdout.strip().splitlines()[-1]
    proc = ratchet(repo, "wait", *ids.values(), "--json", check=True, timeout=400)
    verdicts = {row["id"]: row for row in map(json.loads, proc.stdout.strip().splitlines())}
    by_name = {name: verdicts[cid] for name, cid in ids.items()}
    return repo, ids, by_name


@pytest.mark.parametrize("name", ["narrow", "relu"])
def test_architecture_changes_are_scored_as_trained(judged, name):
    repo, _, verdicts = judged
    verdict = verdicts[name]
    assert verdict["status"] in ("keep", "discard"), verdict
    assert 0 < verdict["metric"] < 8.0  # scored, and better than a uniform guess
    rows = {row["description"]: row for row in results_tsv(repo)}
    assert rows[name]["status"] == verdict["status"]


def test_a_model_that_looks_ahead_is_rejected(judged):
    repo, ids, verdicts = judged
    assert verdicts["lookahead"]["status"] == "rejected", verdicts["lookahead"]
    assert verdicts["lookahead"]["metric"] is None
    logs = ratchet(repo, "logs", ids["lookahead"], check=True).stdout
    assert "not causal" in logs


def test_the_evaluator_never_imports_candidate_python(judged):
    repo, ids, verdicts = judged
    logs = ratchet(repo, "logs", ids["relu"], check=True).stdout
    assert "TRAIN_PY_WAS_IMPORTED" not in logs and "DECOY_WAS_IMPORTED" not in logs
    assert "saved: model.pt2" in logs  # printed after the decoys were written
    assert verdicts["relu"]["status"] in ("keep", "discard"), verdicts["relu"]
    # The trap is armed: importing that train.py does fail loudly.
    work = repo / "trap-check"
    work.mkdir()
    (work / "train.py").write_text(git(repo, "show", "relu:train.py") + "\n")
    proc = subprocess.run([sys.executable, "-c", "import train"], cwd=work,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "TRAIN_PY_WAS_IMPORTED" in proc.stdout


def test_memory_gb_is_the_training_runs_peak(judged):
    repo, _, _ = judged
    rows = [row for row in results_tsv(repo) if row["status"] in ("keep", "discard")]
    # The worker's measurement of the run phase (peak RSS on a CPU), not a dummy 0.0.
    assert len(rows) == 3 and all(float(row["memory_gb"]) > 0 for row in rows), rows
