"""`ratchet ...` with `search.mode = "rolling"` (and `search.candidates` from
RATCHET_TEST_CANDIDATES), for the reliability tests of rolling search.

The reliability tests share repositories built for rounds; this runs the same CLI code
path with the study's config switched to rolling, so each test need not rewrite and
re-commit its ratchet.toml. tests/test_loop.py::test_rolling_mode_from_the_config runs
rolling from a committed ratchet.toml through the plain CLI.
"""

from __future__ import annotations

import os

from ratchet import cli
from ratchet.driver import opening
from ratchet.driver.study import Study


class RollingStudy(Study):
    def __init__(self, repo, config=None, **kwargs) -> None:
        if config is not None:
            config = config.model_copy(update={"search": config.search.model_copy(
                update={"mode": "rolling"})})
        super().__init__(repo, config, **kwargs)

    def run(self, rounds: int | None = None, candidates: int | None = None) -> None:
        budget = os.environ.get("RATCHET_TEST_CANDIDATES")
        super().run(rounds, candidates or (int(budget) if budget else None))


opening.Study = RollingStudy  # type: ignore[misc]  # every front opens its study there

if __name__ == "__main__":
    cli.main()
