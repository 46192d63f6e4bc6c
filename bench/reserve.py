"""What deriving the reserve from the limit costs the latch, against a configured one.

    .venv/bin/python bench/reserve.py [--number 200000]

Times ``AdmissionController.decide`` on one admitting reading (100 MiB of 4 GiB), in
the same run, with a configured 64 MiB reserve and with the reserve unset (derived
from the limit by ``reserve_for``), and prints the best of seven runs in nanoseconds
and their ratio.
"""

from __future__ import annotations

import argparse
import timeit

from asgi_admission import AdmissionController, MemoryReading
from benchkit import MIB


def best_ns(controller: AdmissionController, reading: MemoryReading, number: int) -> float:
    """The best of seven runs of ``number`` decisions, per decision, in nanoseconds."""
    runs = timeit.repeat(lambda: controller.decide(reading, 0, 100), number=number, repeat=7)
    return min(runs) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args()
    reading = MemoryReading(used_bytes=100 * MIB, limit_bytes=4096 * MIB, available=True)
    configured = AdmissionController(memory_reader=lambda: reading, reserve_bytes=64 * MIB)
    derived = AdmissionController(memory_reader=lambda: reading)
    configured_ns = best_ns(configured, reading, args.number)
    derived_ns = best_ns(derived, reading, args.number)
    print(f"decide, configured reserve: {configured_ns:.0f} ns")
    print(f"decide, derived reserve:    {derived_ns:.0f} ns ({derived_ns / configured_ns:.2f}x)")


if __name__ == "__main__":
    main()
