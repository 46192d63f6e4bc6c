"""The one value every reader produces and the latch consumes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
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


def slot_setters(cls: type) -> dict[str, Callable[[Any, Any], None]]:
    """Each field's slot setter of a frozen, slotted dataclass, by field name.

    The generated ``__init__`` of a frozen dataclass sets each field through
    ``object.__setattr__``, which costs about 1 µs per object; the readings and
    decisions made on the request path are built by writing their slots directly
    instead (tests check that the result equals the constructor's).
    """
    return {field.name: getattr(cls, field.name).__set__ for field in fields(cls)}


_SLOT_SETTERS = slot_setters(MemoryReading)
_set_used = _SLOT_SETTERS["used_bytes"]
_set_limit = _SLOT_SETTERS["limit_bytes"]
_set_available = _SLOT_SETTERS["available"]
_set_usage = _SLOT_SETTERS["usage_bytes"]
_set_reclaimable = _SLOT_SETTERS["reclaimable_bytes"]
_set_source = _SLOT_SETTERS["source"]
_set_path = _SLOT_SETTERS["path"]
_set_limit_file = _SLOT_SETTERS["limit_file"]
_set_pressure = _SLOT_SETTERS["pressure_some_avg10"]
_set_exact = _SLOT_SETTERS["exact"]
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
    reading: MemoryReading = _new(MemoryReading)
    _set_used(reading, used_bytes)
    _set_limit(reading, limit_bytes)
    _set_available(reading, True)
    _set_usage(reading, usage_bytes)
    _set_reclaimable(reading, reclaimable_bytes)
    _set_source(reading, source)
    _set_path(reading, path)
    _set_limit_file(reading, limit_file)
    _set_pressure(reading, None)
    _set_exact(reading, exact)
    return reading


UNAVAILABLE = MemoryReading(used_bytes=None, limit_bytes=None, available=False)
