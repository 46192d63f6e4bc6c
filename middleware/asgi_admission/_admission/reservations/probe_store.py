"""Where the probe windows are kept (``probing.py``): in one process, or in a file the
workers share (``shared_probes.SharedProbeStore``)."""

from __future__ import annotations

from typing import Protocol

from asgi_admission._admission.reservations.probe_window import ProbeWindow


class ProbeStore(Protocol):
    """Where the windows are: in this process, or in a file the workers share."""

    def load(self) -> dict[str, ProbeWindow] | None:
        """The windows; ``None`` while they cannot be read (the last ones seen stand)."""
        ...

    def store(self, windows: dict[str, ProbeWindow]) -> None: ...

    def owner_alive(self, pid: int) -> bool: ...

    @property
    def shared(self) -> bool: ...


class LocalProbeStore:
    """The windows of one process."""

    __slots__ = ("_windows",)

    def __init__(self) -> None:
        self._windows: dict[str, ProbeWindow] = {}

    def load(self) -> dict[str, ProbeWindow]:
        return self._windows

    def store(self, windows: dict[str, ProbeWindow]) -> None:
        self._windows = windows

    def owner_alive(self, pid: int) -> bool:
        return True

    @property
    def shared(self) -> bool:
        return False
