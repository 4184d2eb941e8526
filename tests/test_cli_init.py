"""`ratchet init` leaves a directory from which the printed next step works as printed
(issue 12, item 12)."""

from __future__ import annotations

from cli_shell import sh, user_env
from helpers import git, make_repo


def next_step(stdout: str) -> str:
    line = next(x for x in stdout.splitlines() if x.startswith("next: "))
    return line.removeprefix("next: ")


def test_init_in_a_plain_directory_sets_up_the_repository(tmp_path):
    env = user_env(tmp_path)
    work = tmp_path / "study"
    work.mkdir()
    (work / "notes.txt").write_text("mine, not the task's\n")
    proc = sh("ratchet init", cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "initialised an empty git repository" in proc.stdout
    assert (work / ".git").is_dir()
    step = next_step(proc.stdout)
    assert step.startswith("git add ") and "notes.txt" not in step
    ran = sh(step.replace("ratchet run", "ratchet run --rounds 1"), cwd=work, env=env)
    assert ran.returncode == 0, ran.stderr
    assert (work / "results.tsv").read_text().startswith("commit\tscore\t")
    assert git(work, "status", "--porcelain") == "?? notes.txt"  # left to its owner


def test_init_elsewhere_prints_a_step_that_works_from_here(tmp_path):
    env = user_env(tmp_path)
    proc = sh("ratchet init --template blank -C 'new study'", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    step = next_step(proc.stdout)
    assert step.startswith("cd ")
    ran = sh(step + " --rounds 1", cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "new study" / "results.tsv").exists()


def test_init_in_an_existing_repository_commits_only_the_task(tmp_path):
    env = user_env(tmp_path)
    repo = make_repo(tmp_path / "r", {"README": "a project\n"})
    (repo / "scratch.txt").write_text("not for the task\n")
    proc = sh("ratchet init", cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "initialised" not in proc.stdout
    ran = sh(next_step(proc.stdout) + " --rounds 1", cwd=repo, env=env)
    assert ran.returncode == 0, ran.stderr
    assert "scratch.txt" not in git(repo, "show", "--stat", "HEAD")


def test_init_inside_another_repository_is_refused(tmp_path):
    env = user_env(tmp_path)
    repo = make_repo(tmp_path / "r", {"README": "a project\n"})
    proc = sh("ratchet init -C sub", cwd=repo, env=env)
    assert proc.returncode == 2
    assert f"is inside the git repository {repo}" in proc.stderr
    assert "git init" in proc.stderr
    assert not (repo / "sub").exists()
