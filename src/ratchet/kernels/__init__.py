"""`ratchet.kernels`: the public name of the kernel harness (ratchet.evaluator.kernels).

Evaluators import the SDK by its public names, `ratchet.kernels`, `ratchet.channel` and
`ratchet.isolate` (docs/kernels.md, the `ratchet init` templates, and every evaluator
a user copied from them), so those names are a stable interface. Each is a real module:
the module of a public name puts the real one in its place in `sys.modules` (the import
system hands back whatever a module leaves there), so `import ratchet.kernels.timing`
gives ratchet.evaluator.kernels.timing itself: one module object, its classes, caches
and isinstance checks shared. This package keeps a folder of its own so that each
submodule's public name finds its file here; its attributes are the real package's.
"""

from typing import Any

from ratchet.evaluator import kernels as _real
from ratchet.evaluator.kernels import *  # noqa: F403 - the harness's public surface
from ratchet.evaluator.kernels import __all__ as __all__


def __getattr__(name: str) -> Any:
    """Every other attribute (a submodule the real package loaded) is the real one's."""
    return getattr(_real, name)
