"""The tuner rewrites one literal and leaves every other byte alone."""

import pytest

from ratchet.proposers.knobs import KnobError, find_knob, set_knob

SOURCE = (
    "# header comment\n"
    "import numpy as np  # unrelated\n"
    "BLOCK = 64   # block size (bytes) — café\n"
    "LR: float = 3e-4\n"
    "NAME = 'x'\n"
    "def f():\n"
    "    BLOCK = 1  # local, not a knob\n"
    "    return BLOCK\n"
).encode()


def test_rewrite_changes_only_the_literal():
    out = set_knob(SOURCE, "BLOCK", 128)
    assert out == SOURCE.replace(b"BLOCK = 64 ", b"BLOCK = 128 ", 1)
    out = set_knob(SOURCE, "LR", 0.001)
    assert out == SOURCE.replace(b"3e-4", b"0.001")
    out = set_knob(SOURCE, "NAME", "y")
    assert out == SOURCE.replace(b"'x'", b"'y'")


def test_round_trip_is_byte_identical():
    site = find_knob(SOURCE, "BLOCK")
    assert site.value == 64
    changed = set_knob(SOURCE, "BLOCK", 256)
    assert set_knob(changed, "BLOCK", 64) == SOURCE


def test_missing_or_non_literal_knob_is_a_clear_error():
    with pytest.raises(KnobError, match="no module-level assignment `DEPTH"):
        find_knob(SOURCE, "DEPTH", "kernel.py")
    with pytest.raises(KnobError, match="not assigned a literal"):
        find_knob(b"X = compute()\n", "X", "kernel.py")
    with pytest.raises(KnobError, match="assigned 2 times"):
        find_knob(b"X = 1\nX = 2\n", "X", "kernel.py")


# -- the tuner never repeats an experiment (issue 12, item 4) ------------------------------

def _kernel_repo(tmp_path):
    """examples/kernel-cpu's kernel and knobs in a real git repo; returns (repo, config)."""
    from helpers import ROOT, git, make_repo

    from ratchet.driver.config import load_config

    example = ROOT / "examples" / "kernel-cpu"
    repo = make_repo(tmp_path / "r", {
        name: (example / name).read_text() for name in ("ratchet.toml", "kernel.py",
                                                        "evaluate.py")
    })
    return repo, load_config(repo), git


def _commit_knobs(repo, git, base, **values):
    """A commit on `base` with kernel.py's knobs set to `values` (what a candidate is)."""
    from ratchet.job import gitrepo

    source = gitrepo.show(repo, base, "kernel.py")
    for name, value in values.items():
        source = set_knob(source, name, value)
    return gitrepo.commit_files(repo, base, {"kernel.py": source}, "candidate")


def _tune(repo, config, incumbent, history, k):
    from ratchet.proposers import ProposalContext
    from ratchet.proposers.tune import TuneProposer

    ctx = ProposalContext(repo=repo, state_dir=repo / ".ratchet", config=config,
                          study="softmax-cpu", round=2, incumbent=incumbent,
                          incumbent_metric=20.0, history=history)
    return TuneProposer(config, history).propose(k, ctx)


def _values(proposal):
    return (proposal.params["kernel.py:CHUNK_ROWS"], proposal.params["kernel.py:INPLACE"])


def test_tuner_never_reproposes_the_baseline_after_the_incumbent_moved(tmp_path):
    from ratchet.core.candidate import Candidate

    repo, config, git = _kernel_repo(tmp_path)
    base = git(repo, "rev-parse", "HEAD")
    kept = _commit_knobs(repo, git, base, CHUNK_ROWS=64)
    history = [  # what the ledger holds after round 1: the baseline has no params
        Candidate(id="c0000", seq=0, round=1, status="keep", kind="baseline",
                  commit_sha=base, parent=base, metric=50.0),
        Candidate(id="c0001", seq=1, round=1, status="keep", commit_sha=kept, parent=base,
                  params={"kernel.py:CHUNK_ROWS": 64, "kernel.py:INPLACE": False},
                  metric=20.0),
    ]
    proposals = _tune(repo, config, kept, history, k=12)  # ask for more than exist
    values = [_values(p) for p in proposals]
    assert len(values) == len(set(values)) == 10  # 12 combinations, 2 already measured
    assert (1, False) not in values and (64, False) not in values
    baseline_kernel = (repo / "kernel.py").read_bytes()
    assert all(p.files["kernel.py"] != baseline_kernel for p in proposals)
    assert all("CHUNK_ROWS=1, INPLACE=False" not in p.description for p in proposals)


def test_tuner_compares_file_contents_not_only_recorded_params(tmp_path):
    """A candidate recorded under other knobs (the config grew a knob) is still the same
    experiment as a proposal that produces the same bytes."""
    from ratchet.core.candidate import Candidate

    repo, config, git = _kernel_repo(tmp_path)
    base = git(repo, "rev-parse", "HEAD")
    older = _commit_knobs(repo, git, base, CHUNK_ROWS=16)
    submitted = _commit_knobs(repo, git, base, CHUNK_ROWS=256, INPLACE=True)
    history = [
        Candidate(id="c0000", seq=0, round=1, status="keep", kind="baseline",
                  commit_sha=base, parent=base, metric=50.0),
        # params recorded when only CHUNK_ROWS was a knob
        Candidate(id="c0001", seq=1, round=1, status="discard", commit_sha=older,
                  parent=base, params={"kernel.py:CHUNK_ROWS": 16}, metric=60.0),
        # `ratchet submit`: a commit with no params at all
        Candidate(id="c0002", seq=2, round=2, status="discard", commit_sha=submitted,
                  parent=base, metric=55.0),
    ]
    proposals = _tune(repo, config, base, history, k=12)
    values = [_values(p) for p in proposals]
    assert len(values) == len(set(values)) == 9
    for repeat in [(1, False), (16, False), (256, True)]:
        assert repeat not in values
    from ratchet.job import gitrepo
    earlier = {gitrepo.show(repo, c.commit_sha, "kernel.py") for c in history}
    assert not earlier & {p.files["kernel.py"] for p in proposals}


def test_tune_without_knobs_is_a_proposer_error_not_a_config_error():
    from helpers import config_text

    from ratchet.driver.config import loads_config
    from ratchet.proposers import ProposerError
    from ratchet.proposers.tune import TuneProposer

    config = loads_config(config_text(knobs="").encode())  # valid: submit/wait need no knobs
    with pytest.raises(ProposerError, match=r"needs at least one \[tune.knobs\] entry"):
        TuneProposer(config, [])
