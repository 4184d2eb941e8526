"""The tuner never re-proposes the incumbent or an earlier candidate (issue 12, item 4),
through `ratchet run` on a real repository with examples/kernel-cpu's kernel and knobs."""

from __future__ import annotations

from helpers import ROOT, git, make_repo, ratchet

# A fast, deterministic stand-in for the timing evaluator: each knob setting has its own
# time, so round 1 moves the incumbent away from the baseline, as in a real run.
EVALUATOR = '''
import kernel
base = {1: 50.0, 4: 30.0, 16: 20.0, 64: 12.0, 256: 10.0, 1024: 11.0}[kernel.CHUNK_ROWS]
print("correct: true")
print(f"time_ms: {base * (0.9 if kernel.INPLACE else 1.0):.3f}")
'''


def test_no_candidate_repeats_the_baseline_or_another(tmp_path):
    example = ROOT / "examples" / "kernel-cpu"
    # K=4 for 8 rounds asks for up to 31 experiments (a round beside a keep's
    # confirmation holds K - 2); the knobs allow only 12 (the baseline included), so the
    # tuner is pushed to the end of the space, where a repeat would be
    toml = (example / "ratchet.toml").read_text().replace("parallel = 2", "parallel = 4").replace(
        "co_run_incumbent = true", "co_run_incumbent = false").replace(
        # this test's stand-in evaluator imports the kernel in-process (it tests the tuner)
        "python -P evaluate.py", "python evaluate.py")
    repo = make_repo(tmp_path / "k", {
        "ratchet.toml": toml,
        "kernel.py": (example / "kernel.py").read_text(),
        "evaluate.py": EVALUATOR,
    })
    proc = ratchet(repo, "run", "--rounds", "8", timeout=600)
    assert proc.returncode == 0, proc.stderr
    baseline_blob = git(repo, "rev-parse", "HEAD:kernel.py")
    refs = git(repo, "for-each-ref", "--format=%(refname)", "refs/ratchet/softmax-cpu/")
    blobs = {ref: git(repo, "rev-parse", f"{ref}:kernel.py") for ref in refs.split()}
    assert len(blobs) == 11, blobs  # every other setting, once
    assert baseline_blob not in blobs.values()
    assert len(set(blobs.values())) == len(blobs)
    tsv = (repo / "results.tsv").read_text()
    assert "tune: CHUNK_ROWS=1, INPLACE=False" not in tsv
