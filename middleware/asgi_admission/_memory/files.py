"""Cgroup files kept open and re-read cheaply.

Notes:

- Readings are on the request path (docs/how-it-decides.md has the figures).
  Files are opened once and re-read with ``os.pread`` at offset 0, a fraction of
  what opening them each time costs (the kernel still formats a v1 ``memory.stat``
  on every read; bench/README.md has the figures). A descriptor that fails is
  reopened, since a cgroup is recreated when a container restarts (old descriptors
  then fail with ENODEV).
- Regular files (fixture trees, snapshots) can be replaced under an open
  descriptor without it failing, so for those alone an unlinked file is noticed
  with ``fstat``; cgroupfs files report size 0 yet have content, which is how
  the two are told apart.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Final

from asgi_admission._memory.parse import parse_bytes_value

READ_SIZE: Final = 65536
#: What one value file (memory.current, memory.max, ...) is read with first: a kernel
#: value takes at most 21 bytes, and a small buffer is measurably cheaper for pread to
#: fill. Whatever fills it is read again whole, so an odd file reads as it always did.
VALUE_READ_SIZE: Final = 64
#: The files with many lines; every other file read is a single value.
MULTILINE: Final = frozenset({"memory.stat", "memory.pressure"})


class KeptFile:
    """A file kept open and re-read from offset 0; reopened when it fails."""

    __slots__ = ("_check_unlinked", "_fd", "_size", "path")

    def __init__(self, path: str, size: int = READ_SIZE) -> None:
        self.path = path
        self._size = size
        self._fd = -1
        self._check_unlinked = True

    def _read_fresh(self) -> bytes:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, self._size, 0)
            if len(data) == self._size:
                data = os.pread(fd, READ_SIZE, 0)
        except OSError:
            os.close(fd)
            raise
        # cgroupfs files report size 0 yet have content, and fail with ENODEV once
        # their cgroup is removed. A regular file (a fixture tree, a snapshot) can be
        # replaced under an open descriptor without failing, so only those pay one
        # fstat per read to notice that they were unlinked.
        self._check_unlinked = size > 0 or not data
        self._fd = fd
        return data

    def read(self) -> bytes:
        """The whole file; raises ``OSError`` when it cannot be read even after reopening."""
        fd = self._fd
        if fd < 0:
            return self._read_fresh()
        try:
            if not (self._check_unlinked and os.fstat(fd).st_nlink == 0):
                data = os.pread(fd, self._size, 0)
                if len(data) < self._size:
                    return data
                return os.pread(fd, READ_SIZE, 0)
        except OSError:
            pass
        self.close()
        return self._read_fresh()

    def read_value(self) -> int | None:
        """:meth:`read` as one non-negative integer (``parse_bytes_value``), ``None`` for
        anything else; ``OSError`` as :meth:`read` raises it.

        One call from the fast path of every decision where it made two per file (the
        reading, then the parsing).
        """
        fd = self._fd
        if fd >= 0 and not self._check_unlinked:
            try:
                data = os.pread(fd, self._size, 0)
                if len(data) >= self._size:
                    data = os.pread(fd, READ_SIZE, 0)
            except OSError:
                self.close()
                data = self._read_fresh()
        else:
            data = self.read()
        return parse_bytes_value(data)

    @property
    def is_open(self) -> bool:
        return self._fd >= 0

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):  # closing a descriptor we own
                os.close(fd)


def parent_levels(directory: str, top: str | None, marker: str) -> Iterator[str]:
    """``directory``'s ancestors, nearest first, that hold ``marker``.

    With ``top`` the walk stops there (the mount root); without it, at the first
    ancestor lacking ``marker`` (a hierarchy's root cgroup has no limit files).
    """
    current = os.path.normpath(directory)
    stop = os.path.normpath(top) if top is not None else None
    while current != stop:
        parent = os.path.dirname(current)
        if parent == current or not os.path.exists(os.path.join(parent, marker)):
            return
        yield parent
        current = parent


class KeptFiles:
    """The kept files of one cgroup directory."""

    __slots__ = ("absent", "directory", "files")

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files: dict[str, KeptFile] = {}
        #: Optional files found missing, not looked for again.
        self.absent: set[str] = set()

    def file(self, name: str) -> KeptFile:
        kept = self.files.get(name)
        if kept is None:
            size = READ_SIZE if name in MULTILINE else VALUE_READ_SIZE
            kept = self.files[name] = KeptFile(os.path.join(self.directory, name), size)
        return kept

    def read(self, name: str) -> bytes:
        return self.file(name).read()

    def paths(self) -> list[str]:
        """The files currently open (those that exist and were read)."""
        return [kept.path for kept in self.files.values() if kept.is_open]

    def close(self) -> None:
        for kept in self.files.values():
            kept.close()
