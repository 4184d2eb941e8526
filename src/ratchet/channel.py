"""`ratchet.channel`: the evaluator SDK's public name of ratchet.evaluator.channel, the very
module object (ratchet/kernels/__init__.py says why)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("ratchet.evaluator.channel")
