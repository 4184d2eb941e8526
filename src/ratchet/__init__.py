"""ratchet: autoresearch that only moves forward.

The flow, one direction: config -> study -> proposer -> candidate -> backend -> worker
-> judge -> ledger. Each stage is a module of its own under this package.
"""

__version__ = "0.1.0"
