"""Backends place jobs and hand back ids; they know nothing about metrics.

The same verbs for every place a job can run (after submitit / Ray's job SDK):
`submit(spec) -> id`, `status(id)`, `result(id)`, `logs(id)`, `cancel(id)`.

One registry of backends (after submitit's `plugins.get_executors()`): a name, the class
(or a function choosing one) and the pydantic model of its `[backend.<name>]` table.
A new engine is one class extending `Backend` (backends/base.py) and its settings model:

    class MySettings(BaseModel):
        queue: str = "default"

    @register_backend("mine", settings=MySettings, summary="my cluster's queue")
    class MyBackend(Backend):
        def __init__(self, state_dir: Path, settings: MySettings, backend: config.Backend): ...

`[backend] kind`'s accepted values, the check of `[backend.<name>]` tables and the CLI's
`--backend` help all come from here. The built-in backends register themselves when
their modules are imported; `backends()` imports them (and only then: the job side
imports this package for `remote` and must stay light).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ratchet.backends.base import Backend, BackendError
from ratchet.vocab import JobState

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ratchet.driver.config import Backend as BackendSection

__all__ = ["Backend", "BackendError", "BackendPlugin", "JobState", "backends", "make_backend",
           "register_backend"]

# imported by `backends()`: each registers itself with `register_backend` under its
# name, known here too so the config and the CLI's help need not import them (psutil,
# the engines' settings models: a tenth of a second of every `ratchet status`)
BUILT_IN_NAMES = {"local": "ratchet.backends.local", "ray": "ratchet.backends.ray",
                  "shell": "ratchet.backends.shell"}
BUILT_IN = tuple(BUILT_IN_NAMES.values())

F = TypeVar("F", bound=Callable[..., Backend])


@dataclass(frozen=True)
class BackendPlugin:
    name: str
    # a Backend subclass, or a function choosing one (ray: actors or jobs); either is
    # called as factory(state_dir, settings, backend_section)
    factory: Callable[..., Backend]
    settings: type[BaseModel]  # the model of the `[backend.<name>]` table
    summary: str  # one line, for `--help`


_REGISTRY: dict[str, BackendPlugin] = {}


def register_backend(name: str, *, settings: type[BaseModel], summary: str) -> Callable[[F], F]:
    """Register a backend class (or factory) under `name` with its settings model."""

    def add(factory: F) -> F:
        known = _REGISTRY.get(name)
        if known is not None and known.factory.__qualname__ != factory.__qualname__:
            raise ValueError(f"backend {name!r} is registered twice "
                             f"({known.factory.__qualname__} and {factory.__qualname__})")
        _REGISTRY[name] = BackendPlugin(name, factory, settings, summary)
        return factory

    return add


def backends() -> dict[str, BackendPlugin]:
    """Every registered backend by name (the built-in ones first)."""
    for module in BUILT_IN:
        importlib.import_module(module)

    def order(plugin: BackendPlugin) -> int:  # the built-in ones in BUILT_IN's order
        module = plugin.factory.__module__
        return BUILT_IN.index(module) if module in BUILT_IN else len(BUILT_IN)

    return {p.name: p for p in sorted(_REGISTRY.values(), key=order)}


def names_help() -> str:
    """`local | ray | shell` for the CLI's help text (and any registered since)."""
    return " | ".join(dict.fromkeys([*BUILT_IN_NAMES, *_REGISTRY]))


def make_backend(kind: str, state_dir: Path, backend: BackendSection) -> Backend:
    """The backend `kind` with its typed settings (`[backend.<kind>]`, validated when the
    config was loaded, or its defaults)."""
    plugin = backends().get(kind)
    if plugin is None:
        from ratchet.driver.config import ConfigError

        raise ConfigError(f"backend {kind!r} is not known (expected {' | '.join(backends())})")
    settings: Any = backend.settings(kind)
    return plugin.factory(state_dir, settings, backend)
