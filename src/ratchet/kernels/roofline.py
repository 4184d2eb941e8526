"""`ratchet.kernels.roofline`: the public name of ratchet.evaluator.kernels.roofline, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import roofline

sys.modules[__name__] = roofline
