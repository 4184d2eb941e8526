"""The driver wing: the study's own, trusted process: the loop.

study (the front the CLI calls), the two policies (rounds, rolling) over the loop they
share (settle) and the proposals made for them, jobs, the judge, the integrity guard,
the config's loader, the spend and budget sums, and the loop's own outputs (its lines,
results.tsv). It stands on ratchet.core and the ledger (ratchet.store) and may import
the plug-ins and the job and evaluator wings. Above it: the views (ratchet.ui) and the
fronts (the CLI, `ratchet mcp`), which hand the study its watchers ([notify]). The
plug-ins never import it (tests/test_import_rules.py).
"""
