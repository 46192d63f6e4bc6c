"""Finding this process's memory cgroup and reading it cheaply and safely.

Notes:

- Which cgroup: ``/proc/self/cgroup`` names our cgroup path per hierarchy and
  ``/proc/self/mountinfo`` says where each hierarchy is mounted and which part of
  it the mount shows (its root field). The cgroup directory is the mount point
  plus our path relative to the mount root, the way the JDK and Go's cgroup
  libraries resolve it. Inside a cgroup namespace the mount root is our own
  cgroup, so the directory is the mount point itself.
- A path that climbs out of its mount (``0::/../..``, seen with some cgroup
  namespaces) or does not lie under any mount root cannot be resolved; the JDK
  falls back to the mount point and so do we, with one warning.
- The effective limit is the tightest along the ancestry: on v1 the kernel
  reports it as ``hierarchical_memory_limit``; on v2 we walk up to the mount root,
  counting ``memory.high`` too (the kernel throttles hard at it). Where an ancestor
  binds, its usage is what the limit is compared with, since siblings count too.
- Cost: readings are on the request path. Files are opened once and re-read with
  ``os.pread`` at offset 0 (about 0.6 µs for a small cgroupfs file against about
  10 µs for open/read/close). A descriptor that fails is reopened, since a cgroup
  is recreated when a container restarts (old descriptors then fail with ENODEV).
  Regular files (fixture trees, snapshots) can be replaced under an open
  descriptor without it failing, so for those alone an unlinked file is detected
  with ``fstat`` and reopened; cgroupfs and kernfs report size 0, which is how the
  two are told apart.
- Nothing here raises on bad files: an unreadable or malformed pair reports
  ``available=False`` and a malformed ``memory.stat`` counter counts as 0, so bad
  data can only make the guard more conservative.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Final, Literal

from ._reading import MemoryReading, Source

logger = logging.getLogger("asgi_admission")

#: A cgroup v1 limit at or above this is the kernel's "unlimited" sentinel.
V1_UNLIMITED_FLOOR: Final = 1 << 60
DEFAULT_CGROUP_MOUNT: Final = "/sys/fs/cgroup"

Reclaimable = Literal["file", "inactive"]

_READ_SIZE: Final = 65536


def parse_cgroup_memory_value(value: str, *, allow_max: bool = False) -> int | None:
    """Parse one cgroup byte value: a base-10 integer, else ``None``.

    Negative numbers and junk give ``None``; so does ``"max"``, but only with
    ``allow_max`` (where it means "no limit").
    """
    value = value.strip()
    if allow_max and value == "max":
        return None
    try:
        parsed = int(value, 10)
    except ValueError:
        return None
    return parsed if parsed >= 0 else None


def _parse_bytes_value(data: bytes) -> int | None:
    try:
        parsed = int(data, 10)
    except ValueError:
        return None
    return parsed if parsed >= 0 else None


_MALFORMED: Final = -1


def _stat_value(data: bytes, key: bytes) -> int | None:
    """The counter ``key`` from ``memory.stat`` text, ``None`` when absent.

    The first line whose first field is ``key`` counts. A value that is not a
    non-negative integer gives ``_MALFORMED``, so callers can tell "absent" (fall
    back to another key) from "present but unusable" (count as 0).
    """
    if data.startswith(key + b" "):
        start = len(key) + 1
    else:
        found = data.find(b"\n" + key + b" ")
        if found < 0:
            return None
        start = found + len(key) + 2
    end = data.find(b"\n", start)
    raw = data[start:] if end < 0 else data[start:end]
    try:
        value = int(raw, 10)
    except ValueError:
        return _MALFORMED
    return value if value >= 0 else _MALFORMED


def reclaimable_file_bytes(
    stat: bytes, *, reclaimable: Reclaimable = "file", prefer_total: bool = False
) -> int:
    """Reclaimable file cache from ``memory.stat`` content; never raises.

    ``reclaimable="file"`` counts ``inactive_file`` and ``active_file``;
    ``"inactive"`` only ``inactive_file`` (the kubelet's working set). With
    ``prefer_total`` (cgroup v1) the subtree-inclusive ``total_*`` keys win where
    present. An unusable counter contributes 0.
    """
    keys = (b"inactive_file", b"active_file") if reclaimable == "file" else (b"inactive_file",)
    total = 0
    for key in keys:
        value = _stat_value(stat, b"total_" + key) if prefer_total else None
        if value is None:
            value = _stat_value(stat, key)
        if value is not None and value > 0:
            total += value
    return total


def parse_pressure_some_avg10(data: bytes) -> float | None:
    """PSI ``some avg10`` (percent) from a ``memory.pressure`` file; ``None`` if absent."""
    for line in data.splitlines():
        if line.startswith(b"some "):
            for field in line.split()[1:]:
                name, _, value = field.partition(b"=")
                if name == b"avg10":
                    try:
                        parsed = float(value)
                    except ValueError:
                        return None
                    return parsed if 0.0 <= parsed <= 100.0 else None
    return None


class _KeptFile:
    """A file kept open and re-read from offset 0; reopened when it fails."""

    __slots__ = ("_check_unlinked", "_fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._check_unlinked = False

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._check_unlinked = os.fstat(fd).st_size > 0
        except OSError:  # pragma: no cover - fstat on a descriptor we just opened
            os.close(fd)
            raise
        self._fd = fd
        return fd

    def read(self) -> bytes:
        """The whole file; raises ``OSError`` when it cannot be read even after reopening."""
        fd = self._fd
        if fd < 0:
            fd = self._open()
        elif self._check_unlinked and os.fstat(fd).st_nlink == 0:
            self.close()
            fd = self._open()
        try:
            return os.pread(fd, _READ_SIZE, 0)
        except OSError:
            self.close()
            return os.pread(self._open(), _READ_SIZE, 0)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError:  # pragma: no cover - closing a descriptor we own
                pass


def _parent_levels(directory: str, top: str | None, marker: str) -> Iterator[str]:
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


class _Files:
    """The kept files of one cgroup directory."""

    __slots__ = ("directory", "files")

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files: dict[str, _KeptFile] = {}

    def read(self, name: str) -> bytes:
        kept = self.files.get(name)
        if kept is None:
            kept = self.files[name] = _KeptFile(os.path.join(self.directory, name))
        return kept.read()

    def paths(self) -> list[str]:
        return [kept.path for kept in self.files.values()]

    def close(self) -> None:
        for kept in self.files.values():
            kept.close()


class _Source:
    """One place a reading can come from: a v2 directory or a v1 location."""

    source: Source

    def __init__(self, directory: str, top: str | None, reclaimable: Reclaimable) -> None:
        self.own = _Files(directory)
        self.top = top
        self.reclaimable: Reclaimable = reclaimable
        self.ancestors: list[_Files] | None = None

    def read(self) -> MemoryReading | None:
        """A reading, or ``None`` when this source's files are not there at all."""
        raise NotImplementedError

    def ancestor_files(self, marker: str) -> list[_Files]:
        if self.ancestors is None:
            self.ancestors = [
                _Files(level) for level in _parent_levels(self.own.directory, self.top, marker)
            ]
        return self.ancestors

    def paths(self) -> list[str]:
        levels = [self.own, *(self.ancestors or ())]
        return [path for level in levels for path in level.paths()]

    def close(self) -> None:
        for level in [self.own, *(self.ancestors or ())]:
            level.close()

    def unavailable(self) -> MemoryReading:
        return MemoryReading(
            used_bytes=None,
            limit_bytes=None,
            available=False,
            source=self.source,
            path=self.own.directory,
        )


class _V2Source(_Source):
    source: Source = "cgroup-v2"

    def _limit(self, level: _Files) -> tuple[int | None, str | None, bool]:
        """(tightest of memory.max and memory.high, the file that set it, parsed ok)."""
        best: int | None = None
        best_file: str | None = None
        for name in ("memory.max", "memory.high"):
            try:
                raw = level.read(name)
            except OSError:
                if name == "memory.max":
                    return None, None, False
                continue  # memory.high is optional (and absent on some kernels)
            value = raw.strip()
            if value == b"max":
                continue
            parsed = _parse_bytes_value(value)
            if parsed is None or parsed == 0:
                return None, None, False
            if best is None or parsed < best:
                best, best_file = parsed, os.path.join(level.directory, name)
        return best, best_file, True

    def read(self) -> MemoryReading | None:
        try:
            usage_raw = self.own.read("memory.current")
        except OSError:
            return None
        limit, limit_file, ok = self._limit(self.own)
        if not ok:
            return self.unavailable()
        binding = self.own
        for level in self.ancestor_files("memory.max"):
            level_limit, level_file, ok = self._limit(level)
            if not ok:
                return self.unavailable()
            if level_limit is not None and (limit is None or level_limit < limit):
                limit, limit_file, binding = level_limit, level_file, level
        if binding is not self.own:
            try:
                usage_raw = binding.read("memory.current")
            except OSError:
                return self.unavailable()
        usage = _parse_bytes_value(usage_raw)
        if usage is None:
            return self.unavailable()
        try:
            stat = binding.read("memory.stat")
        except OSError:
            stat = b""
        reclaimable = reclaimable_file_bytes(stat, reclaimable=self.reclaimable)
        return MemoryReading(
            used_bytes=max(0, usage - reclaimable),
            limit_bytes=limit,
            available=True,
            usage_bytes=usage,
            reclaimable_bytes=min(reclaimable, usage),
            source=self.source,
            path=binding.directory,
            limit_file=limit_file,
        )


class _V1Source(_Source):
    source: Source = "cgroup-v1"

    def read(self) -> MemoryReading | None:
        try:
            usage_raw = self.own.read("memory.usage_in_bytes")
            limit_raw = self.own.read("memory.limit_in_bytes")
        except OSError:
            return None
        usage = _parse_bytes_value(usage_raw)
        limit = _parse_bytes_value(limit_raw)
        if usage is None or limit is None or limit <= 0:
            return self.unavailable()
        limit_file = os.path.join(self.own.directory, "memory.limit_in_bytes")
        try:
            stat = self.own.read("memory.stat")
        except OSError:
            stat = b""
        binding = self.own
        hierarchical = _stat_value(stat, b"hierarchical_memory_limit")
        if hierarchical is not None and 0 < hierarchical < limit:
            limit = hierarchical
            limit_file = os.path.join(self.own.directory, "memory.stat")
            if limit < V1_UNLIMITED_FLOOR:
                # An ancestor binds: compare its usage, which includes our siblings.
                # Where the ancestor is not visible (a container's view), our own
                # usage is all there is to compare.
                found = self._binding_ancestor(limit)
                if found is not None:
                    binding, usage, stat = found
                    limit_file = os.path.join(binding.directory, "memory.limit_in_bytes")
        reclaimable = reclaimable_file_bytes(stat, reclaimable=self.reclaimable, prefer_total=True)
        return MemoryReading(
            used_bytes=max(0, usage - reclaimable),
            limit_bytes=None if limit >= V1_UNLIMITED_FLOOR else limit,
            available=True,
            usage_bytes=usage,
            reclaimable_bytes=min(reclaimable, usage),
            source=self.source,
            path=binding.directory,
            limit_file=None if limit >= V1_UNLIMITED_FLOOR else limit_file,
        )

    def _binding_ancestor(self, limit: int) -> tuple[_Files, int, bytes] | None:
        for level in self.ancestor_files("memory.limit_in_bytes"):
            try:
                if _parse_bytes_value(level.read("memory.limit_in_bytes")) != limit:
                    continue
                usage = _parse_bytes_value(level.read("memory.usage_in_bytes"))
                stat = level.read("memory.stat")
            except OSError:
                return None
            return (level, usage, stat) if usage is not None else None
        return None


@dataclass(frozen=True, slots=True)
class _Mount:
    root: str
    mount_point: str
    fstype: str
    super_options: frozenset[str]


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[_Mount]:
    """The cgroup and cgroup2 mounts in ``/proc/<pid>/mountinfo`` text, in order."""
    mounts: list[_Mount] = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 4 or fields[sep + 1] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            _Mount(
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fstype=fields[sep + 1],
                super_options=frozenset(fields[sep + 3].split(",")),
            )
        )
    return mounts


