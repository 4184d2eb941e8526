"""`ratchet.kernels.workload`: the public name of ratchet.evaluator.kernels.workload, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import workload

sys.modules[__name__] = workload
