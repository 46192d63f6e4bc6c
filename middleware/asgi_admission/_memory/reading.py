"""Reading memory: this process's cgroup memory, read per decision, cheaply and safely.

``MemoryReading`` is the one value every reader produces and the latch consumes;
``CgroupMemoryReader`` produces it from the cgroup files, kept open and re-read with
``os.pread``. Finding the cgroup at start is ``discover.py``'s. (docs/how-it-decides.md)
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, Protocol

from asgi_admission._memory.discover import (
    DEFAULT_CGROUP_MOUNT,
    CgroupLocation,
    discover_cgroup,
    on_host,
    whole_chain_tops,
)

# --------------------------------------------------------------------------------------
# The one value every reader produces and the latch consumes.

Source = Literal["cgroup-v2", "cgroup-v1", "host"]
#: Which file cache counts as reclaimable: both LRUs ("file", the default) or only
#: ``inactive_file`` ("inactive", the kubelet's working set, as ``kubectl top`` shows).
Reclaimable = Literal["file", "inactive"]


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """One reading of the memory the guard protects.

    ``used_bytes`` is the working set (usage minus reclaimable file cache) at the
    level whose limit binds, ``limit_bytes`` that level's limit (``None`` when
    unlimited), and ``available`` is false when the files could not be read or
    parsed. The remaining fields describe where the figures came from; each has a
    default so that ``MemoryReading(used_bytes=..., limit_bytes=..., available=...)``
    constructs.
    """

    used_bytes: int | None
    limit_bytes: int | None
    available: bool
    #: Raw usage before the reclaimable cache was subtracted.
    usage_bytes: int | None = None
    #: The file cache subtracted from usage to get ``used_bytes``.
    reclaimable_bytes: int = 0
    source: Source | None = None
    #: The cgroup directory (or ``"host"``) the reading describes.
    path: str | None = None
    #: The file that set the effective limit, e.g. ``/sys/fs/cgroup/memory.max``.
    limit_file: str | None = None
    #: PSI ``some avg10`` for this cgroup, in percent; ``None`` without PSI.
    pressure_some_avg10: float | None = None
    #: ``False`` for an upper bound taken without ``memory.stat``: ``used_bytes`` is
    #: then the raw usage, reclaimable cache not subtracted. The latch admits on such
    #: a reading only where the exact working set could not have decided otherwise.
    exact: bool = True

    @property
    def percent(self) -> float | None:
        """Working set as a percentage of the limit, rounded to two decimals."""
        if not self.available or self.used_bytes is None or not self.limit_bytes:
            return None
        return round(self.used_bytes * 100 / self.limit_bytes, 2)


class MemoryReader(Protocol):
    """Anything that can take one reading; called on the request path."""

    def __call__(self) -> MemoryReading: ...


def draft_class(cls: type) -> Any:
    """A plain class with the slots of the frozen, slotted dataclass ``cls``: the request
    path fills one and then sets its ``__class__`` to ``cls`` (allowed between classes of
    one layout), skipping the frozen ``__init__``'s slow ``object.__setattr__``
    (bench/README.md). Tests check the results equal the constructor's."""
    return type(f"_{cls.__name__}Draft", (), {"__slots__": vars(cls)["__slots__"]})


_Draft = draft_class(MemoryReading)
_new = object.__new__


def available_reading(
    used_bytes: int,
    limit_bytes: int | None,
    usage_bytes: int,
    reclaimable_bytes: int,
    source: Source,
    path: str,
    limit_file: str | None,
    exact: bool = True,
) -> MemoryReading:
    """``MemoryReading(..., available=True)`` without the frozen-dataclass overhead."""
    reading = _new(_Draft)
    reading.used_bytes = used_bytes
    reading.limit_bytes = limit_bytes
    reading.available = True
    reading.usage_bytes = usage_bytes
    reading.reclaimable_bytes = reclaimable_bytes
    reading.source = source
    reading.path = path
    reading.limit_file = limit_file
    reading.pressure_some_avg10 = None
    reading.exact = exact
    reading.__class__ = MemoryReading
    built: MemoryReading = reading
    return built


UNAVAILABLE = MemoryReading(used_bytes=None, limit_bytes=None, available=False)


# The reader the decisions use may be the operator's code (the latch's ``memory_reader``)
# and must not turn a session request into a 500: one that raises reads as unavailable.


