"""`ratchet.kernels.sweep`: the public name of ratchet.evaluator.kernels.sweep, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import sweep

sys.modules[__name__] = sweep
