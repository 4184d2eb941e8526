"""`ratchet.kernels.correctness`: the public name of ratchet.evaluator.kernels.correctness, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import correctness

sys.modules[__name__] = correctness
