"""The job wing: what a job's machine runs to run one job (the worker, the sandbox and its
warden, the sealed result, slots, prepared data, the node half of remote backends).

Standard library and this wing only (tests/test_import_rules.py holds it to that): it is
what a cluster node must import with nothing else of ratchet's installed, and what stands
between untrusted candidate code and the result the driver believes.
"""
