"""Security tests reuse the red-team task and its fixture, and the private Ray cluster."""

import sys
from pathlib import Path

from redteam.conftest import template  # noqa: F401  (a fixture)

# ray_cluster.py as tests/backends imports it: one module, so one session cluster
sys.path.insert(0, str(Path(__file__).parents[1] / "backends"))
