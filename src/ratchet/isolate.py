"""`ratchet.isolate`: the evaluator SDK's public name of ratchet.evaluator.isolate, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator import isolate

sys.modules[__name__] = isolate
