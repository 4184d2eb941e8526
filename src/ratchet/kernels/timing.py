"""`ratchet.kernels.timing`: the public name of ratchet.evaluator.kernels.timing, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import timing

sys.modules[__name__] = timing
