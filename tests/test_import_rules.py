"""Who may import what, as the trust zones need it (checked by loading, not by reading):

- the job side (what a job's machine loads to run a job: the worker, the node half of
  the remote entry point, the Ray slot actor, the sandbox's warden) loads only the
  standard library and the job side's own modules;
- the evaluator SDK (what an evaluator imports: the metric channel, isolate, the kernel
  harness) never loads a driver module (study, scheduler, judge, ledger, config,
  proposers, backends' driver halves, ...).

Each is checked in a fresh interpreter, so a module-level import anywhere down the chain
(a package `__init__` included) counts.

And, read from the source (every import, a function's included; only those under
`if TYPE_CHECKING:` left out, as they never run): no import crosses a wing upward, the
plug-ins (backends, proposers) never import the driver, nothing but the fronts imports the
views (ratchet/ui), the import graph of src/ratchet
has no cycle, and ratchet/core imports nothing but the standard library, pydantic and
itself.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

# the core modules of the standard library alone, which every side may load
SHARED = {"ratchet", "ratchet.core", "ratchet.core.errors", "ratchet.core.vocab",
          "ratchet.core.stats"}


def job_side(name: str) -> bool:
    return name in SHARED - {"ratchet.core.stats"} or name == "ratchet.job" \
        or name.startswith("ratchet.job.")


def sdk(name: str) -> bool:
    """The evaluator SDK may use the job wing (isolate starts the candidate child through
    the sandbox and reads sealed answers) and the shared vocabulary and arithmetic."""
    return name in SHARED or job_side(name) or name == "ratchet.evaluator" \
        or name.startswith("ratchet.evaluator.")


# arrays an evaluator brings (cython_runtime: what numpy's compiled parts register)
SDK_THIRD_PARTY = {"numpy", "torch", "triton", "cupy", "cython_runtime"}


def _loaded(*modules: str) -> list[str]:
    """Every module a fresh interpreter holds after importing `modules`, beyond what it
    starts with."""
    code = ("import sys; before = set(sys.modules)\n"
            + "".join(f"import {m}\n" for m in modules)
            + "import json; print(json.dumps(sorted(set(sys.modules) - before)))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=60).stdout
    return json.loads(out.splitlines()[-1])


def _third_party(name: str) -> bool:
    top = name.split(".")[0]
    return not (top in sys.stdlib_module_names or top.startswith("_") or top == "ratchet")


@pytest.mark.parametrize("entry", ["ratchet.job.worker", "ratchet.job.node",
                                   "ratchet.job.ray_slots", "ratchet.job.warden"])
def test_the_job_side_loads_only_the_standard_library_and_itself(entry):
    loaded = _loaded(entry)
    outside = [m for m in loaded if m.startswith("ratchet") and not job_side(m)]
    assert outside == [], f"{entry} loads driver modules: {outside}"
    foreign = [m for m in loaded if _third_party(m)]
    assert foreign == [], f"{entry} loads third-party modules: {foreign}"


def test_the_evaluator_sdk_never_loads_the_driver():
    loaded = _loaded("ratchet.channel", "ratchet.isolate", "ratchet.kernels")
    driver = [m for m in loaded if m.startswith("ratchet") and not sdk(m)
              and _wing(m) != "sdk"]
    assert driver == [], driver
    foreign = {m.split(".")[0] for m in loaded if _third_party(m)}
    assert foreign <= SDK_THIRD_PARTY, foreign


# -- the wings, read from the source: every import, a function's lazy ones included -------

SRC = ROOT / "src" / "ratchet"
# the evaluator SDK's public names: each module is the real one's (ratchet/kernels/)
PUBLIC_SDK = {"ratchet.channel", "ratchet.isolate", "ratchet.kernels", "ratchet.stats",
              "ratchet.errors"}
# wing -> the wings it may import (itself always); `ratchet.cli` is the front
MAY_IMPORT = {
    "core": {"core"},
    "job": {"core"},
    "evaluator": {"core", "job"},
    "sdk": {"core", "evaluator"},
    # the ledger: below everything that reads or writes a study's record
    "store": {"core", "store"},
    # the plug-ins stand on core, the job wing and the store (a proposer's Meter), never
    # on the driver: an out-of-tree one needs nothing of the loop to be written
    "backends": {"core", "job", "evaluator", "backends"},
    "proposers": {"core", "job", "evaluator", "store", "proposers", "backends"},
    # the loop: never the views (it writes results.tsv and its own log lines, and the
    # fronts hand it what a view does at a round's end)
    "driver": {"core", "job", "evaluator", "store", "driver", "proposers", "backends"},
    # the views read the ledger (store) and the driver's read functions (spend, budget,
    # tally, the headline); nothing below them imports them
    "ui": {"core", "job", "store", "driver", "proposers", "ui"},
    "front": {"core", "job", "evaluator", "store", "driver", "proposers", "backends", "ui",
              "templates", "mcp"},
    # `ratchet mcp`'s server: another front over the driver, never over the CLI
    "mcp": {"core", "job", "evaluator", "store", "driver", "proposers", "backends", "ui",
            "mcp"},
}
# the plug-in wings, which must never reach the driver (lazily or not)
PLUGINS = ("backends", "proposers")
# what ratchet/core may import beyond itself and the standard library
CORE_THIRD_PARTY = {"pydantic"}


def _wing(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "core"  # the package itself: its version
    if ".".join(parts[:2]) in PUBLIC_SDK:
        return "sdk"
    head = parts[1]
    if head in {"core", "job", "evaluator", "store", "driver", "ui", "proposers", "backends",
                "templates", "mcp"}:
        return head
    return "front" if head == "cli" else f"stray:{head}"


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The nodes under `if TYPE_CHECKING:` (annotations only: they never run)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            skip.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return skip


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("ratchet")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                package = module.split(".")[: -node.level if path.name != "__init__.py"
                                            else len(module.split(".")) - node.level + 1]
                base = ".".join([*package, *([base] if base else [])])
            if not base.startswith("ratchet"):
                continue
            for alias in node.names:  # `from ratchet import gitrepo` names a module
                full = f"{base}.{alias.name}"
                sub = SRC.joinpath(*full.split(".")[1:])
                is_module = sub.with_suffix(".py").is_file() or sub.is_dir()
                found.append((node.lineno, full if is_module else base))
    return found


def _modules() -> list[tuple[Path, str]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        if "templates" in parts:
            continue  # the starter files `ratchet init` copies: the user's code
        out.append((path, ".".join(parts)))
    return out


def test_every_module_lives_in_a_wing():
    stray = [m for _, m in _modules() if _wing(m).startswith("stray")]
    assert stray == [], f"modules outside the wings (driver/, job/, evaluator/, ...): {stray}"


def test_no_import_crosses_a_wing_upward_lazy_ones_included():
    wrong = []
    for path, module in _modules():
        wing = _wing(module)
        for line, target in _imports(path, module):
            allowed = MAY_IMPORT[wing] | {wing}
            if _wing(target) not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({wing}) imports {target} "
                             f"({_wing(target)})")
    assert wrong == [], "\n".join(wrong)


def test_the_plug_ins_never_import_the_driver():
    """A backend or a proposer stands on core (and the job wing, and the store for a
    proposer's calls): every import of theirs, a function's included, read from the
    source, and what a fresh interpreter loads with all of them."""
    assert not any("driver" in MAY_IMPORT[wing] for wing in PLUGINS)
    reaching = [f"{path.relative_to(ROOT)}:{line} imports {target}"
                for path, module in _modules() if _wing(module) in PLUGINS
                for line, target in _imports(path, module) if _wing(target) == "driver"]
    assert reaching == [], "\n".join(reaching)
    plugins = [m for _, m in _modules() if _wing(m) in PLUGINS]
    loaded = _loaded(*plugins)
    assert [m for m in loaded if _wing(m) == "driver"] == []


def test_the_loop_never_imports_the_views():
    """The views (ratchet/ui) stand on the driver, never the other way: no module below
    them imports one (read from the source, lazy imports included), and the study, its
    policies and the opening every front shares load none in a fresh interpreter.
    What a view does at a round's end (`[notify]`) the front hands to the study."""
    assert not any("ui" in allowed for wing, allowed in MAY_IMPORT.items()
                   if wing not in {"ui", "front", "mcp"})
    below = [f"{path.relative_to(ROOT)}:{line} imports {target}"
             for path, module in _modules() if _wing(module) not in {"ui", "front", "mcp"}
             for line, target in _imports(path, module) if _wing(target) == "ui"]
    assert below == [], "\n".join(below)
    loaded = _loaded("ratchet.driver.study", "ratchet.driver.opening",
                     "ratchet.driver.rolling", "ratchet.driver.rounds")
    assert [m for m in loaded if _wing(m) == "ui"] == []


def test_the_plug_in_rule_finds_a_driver_import(tmp_path):
    """The reading above sees a lazy import of the driver in a plug-in's function."""
    plugin = tmp_path / "mine.py"
    plugin.write_text("def f():\n    from ratchet.driver.study import Study\n    return Study\n")
    assert [_wing(t) for _, t in _imports(plugin, "ratchet.proposers.mine")] == ["driver"]


def _graph() -> dict[str, set[str]]:
    """module -> the modules of src/ratchet it imports (a package's `__init__` by its
    package's name)."""
    modules = dict((m, p) for p, m in _modules())
    return {m: {t for _, t in _imports(p, m) if t in modules and t != m}
            for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle_lazy_imports_included():
    """A cycle is a pair of rooms that each need the other: what both need belongs in a
    room below them (ratchet/core, or a smaller module of the wing)."""
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_core_imports_only_the_standard_library_pydantic_and_itself():
    foreign = []
    for path in sorted((SRC / "core").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level \
                else []
            if isinstance(node, ast.ImportFrom) and node.level:
                names = ["ratchet.core"] if node.level == 1 else ["ratchet.?"]
            for name in names:
                top = name.split(".")[0]
                inside = name == "ratchet.core" or name.startswith("ratchet.core.")
                if not (inside or top in sys.stdlib_module_names or top in CORE_THIRD_PARTY):
                    foreign.append(f"{path.relative_to(SRC)}:{node.lineno} imports {name}")
    assert foreign == [], foreign
    # and in a fresh interpreter: importing all of core loads nothing else of ratchet
    loaded = _loaded(*(f"ratchet.core.{p.stem}" for p in sorted((SRC / "core").glob("*.py"))
                       if p.stem != "__init__"))
    assert [m for m in loaded if m.startswith("ratchet") and _wing(m) != "core"] == []


def test_the_public_sdk_names_are_the_evaluator_wing_modules_themselves():
    """`ratchet.kernels`, `ratchet.channel` and `ratchet.isolate` (what users' evaluators and
    the docs import) are the very module objects of the evaluator wing."""
    code = ("import ratchet.kernels.timing as a, ratchet.evaluator.kernels.timing as b\n"
            "import ratchet.channel as c, ratchet.evaluator.channel as d\n"
            "from ratchet.isolate import CandidateProcess as e\n"
            "from ratchet.evaluator.isolate import CandidateProcess as f\n"
            "import ratchet.kernels as rk\n"
            "assert a is b and c is d and e is f and rk.timing is b, 'two copies'\n"
            "assert a.__spec__.name == 'ratchet.evaluator.kernels.timing', a.__spec__\n"
            "print('ok')")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_every_harness_module_has_its_public_name():
    """`ratchet.kernels.<name>` is a file of its own per harness module: a module added to
    the evaluator wing without its twin here would have no public name."""
    def stems(folder: Path) -> set[str]:
        return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}

    assert stems(SRC / "kernels") == stems(SRC / "evaluator" / "kernels")


def test_the_documented_layout_names_every_module_where_it_lives():
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## Layout"):]
    block = block[block.index("```"):block.index("```", block.index("```") + 3)]
    missing = []
    for path, module in _modules():
        if path.name == "__init__.py" or module.startswith(("ratchet.evaluator.kernels.",
                                                            "ratchet.kernels.")):
            continue
        if module.startswith(("ratchet.proposers.", "ratchet.backends.")):
            continue  # listed by name within their wing's line
        if not re.search(rf"(?<![\w/]){re.escape(path.name)}(?![\w])", block):
            missing.append(str(path.relative_to(SRC)))
    assert missing == [], f"docs/architecture.md's layout does not list: {missing}"
