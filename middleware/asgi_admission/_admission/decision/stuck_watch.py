"""The guard's watch for stuck pressure: its looks, its log lines and its shared file.

``StuckWatch`` feeds a :class:`StuckDetector` (``stuck.py``) from the app's
lifespan: while the latch is set it runs the readiness check (which reads memory
and may clear the latch, as a readiness probe would) about once a second, and
while it is clear it reads nothing. Where the server runs no lifespan, the
liveness path's own requests take the looks. The decision path never calls it.

Notes:

- A look only ever tries the shared ledger (``LedgerBusy``: skipped until the
  next); the reading is the latch's own (``pread`` of a few cgroup files), so a
  look never stalls the event loop.
- The pressure becoming stuck is logged once at WARNING with the figures, and its
  end once at INFO, as the latch's own transitions are (``decision_log.py``).
- With a shared directory the status is written to ``asgi-admission.stuck`` there
  at each change (a few hundred bytes), for ``asgi-admission probe``; a file that
  cannot be used is logged once and never stops the service.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any, Final

from asgi_admission._admission.decision.latch import AdmissionController, CapacityDecision
from asgi_admission._admission.decision.stuck import (
    Change,
    StuckDetector,
    StuckStatus,
    liveness_delay_s,
)
from asgi_admission._admission.ledger.ledger import LedgerBusy
from asgi_admission._admission.ledger.safe_files import SHARED_DIR_SETTING, open_private_file
from asgi_admission._config import MIB, AdmissionConfig

logger = logging.getLogger("asgi_admission")

STUCK_FILE: Final = "asgi-admission.stuck"
#: The longest between two looks while the latch is set (a tenth of a shorter window).
LOOK_INTERVAL_S: Final = 1.0

#: One look: the readiness check's decision and the counts it was decided with.
LatchLook = Callable[[], tuple[CapacityDecision, tuple[int, int]]]


class StuckWatch:
    """Looks at a set latch for the detector; logs and publishes what changes.

    ``look`` is the guard's readiness check with its counts (it may raise
    ``LedgerBusy``); ``shared_dir`` where the status file goes (``None``: none).
    """

    def __init__(
        self,
        *,
        detector: StuckDetector,
        controller: AdmissionController,
        look: LatchLook,
        shared_dir: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.detector = detector
        self._controller = controller
        self._look = look
        self._clock = clock
        self._store = None if shared_dir is None else StuckFile(shared_dir)
        #: How many lifespan watches run (:meth:`run`); none: the liveness path looks.
        self.running = 0
        # Whether the pressure was logged as stuck, so that its end is logged once too.
        self._was_logged = False

    @property
    def on(self) -> bool:
        """Whether stuck pressure is watched for at all (a window above 0)."""
        return self.detector.after_s > 0

    @property
    def interval_s(self) -> float:
        return max(0.05, min(LOOK_INTERVAL_S, self.detector.after_s / 10))

    def status(self) -> StuckStatus:
        """What the last look found, reckoned now."""
        return self.detector.status(self._clock())

    def step(self) -> None:
        """One look where there is something to watch; never raises ``LedgerBusy``."""
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
            decision, (active, pending) = self._look()
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
        """Look every :attr:`interval_s` until cancelled (the lifespan runs this)."""
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


def liveness_path_of(
    config: AdmissionConfig, liveness_path: str | None, readiness_path: str | None
) -> str | None:
    """The liveness path a guard serves: ``liveness_path`` when given, else the config's;
    ``ValueError`` naming it for one not starting with ``/`` or equal to the readiness path
    (one path cannot answer both: readiness fails whenever the latch is set)."""
    if liveness_path is None:
        liveness_path = config.liveness_path
    elif not (isinstance(liveness_path, str) and liveness_path.startswith("/")):
        raise ValueError(f"liveness_path must start with '/'; got {liveness_path!r}.")
    if liveness_path is not None and liveness_path == readiness_path:
        raise ValueError(
            f"liveness_path and readiness_path are both {liveness_path!r}; give them "
            "different paths (liveness_path comes from ADMISSION_LIVENESS_PATH when not "
            "given): the readiness path fails whenever the latch is set, and a liveness "
            "probe on it would restart the pod each time."
        )
    return liveness_path


def build_watch(
    config: AdmissionConfig,
    controller: AdmissionController,
    look: LatchLook,
    shared_dir: str | None,
    *,
    host: str | None = None,
) -> StuckWatch:
    """The watch ``config`` describes, its liveness delay fixed by ``host`` (default: this
    machine's host name, the pod's name in Kubernetes, so every worker of a pod agrees)."""
    after_s = config.stuck_after_s
    key = socket.gethostname() if host is None else host
    detector = StuckDetector(
        controller=controller, after_s=after_s, liveness_delay_s=liveness_delay_s(after_s, key)
    )
    return StuckWatch(detector=detector, controller=controller, look=look, shared_dir=shared_dir)


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

    Its ``flock`` is only tried: while another worker or ``probe`` holds it, the status
    waits for the next look (:meth:`flush`), so a look never waits for another process.
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
            return  # held by another process for a moment: at the next look
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
    """The status file in ``directory`` for ``probe``; ``None`` when there is none.

    ``OSError`` or ``ValueError`` when it cannot be read or is not one.
    """
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
