"""What the metrics cost: per session decision, and per scrape.

    .venv/bin/python bench/metrics.py [--iterations 200000] [--scrapes 2000]

Decision: times ``AdmissionService.admit("http")`` (read, latch, reserve,
observer) plus the release of its reservation, with a fixed in-memory reader so
that only the guard's own work is measured, once with ``registry=None`` (no
metrics) and once with a fresh registry, interleaved in rounds so that drift in
the machine hits both alike. Also times ``DecisionMetrics.on_decision`` alone.
Scrape: ``generate_latest`` of the registry holding the scrape-time collector
and the counters, against an empty registry, and the OpenMetrics encoding.
Prints medians of per-round means in microseconds. Target: metrics add at most
2 µs to a decision.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from asgi_admission import (
    AdmissionController,
    AdmissionMiddleware,
    AdmissionTicket,
    MemoryReading,
)
from asgi_admission._metrics.decisions import DecisionMetrics
from benchkit import MIB

TARGET_ADDED_US = 2.0
READING = MemoryReading(
    used_bytes=300 * MIB, limit_bytes=1000 * MIB, available=True, reclaimable_bytes=MIB
)


async def _app(scope: object, receive: object, send: object) -> None:
    return None


def guard(registry: CollectorRegistry | None) -> AdmissionMiddleware:
    return AdmissionMiddleware(
        _app,
        session_routes=["POST /sessions"],
        controller=AdmissionController(memory_reader=lambda: READING, reserve_bytes=10 * MIB),
        max_sessions=1_000_000,
        registry=registry,
    )


def decision_loop(middleware: AdmissionMiddleware) -> Callable[[int], float]:
    admit = middleware.service.admit

    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            reservation = admit("http")
            assert isinstance(reservation, AdmissionTicket)
            reservation.release()
        return (time.perf_counter() - start) / n * 1e6

    return run


def rounds(cases: dict[str, Callable[[int], float]], n: int, count: int = 15) -> dict[str, float]:
    """Median over ``count`` interleaved rounds of each case's mean µs per call."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for run in cases.values():
        run(max(1, n // 10))  # warm up
    gc.disable()
    try:
        for _ in range(count):
            for name, run in cases.items():
                samples[name].append(run(n))
    finally:
        gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--scrapes", type=int, default=2_000)
    args = parser.parse_args()
    per_round = max(1, args.iterations // 15)

    metrics = DecisionMetrics(registry=None)
    decision = AdmissionController(memory_reader=lambda: READING).evaluate(0, 16)

    def observe(n: int) -> float:
        on_decision = metrics.on_decision
        start = time.perf_counter()
        for _ in range(n):
            on_decision("http", decision, 4e-6)
        return (time.perf_counter() - start) / n * 1e6

    registry = CollectorRegistry()
    decisions = rounds(
        {
            "without metrics": decision_loop(guard(None)),
            "with metrics": decision_loop(guard(registry)),
            "on_decision alone": observe,
        },
        per_round,
    )
    added = decisions["with metrics"] - decisions["without metrics"]
    print(f"session decision ({per_round} x 15 rounds, median of round means):")
    for name, us in decisions.items():
        print(f"  {name:<20} {us:8.3f} µs")
    verdict = "ok" if added <= TARGET_ADDED_US else "OVER TARGET"
    print(
        f"  {'added by metrics':<20} {added:8.3f} µs  (target <= {TARGET_ADDED_US} µs: {verdict})"
    )

    empty = CollectorRegistry()
    scrape_rounds = max(1, args.scrapes // 15)

    def scrape(target: CollectorRegistry, encode: Callable[[CollectorRegistry], bytes]):  # type: ignore[no-untyped-def]
        def run(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                encode(target)
            return (time.perf_counter() - start) / n * 1e6

        return run

    scrapes = rounds(
        {
            "empty registry": scrape(empty, generate_latest),
            "text": scrape(registry, generate_latest),
            "openmetrics": scrape(registry, generate_openmetrics),
        },
        scrape_rounds,
    )
    print(f"one scrape ({scrape_rounds} x 15 rounds):")
    for name, us in scrapes.items():
        print(f"  {name:<20} {us:8.1f} µs")
    print(
        f"  {'added by metrics':<20} {scrapes['text'] - scrapes['empty registry']:8.1f} µs (text)"
    )
    return 0 if added <= TARGET_ADDED_US else 1


if __name__ == "__main__":
    raise SystemExit(main())
