"""The ledger: counting sessions, in one process or in a file the workers share."""
