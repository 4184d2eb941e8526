"""`ratchet.kernels.profile`: the public name of ratchet.evaluator.kernels.profile, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import profile

sys.modules[__name__] = profile
