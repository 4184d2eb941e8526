"""Run shell text as a user would type it: `ratchet` on PATH, plain git configuration.

`git init` here takes git's own default branch name, forced to `master` so nothing
silently depends on `main`; the identity is set only so commits work on any machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import ROOT


def user_env(tmp: Path) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "ratchet"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ratchet.cli "$@"\n')
    wrapper.chmod(0o755)
    gitconfig = tmp / "gitconfig"
    gitconfig.write_text("[init]\n\tdefaultBranch = master\n"
                         "[user]\n\tname = tour\n\temail = tour@example.invalid\n")
    # a user's shell: no git overrides, and none of the suite's own switches (conftest.py)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GIT_") and k != "RATCHET_PROGRESS_PNG"}
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
               PYTHONPATH=str(ROOT / "src"), GIT_CONFIG_GLOBAL=str(gitconfig),
               GIT_CONFIG_NOSYSTEM="1", COLUMNS="200")
    return env


def sh(script: str, cwd: Path, env: dict[str, str], timeout: float = 600
       ) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
