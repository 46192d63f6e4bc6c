"""The stuck-pressure gauges, collected with the guard's other scrape-time figures.

``asgi_admission_pressure_stuck`` is 1 while any guard described calls its
pressure stuck (its last look, from its lifespan watch or its liveness path);
``asgi_admission_unattributed_bytes`` is the working set less one reserve per
counted session (``_admission/decision/stuck.py``), from the scrape's own reading.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from asgi_admission._admission.decision.observer import AdmissionView
from asgi_admission._admission.decision.stuck import StuckWatch, attribute_working_set
from asgi_admission._memory.reading import MemoryReading
from asgi_admission._metrics.decisions import PREFIX


def stuck_families(
    views: Sequence[AdmissionView],
    reading: MemoryReading | None,
    counts: tuple[int, int] | None,
    *,
    describing: bool,
) -> Iterator[Metric]:
    """The two gauges for ``views`` (the newest last), ``reading`` and the summed
    ``counts``; both families, empty, when ``describing``."""
    stuck = GaugeMetricFamily(
        PREFIX + "pressure_stuck",
        "1 while the latch has been held by the server's own memory (no session pending, "
        "the same sessions open, their reserves not enough to clear it) for "
        "ADMISSION_STUCK_AFTER_SECONDS; 0 otherwise.",
    )
    rest = GaugeMetricFamily(
        PREFIX + "unattributed_bytes",
        "Working set no session of the guard's accounts for (the working set less one "
        "reserve per active or pending session): the server's own memory.",
    )
    if describing:
        yield from (stuck, rest)
        return
    watches = [w for w in (getattr(v, "stuck", None) for v in views) if isinstance(w, StuckWatch)]
    if watches:
        stuck.add_metric((), int(any(watch.status().stuck for watch in watches)))
        yield stuck
    if views and counts is not None:
        split = attribute_working_set(views[-1].controller, reading, counts[0] + counts[1])
        if split is not None:
            rest.add_metric((), split.unattributed_bytes)
            yield rest
