"""The example docs work as written: the commands at the top of examples/configs/*.toml,
and the kernel-cpu README's steps, run literally (in a scratch directory instead of
/tmp/k) and leave a study that `ratchet` opens. And `-C` into a directory with its own
ratchet.toml inside another repository is refused in one line instead of studying that
other repository."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import GIT_ENV, ROOT, make_repo, ratchet

CONFIGS = ["llm", "agent", "patches"]


def _documented(path: Path) -> list[str]:
    """The indented command lines of a config's header comment."""
    commands = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("#   "):
            commands.append(line[4:].split("   #")[0].strip())
    return commands


def _shell(commands: list[str], scratch: Path) -> subprocess.CompletedProcess:
    script = "set -e\n" + "\n".join(c.replace("/tmp/k", str(scratch)) for c in commands)
    env = {**os.environ, **GIT_ENV, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("name", CONFIGS)
def test_a_config_headers_commands_make_a_study_ratchet_opens(tmp_path, name):
    commands = _documented(ROOT / "examples" / "configs" / f"{name}.toml")
    assert commands and commands[-1] == "ratchet run", commands
    # everything but the study itself (it needs an API key or an agent CLI), then a
    # command that opens the study the way `ratchet run` does
    setup = [c for c in commands[:-1] if not c.startswith("export ")]
    scratch = tmp_path / "k"
    done = _shell([*setup, "ratchet status"], scratch)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not started (run `ratchet run`)" in done.stdout, done.stdout


def test_the_kernel_cpu_readme_diff_names_the_branch_the_repository_has(tmp_path):
    readme = (ROOT / "examples" / "kernel-cpu" / "README.md").read_text()
    diff = next(line for line in readme.splitlines() if line.startswith("git diff "))
    scratch = tmp_path / "k"
    # a repository whose first branch is `master` (git's default without init.defaultBranch)
    steps = [f"cp -r examples/kernel-cpu {scratch}", f"cd {scratch}",
             "git -c init.defaultBranch=master init -q", "git add -A",
             "git commit -qm task", "git branch ratchet/softmax-cpu",
             diff.split("#")[0].strip()]
    done = _shell(steps, scratch)
    assert done.returncode == 0, done.stderr


def test_minus_c_into_a_study_inside_another_repository_is_one_line(tmp_path):
    outer = make_repo(tmp_path / "outer", {"README": "outer\n"})
    inner = outer / "examples" / "task"
    inner.mkdir(parents=True)
    (inner / "ratchet.toml").write_text((ROOT / "examples" / "configs" / "llm.toml").read_text())
    proc = ratchet(inner, "status")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"is inside the git repository {outer}" in lines[0]
    assert "git init" in lines[0]


@pytest.mark.parametrize("name", CONFIGS)
def test_a_config_runs_the_examples_evaluator_as_the_example_does(name):
    """examples/configs/*.toml run the kernel-cpu example's evaluator: with `python -P`,
    as its own ratchet.toml does (docs/evaluator-imports.md), never importable from the
    candidate's tree."""
    import tomllib

    example = tomllib.loads((ROOT / "examples" / "kernel-cpu" / "ratchet.toml").read_text())
    config = tomllib.loads((ROOT / "examples" / "configs" / f"{name}.toml").read_text())
    for command in ("evaluate", "holdout"):
        assert config["task"][command] == example["task"][command], (name, command)
        assert config["task"][command].startswith("python -P "), (name, command)
