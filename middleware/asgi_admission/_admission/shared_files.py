"""The reservation state the workers of a container share in ``ADMISSION_SHARED_DIR``.

Two small files beside the session ledger: the settling queue
(``asgi-admission.settling``, fixed binary rows) and what was learned of each
route (``asgi-admission.learned``, JSON). Both are read and written inside the
ledger's critical section (its ``flock`` serialises the workers), or, for the
learned file, under its own ``flock``.

Notes:

- ``open_private`` opens them with the care a shared directory needs: no
  symlink is followed (``O_NOFOLLOW``), a new file is ``0600``, and an existing
  one must be a regular file owned by this user and closed to everyone else,
  else the error names ``ADMISSION_SHARED_DIR``. It is one function so that a
  project-wide safe-open helper can replace it.
- A malformed settling file is rebuilt empty (reservations in it then settle by
  time); a malformed learned file is replaced (what it held is learned again).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
import struct
from collections.abc import Iterator
from typing import Final

from asgi_admission._admission.settling import QueueRecord

logger = logging.getLogger("asgi_admission")

SETTLING_FILE: Final = "asgi-admission.settling"
LEARNED_FILE: Final = "asgi-admission.learned"
SETTLING_MAGIC: Final = b"ASGISET1"
#: Rows in the settling file: far more unsettled sessions than one container holds.
SETTLING_CAPACITY: Final = 4096

_HEADER: Final = struct.Struct("=8sIIq")  # magic, capacity, rows in use, floor (-1: none)
_ROW: Final = struct.Struct("=qqdqq?7x")  # pid, seq, admitted at, base, expected, placeholder


def open_private(path: str) -> int:
    """Open (or create, ``0600``) a file of the shared directory, refusing what is unsafe.

    Raises ``ValueError`` naming ``ADMISSION_SHARED_DIR`` for a symlink, a file
    that is not regular, one owned by another user, or one others may read.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise ValueError(
            f"ADMISSION_SHARED_DIR: cannot open {path}: {why}. Point ADMISSION_SHARED_DIR at "
            "a directory only this service's user can write."
        ) from exc
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "it is not a regular file"
    elif info.st_uid != os.geteuid():
        problem = f"it is owned by uid {info.st_uid}, not by this process's uid {os.geteuid()}"
    elif info.st_mode & 0o077:
        problem = f"its mode {stat.S_IMODE(info.st_mode):04o} lets other users in"
    if problem is not None:
        os.close(fd)
        raise ValueError(
            f"ADMISSION_SHARED_DIR: refusing {path}: {problem}. Remove it, or point "
            "ADMISSION_SHARED_DIR at a directory only this service's user can write."
        )
    return fd


