"""Starting a study over without losing the old one: `ratchet reset`, and a committed
ratchet.toml change taken while no candidate is judged. Real git repos, the real CLI."""

from __future__ import annotations

import fcntl
import subprocess
import sys

from helpers import config_text, git, make_repo, ratchet, score_repo

from ratchet.store.ledger import Ledger


def refs(repo, prefix: str) -> dict[str, str]:
    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname)", prefix)
    return dict(line.split(" ") for line in out.splitlines())


def test_reset_archives_the_study_and_the_next_run_starts_fresh(tmp_path):
    repo = score_repo(tmp_path / "r", search='[search]\nproposer = "tune"\nparallel = 2\n'
                                             'rounds = 1\n')
    first = ratchet(repo, "run")
    assert first.returncode == 0, first.stderr
    old_refs = refs(repo, "refs/ratchet/demo/")
    old_branch = git(repo, "rev-parse", "refs/heads/ratchet/demo")
    assert old_refs  # the candidates' refs
    old_ledger = Ledger(repo / ".ratchet" / "ledger.db")
    old_ids = [c.id for c in old_ledger.candidates()]
    old_ledger.close()

    proc = ratchet(repo, "reset")
    assert proc.returncode == 0, proc.stderr
    archives = list((repo / ".ratchet" / "archive").iterdir())
    assert len(archives) == 1 and archives[0].name.startswith("demo-")
    name = archives[0].name
    assert f"archived the study as {archives[0]}" in proc.stdout
    assert f"refs/ratchet-archive/{name}/" in proc.stdout
    assert "the next `ratchet run` starts a fresh study" in proc.stdout
    # nothing lost: the old ledger, its job directories, results.tsv and every ref
    archived = Ledger(archives[0] / "ledger.db")
    assert [c.id for c in archived.candidates()] == old_ids
    archived.close()
    assert (archives[0] / "jobs").is_dir() and (archives[0] / "results.tsv").is_file()
    moved = refs(repo, f"refs/ratchet-archive/{name}/")
    assert moved[f"refs/ratchet-archive/{name}/branch"] == old_branch
    assert sorted(moved.values()) == sorted([*old_refs.values(), old_branch])
    assert refs(repo, "refs/ratchet/demo/") == {}
    assert git(repo, "branch", "--list", "ratchet/demo") == ""
    assert not (repo / ".ratchet" / "ledger.db").exists() and not (repo / "results.tsv").exists()

    again = ratchet(repo, "reset")
    assert again.returncode == 2
    assert "no study to reset" in again.stderr and "Traceback" not in again.stderr

    fresh = ratchet(repo, "run")
    assert fresh.returncode == 0, fresh.stderr
    status = ratchet(repo, "log")
    assert status.returncode == 0, status.stderr
    # the new study has its own baseline and candidates, from c0001 again
    new_ledger = Ledger(repo / ".ratchet" / "ledger.db")
    assert [c.id for c in new_ledger.candidates()] == old_ids
    assert new_ledger.get("created") > archived_created(archives[0])
    new_ledger.close()
    # the archive is untouched by the new study
    assert refs(repo, f"refs/ratchet-archive/{name}/") == moved

    # a second reset never overwrites the first archive
    second = ratchet(repo, "reset")
    assert second.returncode == 0, second.stderr
    names = sorted(p.name for p in (repo / ".ratchet" / "archive").iterdir())
    assert len(names) == 2 and name in names
    assert refs(repo, f"refs/ratchet-archive/{name}/") == moved


def archived_created(directory) -> float:
    ledger = Ledger(directory / "ledger.db")
    try:
        return ledger.get("created")
    finally:
        ledger.close()


def test_reset_is_refused_while_a_driver_holds_the_study(tmp_path):
    repo = score_repo(tmp_path / "r", search='[search]\nproposer = "tune"\nparallel = 2\n'
                                             'rounds = 1\n')
    assert ratchet(repo, "run").returncode == 0
    # a real second process holds the study's flock, as a running driver does
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl,sys,time\n"
         f"f=open({str(repo / '.ratchet' / 'lock')!r},'a+')\n"
         "fcntl.flock(f, fcntl.LOCK_EX)\nf.write('pid 4242 in a test\\n'); f.flush()\n"
         "print('held', flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = ratchet(repo, "reset")
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2
    assert "study is locked by" in proc.stderr and "Traceback" not in proc.stderr
    assert (repo / ".ratchet" / "ledger.db").exists()
    assert not (repo / ".ratchet" / "archive").exists()
    assert git(repo, "branch", "--list", "ratchet/demo").strip() == "ratchet/demo"
    # released, the lock is free again for a reset
    with open(repo / ".ratchet" / "lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)


FAILING_EVALUATOR = '''
import sys
import solution
if "--broken" in sys.argv:
    sys.exit("evaluate.py: called with --broken")
print("correct: true")
print(f"score: {solution.score():.6f}")
'''


def broken_repo(path):
    task = config_text().split("[task.metric]")[0]  # the [task] section alone
    return make_repo(path, {
        "ratchet.toml": config_text(
            task=task.replace('evaluate = "python evaluate.py"',
                              'evaluate = "python evaluate.py --broken"'),
            metric='[task.metric]\nname = "score"\ngoal = "minimize"\n'),
        "evaluate.py": FAILING_EVALUATOR,
        "solution.py": "X = 3.0\n\ndef score():\n    return (X - 1.25) ** 2\n",
    })


def test_a_config_fixed_before_any_candidate_is_judged_starts_the_study_over(tmp_path):
    repo = broken_repo(tmp_path / "r")
    first = ratchet(repo, "run")
    assert first.returncode == 2
    # the baseline failed: the error says how to start over, and no longer `rm -rf`
    assert "the baseline" in first.stderr and "ratchet reset" in first.stderr
    assert "rm -rf" not in first.stderr
    started = git(repo, "rev-parse", "HEAD")

    toml = repo / "ratchet.toml"
    toml.write_text(toml.read_text().replace(" --broken", ""))
    git(repo, "commit", "-qam", "evaluate without --broken")
    fixed = git(repo, "rev-parse", "HEAD")
    proc = ratchet(repo, "run", "--rounds", "1")
    assert proc.returncode == 0, proc.stderr
    assert (f"ratchet.toml changed in HEAD {fixed[:7]} since the study started at "
            f"{started[:7]} and no candidate was judged against a baseline yet: the study "
            "starts over with it"
            in proc.stderr)
    assert "they are ignored" not in proc.stderr
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    assert ledger.get("pinned") == fixed
    baseline = [c for c in ledger.candidates() if c.kind == "baseline"]
    assert baseline and baseline[0].status == "keep" and baseline[0].metric is not None
    ledger.close()
    archive = next((repo / ".ratchet" / "archive").iterdir())
    old = Ledger(archive / "ledger.db")
    assert old.get("pinned") == started  # the failed start is kept, not lost
    old.close()

    # once a candidate is judged, the pinned config stays: an edit is ignored, as before
    toml.write_text(toml.read_text().replace("parallel = 2", "parallel = 3"))
    git(repo, "commit", "-qam", "three at a time")
    later = ratchet(repo, "run", "--rounds", "2")
    assert later.returncode == 0, later.stderr
    assert "starts over" not in later.stderr
    assert "they are ignored" in later.stderr
    assert len(list((repo / ".ratchet" / "archive").iterdir())) == 1
