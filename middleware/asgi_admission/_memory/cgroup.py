"""``CgroupMemoryReader``: this process's cgroup memory, read cheaply and safely.

Notes:

- The sources (``_memory/sources.py``) are tried v2 first, then v1; the one
  that last answered is read first next time.
- PSI comes from the v2 directory: in a hybrid layout (v1 memory controller,
  cgroup2 mounted at ``/sys/fs/cgroup/unified``) that is our unified cgroup,
  which for most processes is the root, i.e. machine-wide pressure.
- Nothing here raises on bad files: an unreadable or malformed pair reports
  ``available=False``, so bad data can only make the guard more conservative.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace

from asgi_admission._memory.discover import (
    DEFAULT_CGROUP_MOUNT,
    CgroupLocation,
    discover_cgroup,
    whole_chain_tops,
)
from asgi_admission._memory.files import KeptFile
from asgi_admission._memory.parse import parse_pressure_some_avg10
from asgi_admission._memory.reading import MemoryReading, Reclaimable
from asgi_admission._memory.sources import CgroupSource, V1Source, V2Source

logger = logging.getLogger("asgi_admission")


class CgroupMemoryReader:
    """Reads this process's container memory from its cgroup, v2 first, then v1.

    ``root`` names the cgroup directory to read (v2 files in it, v1 files in
    ``<root>/memory`` or ``<root>``); without it the reader finds its own cgroup
    from ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` (both injectable),
    falling back to ``/sys/fs/cgroup``. Calling the reader takes one reading;
    it never raises, and it is safe to call from several threads.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        reclaimable: Reclaimable = "file",
        proc_self_cgroup: str = "/proc/self/cgroup",
        mountinfo: str = "/proc/self/mountinfo",
        hostfs: str = "/",
        cgroup_namespace: str = "/proc/self/ns/cgroup",
    ) -> None:
        if reclaimable not in ("file", "inactive"):
            raise ValueError(f"reclaimable must be 'file' or 'inactive'; got {reclaimable!r}.")
        self.reclaimable: Reclaimable = reclaimable
        if root is not None:
            root = os.fspath(root)
            self.location = CgroupLocation(v2=(root, root), v1=None, how="explicit")
        else:
            self.location = discover_cgroup(
                proc_self_cgroup=proc_self_cgroup,
                mountinfo=mountinfo,
                hostfs=hostfs,
                cgroup_namespace=cgroup_namespace,
            )
        for warning in self.location.warnings:
            logger.warning("asgi-admission: %s.", warning)
        if self.location.how == "fallback":
            fallback = os.path.join(hostfs, DEFAULT_CGROUP_MOUNT.lstrip("/"))
            self.root: str | None = fallback
        else:
            self.root = os.fspath(root) if root is not None else None
        # Where an explicit root lies inside a v1 memory mount showing the whole
        # hierarchy, the v1 sources there can read every ancestor's limit (read_bound).
        self._v1_tops: dict[str, str] = {}
        if self.root is not None:  # explicit or fallback root
            self._v1_tops = whole_chain_tops(self.root, mountinfo, hostfs, cgroup_namespace)
        self._lock = threading.Lock()
        self._sources: list[CgroupSource] = []
        self._active: CgroupSource | None = None
        # PSI lives in a v2 directory: the root given, else our v2 cgroup (in a hybrid
        # layout our unified cgroup), else the v1 directory for kernels that offer it there.
        found = [place[0] for place in (self.location.v2, self.location.v1) if place is not None]
        pressure_dir = self.root if self.root is not None else found[0]
        self._pressure = KeptFile(os.path.join(pressure_dir, "memory.pressure"))
        self._build()

    def _build(self) -> None:
        sources: list[CgroupSource] = []
        if self.root is not None:
            # Explicit (or fallback) root: v2 in it, then v1 in <root>/memory, then <root>.
            sources.append(V2Source(self.root, None, self.reclaimable))
            for directory in (os.path.join(self.root, "memory"), self.root):
                top = self._v1_tops.get(directory)
                sources.append(
                    V1Source(directory, top, self.reclaimable, whole_chain=top is not None)
                )
        else:
            if self.location.v2 is not None:
                directory, top = self.location.v2
                sources.append(V2Source(directory, top, self.reclaimable))
            if self.location.v1 is not None:
                directory, top = self.location.v1
                sources.append(
                    V1Source(
                        directory,
                        top,
                        self.reclaimable,
                        whole_chain=self.location.v1_whole_chain,
                    )
                )
        self._sources = sources

    def __call__(self) -> MemoryReading:
        """Take one reading (without PSI, which the decision path does not need)."""
        with self._lock:
            return self._read_locked()

    def read(self, *, pressure: bool = False) -> MemoryReading:
        """Take one reading; with ``pressure`` also read PSI ``some avg10``."""
        with self._lock:
            reading = self._read_locked()
            if pressure:
                avg10 = self._read_pressure()
                if avg10 is not None:
                    reading = replace(reading, pressure_some_avg10=avg10)
            return reading

    def read_bound(self) -> MemoryReading | None:
        """An upper bound of the working set (raw usage) with the exact effective limit,
        read without ``memory.stat``; ``None`` where that cannot be had exactly.

        The latch admits on it only where the exact working set could not decide
        otherwise, and takes a full reading everywhere else. Available on cgroup v2,
        and on v1 where every ancestor is visible (no cgroup namespace, the mount
        showing the whole hierarchy); never before the first full reading.
        """
        with self._lock:
            active = self._active
            return None if active is None else active.read_bound()

    def _read_locked(self) -> MemoryReading:
        active = self._active
        if active is not None:
            try:
                reading = active.read()
            except Exception:  # pragma: no cover - defensive: never raise on the request path
                logger.exception("asgi-admission: error reading %s", active.own.directory)
                reading = None
            if reading is not None and reading.available:
                return reading
        # Slow path (first reading, or the source that answered last failed):
        # start over in precedence order with fresh descriptors.
        for source in self._sources:
            source.close()
        self._build()
        self._active = None
        first_unavailable: MemoryReading | None = None
        for source in self._sources:
            try:
                reading = source.read()
            except Exception:  # pragma: no cover - defensive: never raise on the request path
                logger.exception("asgi-admission: error reading %s", source.own.directory)
                continue
            if reading is None:
                continue
            if reading.available:
                self._active = source
                return reading
            first_unavailable = first_unavailable or reading
        if first_unavailable is not None:
            return first_unavailable
        return MemoryReading(
            used_bytes=None,
            limit_bytes=None,
            available=False,
            path=self.root or (self._sources[0].own.directory if self._sources else None),
        )

    def _read_pressure(self) -> float | None:
        try:
            return parse_pressure_some_avg10(self._pressure.read())
        except OSError:
            # Missing file, or EOPNOTSUPP where PSI is compiled in but disabled: no PSI.
            return None

    def group_directory(self) -> str | None:
        """The directory of the memory cgroup this reader measures: the one whose files
        answer (its own group, not an ancestor whose limit binds), else the first of its
        places that exists; ``None`` where none does. Takes a reading if none was taken."""
        with self._lock:
            if self._active is None:
                self._read_locked()
            if self._active is not None:
                return self._active.own.directory
            for source in self._sources:
                if os.path.isdir(source.own.directory):
                    return source.own.directory
            return None

    def files(self) -> list[str]:
        """The files the reader has open, for diagnostics (``asgi-admission probe``)."""
        with self._lock:
            paths = [] if self._active is None else self._active.paths()
            if self._pressure.is_open:
                paths.append(self._pressure.path)
            return paths

    def close(self) -> None:
        """Close every kept descriptor; the next reading reopens what it needs."""
        with self._lock:
            for source in self._sources:
                source.close()
            self._active = None
            self._pressure.close()


_readers: dict[tuple[str | None, str], CgroupMemoryReader] = {}
_readers_lock = threading.Lock()


def read_cgroup_memory(
    root: str | os.PathLike[str] | None = None, *, reclaimable: Reclaimable = "file"
) -> MemoryReading:
    """Read container memory from the cgroup, never from host-wide figures.

    ``root`` (or ``ADMISSION_CGROUP_ROOT``, or the legacy ``CODA_CGROUP_V2_ROOT``)
    names the cgroup directory; without either, this process's own cgroup is
    found. Tries v2 first, then v1. Unreadable or malformed files give
    ``available=False``, so admission falls back to the fixed session cap. The
    reader behind each root keeps its files open between calls, and PSI is
    included where readable.
    """
    if root is None:
        root = os.environ.get("ADMISSION_CGROUP_ROOT") or os.environ.get("CODA_CGROUP_V2_ROOT")
    key = (os.fspath(root) if root is not None else None, reclaimable)
    with _readers_lock:
        reader = _readers.get(key)
        if reader is None:
            reader = _readers[key] = CgroupMemoryReader(key[0], reclaimable=reclaimable)
    return reader.read(pressure=True)
