"""`ratchet.kernels.profile`: the public name of ratchet.evaluator.kernels.profile, the very
module object (ratchet/kernels/__init__.py says why)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("ratchet.evaluator.kernels.profile")
