"""Fixtures shared by the red-team modules."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A temp base directory and the hold-out data only the hold-out evaluator may read."""
    base = tmp_path_factory.mktemp("redteam")
    holdout = base / "holdout-data"
    holdout.mkdir()
    (holdout / "holdout.json").write_text(json.dumps([[3, 4, 5], [-7, 11], [2] * 33]))
    return base, holdout
