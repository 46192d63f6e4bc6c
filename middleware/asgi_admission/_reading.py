"""The one value every reader produces and the latch consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Source = Literal["cgroup-v2", "cgroup-v1", "host"]


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """One look at the memory the guard protects.

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

    @property
    def percent(self) -> float | None:
        """Working set as a percentage of the limit, rounded to two decimals."""
        if not self.available or self.used_bytes is None or not self.limit_bytes:
            return None
        return round(self.used_bytes * 100 / self.limit_bytes, 2)


class MemoryReader(Protocol):
    """Anything that can take one reading; called on the request path."""

    def __call__(self) -> MemoryReading: ...


UNAVAILABLE = MemoryReading(used_bytes=None, limit_bytes=None, available=False)
