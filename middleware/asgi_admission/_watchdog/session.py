"""A watched session: its handle, and the figures the watchdog hands on when it ends."""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Protocol

import psutil

from asgi_admission._watchdog.groups import SessionGroup
from asgi_admission._watchdog.halt import HaltReason, SessionHalt
from asgi_admission._watchdog.sampler import ProcessSample, ProcessTreeSampler

#: Where a session's peak came from: its memory group's own counter (exact), or the
#: highest RSS the sampler saw (an upper bound).
PeakSource = Literal["memory_group", "rss"]


@dataclass(frozen=True, slots=True)
class SessionPeak:
    """One session's peak memory, told once when it ends (``SessionWatchdog.on_session_peak``)."""

    session_id: str
    #: The session route it was admitted by (the ticket's), ``None`` if not given.
    route: str | None
    peak_bytes: int
    source: PeakSource
    budget_bytes: int | None
    #: Why it was halted, ``None`` if it ended on its own.
    halted: HaltReason | None


class SessionTicket(Protocol):
    """What the watchdog asks of a session's admission ticket (``AdmissionTicket``)."""

    @property
    def route(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def awaiting_memory(self) -> bool: ...

    def measured(self, used_bytes: int) -> None: ...

    def release(self) -> None: ...


class _Unregisters(Protocol):
    def unregister(self, session: WatchedSession) -> None: ...


class WatchedSession:
    """A registered session process; returned by ``SessionWatchdog.register``.

    Use it as a context manager to unregister when the block ends, or call
    ``unregister()``. Its read-only properties say what the sampler last saw.
    """

    __slots__ = (
        "_ended",
        "_halt",
        "_last",
        "_observed",
        "_peak",
        "_peak_own",
        "_sampler",
        "_watchdog",
        "budget_bytes",
        "group",
        "include_children",
        "pid",
        "route",
        "session_id",
        "ticket",
    )

    def __init__(
        self,
        watchdog: _Unregisters,
        sampler: ProcessTreeSampler | None,
        *,
        pid: int,
        session_id: str,
        budget_bytes: int | None,
        include_children: bool,
        route: str | None = None,
        group: SessionGroup | None = None,
        ticket: SessionTicket | None = None,
    ) -> None:
        self._watchdog = watchdog
        self._sampler = sampler
        self.pid = pid
        self.session_id = session_id
        self.budget_bytes = budget_bytes
        self.include_children = include_children
        self.route = route  # the session route it was admitted by, for learning
        #: Told the session's own memory while pending, to settle its reservation by it.
        self.ticket = ticket
        #: The memory group the kernel holds it to its budget in, if it has one.
        self.group = group
        self._last: ProcessSample | None = None
        self._peak: int | None = None
        self._peak_own: int | None = None
        self._halt: SessionHalt | None = None
        self._ended = sampler is None
        self._observed = False

    def __repr__(self) -> str:
        return (
            f"<WatchedSession {self.session_id!r} pid={self.pid} "
            f"peak_rss_bytes={self._peak} ended={self._ended}>"
        )

    @property
    def last_sample(self) -> ProcessSample | None:
        """The latest measurement, ``None`` until the first."""
        return self._last

    @property
    def peak_rss_bytes(self) -> int | None:
        """The highest RSS measured so far, ``None`` until the first measurement."""
        return self._peak

    @property
    def peak_own_bytes(self) -> int | None:
        """The highest memory of its own measured so far (what it alone maps: measured
        for a session registered under its admission ticket), ``None`` if never."""
        return self._peak_own

    @property
    def halt(self) -> SessionHalt | None:
        """Why the watchdog halted this session, or ``None`` if it has not."""
        return self._halt

    @property
    def ended(self) -> bool:
        """True once unregistered or once its process has gone; nothing samples it after."""
        return self._ended

    @property
    def process(self) -> psutil.Process:
        """The session's process as psutil sees it (safe against pid reuse)."""
        if self._sampler is None:
            return psutil.Process(self.pid)
        return self._sampler.process

    @property
    def descendant_pids(self) -> tuple[int, ...]:
        """The descendants counted by the last sample (empty without ``include_children``)."""
        return () if self._sampler is None else self._sampler.descendant_pids

    def is_running(self) -> bool:
        """Whether the session's own process still runs (not exited, reaped or a zombie)."""
        return self._sampler is not None and self._sampler.alive()

    def unregister(self) -> None:
        """End the session: no more samples, and its peak goes into the histogram."""
        self._watchdog.unregister(self)

    def __enter__(self) -> WatchedSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unregister()


class SessionWatch(WatchedSession):
    """The handle ``register`` returns, with the writes only the watchdog makes."""

    __slots__ = ()

    @property
    def sampler(self) -> ProcessTreeSampler | None:
        """What samples its processes; ``None`` for a process already gone at registration."""
        return self._sampler

    def record(self, sample: ProcessSample, *, peak: bool = True) -> None:
        """Record ``sample``; ``peak`` false: taken as the kernel killed in its group."""
        self._last = sample
        if peak and (self._peak is None or sample.rss_bytes > self._peak):
            self._peak = sample.rss_bytes
        own = sample.unique_bytes
        if peak and own is not None and (self._peak_own is None or own > self._peak_own):
            self._peak_own = own

    def halted(self, halt: SessionHalt) -> None:
        """The watchdog halted it, for the reason and on the figures ``halt`` says."""
        self._halt = halt

    def end(self) -> None:
        """Nothing samples it any more: unregistered, or its process has gone."""
        self._ended = True

    def claim_peak(self) -> bool:
        """True the first time only: its peak is told once."""
        if self._observed:
            return False
        self._observed = True
        return True


class PeakHook(Protocol):
    """Told each watched session's peak once (``SessionWatchdog.on_peak``): ``exact``
    when it is the session's own memory group's, else the highest RSS sampled."""

    def __call__(self, route: str, peak_bytes: int, *, exact: bool = False) -> None: ...
