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
- Cost: readings are on the request path (bench/README.md has the figures). Files
  are opened once and re-read with ``os.pread`` at offset 0 (0.7 µs for a
  one-value cgroupfs file, 3.5 µs for a v1 ``memory.stat``, which the kernel
  formats on every read; ``Path.read_text`` of the same three files takes about
  30 µs). A descriptor that fails is reopened, since a cgroup is recreated when a
  container restarts (old descriptors then fail with ENODEV). Regular files
  (fixture trees, snapshots) can be replaced under an open descriptor without it
  failing, so for those alone an unlinked file is noticed with ``fstat``;
  cgroupfs files report size 0 yet have content, which is how the two are told
  apart.
- PSI comes from the v2 directory: in a hybrid layout (v1 memory controller,
  cgroup2 mounted at ``/sys/fs/cgroup/unified``) that is our unified cgroup,
  which for most processes is the root, i.e. machine-wide pressure.
- Nothing here raises on bad files: an unreadable or malformed pair reports
  ``available=False`` and a malformed ``memory.stat`` counter counts as 0, so bad
  data can only make the guard more conservative.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Final, Literal

from ._reading import MemoryReading, Source, available_reading

logger = logging.getLogger("asgi_admission")

#: A cgroup v1 limit at or above this is the kernel's "unlimited" sentinel.
V1_UNLIMITED_FLOOR: Final = 1 << 60
DEFAULT_CGROUP_MOUNT: Final = "/sys/fs/cgroup"

Reclaimable = Literal["file", "inactive"]

_READ_SIZE: Final = 65536
#: What one value file (memory.current, memory.max, ...) is read with first: a kernel
#: value takes at most 21 bytes, and a small buffer is measurably cheaper for pread to
#: fill. Whatever fills it is read again whole, so an odd file reads as it always did.
_VALUE_READ_SIZE: Final = 64
#: The files with many lines; every other file read is a single value.
_MULTILINE: Final = frozenset({"memory.stat", "memory.pressure"})


def parse_cgroup_memory_value(value: str, *, allow_max: bool = False) -> int | None:
    """Parse one cgroup byte value: a base-10 integer, else ``None``.

    Negative numbers and junk give ``None``; so does ``"max"``, but only with
    ``allow_max`` (where it means "no limit"). Only plain ASCII digits count:
    Python's ``int`` would also take ``1_000``, ``+5`` or other scripts' digits,
    none of which the kernel writes.
    """
    value = value.strip()
    if allow_max and value == "max":
        return None
    return _digits(value) if value.isascii() else None


def _digits(text: str | bytes) -> int | None:
    if not text.isdigit():
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() accepts (sys.get_int_max_str_digits)
        return None


def _parse_bytes_value(data: bytes) -> int | None:
    # _digits inlined: this runs on every decision.
    text = data.strip()
    if not text.isdigit():
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() accepts
        return None


_MALFORMED: Final = -1


def _stat_key(key: bytes) -> tuple[bytes, bytes]:
    """The two spellings of ``key`` at a line start in ``memory.stat``: first line, later line."""
    return key + b" ", b"\n" + key + b" "


def _find_stat(data: bytes, key: tuple[bytes, bytes]) -> int | None:
    """:func:`_stat_value` with the key prepared by :func:`_stat_key` (the hot path)."""
    first, later = key
    # The common case is a single C-level scan: the key found at a line start.
    found = data.find(first)
    if found < 0:
        return None
    if found > 0 and data[found - 1] != 0x0A:
        # A match inside another line ("inactive_file " inside "total_inactive_file ").
        found = data.find(later, found)
        if found < 0:
            return None
        found += 1
    start = found + len(first)
    end = data.find(b"\n", start)
    # bytes.isdigit is ASCII-only: no sign, no "1_000", nothing int() would stretch to.
    value = _digits((data[start:] if end < 0 else data[start:end]).strip())
    return _MALFORMED if value is None else value


def _stat_value(data: bytes, key: bytes) -> int | None:
    """The counter ``key`` from ``memory.stat`` text, ``None`` when absent.

    The first line whose first field is ``key`` counts. A value that is not a
    non-negative integer gives ``_MALFORMED``, so callers can tell "absent" (fall
    back to another key) from "present but unusable" (count as 0).
    """
    return _find_stat(data, _stat_key(key))


