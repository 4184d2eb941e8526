"""`ratchet.errors`: the name evaluators written from earlier examples import the typed
errors by (`from ratchet.errors import ...`), the very module object of ratchet.core.errors
(ratchet/kernels/__init__.py says why)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("ratchet.core.errors")