def prepare_dir(directory: str) -> None:
    """Create the shared directory (``0700``) if needed; ``ValueError`` naming the setting."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"ADMISSION_SHARED_DIR={directory!r} cannot be created: {exc.strerror or exc}."
        ) from exc


class SharedSettleQueue:
    """The settling queue of every worker, in one file; used inside the ledger's lock."""

    __slots__ = ("_fd", "path")

    def __init__(self, directory: str) -> None:
        prepare_dir(directory)
        self.path = os.path.join(directory, SETTLING_FILE)
        self._fd = open_private(self.path)
        with self._exclusive():
            header = os.pread(self._fd, _HEADER.size, 0)
            if not self._usable(header):
                self._reset(None if not header else "an unreadable header")

    def _usable(self, header: bytes) -> bool:
        if len(header) < _HEADER.size:
            return False
        magic, capacity, count, _floor = _HEADER.unpack(header)
        return bool(magic == SETTLING_MAGIC and capacity == SETTLING_CAPACITY and count <= capacity)

    def _reset(self, problem: str | None) -> None:
        if problem is not None:
            logger.warning(
                "asgi-admission: the shared settling queue %s was unusable (%s); starting "
                "it afresh. Sessions in it settle by time.",
                self.path,
                problem,
            )
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, _HEADER.pack(SETTLING_MAGIC, SETTLING_CAPACITY, 0, -1), 0)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def load(self) -> tuple[int | None, list[QueueRecord]]:
        header = os.pread(self._fd, _HEADER.size, 0)
        if not self._usable(header):
            self._reset("an unreadable header")
            return None, []
        _magic, _capacity, count, floor = _HEADER.unpack(header)
        if not count:
            return None, []
        data = os.pread(self._fd, count * _ROW.size, _HEADER.size)
        records = [
            QueueRecord(pid, seq, admitted_at, base, expected, placeholder)
            for pid, seq, admitted_at, base, expected, placeholder in _ROW.iter_unpack(
                data[: len(data) - len(data) % _ROW.size]
            )
        ]
        return (None if floor < 0 else floor), records

    def store(self, floor: int | None, records: list[QueueRecord]) -> None:
        if len(records) > SETTLING_CAPACITY:
            logger.warning(
                "asgi-admission: the shared settling queue %s is full; the oldest entries "
                "are dropped and settle by time.",
                self.path,
            )
            records = records[-SETTLING_CAPACITY:]
        rows = b"".join(
            _ROW.pack(r.pid, r.seq, r.admitted_at, r.base_bytes, r.expected_bytes, r.placeholder)
            for r in records
        )
        header = _HEADER.pack(
            SETTLING_MAGIC, SETTLING_CAPACITY, len(records), -1 if floor is None else floor
        )
        os.pwrite(self._fd, header + rows, 0)

    def owner_alive(self, pid: int) -> bool:
        if pid == os.getpid():
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    @property
    def shared(self) -> bool:
        return True

    def after_fork(self) -> None:
        # flock belongs to the open file description: a child opens its own.
        os.close(self._fd)
        self._fd = open_private(self.path)

    def close(self) -> None:
        os.close(self._fd)


Observations = dict[str, dict[str, list[float]]]


class LearnedStore:
    """What the workers learned, per route, in one JSON file that outlives them."""

    __slots__ = ("path", "window")

    def __init__(self, directory: str, *, window: int) -> None:
        prepare_dir(directory)
        self.path = os.path.join(directory, LEARNED_FILE)
        self.window = window
        os.close(open_private(self.path))

    def load(self) -> Observations:
        """The observations in the file; empty when it has none or is unreadable."""
        fd = open_private(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return self._parse(_read_all(fd))
        finally:
            os.close(fd)

    def add(self, new: list[tuple[str, int, float | None]]) -> Observations:
        """Append ``(route, footprint, ramp)`` observations; the merged result."""
        fd = open_private(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            merged = self._parse(_read_all(fd))
            for route, footprint, ramp in new:
                values = merged.setdefault(route, {"footprints": [], "ramps": []})
                values["footprints"] = [*values["footprints"], float(footprint)][-self.window :]
                if ramp is not None:
                    values["ramps"] = [*values["ramps"], float(ramp)][-self.window :]
            data = json.dumps({"version": 1, "routes": merged}, separators=(",", ":")).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            return merged
        finally:
            os.close(fd)

    def _parse(self, data: bytes) -> Observations:
        if not data.strip():
            return {}
        try:
            routes = json.loads(data)["routes"]
            return {
                str(route): {
                    "footprints": [float(v) for v in values["footprints"]][-self.window :],
                    "ramps": [float(v) for v in values["ramps"]][-self.window :],
                }
                for route, values in routes.items()
            }
        except (ValueError, KeyError, TypeError, AttributeError):
            logger.warning(
                "asgi-admission: %s is not a learned-sessions file this version reads; "
                "it is replaced by what is learned from now on.",
                self.path,
            )
            return {}


def _read_all(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size, 0)


def read_learned(directory: str, *, window: int) -> Observations | None:
    """The learned file in ``directory`` for ``probe``; ``None`` when there is none."""
    path = os.path.join(directory, LEARNED_FILE)
    if not os.path.isfile(path):
        return None
    return LearnedStore(directory, window=window).load()