class ReaderInUse(Protocol):
    """What holds the reader the decisions use, which may be replaced (the latch)."""

    @property
    def memory_reader(self) -> MemoryReader: ...


class SafeReader:
    """The memory reader ``owner`` uses now, never raising."""

    __slots__ = ("_owner",)

    def __init__(self, owner: ReaderInUse) -> None:
        self._owner = owner

    def __call__(self) -> MemoryReading:
        try:
            return self._owner.memory_reader()
        except Exception:
            return UNAVAILABLE


# --------------------------------------------------------------------------------------
# Parsing cgroup memory files: value files, ``memory.stat`` counters and PSI.
#
# Nothing here raises on bad data: a malformed value is ``None`` and a malformed
# ``memory.stat`` counter counts as 0, so bad data can only make the guard more
# conservative.


def parse_bytes_value(text: bytes) -> int | None:
    """A value file's content as a non-negative integer, ``None`` for anything else.

    ``isdigit`` on bytes is ASCII-only: no sign, no ``1_000``, nothing ``int()``
    would stretch to.
    """
    text = text.strip()
    if not text.isdigit():
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() accepts (sys.get_int_max_str_digits)
        return None


MALFORMED: Final = -1


def stat_key(key: bytes) -> tuple[bytes, bytes]:
    """The two spellings of ``key`` at a line start in ``memory.stat``: first line, later line."""
    return key + b" ", b"\n" + key + b" "


def find_stat(data: bytes, key: tuple[bytes, bytes]) -> int | None:
    """The counter ``key`` (from :func:`stat_key`) in ``memory.stat`` text, ``None`` when absent.

    A value that is not a non-negative integer gives ``MALFORMED``, so callers can
    tell "absent" (fall back to another key) from "present but unusable" (count as 0).
    """
    first, later = key
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
    value = parse_bytes_value(data[start:] if end < 0 else data[start:end])
    return MALFORMED if value is None else value


HIERARCHICAL_LIMIT: Final = stat_key(b"hierarchical_memory_limit")
_INACTIVE: Final = stat_key(b"inactive_file")
_ACTIVE: Final = stat_key(b"active_file")
_TOTAL_INACTIVE: Final = stat_key(b"total_inactive_file")
_TOTAL_ACTIVE: Final = stat_key(b"total_active_file")

# The counters to subtract, as (preferred key, fallback key or None), per mode and version.
StatKeys = tuple[tuple[tuple[bytes, bytes], tuple[bytes, bytes] | None], ...]
RECLAIMABLE_KEYS: Final[dict[tuple[str, bool], StatKeys]] = {
    ("file", False): ((_INACTIVE, None), (_ACTIVE, None)),
    ("inactive", False): ((_INACTIVE, None),),
    ("file", True): ((_TOTAL_INACTIVE, _INACTIVE), (_TOTAL_ACTIVE, _ACTIVE)),
    ("inactive", True): ((_TOTAL_INACTIVE, _INACTIVE),),
}


def reclaimable_bytes(stat: bytes, keys: StatKeys) -> int:
    total = 0
    for preferred, fallback in keys:
        value = find_stat(stat, preferred)
        if value is None and fallback is not None:
            value = find_stat(stat, fallback)
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


# --------------------------------------------------------------------------------------
# Cgroup files kept open and re-read cheaply.
#
# Readings are on the request path: files are opened once and re-read with
# ``os.pread``, a fraction of what opening them costs (bench/README.md). A descriptor
# that fails is reopened, since a cgroup is recreated when a container restarts.

READ_SIZE: Final = 65536
#: What one value file is read with first: a kernel value takes at most 21 bytes, and
#: a small buffer is cheaper for pread to fill; a full one is read again whole.
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
        """:meth:`read` parsed by ``parse_bytes_value``; ``OSError`` as :meth:`read`."""
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


# --------------------------------------------------------------------------------------
# Where a reading comes from: one cgroup v2 directory or one v1 location.
#
# The effective limit is the tightest along the ancestry: on v1 the kernel reports it
# as ``hierarchical_memory_limit``; on v2 we walk up to the mount root, counting
# ``memory.high`` too (the kernel throttles hard at it). Where an ancestor binds, its
# usage is what the limit is compared with, since siblings count too.

