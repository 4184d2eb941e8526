"""`ratchet.kernels.endtoend`: the public name of ratchet.evaluator.kernels.endtoend, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import endtoend

sys.modules[__name__] = endtoend
