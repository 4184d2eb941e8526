"""The views: what a person reads of a study (pages, charts, the report, `ratchet serve`,
progress.png, `log` / `diff` / `export`, `show` / `wait --json`). They read the ledger,
never write it, and stand on the driver's read functions (spend, budget, tally, views);
the driver never imports them."""