#: A cgroup v1 limit at or above this is the kernel's "unlimited" sentinel.
V1_UNLIMITED: Final = 1 << 60


class CgroupSource:
    """One place a reading can come from: a v2 directory or a v1 location."""

    source: Source

    #: Whether ``memory.stat`` has subtree-inclusive ``total_*`` keys that win (v1).
    prefer_total = False

    def __init__(self, directory: str, top: str | None, reclaimable: Reclaimable) -> None:
        self.own = KeptFiles(directory)
        self.top = top
        self.reclaimable: Reclaimable = reclaimable
        self.stat_keys = RECLAIMABLE_KEYS[reclaimable, self.prefer_total]
        self.ancestors: list[KeptFiles] | None = None

    def read(self) -> MemoryReading | None:
        """A reading, or ``None`` when this source's files are not there at all."""
        raise NotImplementedError

    def read_bound(self) -> MemoryReading | None:
        """Raw usage with the exact limit, without ``memory.stat`` (``exact=False``);
        ``None`` where the limit cannot be told exactly that way."""
        raise NotImplementedError

    def ancestor_files(self, marker: str) -> list[KeptFiles]:
        if self.ancestors is None:
            self.ancestors = [
                KeptFiles(level) for level in parent_levels(self.own.directory, self.top, marker)
            ]
        return self.ancestors

    def paths(self) -> list[str]:
        return [path for level in (self.own, *(self.ancestors or ())) for path in level.paths()]

    def close(self) -> None:
        for level in (self.own, *(self.ancestors or ())):
            level.close()

    def unavailable(self) -> MemoryReading:
        return MemoryReading(
            used_bytes=None,
            limit_bytes=None,
            available=False,
            source=self.source,
            path=self.own.directory,
        )


class V2Source(CgroupSource):
    source: Source = "cgroup-v2"

    def _limit(self, level: KeptFiles) -> tuple[int | None, str | None, bool]:
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
                # memory.high is optional (absent on old kernels); a cgroup's set of
                # files never changes, so stop asking until the reader starts over.
                level.absent.add(name)
                continue
            value = raw.strip()
            if value == b"max":
                continue
            parsed = parse_bytes_value(value)
            if parsed is None or parsed == 0:
                return None, None, False
            if best is None or parsed < best:
                best, best_file = parsed, os.path.join(level.directory, name)
        return best, best_file, True

    def _measure(
        self,
    ) -> tuple[int, int | None, str | None, KeptFiles] | MemoryReading | None:
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
        usage = parse_bytes_value(usage_raw)
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
        reclaimable = reclaimable_bytes(stat, self.stat_keys)
        return available_reading(
            max(0, usage - reclaimable),
            limit,
            usage,
            min(reclaimable, usage),
            self.source,
            binding.directory,
            limit_file,
        )

    def read_bound(self) -> MemoryReading | None:
        # Every limit v2 reads comes from the limit files themselves, so only the
        # reclaimable cache (memory.stat) is left out: usage is the upper bound.
        measured = self._measure()
        if not isinstance(measured, tuple):
            return None
        usage, limit, limit_file, binding = measured
        if limit is None or limit_file is None:
            return None
        return available_reading(
            usage, limit, usage, 0, self.source, binding.directory, limit_file, exact=False
        )


