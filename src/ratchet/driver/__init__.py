"""The driver wing: the study's own, trusted process.

study (the front the CLI calls), the two policies (rounds, rolling) over the loop they
share (settle) and the proposals made for them, jobs, the judge, the ledger, the
integrity guard, the config's loader and the views of a study (report, progress,
export, history). It stands on ratchet.core and may import the plug-ins and the job
and evaluator wings. Above it: the fronts (the CLI, `ratchet mcp`); beside it, the
proposers use its meter of spend (spend.py), its sanitiser and its prompt budget. The
backends never import it (tests/test_import_rules.py).
"""
