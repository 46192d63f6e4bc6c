"""The reservations: settling, tickets, learning and probing of the sessions admitted."""
