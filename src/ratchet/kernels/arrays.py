"""`ratchet.kernels.arrays`: the public name of ratchet.evaluator.kernels.arrays, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import arrays

sys.modules[__name__] = arrays
