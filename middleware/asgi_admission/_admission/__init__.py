"""Admission, in four parts: the decision, the reservations, the ledger that counts, and the
wait queue's scheduling."""
