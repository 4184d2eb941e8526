"""The driver wing: the study's own, trusted process.

study (the front the CLI calls), the two policies (rounds, rolling) over the loop they
share (settle) and the proposals made for them, jobs, the judge, the ledger, the
integrity guard and the views of a study (report, progress, export, history). It may
import every other wing; nothing imports it but the CLI.
"""
