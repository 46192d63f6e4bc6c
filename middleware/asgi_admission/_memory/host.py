"""The opt-in host reader, for services on a VM or desktop without a cgroup limit.

Host-wide figures never claim container capacity: this reader is used only when
``memory_source="host"`` is configured, never as a silent fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from asgi_admission._memory.reading import MemoryReading

GIB: Final = 1024**3
#: Kept free for the host: the greater of this share of RAM and ``HEADROOM_MIN_BYTES``.
HEADROOM_FRACTION: Final = 0.10
HEADROOM_MIN_BYTES: Final = 1 * GIB


def host_headroom_bytes(total_bytes: int) -> int:
    """Memory kept free for the host: the greater of 10% of RAM or 1 GiB."""
    return max(int(total_bytes * HEADROOM_FRACTION), HEADROOM_MIN_BYTES)


class HostMemoryReader:
    """Reads the whole machine's memory with psutil, minus a headroom for the host.

    The limit is total RAM minus the headroom and the working set is what is not
    available (``total - available``), so the percentage says how much of the
    usable part is taken.
    """

    def __init__(self, *, virtual_memory: Callable[[], Any] | None = None) -> None:
        if virtual_memory is None:
            import psutil

            virtual_memory = psutil.virtual_memory
        self._virtual_memory = virtual_memory

    def __call__(self) -> MemoryReading:
        try:
            vm = self._virtual_memory()
            total, available = int(vm.total), int(vm.available)
        except Exception:  # psutil raises OSError and friends on odd systems
            return MemoryReading(used_bytes=None, limit_bytes=None, available=False, source="host")
        limit = total - host_headroom_bytes(total)
        if total <= 0 or limit <= 0:
            return MemoryReading(used_bytes=None, limit_bytes=None, available=False, source="host")
        used = max(0, total - available)
        return MemoryReading(
            used_bytes=used,
            limit_bytes=limit,
            available=True,
            usage_bytes=used,
            source="host",
            path="host",
            limit_file="psutil.virtual_memory()",
        )

    def read(self, *, pressure: bool = False) -> MemoryReading:
        """Take one reading (``pressure`` is accepted for symmetry; hosts report none here)."""
        return self()
