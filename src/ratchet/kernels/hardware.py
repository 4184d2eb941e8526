"""`ratchet.kernels.hardware`: the public name of ratchet.evaluator.kernels.hardware, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import hardware

sys.modules[__name__] = hardware
