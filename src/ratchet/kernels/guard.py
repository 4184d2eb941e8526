"""`ratchet.kernels.guard`: the public name of ratchet.evaluator.kernels.guard, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import guard

sys.modules[__name__] = guard
