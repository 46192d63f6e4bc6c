"""Stuck pressure: a latch that nothing the guard admitted can clear.

A set latch normally waits for sessions: they settle, end and free their memory,
and the working set falls to the resume threshold. Where it stays set with no
session pending, the same sessions open, and the working set less what those
sessions account for still holding it, the memory is the server's own (a leak, a
cache that never shrinks): after ``stuck_after_s`` of that the pressure is
*stuck* (docs/operations.md).

Notes:

- :class:`StuckDetector` is a pure state machine over looks (latched or not, one
  reading, the counts); it knows nothing of ASGI, files, logging or Prometheus.
- What the guard's sessions account for is what it admits them with: one reserve
  per counted session (active or pending), the configured or derived one raised by
  what was learned (``AdmissionController.reserve_for``). That overstates small
  sessions, so the unattributed rest is a lower bound and the pressure is called
  stuck late rather than early: a restart drops every session the pod holds.
- Any change in the counts (a session ending, one admitted by another worker)
  starts the stretch again: memory a session held may still be on its way out.
- The liveness answer fails a little after the pressure is stuck:
  :func:`liveness_delay_s` adds up to half the window, fixed per pod from its host
  name, so that every worker of a pod answers alike and replicas that leak alike are
  not restarted at once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final, Literal

from asgi_admission._admission.decision.latch import AdmissionController
from asgi_admission._memory.reading import MemoryReading

#: The liveness answer fails up to this share of the window after the pressure is stuck.
LIVENESS_JITTER_SHARE: Final = 0.5

Change = Literal["holding", "stuck", "cleared"]


def liveness_delay_s(after_s: float, key: str) -> float:
    """How long after the pressure is stuck the liveness answer fails: between 0 and
    ``LIVENESS_JITTER_SHARE * after_s``, the same for every process given ``key``."""
    digest = hashlib.sha256(key.encode()).digest()
    share = int.from_bytes(digest[:8], "big") / 2**64
    return after_s * LIVENESS_JITTER_SHARE * share


@dataclass(frozen=True, slots=True)
class Attribution:
    """The working set split into what the guard's sessions account for and the rest."""

    working_set_bytes: int
    limit_bytes: int
    #: One reserve per counted session, at most the working set.
    attributed_bytes: int
    #: The working set no session of the guard's accounts for: the server's own.
    unattributed_bytes: int


def attribute_working_set(
    controller: AdmissionController, memory: MemoryReading | None, sessions: int
) -> Attribution | None:
    """Split ``memory``'s working set among ``sessions`` counted sessions and the rest;
    ``None`` without a usable reading (blind, or no limit)."""
    if memory is None or not memory.available or memory.used_bytes is None:
        return None
    limit = memory.limit_bytes
    if not limit:
        return None
    used = memory.used_bytes
    attributed = min(used, max(0, sessions) * controller.reserve_for(limit))
    return Attribution(used, limit, attributed, used - attributed)


def holds_latch(controller: AdmissionController, attribution: Attribution) -> bool:
    """Whether the unattributed rest alone keeps the latch set: its clear condition
    (at or below the resume threshold, with room for one reserve under the high
    watermark) fails even with every counted session's memory gone."""
    rest, limit = attribution.unattributed_bytes, attribution.limit_bytes
    below_resume = round(rest * 100 / limit, 2) <= controller.resume_threshold_percent
    return not (below_resume and rest <= controller.ceiling_bytes(limit, 0))


@dataclass(frozen=True, slots=True)
class StuckStatus:
    """What the detector last saw, for the metrics, ``probe`` and the liveness answer."""

    #: Whether the pressure is stuck now.
    stuck: bool
    #: How long the latch has been held by the server's own memory (0: it is not).
    held_s: float
    #: Whether the liveness answer fails (stuck for its jittered delay too).
    liveness_failing: bool
    #: The split at the last look where the latch was held; ``None``: not held.
    attribution: Attribution | None
    #: Sessions counted at that look, ``(active, pending)``.
    sessions: tuple[int, int]


NOT_STUCK: Final = StuckStatus(False, 0.0, False, None, (0, 0))


class StuckDetector:
    """Watches a set latch for the server's own memory holding it (module notes).

    ``after_s`` is the window (0: never stuck); ``liveness_delay_s`` how much longer
    the liveness answer waits to fail (:func:`liveness_delay_s`). Not thread-safe:
    one caller (the guard's watch) feeds it.
    """

    __slots__ = (
        "_attribution",
        "_controller",
        "_counts",
        "_last",
        "_since",
        "_stuck",
        "after_s",
        "liveness_delay_s",
    )

    def __init__(
        self,
        *,
        controller: AdmissionController,
        after_s: float,
        liveness_delay_s: float = 0.0,
    ) -> None:
        if not after_s >= 0:
            raise ValueError(f"after_s must be 0 (off) or more seconds; got {after_s!r}.")
        if not liveness_delay_s >= 0:
            raise ValueError(f"liveness_delay_s must be 0 or more; got {liveness_delay_s!r}.")
        self._controller = controller
        self.after_s = float(after_s)
        self.liveness_delay_s = float(liveness_delay_s)
        #: When the latch began to be held by the server's own memory; ``None``: it is not.
        self._since: float | None = None
        self._counts = (0, 0)
        self._attribution: Attribution | None = None
        self._stuck = False
        self._last = 0.0

    @property
    def watching(self) -> bool:
        """Whether a stretch is under way (the latch held by the rest alone)."""
        return self._since is not None

    def observe(
        self,
        now: float,
        *,
        latched: bool,
        memory: MemoryReading | None,
        active: int,
        pending: int,
    ) -> Change | None:
        """One look at ``now``: whether the latch is set, the reading it was decided on,
        the session counts. What changed: a stretch began (``"holding"``), the pressure
        became stuck, or a stuck pressure (or a stretch) ended (``"cleared"``)."""
        self._last = now
        counts = (active, pending)
        attribution = None
        held = latched and pending == 0 and self.after_s > 0
        if held:
            attribution = attribute_working_set(self._controller, memory, active + pending)
            held = attribution is not None and holds_latch(self._controller, attribution)
        if not held:
            was = self._since is not None
            self._since = None
            self._attribution = None
            if self._stuck:
                self._stuck = False
                return "cleared"
            return "cleared" if was else None
        self._attribution = attribution
        if self._since is None or counts != self._counts:
            # A new stretch: the first look, or sessions moved (one that ended may still
            # be freeing its memory).
            restarted = self._stuck
            self._since = now
            self._counts = counts
            self._stuck = False
            return "cleared" if restarted else "holding"
        if not self._stuck and now - self._since >= self.after_s:
            self._stuck = True
            return "stuck"
        return None

    def status(self, now: float | None = None) -> StuckStatus:
        """What the last look found, with the times reckoned at ``now`` (default: then)."""
        if self._since is None:
            return NOT_STUCK
        at = self._last if now is None else now
        held_s = max(0.0, at - self._since)
        return StuckStatus(
            stuck=self._stuck,
            held_s=held_s,
            liveness_failing=self._stuck and held_s >= self.after_s + self.liveness_delay_s,
            attribution=self._attribution,
            sessions=self._counts,
        )
