"""The probes of every worker in one file of ``ADMISSION_SHARED_DIR`` (``asgi-admission.probing``).

With the shared ledger the workers of a container probe a route not learned yet
together: ``probe_sessions`` counts the probes of the whole container, and a
worker's waiters go on once another worker's probe has shown its memory
(``probing.py``, ``docs/reservations.md``).

Notes:

- The file is JSON, small (a window per route being probed, a few numbers each),
  and read and written only inside the ledger's critical section, so the workers
  never race on it; its own ``flock`` (exclusive to write, shared to read) keeps
  ``asgi-admission probe`` from reading half a write.
- It is opened as the ledger's other files are (``safe_files.open_private_file``):
  a new file ``0600``, an existing one a regular file of this user, else the error
  names ``ADMISSION_SHARED_DIR``. Once the service runs, a fault never raises: a
  file that cannot be used is logged once (each worker then goes on with the
  windows it last saw, probing on its own), and a malformed one is replaced.
- Only touched while something is being probed: a decision for a route not learned
  yet, and the samples of a worker with probes or waiters of its own.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from typing import Any, Final

from asgi_admission._admission.ledger.safe_files import (
    SHARED_DIR_SETTING,
    open_private_file,
    process_alive,
)
from asgi_admission._admission.reservations.probe_window import Probe, ProbeWindow

logger = logging.getLogger("asgi_admission")

PROBING_FILE: Final = "asgi-admission.probing"


def encode(windows: dict[str, ProbeWindow]) -> bytes:
    """The file's contents for ``windows``."""
    routes = {
        route: {
            "started_at": w.started_at,
            "base": w.base_bytes,
            "guess": w.guess_bytes,
            "peak": w.peak_bytes,
            "last_peak_at": w.last_peak_at,
            "last_event_at": w.last_event_at,
            "probes": [[p.pid, p.seq, p.responded] for p in w.probes],
            "admitted": w.admitted,
            "peaks": [[t, used] for t, used in w.peaks],
            "mixed": w.mixed,
            "ended": w.ended,
            "visible_at": w.visible_at,
            "footprint": w.footprint_bytes,
            "ramp_s": w.ramp_s,
            "concluded_at": w.concluded_at,
            "waiting": {str(pid): n for pid, n in w.waiting.items()},
        }
        for route, w in windows.items()
    }
    return json.dumps({"version": 1, "routes": routes}, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, ProbeWindow]:
    """The windows in the file's contents; ``ValueError`` when they are not a probing file."""
    if not data.strip():
        return {}
    try:
        routes: dict[str, Any] = json.loads(data)["routes"]
        return {str(route): _window(str(route), values) for route, values in routes.items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a probing file this version reads ({exc!r})") from None


def _window(route: str, v: dict[str, Any]) -> ProbeWindow:
    def optional(key: str) -> float | None:
        value = v.get(key)
        return None if value is None else float(value)

    footprint = v.get("footprint")
    return ProbeWindow(
        route=route,
        started_at=float(v["started_at"]),
        base_bytes=int(v["base"]),
        guess_bytes=int(v["guess"]),
        peak_bytes=int(v["peak"]),
        last_peak_at=float(v["last_peak_at"]),
        last_event_at=float(v["last_event_at"]),
        probes=[Probe(int(pid), int(seq), bool(done)) for pid, seq, done in v["probes"]],
        admitted=int(v["admitted"]),
        peaks=[(float(t), int(used)) for t, used in v["peaks"]],
        mixed=bool(v["mixed"]),
        ended=bool(v["ended"]),
        visible_at=optional("visible_at"),
        footprint_bytes=None if footprint is None else int(footprint),
        ramp_s=float(v["ramp_s"]),
        concluded_at=optional("concluded_at"),
        waiting={int(pid): int(n) for pid, n in v["waiting"].items()},
    )


class SharedProbeStore:
    """The windows of every worker, in one file; used inside the ledger's lock."""

    __slots__ = ("_broken", "_directory", "path")

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self.path = os.path.join(directory, PROBING_FILE)
        self._broken = False
        # At startup a file that cannot be used is an error naming the setting.
        os.close(open_private_file(directory, PROBING_FILE, setting=SHARED_DIR_SETTING))

    def load(self) -> dict[str, ProbeWindow] | None:
        fd = self._open()
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            data = os.pread(fd, os.fstat(fd).st_size, 0)
        except OSError as exc:
            self._unusable(exc)
            return None
        finally:
            os.close(fd)
        try:
            return decode(data)
        except ValueError:
            logger.warning(
                "asgi-admission: %s is not a probing file this version reads; it is "
                "replaced by the probes from now on.",
                self.path,
            )
            return {}

    def store(self, windows: dict[str, ProbeWindow]) -> None:
        fd = self._open()
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = encode(windows)
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except OSError as exc:
            self._unusable(exc)
        finally:
            os.close(fd)

    def owner_alive(self, pid: int) -> bool:
        return process_alive(pid)

    @property
    def shared(self) -> bool:
        return True

    def _open(self) -> int | None:
        try:
            fd = open_private_file(self._directory, PROBING_FILE, setting=SHARED_DIR_SETTING)
        except (OSError, ValueError) as exc:
            self._unusable(exc)
            return None
        if self._broken:
            self._broken = False
            logger.warning("asgi-admission: the probing file %s is usable again.", self.path)
        return fd

    def _unusable(self, exc: BaseException) -> None:
        if not self._broken:
            self._broken = True
            logger.warning(
                "asgi-admission: the probing file %s cannot be used (%s); each worker "
                "probes on its own until it can.",
                self.path,
                exc,
            )


def read_probing(directory: str) -> dict[str, ProbeWindow] | None:
    """The probing file in ``directory`` for ``probe``; ``None`` when there is none.

    ``OSError`` or ``ValueError`` when it cannot be read.
    """
    path = os.path.join(directory, PROBING_FILE)
    if not os.path.isfile(path):
        return None
    fd = open_private_file(directory, PROBING_FILE, setting=SHARED_DIR_SETTING)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        data = os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)
    return decode(data)
