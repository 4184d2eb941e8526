"""`ratchet.channel`: the evaluator SDK's public name of ratchet.evaluator.channel, the very
module object (ratchet/kernels/__init__.py says why)."""

import sys

from ratchet.evaluator import channel

sys.modules[__name__] = channel