_HIERARCHICAL_LIMIT: Final = _stat_key(b"hierarchical_memory_limit")
_INACTIVE: Final = _stat_key(b"inactive_file")
_ACTIVE: Final = _stat_key(b"active_file")
_TOTAL_INACTIVE: Final = _stat_key(b"total_inactive_file")
_TOTAL_ACTIVE: Final = _stat_key(b"total_active_file")

# The counters to subtract, as (preferred key, fallback key or None), per mode and version.
_StatKeys = tuple[tuple[tuple[bytes, bytes], tuple[bytes, bytes] | None], ...]
_RECLAIMABLE_KEYS: Final[dict[tuple[str, bool], _StatKeys]] = {
    ("file", False): ((_INACTIVE, None), (_ACTIVE, None)),
    ("inactive", False): ((_INACTIVE, None),),
    ("file", True): ((_TOTAL_INACTIVE, _INACTIVE), (_TOTAL_ACTIVE, _ACTIVE)),
    ("inactive", True): ((_TOTAL_INACTIVE, _INACTIVE),),
}


def _reclaimable(stat: bytes, keys: _StatKeys) -> int:
    total = 0
    for preferred, fallback in keys:
        value = _find_stat(stat, preferred)
        if value is None and fallback is not None:
            value = _find_stat(stat, fallback)
        if value is not None and value > 0:
            total += value
    return total


def reclaimable_file_bytes(
    stat: bytes, *, reclaimable: Reclaimable = "file", prefer_total: bool = False
) -> int:
    """Reclaimable file cache from ``memory.stat`` content; never raises.

    ``reclaimable="file"`` counts ``inactive_file`` and ``active_file``;
    ``"inactive"`` only ``inactive_file`` (the kubelet's working set). With
    ``prefer_total`` (cgroup v1) the subtree-inclusive ``total_*`` keys win where
    present. An unusable counter contributes 0.
    """
    return _reclaimable(stat, _RECLAIMABLE_KEYS[reclaimable, prefer_total])


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

    __slots__ = ("_check_unlinked", "_fd", "_size", "path")

    def __init__(self, path: str, size: int = _READ_SIZE) -> None:
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
                data = os.pread(fd, _READ_SIZE, 0)
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
                return os.pread(fd, _READ_SIZE, 0)
        except OSError:
            pass
        self.close()
        return self._read_fresh()

    @property
    def is_open(self) -> bool:
        return self._fd >= 0

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):  # closing a descriptor we own
                os.close(fd)


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

    __slots__ = ("absent", "directory", "files")

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files: dict[str, _KeptFile] = {}
        #: Optional files found missing, not looked for again.
        self.absent: set[str] = set()

    def file(self, name: str) -> _KeptFile:
        kept = self.files.get(name)
        if kept is None:
            size = _READ_SIZE if name in _MULTILINE else _VALUE_READ_SIZE
            kept = self.files[name] = _KeptFile(os.path.join(self.directory, name), size)
        return kept

    def read(self, name: str) -> bytes:
        return self.file(name).read()

    def paths(self) -> list[str]:
        """The files currently open (those that exist and were read)."""
        return [kept.path for kept in self.files.values() if kept.is_open]

    def close(self) -> None:
        for kept in self.files.values():
            kept.close()


