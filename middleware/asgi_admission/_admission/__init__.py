"""Admission: the latch, the ledgers, and the reservations that outlive a response."""
