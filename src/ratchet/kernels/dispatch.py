"""`ratchet.kernels.dispatch`: the public name of ratchet.evaluator.kernels.dispatch, the very
module object (ratchet/kernels/__init__.py says why)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("ratchet.evaluator.kernels.dispatch")
