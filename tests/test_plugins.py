"""Plug-ins by entry point, as a user installs them: packages made here, installed with
pip into a directory of their own (the shared venv is never changed) and put on the
path of a real `ratchet` process, since finding them by entry point is the point.

- `ratchet-step`: a backend (`counting`) and a proposer (`step`), each with its own
  settings table, declared as entry points; `ratchet run` runs a study with both.
- `ratchet-broken`: a backend that cannot be imported and a proposer that is not a
  Proposer; each is left out with one warning line naming its entry point and the fix.
- ratchet itself, built from this checkout: its built-in backends and proposers come
  from its own entry points, through the same loader.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from helpers import ROOT, git, ratchet, results_tsv, score_repo

from ratchet.core import plugins
from ratchet.driver.budget import preview
from ratchet.driver.config import load_config
from ratchet.proposers import sandbox_status
from ratchet.proposers.context import prompt_tokens
from ratchet.store.ledger import Ledger

STEP_BACKEND = '''
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ratchet.backends import register_backend
from ratchet.backends.local import LocalBackend


class CountingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    placed: Path  # every job placed is appended here
    label: str = "counting"


@register_backend("counting", settings=CountingSettings,
                  summary="this machine, writing down each job it places")
class CountingBackend(LocalBackend):
    name = "counting"

    def __init__(self, state_dir, settings, backend):
        super().__init__(state_dir, backend=backend)
        self.settings = settings

    def submit(self, spec):
        with self.settings.placed.open("a") as fh:
            fh.write(spec.job_id + "\\n")
        return super().submit(spec)

    def describe(self):
        return f"{self.settings.label}: {super().describe()}"
'''

STEP_PROPOSER = '''
import re
import subprocess

from pydantic import BaseModel, ConfigDict

from ratchet.core.candidate import Proposal
from ratchet.proposers import Estimate, Proposer, plugin_settings


class StepSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    values: list[float]  # the values of X to try, in this order
    note: str = "step"


class StepProposer(Proposer):
    """Tries the values of its table, one candidate each, in order."""

    name = "step"
    summary = "the values of [step] values, in order"
    settings_model = StepSettings
    takes_ideas = False

    def __init__(self, config, history):
        self.settings = plugin_settings("step", config)
        tried = {c.description for c in history}
        self.queue = [v for v in self.settings.values if self._text(v) not in tried]

    @classmethod
    def estimate(cls, config, repo, commit, k):
        return Estimate(0.25 * k, f"{k} step(s) at $0.25 each")

    def _text(self, value):
        return f"{self.settings.note}: X = {value}"

    def propose(self, k, ctx):
        source = subprocess.run(["git", "-C", str(ctx.repo), "show",
                                 f"{ctx.incumbent}:solution.py"],
                                capture_output=True, text=True, check=True).stdout
        out = []
        while self.queue and len(out) < k:
            value = self.queue.pop(0)
            changed = re.sub(r"^X = .*$", f"X = {value}", source, count=1, flags=re.M)
            out.append(Proposal(description=self._text(value),
                                files={"solution.py": changed.encode()}))
        return out
'''

BROKEN_BACKEND = '''
import ratchet_not_installed  # the dependency its package forgot to declare
'''

BROKEN_PROPOSER = '''
class NotAProposer:
    """Has a propose method, but does not extend ratchet.proposers.Proposer."""

    def propose(self, k, ctx):
        return []
'''


def _package(root: Path, name: str, modules: dict[str, str],
             entry_points: dict[str, dict[str, str]]) -> Path:
    """A source tree pip can install: pyproject.toml with the entry points, one package."""
    package = name.replace("-", "_")
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    for module, text in modules.items():
        (root / package / f"{module}.py").write_text(textwrap.dedent(text).lstrip())
    groups = "".join(
        f'\n[project.entry-points."{group}"]\n'
        + "".join(f'{key} = "{package}.{value}"\n' for key, value in points.items())
        for group, points in entry_points.items())
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'\n[project]\nname = "{name}"\nversion = "1.0"\n{groups}'
        f'\n[tool.setuptools]\npackages = ["{package}"]\n')
    return root


def _ratchet_source(root: Path) -> Path:
    """This checkout's package as pip builds it (a copy: a build leaves files behind)."""
    root.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "src", root / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return root


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The three packages, installed with pip into one directory (not the venv)."""
    base = tmp_path_factory.mktemp("plugins")
    step = _package(base / "step", "ratchet-step",
                    {"backend": STEP_BACKEND, "proposer": STEP_PROPOSER},
                    {"ratchet.backends": {"counting": "backend:CountingBackend"},
                     "ratchet.proposers": {"step": "proposer:StepProposer"}})
    broken = _package(base / "broken", "ratchet-broken",
                      {"gone": BROKEN_BACKEND, "wrong": BROKEN_PROPOSER},
                      {"ratchet.backends": {"gone": "gone:GoneBackend"},
                       "ratchet.proposers": {"notaproposer": "wrong:NotAProposer",
                                             "tune": "wrong:NotAProposer"}})
    target = base / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(target),
                    str(step), str(broken), str(_ratchet_source(base / "ratchet"))],
                   check=True, capture_output=True, timeout=300)
    return target


def _step_repo(path: Path, placed: Path, step_table: str) -> Path:
    return score_repo(
        path, knobs="",
        search='[search]\nproposer = "step"\nparallel = 1\nrounds = 3\n',
        backend=(f'[backend]\nkind = "counting"\nslots = 1\n\n[backend.counting]\n'
                 f'placed = "{placed}"\nlabel = "lab counter"\n\n{step_table}'))


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning: ")]


def test_an_installed_backend_and_proposer_run_a_study(installed, tmp_path):
    placed = tmp_path / "placed.txt"
    repo = _step_repo(tmp_path / "r", placed,
                      '[step]\nvalues = [2.0, 1.25]\nnote = "from the plug-in"\n')
    run = ratchet(repo, "run", process=True, env={"PYTHONPATH": str(installed)})
    assert run.returncode == 0, run.stdout + run.stderr
    rows = results_tsv(repo)
    assert [(r["description"], r["status"]) for r in rows if r["status"] != "reference"] == [
        ("baseline", "keep"), ("from the plug-in: X = 2.0", "keep"),
        ("from the plug-in: X = 1.25", "keep")]
    assert float(rows[-1]["score"]) == 0.0
    # its own estimate hook, before round 1
    assert "proposer about $0.2500 (1 step(s) at $0.25 each)" in run.stdout + run.stderr
    # every job the study placed went through the plug-in backend, once each
    ledger = Ledger.readonly(repo / ".ratchet" / "ledger.db")
    try:
        job_ids = {c.job_id for c in ledger.candidates() if c.job_id}
    finally:
        ledger.close()
    jobs = placed.read_text().split()
    assert len(jobs) == len(set(jobs)) and job_ids <= set(jobs) and job_ids
    # the broken package beside it: its backend was looked at (the [backend.counting]
    # table is checked against every backend's name) and left out in one line, the study
    # unharmed; its proposer, never used, was never imported
    gone = [w for w in _warnings(run.stderr) if "gone" in w]
    assert len(gone) == 1, run.stderr
    assert re.fullmatch(
        r"warning: backend plug-in gone = 'ratchet_broken\.gone:GoneBackend' in package "
        r"ratchet[-_]broken is left out: cannot be imported \(ModuleNotFoundError: No module "
        r"named 'ratchet_not_installed'\); fix: install what it needs, or uninstall "
        r"ratchet[-_]broken", gone[0]), gone[0]
    assert not [w for w in _warnings(run.stderr) if "notaproposer" in w]


def test_a_plugin_table_is_checked_by_its_own_model_in_one_line(installed, tmp_path):
    repo = _step_repo(tmp_path / "r", tmp_path / "placed.txt", "[step]\nvaluez = [2.0]\n")
    run = ratchet(repo, "run", process=True, env={"PYTHONPATH": str(installed)})
    assert run.returncode == 2
    errors = [line for line in run.stderr.splitlines() if not line.startswith("warning: ")]
    assert errors == [f"error: {repo}/ratchet.toml: step.valuez: unknown key; did you mean "
                      "'values'? (check the spelling)"], run.stderr


def test_a_plugin_that_is_no_proposer_is_refused_in_one_line(installed, tmp_path):
    repo = _step_repo(tmp_path / "r", tmp_path / "placed.txt", "[step]\nvalues = [2.0]\n")
    run = ratchet(repo, "run", "--proposer", "notaproposer", process=True,
                  env={"PYTHONPATH": str(installed)})
    assert run.returncode == 2, run.stdout + run.stderr
    told = [line for line in run.stderr.splitlines() if "notaproposer" in line]
    line = ("proposer plug-in notaproposer = 'ratchet_broken.wrong:NotAProposer' in package "
            "ratchet[-_]broken is left out: NotAProposer is not a subclass of "
            "ratchet.proposers.Proposer; fix: make 'notaproposer' name a class extending "
            "Proposer")
    # warned once when it was loaded, then the study's error: the same line
    assert [re.sub(line, "LINE", t) for t in told] == [
        'warning: LINE (docs/proposers.md, "Writing a plug-in")',
        'error: LINE (docs/proposers.md, "Writing a plug-in")'], run.stderr
    assert not (repo / "results.tsv").exists()  # refused before anything was recorded


_BUILT_INS = """
import json
from ratchet.core import plugins
from ratchet.backends import backends
from ratchet.proposers import proposer_kinds
found = {group.value: {name: [p.package, p.declared, p.value]
                       for name, p in plugins.entry_points(group).items()}
         for group in plugins.Group}
