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

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

JOB_SIDE = {
    "ratchet", "ratchet.errors", "ratchet.vocab", "ratchet.faults", "ratchet.fingerprint",
    "ratchet.gitrepo", "ratchet.jobspec", "ratchet.prep", "ratchet.procs", "ratchet.sandbox",
    "ratchet.seal", "ratchet.slots", "ratchet.warden", "ratchet.worker",
    "ratchet.backends", "ratchet.backends.base", "ratchet.backends.remote",
    "ratchet.backends.ray_slots",
}
SDK = {"ratchet", "ratchet.channel", "ratchet.isolate", "ratchet.isolate_child",
       "ratchet.jobspec", "ratchet.seal", "ratchet.errors", "ratchet.vocab",
       "ratchet.sandbox"}  # isolate starts the candidate child through the job side's sandbox
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


@pytest.mark.parametrize("entry", ["ratchet.worker", "ratchet.backends.remote",
                                   "ratchet.backends.ray_slots", "ratchet.warden"])
def test_the_job_side_loads_only_the_standard_library_and_itself(entry):
    loaded = _loaded(entry)
    outside = [m for m in loaded if m.startswith("ratchet") and m not in JOB_SIDE]
    assert outside == [], f"{entry} loads driver modules: {outside}"
    foreign = [m for m in loaded if _third_party(m)]
    assert foreign == [], f"{entry} loads third-party modules: {foreign}"


def test_the_evaluator_sdk_never_loads_the_driver():
    loaded = _loaded("ratchet.channel", "ratchet.isolate", "ratchet.kernels")
    driver = [m for m in loaded if m.startswith("ratchet") and m not in SDK
              and not m.startswith("ratchet.kernels")]
    assert driver == [], driver
    foreign = {m.split(".")[0] for m in loaded if _third_party(m)}
    assert foreign <= SDK_THIRD_PARTY, foreign
