"""Security tests reuse the red-team task and its fixture."""

from redteam.conftest import template  # noqa: F401  (a fixture)
