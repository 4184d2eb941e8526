"""The domain: what a study is made of, importing only the standard library and pydantic.

- `vocab`: the words a study is recorded in (a candidate's Status and Kind, a job's
  Outcome and JobState, a proposer call's CallOutcome), StrEnums whose values are the
  stored text;
- `candidate`: the records (Proposal, a frozen Candidate, the Incumbent);
- `verdict`: the judge's Verdict and its Reason code;
- `config`: `ratchet.toml`'s schema (pydantic); its loader, which knows the plug-in
  registries, is ratchet.driver.config;
- `errors`: one base error, the user's errors and the one infrastructure error;
- `plugins`: the entry-point loader every registry uses;
- `stats`, `paths`: the keep rule's arithmetic and the path rules, pure functions;
- `sanitize`: text an untrusted party wrote, made safe to show, store and prompt with.

The ledger (store), the driver, the plug-ins (backends, proposers), the views (ui) and
the CLI import core; core imports none of them (tests/test_import_rules.py). This
package's own import loads nothing, and every module here but `config` is standard
library only, so the job side and the evaluator SDK may use `vocab`, `errors` and
`stats` too.
"""
