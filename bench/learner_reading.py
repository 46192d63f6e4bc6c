"""What one reading costs the learner while sessions are admitted fast (the periodic
sample runs it on the event loop, four times a second).

    .venv/bin/python bench/learner_reading.py [--seconds 120]

A ``SessionLearner`` that knows its route (a footprint of 0, as a route whose sessions
hold no memory of their own) is told of sessions admitted at 1, 5, 20 and 200 a second
for ``--seconds`` of fake time, each answering 3 ms after its admission and none
ending (sessions that live longer than the run), on a flat working set, with a reading
every 0.25 s. Printed per rate: the mean and the longest time of one reading, which is
how long the event loop stalls for it.
"""

from __future__ import annotations

import argparse
import sys
import time

from asgi_admission._admission.reservations.learning import SessionLearner
from benchkit import MIB

READ_EVERY_S = 0.25
ROUTE = "POST /sessions"


def reading_cost(rate_per_s: float, seconds: float) -> tuple[float, float, int]:
    """Mean and longest ms of one reading, and how many readings, at ``rate_per_s``."""
    learner = SessionLearner(timeout_s=120)
    learner.observe(ROUTE, footprint_bytes=0)
    used = 300 * MIB
    step = 1.0 / rate_per_s
    now = 0.0
    next_read = 0.0
    times: list[float] = []
    while now < seconds:
        now += step
        learner.on_admit(ROUTE, used, now, responded=False)
        learner.on_response(now, now + 0.003)
        while next_read <= now:
            started = time.perf_counter()
            learner.on_reading(used, next_read + 0.004)
            times.append(time.perf_counter() - started)
            next_read += READ_EVERY_S
    return sum(times) / len(times) * 1e3, max(times) * 1e3, len(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {args.seconds:g} s of admissions, none ending")
    for rate in (1.0, 5.0, 20.0, 200.0):
        mean_ms, worst_ms, readings = reading_cost(rate, args.seconds)
        print(
            f"{rate:5g} sessions/s: one reading {mean_ms:7.2f} ms mean, "
            f"{worst_ms:7.2f} ms longest ({readings} readings)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
