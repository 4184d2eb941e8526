"""Opening the study of a repository as every front does (the CLI's commands, the MCP
server): the repository checked, the config the study runs with (pinned at its start, else
committed in HEAD), the budget as ratchet.toml says it now."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ratchet.core.config import CONFIG_FILE, Config
from ratchet.core.errors import UserError
from ratchet.driver import budget as budgets
from ratchet.driver.config import load_config
from ratchet.driver.study import Study
from ratchet.job import gitrepo


def open_study(repo: Path, **kwargs: Any) -> Study:
    """The study of REPO as every command opens it; use it as `with open_study(repo) as
    study:` (closed on the way out, however the command ends). A user error propagates:
    one line. `log` (default: stderr) hears what it says about the config."""
    repo = repo.resolve()
    if not repo.is_dir():
        raise UserError(f"{repo}: no such directory (check --repo / -C)")
    top = gitrepo.work_tree(repo)
    if top is None:
        raise UserError(f"{repo}: not a git repository (run `git init` and commit your "
                        "files first)")
    if top != repo and (repo / CONFIG_FILE).is_file():
        # a study is the git repository whose root holds ratchet.toml; from inside another
        # repository, -C would quietly study that one instead
        raise UserError(f"{repo} has its own {CONFIG_FILE} but is inside the git repository "
                        f"{top}; a study needs ratchet.toml at a repository's root: copy the "
                        "directory out and `git init` it there (the bundled examples: "
                        "scripts/run_example.sh NAME)")
    on_disk = load_config(top)  # the file as it is: a broken one stops us, even uncommitted
    config, source = _study_config(top, on_disk)
    log = kwargs.setdefault("log", lambda m: print(m, file=sys.stderr))
    if source and config.budget != on_disk.budget:
        # the budget limits the study, it is not part of what is measured: the file as it
        # is now is taken, so a higher limit resumes a study a limit stopped
        config = config.model_copy(update={"budget": on_disk.budget})
        limits = ", ".join(f"{k} {budgets.show(k, v)}" for k, v in on_disk.budget.limits.items())
        log(f"budget from ratchet.toml as it is now: {limits or 'no limits'}")
    if source and config != on_disk:
        log(f"warning: ratchet.toml has changes that are not in the study's config; "
            f"they are ignored: the study reads ratchet.toml as {source}")
    return Study(top, config, **kwargs)


def _study_config(top: Path, on_disk: Config) -> tuple[Config, str | None]:
    """The config a study runs with, and where it comes from: the one pinned when the study
    started, else the one committed in HEAD (where a new study starts). An uncommitted
    edit never takes effect: candidates are evaluated against committed files only."""
    from ratchet.driver.config import loads_config
    from ratchet.store.ledger import Ledger

    db = top / ".ratchet" / "ledger.db"
    if db.exists():
        ledger = Ledger(db)
        pinned, start = ledger.study().config, ledger.study().pinned
        ledger.close()
        if pinned:
            return (loads_config(pinned.encode(), f"{CONFIG_FILE} pinned at the study's start"),
                    f"committed in {str(start)[:7]}, where the study started")
    head = gitrepo.try_rev_parse(top, "HEAD")
    if head is None or not gitrepo.path_exists(top, head, CONFIG_FILE):
        return on_disk, None  # no commit or not committed: starting says what to do
    raw = gitrepo.show(top, head, CONFIG_FILE)
    return loads_config(raw, f"{CONFIG_FILE} in HEAD {head[:7]}"), f"committed in HEAD {head[:7]}"