class _Source:
    """One place a reading can come from: a v2 directory or a v1 location."""

    source: Source

    #: Whether ``memory.stat`` has subtree-inclusive ``total_*`` keys that win (v1).
    prefer_total = False

    def __init__(self, directory: str, top: str | None, reclaimable: Reclaimable) -> None:
        self.own = _Files(directory)
        self.top = top
        self.reclaimable: Reclaimable = reclaimable
        self.stat_keys = _RECLAIMABLE_KEYS[reclaimable, self.prefer_total]
        self.ancestors: list[_Files] | None = None

    def read(self) -> MemoryReading | None:
        """A reading, or ``None`` when this source's files are not there at all."""
        raise NotImplementedError

    def bound(self) -> tuple[int, int, _Files, str] | None:
        """An upper bound of the working set with the exact limit, without ``memory.stat``.

        ``(raw usage, limit, binding level, limit file)``; ``None`` where this source
        cannot tell the effective limit exactly that way (or anything is off): the
        caller then takes a full reading.
        """
        raise NotImplementedError

    def read_bound(self) -> MemoryReading | None:
        """:meth:`bound` as a reading marked ``exact=False``."""
        found = self.bound()
        if found is None:
            return None
        usage, limit, binding, limit_file = found
        return available_reading(
            usage, limit, usage, 0, self.source, binding.directory, limit_file, exact=False
        )

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
            if name in level.absent:
                continue
            try:
                raw = level.read(name)
            except OSError:
                if name == "memory.max":
                    return None, None, False
                # memory.high is optional (absent on old kernels and in some
                # snapshots); a cgroup's set of files never changes, so stop asking
                # until the reader starts over.
                level.absent.add(name)
                continue
            value = raw.strip()
            if value == b"max":
                continue
            parsed = _parse_bytes_value(value)
            if parsed is None or parsed == 0:
                return None, None, False
            if best is None or parsed < best:
                best, best_file = parsed, os.path.join(level.directory, name)
        return best, best_file, True

    def _measure(
        self,
    ) -> tuple[int, int | None, str | None, _Files] | MemoryReading | None:
        """(usage, limit, the file that set it, the binding level), or what to report."""
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
        return usage, limit, limit_file, binding

    def read(self) -> MemoryReading | None:
        measured = self._measure()
        if not isinstance(measured, tuple):
            return measured
        usage, limit, limit_file, binding = measured
        try:
            stat = binding.read("memory.stat")
        except OSError:
            stat = b""
        reclaimable = _reclaimable(stat, self.stat_keys)
        return available_reading(
            max(0, usage - reclaimable),
            limit,
            usage,
            min(reclaimable, usage),
            self.source,
            binding.directory,
            limit_file,
        )

    def bound(self) -> tuple[int, int, _Files, str] | None:
        # Every limit v2 reads comes from the limit files themselves, so only the
        # reclaimable cache (memory.stat) is left out: usage is the upper bound.
        measured = self._measure()
        if not isinstance(measured, tuple):
            return None
        usage, limit, limit_file, binding = measured
        if limit is None or limit_file is None:
            return None
        return usage, limit, binding, limit_file


class _V1Source(_Source):
    source: Source = "cgroup-v1"
    prefer_total = True

    def __init__(
        self,
        directory: str,
        top: str | None,
        reclaimable: Reclaimable,
        *,
        whole_chain: bool = False,
    ) -> None:
        super().__init__(directory, top, reclaimable)
        # The hot path reads these three every time: resolve them once.
        self.usage_file = self.own.file("memory.usage_in_bytes")
        self.limit_file = self.own.file("memory.limit_in_bytes")
        self.stat_file = self.own.file("memory.stat")
        #: Every ancestor up to the hierarchy's root is visible below ``top`` (the
        #: mount shows the whole hierarchy), so their limit files give the kernel's
        #: hierarchical_memory_limit exactly, without memory.stat.
        self.whole_chain = whole_chain and top is not None
        #: The ancestors ``bound`` reads, settled at the first bound: ``None`` until then,
        #: ``False`` where the walk did not reach the hierarchy's root (no bound).
        self.bound_levels: list[_Files] | Literal[False] | None = None

    def read(self) -> MemoryReading | None:
        try:
            usage_raw = self.usage_file.read()
            limit_raw = self.limit_file.read()
        except OSError:
            return None
        usage = _parse_bytes_value(usage_raw)
        limit = _parse_bytes_value(limit_raw)
        if usage is None or limit is None or limit <= 0:
            return self.unavailable()
        limit_file = self.limit_file.path
        try:
            stat = self.stat_file.read()
        except OSError:
            stat = b""
        binding = self.own
        hierarchical = _find_stat(stat, _HIERARCHICAL_LIMIT)
        if hierarchical is not None and 0 < hierarchical < limit:
            limit = hierarchical
            limit_file = self.stat_file.path
            if limit < V1_UNLIMITED_FLOOR:
                # An ancestor binds: compare its usage, which includes our siblings.
                # Where the ancestor is not visible (a container's view), our own
                # usage is all there is to compare.
                found = self._binding_ancestor(limit)
                if found is not None:
                    binding, usage, stat = found
                    limit_file = os.path.join(binding.directory, "memory.limit_in_bytes")
        reclaimable = _reclaimable(stat, self.stat_keys)
        unlimited = limit >= V1_UNLIMITED_FLOOR
        return available_reading(
            max(0, usage - reclaimable),
            None if unlimited else limit,
            usage,
            min(reclaimable, usage),
            self.source,
            binding.directory,
            None if unlimited else limit_file,
        )

    def _bound_levels(self) -> list[_Files] | None:
        """The ancestors whose limits ``read_bound`` reads, or ``None`` where it cannot.

        hierarchical_memory_limit is the least limit of the group and all its
        ancestors; they can be read directly only where all of them are visible (a
        container's view hides them and only memory.stat can tell). The walk is made
        once per source, so whether it reached the hierarchy's root is settled once.
        The last level is the mount point, the hierarchy's root cgroup, whose limit
        v1 cannot set (the kernel refuses with EINVAL): it never binds and is left out.
        """
        if not self.whole_chain:
            return None
        chain = self.ancestor_files("memory.limit_in_bytes")
        last = chain[-1].directory if chain else self.own.directory
        if os.path.normpath(last) != os.path.normpath(self.top or ""):
            return None
        return chain[:-1]

    def bound(self) -> tuple[int, int, _Files, str] | None:
        levels = self.bound_levels
        if levels is None:
            found = self._bound_levels()
            levels = self.bound_levels = False if found is None else found
        if levels is False:
            return None
        try:
            usage = _parse_bytes_value(self.usage_file.read())
            limit = _parse_bytes_value(self.limit_file.read())
            if usage is None or limit is None or limit <= 0:
                return None
            binding, limit_file = self.own, self.limit_file.path
            # Nearest first and strictly less: the level read() would pick as binding.
            for level in levels:
                level_limit = _parse_bytes_value(level.read("memory.limit_in_bytes"))
                if level_limit is None or level_limit <= 0:
                    return None
                if level_limit < limit:
                    limit, binding = level_limit, level
            if limit >= V1_UNLIMITED_FLOOR:
                return None
            if binding is not self.own:
                usage = _parse_bytes_value(binding.read("memory.usage_in_bytes"))
                if usage is None:
                    return None
                limit_file = os.path.join(binding.directory, "memory.limit_in_bytes")
        except OSError:
            return None
        return usage, limit, binding, limit_file

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
    # A ".." anywhere means the path is outside our cgroup namespace (a process
    # moved after the namespace was made): joining it to any mount point would
    # name a directory that is not ours, so it never resolves (the JDK's rule).
    if ".." in path_parts or "." in path_parts:
        return None
    if path_parts[: len(root_parts)] != root_parts:
        return None
    return "/".join(path_parts[len(root_parts) :])


