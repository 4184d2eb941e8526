"""ratchet: autoresearch that only moves forward.

The flow, one direction: config -> study -> proposer -> candidate -> backend -> worker
-> judge -> ledger. The tree shows who may trust whom:

- `ratchet.core`: the domain (config schema, candidate, vocabulary, verdict, errors,
  plug-in loader, the keep rule's arithmetic); imports only the standard library and
  pydantic, and everything below imports it.
- `ratchet.driver`: the study's own process (study, the two policies, jobs, judge, ledger,
  the views); trusted; may import everything below it.
- `ratchet.proposers`, `ratchet.backends`: the driver's plug-ins (one registry each),
  found by entry point.
- `ratchet.evaluator`: the SDK a task's evaluator imports (the metric channel, the
  candidate child, the kernel harness); never imports the driver. Its public names are
  `ratchet.channel`, `ratchet.isolate` and `ratchet.kernels` (ratchet/kernels/__init__.py).
- `ratchet.job`: what a job's machine runs (the worker, the sandbox and its warden, the
  sealed result, the node half of remote backends); the standard library only.
"""

__version__ = "0.1.0"
