"""The one value every reader produces and the latch consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

Source = Literal["cgroup-v2", "cgroup-v1", "host"]
#: Which file cache counts as reclaimable: both LRUs ("file", the default) or only
#: ``inactive_file`` ("inactive", the kubelet's working set, as ``kubectl top`` shows).
Reclaimable = Literal["file", "inactive"]


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
    """A plain class with the slots of the frozen, slotted dataclass ``cls``.

    The generated ``__init__`` of a frozen dataclass sets each field through
    ``object.__setattr__``, which is slow on the request path (bench/README.md).
    The readings and decisions made there are written as an instance of this class
    instead, whose slots are plain attributes, and then handed ``cls`` as
    their class: CPython allows that between classes of one layout and raises
    ``TypeError`` otherwise. Tests check the results equal the constructor's.
    """
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
