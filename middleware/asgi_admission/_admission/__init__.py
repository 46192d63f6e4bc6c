"""Deciding admission: the latch, and the ledgers that count pending and active sessions."""
