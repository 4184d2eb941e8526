"""`ratchet.kernels.runner`: the public name of ratchet.evaluator.kernels.runner, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator.kernels import runner

sys.modules[__name__] = runner
