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

and declare it as an entry point of its package (docs/backends.md, "Writing a plug-in"):

    [project.entry-points."ratchet.backends"]
    mine = "my_package.queue:MyBackend"

`[backend] kind`'s accepted values, the check of `[backend.<name>]` tables and the CLI's
`--backend` help all come from here. The built-in backends are entry points of ratchet
itself, loaded by the same loader (ratchet.core.plugins) as any other package's; a module is
imported only when `backends()` is asked (the config's check of `[backend] kind` and
the CLI's help need only names), and one that fails to load is left out with a warning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ratchet.backends.base import Backend, BackendError
from ratchet.core import plugins
from ratchet.core.config import ConfigError, SectionError, section
from ratchet.core.vocab import JobState

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ratchet.core.config import Backend as BackendSection

__all__ = ["Backend", "BackendError", "BackendPlugin", "JobState", "backends", "make_backend",
           "names", "register_backend"]

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
    """Every backend by name, each entry point loaded (the built-in ones first); one that
    fails to load is left out, warned once."""
    points = plugins.entry_points(plugins.Group.BACKENDS)
    for name in points:
        plugins.load(plugins.Group.BACKENDS, name, _registered)
    order = list(points)

    def place(plugin: BackendPlugin) -> int:  # entry points first, in their order
        return order.index(plugin.name) if plugin.name in order else len(order)

    return {p.name: p for p in sorted(_REGISTRY.values(), key=place)}


def _registered(name: str, found: object) -> tuple[str, str] | None:
    """What a backend's entry point must name: the class (or factory function) that
    `register_backend` registered under the entry point's name."""
    plugin = _REGISTRY.get(name)
    if plugin is not None and plugin.factory is found:
        return None
    what = getattr(found, "__qualname__", type(found).__name__)
    if isinstance(found, type) and not issubclass(found, Backend):
        return (f"{what} is not a subclass of ratchet.backends.Backend",
                "extend Backend (docs/backends.md, \"Writing a plug-in\")")
    return (f"{what} is not registered as backend {name!r}",
            f"decorate it with @register_backend({name!r}, settings=..., summary=...)")


def names() -> list[str]:
    """Every backend's name, without importing any (the entry points' names)."""
    return list(dict.fromkeys([*plugins.entry_points(plugins.Group.BACKENDS), *_REGISTRY]))


def names_help() -> str:
    """`local | ray | shell` for the CLI's help text (and any plug-in's)."""
    return " | ".join(names())


def make_backend(kind: str, state_dir: Path, backend: BackendSection) -> Backend:
    """The backend `kind` with its typed settings (`[backend.<kind>]`, validated when the
    config was loaded, or its defaults)."""
    plugin = backends().get(kind)
    if plugin is None:
        broken = plugins.failure(plugins.Group.BACKENDS, kind)
        raise ConfigError(broken or f"backend {kind!r} is not known "
                                    f"(expected {' | '.join(backends())})")
    settings: Any = backend.engines.get(kind)
    if settings is None:  # no `[backend.<kind>]` table: its model's defaults
        try:
            settings = section(plugin.settings, {}, f"backend.{kind}")
        except SectionError as exc:  # the model has required keys
            raise ConfigError(f"{exc} (add a [backend.{kind}] table)") from None
    return plugin.factory(state_dir, settings, backend)
