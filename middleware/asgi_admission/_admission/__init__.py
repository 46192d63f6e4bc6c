"""Admission, in three rooms: the decision, the reservations, and the ledger that counts."""
