"""`ratchet.kernels.dispatch`: the public name of ratchet.evaluator.kernels.dispatch, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import dispatch

sys.modules[__name__] = dispatch
