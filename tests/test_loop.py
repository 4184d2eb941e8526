"""The keep-or-revert loop end to end, on real git repos and real worker processes."""

import json

from helpers import config_text, git, make_repo, ratchet, results_tsv, score_repo

from ratchet.store.ledger import Ledger


def ledger(repo):
    return Ledger(repo / ".ratchet" / "ledger.db")


def test_study_keeps_only_improvements_and_refs_every_candidate(tmp_path):
    repo = score_repo(tmp_path / "r")
    user_head = git(repo, "rev-parse", "HEAD")
    proc = ratchet(repo, "run", env={"RATCHET_PROGRESS_PNG": "0"})
    assert proc.returncode == 0, proc.stderr
    # asked not to (a CI run's switch): no chart drawn, none said to be written
    assert not (repo / "progress.png").exists() and "progress.png" not in proc.stderr

    db = ledger(repo)
    cands = db.candidates()
    baseline = cands[0]
    assert baseline.kind == "baseline" and baseline.status == "keep"
    assert baseline.metric == (3.0 - 1.25) ** 2
    # 3 rounds x K=2, the first slot of round 1 being the baseline
    assert len(cands) == 6
    assert [c.round for c in cands] == [1, 1, 2, 2, 3, 3]

    # every proposed candidate has a ref pointing at its commit, kept or not
    for cand in cands[1:]:
        assert git(repo, "rev-parse", f"refs/ratchet/demo/{cand.id}") == cand.commit_sha
        assert git(repo, "rev-parse", f"{cand.commit_sha}^") == cand.parent

    # a keep is strictly better than the incumbent it replaced; the branch ends on the best
    incumbent = baseline.metric
    for cand in cands[1:]:
        if cand.status == "keep":
            assert cand.metric < incumbent
            incumbent = cand.metric
        else:
            assert cand.status == "discard"
            assert cand.metric >= incumbent or "beaten by" in (cand.reasons or "")
    branch_head = git(repo, "rev-parse", "ratchet/demo")
    kept = [c for c in cands if c.status == "keep"]
    assert branch_head == kept[-1].commit_sha
    assert db.get("incumbent_metric") == min(c.metric for c in cands)

    # the user's own checkout is untouched and `git status` stays clean
    assert git(repo, "rev-parse", "HEAD") == user_head
    assert git(repo, "status", "--porcelain") == ""

    rows = results_tsv(repo)
    assert [r["status"] for r in rows] == [c.status for c in cands]
    assert rows[0]["commit"] == baseline.commit_sha[:7]
    # duty cycle and the limit, from the ledger, in `ratchet status`
    status = json.loads(ratchet(repo, "status", "--json").stdout)
    assert 0 < status["duty_cycle"] <= 1 and status["limit_per_hour"] > 0
    assert "duty" in ratchet(repo, "status").stdout
    assert list(rows[0]) == ["commit", "score", "memory_gb", "status", "description",
                             "tokens", "cost_usd", "proposer_usd", "compute_usd", "evals",
                             "ci95_low", "ci95_high"]


def test_crashing_candidate_is_recorded_as_crash(tmp_path):
    knobs = '[tune.knobs]\n"solution.py:X" = { choices = ["boom", 2.0] }\n'
    repo = score_repo(tmp_path / "r", knobs=knobs,
                      search='[search]\nparallel = 3\nrounds = 1\n')
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    by_desc = {c.description: c for c in ledger(repo).candidates()}
    crashed = by_desc["tune: X='boom'"]
    assert crashed.status == "crash"
    assert crashed.failed_stage == "evaluate"
    assert "exit code 1" in crashed.reasons and "TypeError" in crashed.reasons
    assert by_desc["tune: X=2.0"].status == "keep"
    logs = ratchet(repo, "logs", crashed.id)
    assert "TypeError" in logs.stdout


def test_min_improvement_blocks_small_gains(tmp_path):
    knobs = '[tune.knobs]\n"solution.py:X" = { choices = [2.95] }\n'
    repo = score_repo(tmp_path / "r", knobs=knobs,
                      search='[search]\nparallel = 2\nrounds = 1\n'
                      '[acceptance]\nmin_improvement = "10%"\n')
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    cand = ledger(repo).candidates()[1]
    assert cand.metric < ledger(repo).candidates()[0].metric  # it is better...
    assert cand.status == "discard"  # ...but not by 10%
    assert "min_improvement" in cand.reasons
    assert git(repo, "rev-parse", "ratchet/demo") == git(repo, "rev-parse", "main")


def test_out_of_scope_edit_is_rejected_before_it_runs(tmp_path):
    repo = score_repo(tmp_path / "r")
    git(repo, "checkout", "-q", "-b", "cheat")
    (repo / "evaluate.py").write_text('print("score: 0")\n')
    (repo / "notes.txt").write_text("hi\n")
    git(repo, "commit", "-qam", "edit evaluator")
    git(repo, "add", "notes.txt")
    git(repo, "commit", "-qm", "add notes")
    git(repo, "checkout", "-q", "main")
    proc = ratchet(repo, "submit", "cheat")
    assert proc.returncode == 0, proc.stderr
    cand_id = proc.stdout.strip().splitlines()[-1]
    cand = ledger(repo).candidate(cand_id)
    assert cand.status == "rejected"
    assert "touches protected path evaluate.py" in cand.reasons
    assert "notes.txt, which is not in task.editable" in cand.reasons
    assert cand.job_id is None  # never ran
    assert git(repo, "rev-parse", f"refs/ratchet/demo/{cand_id}") == git(repo, "rev-parse", "cheat")


