"""One loader for every kind of plug-in: backends and proposers, found by entry point.

After submitit's `plugins.py`: a package adds a backend or a proposer by declaring an
entry point, and ratchet's own built-ins are declared the same way in its
pyproject.toml:

    [project.entry-points."ratchet.backends"]
    myqueue = "my_package.queue:QueueBackend"

    [project.entry-points."ratchet.proposers"]
    mine = "my_package.proposer:MyProposer"

Names are read from the installed distributions' metadata without importing anything
(the config's check of `[backend] kind` and the CLI's `--help` need only names); a
plug-in's module is imported when it is first used. One that cannot be imported, or
names the wrong kind of object, is left out with a one-line warning naming its entry
point and the fix: a broken package beside ratchet never stops a study that does not
use it. Each kind's registry (backends/__init__.py, proposers/__init__.py) says what a
loaded object must be.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

DISTRIBUTION = "ratchet"


class Group(StrEnum):
    """The entry-point groups, one per kind of plug-in."""

    BACKENDS = "ratchet.backends"
    PROPOSERS = "ratchet.proposers"

    @property
    def kind(self) -> str:
        return "backend" if self is Group.BACKENDS else "proposer"


# ratchet's own entry points, exactly as pyproject.toml declares them (a test holds the
# two equal). Read from here only where the installed metadata of ratchet lacks them: an
# editable install made before they were declared keeps working until it is reinstalled.
BUILT_IN: dict[Group, dict[str, str]] = {
    Group.BACKENDS: {
        "local": "ratchet.backends.local:LocalBackend",
        "ray": "ratchet.backends.ray:ray_backend",
        "shell": "ratchet.backends.shell:ShellBackend",
    },
    Group.PROPOSERS: {
        "tune": "ratchet.proposers.tune:TuneProposer",
        "llm": "ratchet.proposers.llm:LLMProposer",
        "agent": "ratchet.proposers.agent:AgentProposer",
        "patches": "ratchet.proposers.patches:PatchesProposer",
    },
}


@dataclass(frozen=True)
class EntryPoint:
    name: str  # the plug-in's name: `[backend] kind`, `search.proposer`
    value: str  # "module:attribute"
    package: str  # the distribution that declares it
    declared: bool  # read from installed metadata (False: ratchet's fallback table)

    def load(self) -> Any:
        module, _, attribute = self.value.partition(":")
        found: Any = importlib.import_module(module)
        for part in filter(None, attribute.split(".")):
            found = getattr(found, part)
        return found

    def __str__(self) -> str:
        return f"{self.name} = {self.value!r} in package {self.package}"


@functools.cache
def entry_points(group: Group) -> dict[str, EntryPoint]:
    """Every plug-in of `group` by name: ratchet's own first, then other packages'.

    An outside package that declares a built-in's name is ignored with a warning (the
    built-in keeps the name); two outside packages declaring one name: the first found
    on the path wins, as Python's own import does."""
    found = {name: EntryPoint(name, value, DISTRIBUTION, declared=False)
             for name, value in BUILT_IN[group].items()}
    for point in _declared().select(group=group.value):
        package = point.dist.name if point.dist is not None else "?"
        here = EntryPoint(point.name, point.value, package, declared=True)
        if package == DISTRIBUTION:
            found[point.name] = here
        elif point.name in BUILT_IN[group]:
            warn(f"{group.kind} {here} is ignored: {point.name!r} is ratchet's built-in "
                 f"{group.kind}; fix: rename the entry point in {package}")
        else:
            found.setdefault(point.name, here)
    return found


@functools.cache
def _declared() -> Any:
    """Every installed distribution's entry points, read once (one pass over the path's
    metadata for both groups); imported here, not at the top: the job side imports the
    backends package and never reads them."""
    from importlib import metadata

    return metadata.entry_points()


@functools.cache
def load(group: Group, name: str, check: Callable[[str, Any], tuple[str, str] | None]) -> Any:
    """The object entry point `name` of `group` names, imported once; None (warned, in
    one line) when it cannot be imported or `check(name, obj)` gives (problem, fix)."""
    point = entry_points(group).get(name)
    if point is None:
        return None
    try:
        found = point.load()
    except Exception as exc:  # whatever a broken package raises: its failure, not ours
        cause = str(exc).splitlines()[0] if str(exc) else ""
        _failed(group, point, f"cannot be imported ({type(exc).__name__}: {cause})",
                f"install what it needs, or uninstall {point.package}")
        return None
    wrong = check(name, found)
    if wrong is not None:
        _failed(group, point, *wrong)
        return None
    return found


_FAILURES: dict[tuple[Group, str], str] = {}


def failure(group: Group, name: str) -> str | None:
    """Why plug-in `name` was left out (the warning's text), if it was."""
    return _FAILURES.get((group, name))


def _failed(group: Group, point: EntryPoint, problem: str, fix: str) -> None:
    line = f"{group.kind} plug-in {point} is left out: {problem}; fix: {fix}"
    _FAILURES[(group, point.name)] = line
    warn(line)


def warn(line: str) -> None:
    """One line on stderr: the CLI's own warnings read the same way."""
    print(f"warning: {line}", file=sys.stderr, flush=True)
