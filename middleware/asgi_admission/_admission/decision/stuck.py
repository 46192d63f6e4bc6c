"""Stuck pressure: a latch that nothing the guard admitted can clear.

What counts as stuck (each counted session accounting for one reserve, so it is called
late rather than early) and the liveness delay: docs/operations.md, "Stuck pressure".
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from asgi_admission._admission.decision.latch import (
    AdmissionController,
    CapacityDecision,
    latched,
)
from asgi_admission._admission.ledger.ledger import LedgerBusy
from asgi_admission._admission.ledger.safe_files import SHARED_DIR_SETTING, open_private_file
from asgi_admission._config import MIB, AdmissionConfig
from asgi_admission._memory.reading import MemoryReading

#: The liveness answer fails up to this share of ``after_s`` after the pressure is stuck.
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
    """Whether the unattributed rest alone keeps the latch set, every session's memory gone."""
    limit = attribution.limit_bytes
    return latched(
        True,
        attribution.unattributed_bytes,
        controller.held(0, limit),
        limit,
        controller.high_watermark_percent,
        controller.resume_threshold_percent,
    )


@dataclass(frozen=True, slots=True)
class StuckStatus:
    """What the detector last saw, for the metrics, ``probe`` and the liveness answer."""

    #: Whether the pressure is stuck now.
    stuck: bool
    #: How long the latch has been held by the server's own memory (0: it is not).
    held_s: float
    #: Whether the liveness answer fails (stuck for its jittered delay too).
    liveness_failing: bool
    #: The split at the last check where the latch was held; ``None``: not held.
    attribution: Attribution | None
    #: Sessions counted at that check, ``(active, pending)``.
    sessions: tuple[int, int]


NOT_STUCK: Final = StuckStatus(False, 0.0, False, None, (0, 0))


class StuckDetector:
    """Watches a set latch for the server's own memory holding it (docs/operations.md).

    ``after_s`` is how long the server's own memory holds the latch before the pressure
    is stuck (0: never); ``liveness_delay_s`` how much longer the liveness answer waits
    to fail (:func:`liveness_delay_s`). Not thread-safe: one caller (the guard's watch)
    feeds it.
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
        # When the latch began to be held by the server's own memory; None: it is not.
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
        """One check at ``now``: whether the latch is set, the reading it was decided on,
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
            was = self._since is not None  # set whenever the pressure is stuck
            self._since = None
            self._attribution = None
            self._stuck = False
            return "cleared" if was else None
        self._attribution = attribution
        if self._since is None or counts != self._counts:
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
        """What the last check found, with the times reckoned at ``now`` (default: then)."""
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


# --------------------------------------------------------------------------------------
# The watch: its checks, its log lines and its shared file (docs/operations.md, "Stuck
# pressure"). A check only tries the shared ledger (``LedgerBusy``: skipped), so it
# never stalls the event loop.

logger = logging.getLogger("asgi_admission")

STUCK_FILE: Final = "asgi-admission.stuck"
#: The longest between two checks while the latch is set (a tenth of a shorter ``after_s``).
CHECK_INTERVAL_S: Final = 1.0

#: One check: the readiness check's decision and the counts it was decided with.
LatchCheck = Callable[[], tuple[CapacityDecision, tuple[int, int]]]