found["backends"] = {name: f"{b.factory.__module__}:{b.factory.__qualname__}"
                     for name, b in backends().items()}
found["proposers"] = {name: k.load().__name__ for name, k in proposer_kinds().items()
                      if k.load() is not None}
print(json.dumps(found))
"""


def test_the_built_ins_come_from_ratchets_own_entry_points(installed):
    """Installed as a user installs it, ratchet's backends and proposers are found in its
    metadata and loaded by the same loader as any other package's."""
    out = subprocess.run([sys.executable, "-c", _BUILT_INS], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(installed)},
                         check=True, timeout=120)
    found = json.loads(out.stdout)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    for group in plugins.Group:
        ours = {name: [value[0], value[2]] for name, value in found[group.value].items()
                if value[0] == "ratchet"}
        assert ours == {name: ["ratchet", value] for name, value in declared[group].items()}
        assert all(found[group.value][name][1] for name in ours)  # from metadata
    assert found["backends"] == {
        "local": "ratchet.backends.local:LocalBackend",
        "ray": "ratchet.backends.ray:ray_backend",
        "shell": "ratchet.backends.shell:ShellBackend",
        "counting": "ratchet_step.backend:CountingBackend"}  # `gone` left out
    assert found["proposers"] == {"tune": "TuneProposer", "llm": "LLMProposer",
                                  "agent": "AgentProposer", "patches": "PatchesProposer",
                                  "step": "StepProposer"}  # the shadowing `tune` ignored
    shadow = [w for w in _warnings(out.stderr) if "'tune' is ratchet's built-in" in w]
    assert len(shadow) == 1, out.stderr
    # `--help` names every installed plug-in from the metadata alone, importing none
    helped = ratchet(Path("."), "run", "--help", process=True,
                     env={"PYTHONPATH": str(installed), "COLUMNS": "200"})
    listed = {m.group(1): m.group(2).split(" | ") for m in
              re.finditer(r"--(backend|proposer) <str>\s+(.*\S)", helped.stdout)}
    assert listed["backend"][:3] == ["local", "ray", "shell"]  # the built-ins first
    assert sorted(listed["backend"][3:]) == ["counting", "gone"], helped.stdout
    assert listed["proposer"][:4] == ["tune", "llm", "agent", "patches"]
    assert sorted(listed["proposer"][4:]) == ["notaproposer", "step"]
    assert "left out" not in helped.stderr  # nothing was imported, so nothing failed


