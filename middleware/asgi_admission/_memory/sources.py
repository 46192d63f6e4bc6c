"""Where a reading comes from: one cgroup v2 directory or one v1 location.

Notes:

- The effective limit is the tightest along the ancestry: on v1 the kernel
  reports it as ``hierarchical_memory_limit``; on v2 we walk up to the mount root,
  counting ``memory.high`` too (the kernel throttles hard at it). Where an ancestor
  binds, its usage is what the limit is compared with, since siblings count too.
- ``read_bound()`` is the fast path's upper bound of the working set: raw usage and the
  exact limit, without ``memory.stat``.
"""

from __future__ import annotations

import os
from typing import Final, Literal

from asgi_admission._memory.files import KeptFiles, parent_levels
from asgi_admission._memory.parse import (
    HIERARCHICAL_LIMIT,
    RECLAIMABLE_KEYS,
    find_stat,
    parse_bytes_value,
    reclaimable_bytes,
)
from asgi_admission._memory.reading import (
    MemoryReading,
    Reclaimable,
    Source,
    available_reading,
)

#: A cgroup v1 limit at or above this is the kernel's "unlimited" sentinel.
V1_UNLIMITED_FLOOR: Final = 1 << 60


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
        """An upper bound of the working set (raw usage) with the exact limit, without
        ``memory.stat``, as a reading marked ``exact=False``.

        ``None`` where this source cannot tell the effective limit exactly that way
        (or anything is off): the caller then takes a full reading.
        """
        raise NotImplementedError

    def ancestor_files(self, marker: str) -> list[KeptFiles]:
        if self.ancestors is None:
            self.ancestors = [
                KeptFiles(level) for level in parent_levels(self.own.directory, self.top, marker)
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
                # memory.high is optional (absent on old kernels and in some
                # snapshots); a cgroup's set of files never changes, so stop asking
                # until the reader starts over.
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
        # Every reading reads these three: resolve them once.
        self.usage_file = self.own.file("memory.usage_in_bytes")
        self.limit_file = self.own.file("memory.limit_in_bytes")
        self.stat_file = self.own.file("memory.stat")
        #: Every ancestor up to the hierarchy's root is visible below ``top`` (the
        #: mount shows the whole hierarchy), so their limit files give the kernel's
        #: hierarchical_memory_limit exactly, without memory.stat.
        self.whole_chain = whole_chain and top is not None
        #: The ancestors ``bound`` reads, settled at the first bound: ``None`` until then,
        #: ``False`` where the walk did not reach the hierarchy's root (no bound).
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
            if limit < V1_UNLIMITED_FLOOR:
                # An ancestor binds: compare its usage, which includes our siblings.
                # Where the ancestor is not visible (a container's view), our own
                # usage is all there is to compare.
                found = self._binding_ancestor(limit)
                if found is not None:
                    binding, usage, stat = found
                    limit_file = os.path.join(binding.directory, "memory.limit_in_bytes")
        reclaimable = reclaimable_bytes(stat, self.stat_keys)
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

    def _bound_levels(self) -> list[KeptFiles] | None:
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
            if limit >= V1_UNLIMITED_FLOOR:
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