class V1Source(CgroupSource):
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
        self.usage_file = self.own.file("memory.usage_in_bytes")
        self.limit_file = self.own.file("memory.limit_in_bytes")
        self.stat_file = self.own.file("memory.stat")
        # Every ancestor is visible below ``top``, so their limit files give the
        # kernel's hierarchical_memory_limit exactly, without memory.stat.
        self.whole_chain = whole_chain and top is not None
        # The ancestors read_bound reads: None until the first bound, False for none.
        self.bound_levels: list[KeptFiles] | Literal[False] | None = None

    def read(self) -> MemoryReading | None:
        try:
            usage_raw = self.usage_file.read()
            limit_raw = self.limit_file.read()
        except OSError:
            return None
        usage = parse_bytes_value(usage_raw)
        limit = parse_bytes_value(limit_raw)
        if usage is None or limit is None or limit <= 0:
            return self.unavailable()
        limit_file = self.limit_file.path
        try:
            stat = self.stat_file.read()
        except OSError:
            stat = b""
        binding = self.own
        hierarchical = find_stat(stat, HIERARCHICAL_LIMIT)
        if hierarchical is not None and 0 < hierarchical < limit:
            limit = hierarchical
            limit_file = self.stat_file.path
            if limit < V1_UNLIMITED:
                # An ancestor binds: compare its usage, which includes our siblings.
                # Where the ancestor is not visible (a container's view), our own
                # usage is all there is to compare.
                found = self._binding_ancestor(limit)
                if found is not None:
                    binding, usage, stat = found
                    limit_file = os.path.join(binding.directory, "memory.limit_in_bytes")
        reclaimable = reclaimable_bytes(stat, self.stat_keys)
        unlimited = limit >= V1_UNLIMITED
        return available_reading(
            max(0, usage - reclaimable),
            None if unlimited else limit,
            usage,
            min(reclaimable, usage),
            self.source,
            binding.directory,
            None if unlimited else limit_file,
        )

    def _bound_levels(self) -> list[KeptFiles] | None:
        """The ancestors whose limits ``read_bound`` reads, or ``None`` where it cannot.

        The last level, the hierarchy's root cgroup, is left out: v1 cannot set its
        limit (EINVAL), so it never binds.
        """
        if not self.whole_chain:
            return None
        chain = self.ancestor_files("memory.limit_in_bytes")
        last = chain[-1].directory if chain else self.own.directory
        if os.path.normpath(last) != os.path.normpath(self.top or ""):
            return None
        return chain[:-1]

    def read_bound(self) -> MemoryReading | None:
        levels = self.bound_levels
        if levels is None:
            found = self._bound_levels()
            levels = self.bound_levels = False if found is None else found
        if levels is False:
            return None
        try:
            usage = self.usage_file.read_value()
            limit = self.limit_file.read_value()
            if usage is None or limit is None or limit <= 0:
                return None
            binding, limit_file = self.own, self.limit_file.path
            # Nearest first and strictly less: the level read() would pick as binding.
            for level in levels:
                level_limit = parse_bytes_value(level.read("memory.limit_in_bytes"))
                if level_limit is None or level_limit <= 0:
                    return None
                if level_limit < limit:
                    limit, binding = level_limit, level
            if limit >= V1_UNLIMITED:
                return None
            if binding is not self.own:
                usage = parse_bytes_value(binding.read("memory.usage_in_bytes"))
                if usage is None:
                    return None
                limit_file = os.path.join(binding.directory, "memory.limit_in_bytes")
        except OSError:
            return None
        return available_reading(
            usage, limit, usage, 0, self.source, binding.directory, limit_file, exact=False
        )

    def _binding_ancestor(self, limit: int) -> tuple[KeptFiles, int, bytes] | None:
        for level in self.ancestor_files("memory.limit_in_bytes"):
            try:
                if parse_bytes_value(level.read("memory.limit_in_bytes")) != limit:
                    continue
                usage = parse_bytes_value(level.read("memory.usage_in_bytes"))
                stat = level.read("memory.stat")
            except OSError:
                return None
            return (level, usage, stat) if usage is not None else None
        return None


# --------------------------------------------------------------------------------------
# ``CgroupMemoryReader``: the sources tried v2 first, then v1; the one that last
# answered is read first next time. In a hybrid layout PSI comes from our unified
# cgroup, for most processes the root, i.e. machine-wide pressure.

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
        #: The directory given, or the fallback mount where none was found; else ``None``.
        self.root = None if root is None else os.fspath(root)
        if self.root is not None:
            self.location = CgroupLocation(v2=(self.root, self.root), v1=None, how="explicit")
        else:
            self.location = discover_cgroup(
                proc_self_cgroup=proc_self_cgroup,
                mountinfo=mountinfo,
                hostfs=hostfs,
                cgroup_namespace=cgroup_namespace,
            )
            if self.location.how == "fallback":
                self.root = on_host(hostfs, DEFAULT_CGROUP_MOUNT)
        for warning in self.location.warnings:
            logger.warning("asgi-admission: %s.", warning)
        # v1 directories under an explicit or fallback root whose every ancestor is visible.
        self._v1_tops: dict[str, str] = {}
        if self.root is not None:
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
                whole_chain = self.location.v1_whole_chain
                sources.append(V1Source(directory, top, self.reclaimable, whole_chain=whole_chain))
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
        # First reading, or the last source failed: start over with fresh descriptors.
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