def test_the_fallback_table_is_what_pyproject_declares():
    """Where ratchet's installed metadata predates its entry points (an old editable
    install), the loader reads the same table from the code."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert {group: dict(points) for group, points in declared.items()} == {
        group.value: points for group, points in plugins.BUILT_IN.items()}
    for group in plugins.Group:
        assert list(plugins.entry_points(group))[:len(plugins.BUILT_IN[group])] == \
            list(plugins.BUILT_IN[group])


def test_the_kinds_own_hooks_give_the_estimate_and_the_sandbox_line(tmp_path):
    """No branch on a kind's name: each kind's class answers (Proposer.estimate,
    Proposer.sandbox_status), the built-in ones as a plug-in would."""
    repo = score_repo(tmp_path / "r", search=(
        '[search]\nproposer = "tune"\n\n[llm]\nmodels = [{provider = "openai", model = "m", '
        'max_tokens = 1000, price_per_mtok_in = 1.0, price_per_mtok_out = 2.0}]\n\n'
        '[agent]\npreset = "claude"\nhourly_usd = 3.0\ntimeout = "10m"\n'))
    config = load_config(repo)
    head = git(repo, "rev-parse", "HEAD")
    llm = preview(config, repo, head, 4, "llm")
    tokens = prompt_tokens(repo, head, config, 24000)
    assert llm.proposer_usd == pytest.approx(4 * (tokens * 1.0 + 1000 * 2.0) / 1e6)
    assert llm.proposer_note.startswith(f"4 requests x ~{tokens:,} tokens in, up to 1,000 out")
    agent = preview(config, repo, head, 2, "agent")
    assert agent.proposer_usd == pytest.approx(2 * 3.0 * 600 / 3600)
    assert agent.proposer_note.startswith("2 agents x at most 600 s at $3/h")
    tune = preview(config, repo, head, 2, "tune")
    assert (tune.proposer_usd, tune.proposer_note) == (0.0, "the tune proposer costs nothing "
                                                            "per call")
    assert sandbox_status("tune", config) is None and sandbox_status("llm", config) is None
    line = sandbox_status("agent", config)
    assert line is not None and line.startswith(("bubblewrap: ", "PID and mount namespace",
                                                 "refused: "))