def test_submit_and_wait_promote_the_best(tmp_path):
    repo = score_repo(tmp_path / "r")
    ids = []
    for x in ("2.0", "1.0", "9.0"):
        git(repo, "checkout", "-q", "-B", f"try-{x}", "main")
        text = (repo / "solution.py").read_text().replace("X = 3.0", f"X = {x}")
        (repo / "solution.py").write_text(text)
        git(repo, "commit", "-qam", f"X={x}")
        proc = ratchet(repo, "submit", f"try-{x}")
        assert proc.returncode == 0, proc.stderr
        ids.append(proc.stdout.strip().splitlines()[-1])
    git(repo, "checkout", "-q", "main")
    proc = ratchet(repo, "wait", *ids, "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert [line["id"] for line in lines] == ids
    status = {line["commit"]: line["status"] for line in lines}
    winner = git(repo, "rev-parse", "try-1.0")
    assert status[winner] == "keep"
    assert status[git(repo, "rev-parse", "try-2.0")] == "discard"
    assert status[git(repo, "rev-parse", "try-9.0")] == "discard"
    assert all({"id", "commit", "status", "metric"} <= set(line) for line in lines)
    assert git(repo, "rev-parse", "ratchet/demo") == winner


def test_init_templates_run(tmp_path):
    repo = tmp_path / "blank"
    repo.mkdir()
    proc = ratchet(repo, "init", "--template", "blank")
    assert proc.returncode == 0, proc.stderr
    make_repo(repo, {})
    proc = ratchet(repo, "run", "--rounds", "2")
    assert proc.returncode == 0, proc.stderr
    assert (repo / "program.md").exists()
    rows = results_tsv(repo)
    assert rows[0]["status"] == "keep" and len(rows) == 4
    again = ratchet(repo, "init", "--template", "blank")
    assert again.returncode == 2 and "exists" in again.stderr


def test_templates_match_the_examples():
    """`ratchet init --template kernel|train` writes exactly the bundled examples."""
    from helpers import ROOT

    from ratchet.templates import template_files

    for template, example in (("kernel", "kernel-cpu"), ("train", "tinygpt")):
        files = template_files(template)
        for rel, content in files.items():
            if rel in ("program.md",) and template == "kernel":
                continue
            assert (ROOT / "examples" / example / rel).read_bytes() == content, (template, rel)


def test_jobs_share_the_study_compile_caches(tmp_path):
    """The candidate's phases compile into the study's caches under .ratchet/cache/; the
    trusted evaluator into a private one (never an artefact a candidate wrote)."""
    probe = ("import os\n"
             "names = ('TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR', 'NUMBA_CACHE_DIR')\n"
             "open('cache.txt', 'w').write(' '.join(os.environ.get(n, '') for n in names))\n")
    evaluator = ("import os, solution\n"
                 "root = os.path.realpath(os.path.join(os.environ['RATCHET_WORKDIR'],"
                 " *['..'] * 4, '.ratchet', 'cache'))\n"
                 "seen = open('cache.txt').read().split()\n"
                 "shared = len(seen) == 3 and all(os.path.realpath(os.path.dirname(p)) == root"
                 " for p in seen)\n"
                 "own = os.environ.get('TRITON_CACHE_DIR', '')\n"
                 "private = bool(own) and not os.path.realpath(own).startswith(root)\n"
                 "print(f'cache_shared: {int(shared)}')\n"
                 "print(f'cache_private: {int(private)}')\n"
                 "print(f'score: {solution.score()}')\n")
    task = config_text().split("[task.metric]")[0].replace(
        'evaluate = "python evaluate.py"', 'evaluate = "python evaluate.py"\nrun = "python probe.py"')
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(task=task, search='[search]\nparallel = 2\nrounds = 1\n'),
        "evaluate.py": evaluator,
        "probe.py": probe,
        "solution.py": "X = 3.0\n\ndef score():\n    return (X - 1.25) ** 2\n",
    })
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    cands = ledger(repo).candidates()
    assert cands and all(c.extra.get("cache_shared") == 1 for c in cands), \
        [(c.extra, c.reasons) for c in cands]
    assert all(c.extra.get("cache_private") == 1 for c in cands)
    assert (repo / ".ratchet" / "cache" / "triton").is_dir()


def test_rolling_mode_from_the_config(tmp_path):
    """`mode = "rolling"` with a budget of candidates, from a committed ratchet.toml."""
    search = '[search]\nproposer = "tune"\nparallel = 2\nmode = "rolling"\ncandidates = 5\n'
    repo = score_repo(tmp_path / "r", search=search)
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    cands = ledger(repo).candidates()
    assert cands[0].kind == "baseline"
    # the budget counts candidates that ran; the baseline is measured on top of it, and
    # a proposal that could not run (a repeat of tried settings) is recorded, with why,
    # on top too
    ran = [c for c in cands if c.kind == "candidate" and c.job_id is not None]
    assert len(ran) == 5, [(c.id, c.kind, c.status, c.reasons) for c in cands]
    unrun = [c for c in cands if c.kind == "candidate" and c.job_id is None]
    assert all(c.status == "rejected" and c.reasons for c in unrun), \
        [(c.id, c.status, c.reasons) for c in unrun]
    # each keep beat the incumbent it started from, which the ledger records as its parent
    best = cands[0].metric
    for cand in cands[1:]:
        if cand.status == "keep":
            assert cand.metric < best
            best = cand.metric
    assert ledger(repo).candidate(
        [c for c in cands if c.status == "keep"][-1].id).commit_sha == git(
        repo, "rev-parse", "ratchet/demo")
