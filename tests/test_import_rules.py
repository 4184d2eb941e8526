"""Who may import what, as the trust zones need it (checked by loading, not by reading):

- the job side (what a job's machine loads to run a job: the worker, the node half of
  the remote entry point, the Ray slot actor, the sandbox's warden) loads only the
  standard library and the job side's own modules;
- the evaluator SDK (what an evaluator imports: the metric channel, isolate, the kernel
  harness) never loads a driver module (study, scheduler, judge, ledger, config,
  proposers, backends' driver halves, ...).

Each is checked in a fresh interpreter, so a module-level import anywhere down the chain
(a package `__init__` included) counts.
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

SHARED = {"ratchet", "ratchet.errors", "ratchet.vocab", "ratchet.stats"}


def job_side(name: str) -> bool:
    return name in SHARED - {"ratchet.stats"} or name == "ratchet.job" \
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
    loaded = _loaded("ratchet.evaluator.channel", "ratchet.evaluator.isolate", "ratchet.evaluator.kernels")
    driver = [m for m in loaded if m.startswith("ratchet") and not sdk(m)]
    assert driver == [], driver
    foreign = {m.split(".")[0] for m in loaded if _third_party(m)}
    assert foreign <= SDK_THIRD_PARTY, foreign


# -- the wings, read from the source: every import, a function's lazy ones included -------

SRC = ROOT / "src" / "ratchet"
# wing -> the wings it may import (itself always); `ratchet.<module>` at the top level is
# its own wing: the CLI front, or the shared vocabulary and arithmetic
MAY_IMPORT = {
    "job": {"shared"},
    "evaluator": {"shared", "job"},
    "shared": {"shared"},
    "backends": {"shared", "job", "evaluator", "driver", "proposers", "backends"},
    "proposers": {"shared", "job", "evaluator", "driver", "proposers", "backends"},
    "driver": {"shared", "job", "evaluator", "driver", "proposers", "backends"},
    "front": {"shared", "job", "evaluator", "driver", "proposers", "backends", "templates",
              "mcp"},
    # `ratchet mcp`'s server: another front over the driver, never over the CLI
    "mcp": {"shared", "job", "evaluator", "driver", "proposers", "backends", "mcp"},
}


def _wing(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "shared"  # the package itself: its public SDK names
    head = parts[1]
    if head in {"job", "evaluator", "driver", "proposers", "backends", "templates", "mcp"}:
        return head
    # plugins: the entry-point loader, standard library only (it imports plug-ins by name)
    return "front" if head == "cli" else "shared" \
        if head in {"errors", "vocab", "stats", "plugins"} else f"stray:{head}"


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
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


def test_the_documented_layout_names_every_module_where_it_lives():
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## Layout"):]
    block = block[block.index("```"):block.index("```", block.index("```") + 3)]
    missing = []
    for path, module in _modules():
        if path.name == "__init__.py" or module.startswith("ratchet.evaluator.kernels."):
            continue
        if module.startswith(("ratchet.proposers.", "ratchet.backends.")):
            continue  # listed by name within their wing's line
        if not re.search(rf"(?<![\w/]){re.escape(path.name)}(?![\w])", block):
            missing.append(str(path.relative_to(SRC)))
    assert missing == [], f"docs/architecture.md's layout does not list: {missing}"
