"""The evaluator wing: the SDK a task's (trusted) evaluator imports.

The metric channel (`channel`), the candidate child and its sandbox (`isolate`,
`isolate_child`, `isolate_clean`) and the kernel harness (`kernels`). It never imports the
driver (tests/test_import_rules.py); it may use the job wing's sandbox and seal. Public
names: `ratchet.channel`, `ratchet.isolate`, `ratchet.kernels` (see ratchet/__init__.py).
"""
