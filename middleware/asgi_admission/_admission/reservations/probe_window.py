"""A probe window: one route's probes from the first one's admission until their evidence
is in, and how an open one is reported.

The board (``probing.py``) opens, feeds and concludes windows; they are kept in this
process or in the workers' shared file (``probe_store.py``, ``shared_probes.py``), and
``describe`` reports an open one for the metrics, ``probe`` and the refusal details.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from asgi_admission._admission.reservations.settle_queue import VISIBLE_FRACTION
from asgi_admission._admission.reservations.window_records import QUIET_S

#: How long after the probes' responses memory already visible must stay without a
#: new peak before it counts as all there: one periodic sample.
CONFIRM_S: Final = 0.25
#: A new peak must beat the last by this share of the growth so far (or 256 KiB), as
#: for the learner's episodes.
_PEAK_STEP: Final = 0.01
_MIN_STEP: Final = 256 * 1024
#: The peaks kept per window for its ramp time (halved when full).
_MAX_PEAKS: Final = 64


@dataclass(slots=True)
class Probe:
    """One probe session: its worker, its sequence number there, whether it answered."""

    pid: int
    seq: int
    responded: bool = False


@dataclass(slots=True)
class ProbeWindow:
    """A route's probes from the first one's admission until their evidence is in."""

    route: str
    started_at: float
    base_bytes: int
    #: The reserve the probes were admitted with (the guess).
    guess_bytes: int
    peak_bytes: int
    last_peak_at: float
    #: The last probe's admission or response.
    last_event_at: float
    probes: list[Probe] = field(default_factory=list)
    #: Probes that opened a session (admitted less those that opened nothing).
    admitted: int = 0
    peaks: list[tuple[float, int]] = field(default_factory=list)
    #: Another session was admitted meanwhile (its growth counts here too).
    mixed: bool = False
    #: A session ended meanwhile (memory freed may hide the probes').
    ended: bool = False
    #: When every probe had answered with its memory visible.
    visible_at: float | None = None
    #: Set once concluded: the footprint one session is taken to add.
    footprint_bytes: int | None = None
    ramp_s: float = 0.0
    concluded_at: float | None = None
    #: Requests waiting for this window, per worker (for the metrics and ``probe``).
    waiting: dict[int, int] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return self.footprint_bytes is None

    def per_probe(self) -> int:
        """The growth since the first probe's admission, per probe that opened a session."""
        return max(0, self.peak_bytes - self.base_bytes) // max(1, self.admitted)

    def ramp(self) -> float:
        """Seconds from the first admission until the working set first reached 90 % of
        the peak growth."""
        reached = self.base_bytes + VISIBLE_FRACTION * max(0, self.peak_bytes - self.base_bytes)
        when = next((t for t, used in self.peaks if used >= reached), self.last_peak_at)
        return max(0.0, when - self.started_at)

    def see(self, used_bytes: int, now: float) -> None:
        """A reading: a new peak when it beats the last by a step."""
        step = max(_MIN_STEP, int((self.peak_bytes - self.base_bytes) * _PEAK_STEP))
        if used_bytes > self.peak_bytes + step or (
            used_bytes > self.peak_bytes and self.peak_bytes == self.base_bytes
        ):
            self.peak_bytes = used_bytes
            self.last_peak_at = now
            if len(self.peaks) >= _MAX_PEAKS:
                del self.peaks[1::2]
            self.peaks.append((now, used_bytes))
        elif used_bytes > self.peak_bytes:
            self.peak_bytes = used_bytes

    def quiet(self, now: float) -> bool:
        """Whether every probe has answered and the memory has stopped growing."""
        if any(not probe.responded for probe in self.probes):
            return False
        if (
            self.visible_at is not None
            and now - self.visible_at >= CONFIRM_S
            and self.last_peak_at <= self.visible_at
        ):
            return True
        spell = max(QUIET_S, 0.5 * (self.last_peak_at - self.started_at))
        return now - max(self.last_peak_at, self.last_event_at) >= spell


@dataclass(frozen=True, slots=True)
class ProbeStatus:
    """One route being probed, for the metrics, ``probe`` and the refusal details."""

    route: str
    #: Probes admitted and not yet concluded.
    probes: int
    #: Requests waiting for their evidence (every worker's, as last written).
    waiting: int
    since_s: float
    growth_bytes: int
    guess_bytes: int


def describe(window: ProbeWindow, now: float, pid: int, waiting_here: int) -> ProbeStatus:
    """One open window as its :class:`ProbeStatus`; ``waiting_here`` counts this process's."""
    others = sum(n for worker, n in window.waiting.items() if worker != pid)
    return ProbeStatus(
        route=window.route,
        probes=len(window.probes),
        waiting=others + waiting_here,
        since_s=round(max(0.0, now - window.started_at), 2),
        growth_bytes=max(0, window.peak_bytes - window.base_bytes),
        guess_bytes=window.guess_bytes,
    )
