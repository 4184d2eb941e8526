"""`ratchet.stats`: the name an evaluator uses for the keep rule's arithmetic
(`stats.incumbent_extra()`, `stats.clearly_slower()`, docs/statistics.md), the very
module object of ratchet.core.stats (ratchet/kernels/__init__.py says why)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("ratchet.core.stats")
