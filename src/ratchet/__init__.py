"""ratchet: autoresearch that only moves forward.

The flow, one direction: config -> study -> proposer -> candidate -> backend -> worker
-> judge -> ledger. The tree shows who may trust whom:

- `ratchet.driver`: the study's own process (study, the two policies, jobs, judge, ledger,
  the views); trusted; may import everything below it.
- `ratchet.proposers`, `ratchet.backends`: the driver's plug-ins (one registry each).
- `ratchet.evaluator`: the SDK a task's evaluator imports (the metric channel, the
  candidate child, the kernel harness); never imports the driver.
- `ratchet.job`: what a job's machine runs (the worker, the sandbox and its warden, the
  sealed result, the node half of remote backends); the standard library only.
- `ratchet.errors`, `ratchet.vocab`, `ratchet.stats`: the shared vocabulary and pure
  arithmetic every wing may use.

Evaluators written before the evaluator wing existed import `ratchet.channel`,
`ratchet.isolate` and `ratchet.kernels`; those names are the SDK's public ones and stay
importable: each is the very module object of `ratchet.evaluator.<name>`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__version__ = "0.1.0"

# the evaluator SDK's public names -> where the modules live
PUBLIC_SDK = {"ratchet.channel": "ratchet.evaluator.channel",
              "ratchet.isolate": "ratchet.evaluator.isolate",
              "ratchet.kernels": "ratchet.evaluator.kernels"}


def _real_name(name: str) -> str | None:
    for public, real in PUBLIC_SDK.items():
        if name == public or name.startswith(public + "."):
            return real + name[len(public):]
    return None


class _PublicSDK:
    """`import ratchet.kernels.timing` gives the module `ratchet.evaluator.kernels.timing`
    itself (one module object, so classes, caches and isinstance checks are shared).

    A meta path finder and loader by its methods alone: importlib.abc's base classes
    import importlib.resources (~10 ms of CPU) into every process that imports ratchet
    (each worker, each spare server, an evaluator using the SDK, the driver)."""

    def find_spec(self, fullname: str, path: object = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if _real_name(fullname) is None:
            return None
        # a loader by create_module and exec_module (typeshed's protocol asks for the
        # deprecated load_module, which the import system never calls when these exist)
        return importlib.util.spec_from_loader(fullname, self)  # type: ignore[arg-type]

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        real = _real_name(spec.name)
        assert real is not None
        module = importlib.import_module(real)
        spec.loader_state = module.__spec__  # the import system is about to overwrite it
        return module

    def exec_module(self, module: ModuleType) -> None:
        # give the real module its own spec back (set over by the alias's), so reloads,
        # pickles and tracebacks name the real module
        spec = module.__spec__
        if spec is not None and isinstance(spec.loader_state, importlib.machinery.ModuleSpec):
            module.__spec__ = spec.loader_state


if not any(isinstance(finder, _PublicSDK) for finder in sys.meta_path):
    sys.meta_path.insert(0, _PublicSDK())