@dataclass(frozen=True, slots=True)
class CgroupLocation:
    """Where the reader looks: directories per cgroup version, and how they were found."""

    v2: tuple[str, str] | None  # (cgroup directory, mount point)
    v1: tuple[str, str] | None
    #: ``"explicit"`` (root given), ``"discovered"`` or ``"fallback"``.
    how: Literal["explicit", "discovered", "fallback"]
    warnings: tuple[str, ...] = ()
    #: The v1 mount shows the whole hierarchy (its root is ``/``) and our directory
    #: lies inside it, so every ancestor's limit file is visible.
    v1_whole_chain: bool = False


def _resolve(
    path: str, mounts: list[_Mount], hostfs: str
) -> tuple[tuple[str, str] | None, str | None, bool]:
    """((directory, mount point), a warning, whether the mount shows the whole hierarchy)."""

    def host(mount_point: str) -> str:
        return os.path.join(hostfs, mount_point.lstrip("/"))

    for mount in mounts:
        rel = _relative(path, mount.root)
        if rel is not None:
            mount_point = host(mount.mount_point)
            directory = os.path.join(mount_point, rel) if rel else mount_point
            if os.path.isdir(directory):
                return (os.path.normpath(directory), mount_point), None, mount.root == "/"
    for mount in mounts:
        mount_point = host(mount.mount_point)
        if os.path.isdir(mount_point):
            return (
                (os.path.normpath(mount_point), mount_point),
                f"cgroup path {path!r} does not resolve inside its mount "
                f"(root {mount.root!r} at {mount.mount_point!r}); reading the mount point "
                f"{mount_point!r} instead",
                False,
            )
    return None, None, False


#: The inode of the initial cgroup namespace (the kernel's PROC_CGROUP_INIT_INO). In any
#: other namespace a mount root of "/" is the namespace's root, with ancestors hidden.
INITIAL_CGROUP_NAMESPACE_INODE: Final = 0xEFFFFFFB


def in_initial_cgroup_namespace(path: str = "/proc/self/ns/cgroup") -> bool:
    """Whether this process sees the whole cgroup hierarchy (no cgroup namespace)."""
    try:
        return os.stat(path).st_ino == INITIAL_CGROUP_NAMESPACE_INODE
    except OSError:
        return False