class StuckWatch:
    """Samples at a set latch for the detector; logs and publishes what changes.

    ``check`` is the guard's readiness check with its counts (it may raise
    ``LedgerBusy``); ``shared_dir`` where the status file goes (``None``: none).
    """

    def __init__(
        self,
        *,
        detector: StuckDetector,
        controller: AdmissionController,
        check: LatchCheck,
        shared_dir: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.detector = detector
        self._controller = controller
        self._check = check
        self._clock = clock
        self._store = None if shared_dir is None else StuckFile(shared_dir)
        #: How many lifespan watches run (:meth:`run`); none: the liveness path checks.
        self.running = 0
        self._was_logged = False

    @property
    def on(self) -> bool:
        """Whether stuck pressure is watched for at all (``after_s`` above 0)."""
        return self.detector.after_s > 0

    @property
    def interval_s(self) -> float:
        return max(0.05, min(CHECK_INTERVAL_S, self.detector.after_s / 10))

    def status(self) -> StuckStatus:
        """What the last check found, reckoned now."""
        return self.detector.status(self._clock())

    def step(self) -> None:
        """One check where there is something to watch; never raises ``LedgerBusy``."""
        if not self.on:
            return
        if self._store is not None:
            self._store.flush()
        detector = self.detector
        now = self._clock()
        if self._controller.pressure_state != "pressured":
            if detector.watching:
                self._changed(
                    detector.observe(now, latched=False, memory=None, active=0, pending=0)
                )
            return
        try:
            decision, (active, pending) = self._check()
        except LedgerBusy:
            return
        change = detector.observe(
            self._clock(),
            latched=decision.state == "pressured",
            memory=decision.memory,
            active=active,
            pending=pending,
        )
        self._changed(change)

    async def run(self) -> None:
        """Check every :attr:`interval_s` until cancelled (the lifespan runs this)."""
        self.running += 1
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                try:
                    self.step()
                except Exception:
                    logger.exception(
                        "asgi-admission: the stuck-pressure look failed; trying again."
                    )
        finally:
            self.running -= 1

    def _changed(self, change: Change | None) -> None:
        if change is None:
            return
        status = self.status()
        if change == "stuck":
            self._log_stuck(status)
        elif change == "cleared" and not status.stuck and self._was_logged:
            self._was_logged = False
            logger.info(
                "asgi-admission: memory pressure is no longer stuck: %s.",
                "the latch cleared"
                if self._controller.pressure_state == "normal"
                else "sessions moved, so memory may free; watching afresh",
            )
        if self._store is not None:
            self._store.write(self.detector.after_s, self.detector.liveness_delay_s, status)

    def _log_stuck(self, status: StuckStatus) -> None:
        split = status.attribution
        assert split is not None  # a stuck status always has its split
        self._was_logged = True
        active, _ = status.sessions
        logger.warning(
            "asgi-admission: memory pressure is stuck: the latch has been set for %.0f s "
            "with nothing the guard admitted able to clear it. Working set %.1f MiB of "
            "%.1f MiB (%.1f%%); its %d session(s) account for %.1f MiB; %.1f MiB is the "
            "server's own (a leak or a cache). Sessions are refused until the working set "
            "falls to the resume threshold (%.1f%%); a liveness path fails once it has been "
            "held for %.0f s (docs/operations.md).",
            status.held_s,
            split.working_set_bytes / MIB,
            split.limit_bytes / MIB,
            split.working_set_bytes * 100 / split.limit_bytes,
            active,
            split.attributed_bytes / MIB,
            split.unattributed_bytes / MIB,
            self._controller.resume_threshold_percent,
            self.detector.after_s + self.detector.liveness_delay_s,
        )


def build_watch(
    config: AdmissionConfig,
    controller: AdmissionController,
    check: LatchCheck,
    shared_dir: str | None,
    *,
    host: str | None = None,
) -> StuckWatch:
    """The watch ``config`` describes, its liveness delay fixed by ``host`` (the pod's name)."""
    after_s = config.stuck_after_s
    key = socket.gethostname() if host is None else host
    detector = StuckDetector(
        controller=controller, after_s=after_s, liveness_delay_s=liveness_delay_s(after_s, key)
    )
    return StuckWatch(detector=detector, controller=controller, check=check, shared_dir=shared_dir)


def encode_stuck(after_s: float, delay_s: float, status: StuckStatus, *, now: float) -> bytes:
    """The status file's contents (times as wall-clock seconds)."""
    split = status.attribution
    report: dict[str, Any] = {
        "version": 1,
        "pid": os.getpid(),
        "written_at": now,
        "after_s": after_s,
        "liveness_delay_s": delay_s,
        "held_since": None if split is None else now - status.held_s,
        "stuck": status.stuck,
        "sessions": list(status.sessions),
        "working_set_bytes": None if split is None else split.working_set_bytes,
        "limit_bytes": None if split is None else split.limit_bytes,
        "attributed_bytes": None if split is None else split.attributed_bytes,
        "unattributed_bytes": None if split is None else split.unattributed_bytes,
    }
    return json.dumps(report, separators=(",", ":")).encode()


class StuckFile:
    """``asgi-admission.stuck`` in the shared directory, written at each change.

    Its ``flock`` is only tried, so a check never waits for another process.
    """

    __slots__ = ("_broken", "_directory", "_pending", "path")

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self.path = os.path.join(directory, STUCK_FILE)
        self._broken = False
        self._pending: bytes | None = None

    def write(self, after_s: float, delay_s: float, status: StuckStatus) -> None:
        self._pending = encode_stuck(after_s, delay_s, status, now=time.time())
        self.flush()

    def flush(self) -> None:
        """Write the status not written yet, if any (and if the file is free now)."""
        data = self._pending
        if data is None:
            return
        try:
            fd = open_private_file(self._directory, STUCK_FILE, setting=SHARED_DIR_SETTING)
        except (OSError, ValueError) as exc:
            self._unusable(exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BlockingIOError:
            return  # held by another process for a moment: at the next check
        except OSError as exc:
            self._unusable(exc)
            return
        finally:
            os.close(fd)
        self._pending = None
        if self._broken:
            self._broken = False
            logger.warning("asgi-admission: the stuck-pressure file %s is usable again.", self.path)

    def _unusable(self, exc: BaseException) -> None:
        if not self._broken:
            self._broken = True
            logger.warning(
                "asgi-admission: the stuck-pressure file %s cannot be used (%s); probe will "
                "not show stuck pressure until it can.",
                self.path,
                exc,
            )


def read_stuck(directory: str) -> dict[str, Any] | None:
    """The status file in ``directory`` for ``probe``; ``None`` when there is none."""
    path = os.path.join(directory, STUCK_FILE)
    if not os.path.lexists(path):  # a planted symlink is reported, not taken for none
        return None
    fd = open_private_file(directory, STUCK_FILE, setting=SHARED_DIR_SETTING)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        data = os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)
    try:
        report: dict[str, Any] = json.loads(data)
    except ValueError:
        raise ValueError(f"{path} is not a stuck-pressure file this version reads") from None
    if not isinstance(report, dict) or report.get("version") != 1:
        raise ValueError(f"{path} is not a stuck-pressure file this version reads")
    return report