def parse_proc_cgroup(text: str) -> tuple[str | None, str | None]:
    """(unified v2 path, v1 memory controller path) from ``/proc/<pid>/cgroup`` text."""
    v2: str | None = None
    v1: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _relative(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` when it lies inside it and never climbs out."""
    path_parts = [p for p in path.split("/") if p]
    root_parts = [p for p in root.split("/") if p]
    if path_parts[: len(root_parts)] != root_parts:
        return None
    rest = path_parts[len(root_parts) :]
    if ".." in rest or "." in rest:
        return None
    return "/".join(rest)


@dataclass(frozen=True, slots=True)
class CgroupLocation:
    """Where the reader looks: directories per cgroup version, and how they were found."""

    v2: tuple[str, str] | None  # (cgroup directory, mount point)
    v1: tuple[str, str] | None
    #: ``"explicit"`` (root given), ``"discovered"`` or ``"fallback"``.
    how: Literal["explicit", "discovered", "fallback"]
    warnings: tuple[str, ...] = ()


def _resolve(
    path: str, mounts: list[_Mount], hostfs: str
) -> tuple[tuple[str, str] | None, str | None]:
    def host(mount_point: str) -> str:
        return os.path.join(hostfs, mount_point.lstrip("/"))

    for mount in mounts:
        rel = _relative(path, mount.root)
        if rel is not None:
            directory = os.path.join(host(mount.mount_point), rel) if rel else host(mount.mount_point)
            if os.path.isdir(directory):
                return (os.path.normpath(directory), host(mount.mount_point)), None
    for mount in mounts:
        mount_point = host(mount.mount_point)
        if os.path.isdir(mount_point):
            return (
                (os.path.normpath(mount_point), mount_point),
                f"cgroup path {path!r} does not resolve inside its mount "
                f"(root {mount.root!r} at {mount.mount_point!r}); reading the mount point "
                f"{mount_point!r} instead",
            )
    return None, None


def discover_cgroup(
    *,
    proc_self_cgroup: str = "/proc/self/cgroup",
    mountinfo: str = "/proc/self/mountinfo",
    hostfs: str = "/",
) -> CgroupLocation:
    """Find this process's own memory cgroup, v2 and v1, from ``/proc``.

    ``hostfs`` prefixes every mount point (for a tree captured from another
    machine, or a host filesystem mounted elsewhere). Falls back to
    ``/sys/fs/cgroup`` (under ``hostfs``) when the files cannot be read or
    name no usable mount.
    """
    try:
        with open(proc_self_cgroup, encoding="utf-8", errors="replace") as f:
            v2_path, v1_path = parse_proc_cgroup(f.read())
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        v2_path = v1_path = None
        mounts = []
    warnings: list[str] = []
    v2 = v1 = None
    if v2_path is not None:
        v2, warning = _resolve(v2_path, [m for m in mounts if m.fstype == "cgroup2"], hostfs)
        if warning:
            warnings.append(warning)
    if v1_path is not None:
        v1_mounts = [m for m in mounts if m.fstype == "cgroup" and "memory" in m.super_options]
        v1, warning = _resolve(v1_path, v1_mounts, hostfs)
        if warning:
            warnings.append(warning)
    if v2 is None and v1 is None:
        fallback = os.path.join(hostfs, DEFAULT_CGROUP_MOUNT.lstrip("/"))
        return CgroupLocation(
            v2=None,
            v1=None,
            how="fallback",
            warnings=(f"could not find this process's cgroup; reading {fallback!r}",),
        )
    return CgroupLocation(v2=v2, v1=v1, how="discovered", warnings=tuple(warnings))


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
    ) -> None:
        if reclaimable not in ("file", "inactive"):
            raise ValueError(f"reclaimable must be 'file' or 'inactive'; got {reclaimable!r}.")
        self.reclaimable: Reclaimable = reclaimable
        if root is not None:
            root = os.fspath(root)
            self.location = CgroupLocation(v2=(root, root), v1=None, how="explicit")
        else:
            self.location = discover_cgroup(
                proc_self_cgroup=proc_self_cgroup, mountinfo=mountinfo, hostfs=hostfs
            )
        for warning in self.location.warnings:
            logger.warning("asgi-admission: %s.", warning)
        if self.location.how == "fallback":
            fallback = os.path.join(hostfs, DEFAULT_CGROUP_MOUNT.lstrip("/"))
            self.root: str | None = fallback
        else:
            self.root = os.fspath(root) if root is not None else None
        self._lock = threading.Lock()
        self._sources: list[_Source] = []
        self._active: _Source | None = None
        self._pressure: _KeptFile | None = None
        self._pressure_dir: str | None = None
        self._build()

    def _build(self) -> None:
        sources: list[_Source] = []
        if self.root is not None:
            # Explicit (or fallback) root: v2 in it, then v1 in <root>/memory, then <root>.
            sources.append(_V2Source(self.root, None, self.reclaimable))
            sources.append(_V1Source(os.path.join(self.root, "memory"), None, self.reclaimable))
            sources.append(_V1Source(self.root, None, self.reclaimable))
            self._pressure_dir = self.root
        else:
            if self.location.v2 is not None:
                directory, top = self.location.v2
                sources.append(_V2Source(directory, top, self.reclaimable))
                self._pressure_dir = directory
            if self.location.v1 is not None:
                directory, top = self.location.v1
                sources.append(_V1Source(directory, top, self.reclaimable))
                if self._pressure_dir is None:
                    self._pressure_dir = directory
        self._sources = sources

    def __call__(self) -> MemoryReading:
        """Take one reading (without PSI, which the decision path does not need)."""
        return self.read()

    def read(self, *, pressure: bool = False) -> MemoryReading:
        """Take one reading; with ``pressure`` also read PSI ``some avg10``."""
        with self._lock:
            reading = self._read_locked()
            if pressure:
                avg10 = self._read_pressure()
                if avg10 is not None:
                    reading = replace(reading, pressure_some_avg10=avg10)
            return reading

    def _read_locked(self) -> MemoryReading:
        active = self._active
        if active is not None:
            try:
                reading = active.read()
            except Exception:  # pragma: no cover - defensive: never raise on the request path
                logger.exception("asgi-admission: unexpected error reading %s", active.own.directory)
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
                logger.exception("asgi-admission: unexpected error reading %s", source.own.directory)
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
        if self._pressure_dir is None:
            return None
        if self._pressure is None:
            self._pressure = _KeptFile(os.path.join(self._pressure_dir, "memory.pressure"))
        try:
            return parse_pressure_some_avg10(self._pressure.read())
        except OSError:
            # Missing file, or EOPNOTSUPP where PSI is compiled in but disabled: no PSI.
            return None

    def files(self) -> list[str]:
        """The files the reader has open, for diagnostics (``asgi-admission probe``)."""
        with self._lock:
            paths = [] if self._active is None else self._active.paths()
            if self._pressure is not None:
                paths.append(self._pressure.path)
            return paths

    def close(self) -> None:
        """Close every kept descriptor; the next reading reopens what it needs."""
        with self._lock:
            for source in self._sources:
                source.close()
            self._active = None
            if self._pressure is not None:
                self._pressure.close()
                self._pressure = None


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
    reader = _readers.get(key)
    if reader is None:
        with _readers_lock:
            reader = _readers.get(key)
            if reader is None:
                reader = _readers[key] = CgroupMemoryReader(key[0], reclaimable=reclaimable)
    return reader.read(pressure=True)