def whole_hierarchy_mount(directory: str, mounts: list[_Mount], hostfs: str = "/") -> str | None:
    """The mount point of the cgroup v1 memory mount that shows its whole hierarchy and
    holds ``directory``, if there is one: then every ancestor's limit file is visible."""
    directory = os.path.normpath(directory)
    for mount in mounts:
        if mount.fstype != "cgroup" or "memory" not in mount.super_options or mount.root != "/":
            continue
        mount_point = os.path.normpath(os.path.join(hostfs, mount.mount_point.lstrip("/")))
        if directory == mount_point or directory.startswith(mount_point + os.sep):
            return mount_point
    return None


def discover_cgroup(
    *,
    proc_self_cgroup: str = "/proc/self/cgroup",
    mountinfo: str = "/proc/self/mountinfo",
    hostfs: str = "/",
    cgroup_namespace: str = "/proc/self/ns/cgroup",
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
    v1_whole_chain = False
    if v2_path is not None:
        v2, warning, _ = _resolve(v2_path, [m for m in mounts if m.fstype == "cgroup2"], hostfs)
        if warning:
            warnings.append(warning)
    if v1_path is not None:
        v1_mounts = [m for m in mounts if m.fstype == "cgroup" and "memory" in m.super_options]
        v1, warning, v1_whole_chain = _resolve(v1_path, v1_mounts, hostfs)
        v1_whole_chain = v1_whole_chain and in_initial_cgroup_namespace(cgroup_namespace)
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
    return CgroupLocation(
        v2=v2,
        v1=v1,
        how="discovered",
        warnings=tuple(warnings),
        v1_whole_chain=v1_whole_chain,
    )


def _whole_chain_tops(
    root: str, mountinfo: str, hostfs: str, cgroup_namespace: str
) -> dict[str, str]:
    """For the v1 places under an explicit root, the mount point above which nothing is
    hidden, where the mount shows the whole hierarchy; empty where unknown."""
    if not in_initial_cgroup_namespace(cgroup_namespace):
        return {}
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        return {}
    tops: dict[str, str] = {}
    for directory in (os.path.join(root, "memory"), root):
        top = whole_hierarchy_mount(directory, mounts, hostfs)
        if top is not None:
            tops[directory] = top
    return tops


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
            self._v1_tops = _whole_chain_tops(self.root, mountinfo, hostfs, cgroup_namespace)
        self._lock = threading.Lock()
        self._sources: list[_Source] = []
        self._active: _Source | None = None
        # PSI lives in a v2 directory: the root given, else our v2 cgroup (in a hybrid
        # layout our unified cgroup), else the v1 directory for kernels that offer it there.
        found = [place[0] for place in (self.location.v2, self.location.v1) if place is not None]
        pressure_dir = self.root if self.root is not None else found[0]
        self._pressure = _KeptFile(os.path.join(pressure_dir, "memory.pressure"))
        self._build()

    def _build(self) -> None:
        sources: list[_Source] = []
        if self.root is not None:
            # Explicit (or fallback) root: v2 in it, then v1 in <root>/memory, then <root>.
            sources.append(_V2Source(self.root, None, self.reclaimable))
            for directory in (os.path.join(self.root, "memory"), self.root):
                top = self._v1_tops.get(directory)
                sources.append(
                    _V1Source(directory, top, self.reclaimable, whole_chain=top is not None)
                )
        else:
            if self.location.v2 is not None:
                directory, top = self.location.v2
                sources.append(_V2Source(directory, top, self.reclaimable))
            if self.location.v1 is not None:
                directory, top = self.location.v1
                sources.append(
                    _V1Source(
                        directory,
                        top,
                        self.reclaimable,
                        whole_chain=self.location.v1_whole_chain,
                    )
                )
        self._sources = sources

    def __call__(self) -> MemoryReading:
        """Take one reading (without PSI, which the decision path does not need)."""
        # The request path: one call layer fewer than read() (about 0.2 µs).
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

    def read_bound_bytes(self) -> tuple[int, int] | None:
        """:meth:`read_bound`'s ``(used_bytes, limit_bytes)`` without building a reading.

        For a decision that needs no reading to show (the middleware's admissions
        where nothing observes the reading); ``None`` exactly where ``read_bound`` is.
        """
        with self._lock:
            active = self._active
            found = None if active is None else active.bound()
        return None if found is None else (found[0], found[1])

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
