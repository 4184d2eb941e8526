"""The store: the ledger every other wing stands on (below the plug-ins, the driver and
the views; above core alone). The driver writes a study's rows; a proposer's `Meter`
writes its calls; the views and `ratchet serve` read it."""
