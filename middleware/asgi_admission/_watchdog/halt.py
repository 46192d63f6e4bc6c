"""Halts: what a halt is, and the default way of carrying one out.

Notes:

- The default action signals the session's process group only when the session
  process leads a group of its own (``start_new_session=True``, a PTY's shell, a
  kernel launcher): then everything it started goes with it. A process in somebody
  else's group, and above all in ours, is signalled on its own, with the descendants
  the sampler last saw; ``killpg`` there would take down the server too.
- SIGKILL after the grace period is scheduled on the event loop (a task that sleeps),
  never with ``time.sleep`` or a thread. When the watchdog stops, pending escalations
  are cancelled and kill at once, so shutdown leaves no halted process running.
- A process that is already gone is not an error at any step, nor is one we may not
  signal (docs/trust.md, "A halt that cannot signal").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol, get_args

import psutil

from asgi_admission._memory.reading import MemoryReading

HaltReason = Literal["budget_exceeded", "container_headroom", "memory_limit"]
HALT_REASONS: Final[tuple[HaltReason, ...]] = get_args(HaltReason)


class HaltableSession(Protocol):
    """What a halt needs of a watched session; ``WatchedSession`` is one."""

    @property
    def session_id(self) -> str: ...

    @property
    def pid(self) -> int: ...

    @property
    def process(self) -> psutil.Process: ...

    @property
    def descendant_pids(self) -> tuple[int, ...]: ...

    def is_running(self) -> bool: ...


logger = logging.getLogger("asgi_admission")

DEFAULT_GRACE_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class SessionHalt:
    """Why and on what figures the watchdog halted a session; passed to ``halt`` and ``on_halt``."""

    #: The ``WatchedSession`` halted.
    session: HaltableSession
    #: ``"budget_exceeded"``: over its own budget; ``"container_headroom"``: the
    #: container crossed the critical watermark and this was the largest session;
    #: ``"memory_limit"``: the kernel's OOM killer struck inside the session's own
    #: memory group, which had reached its budget (the watchdog reports it after).
    reason: HaltReason
    #: The session's RSS in the sample that decided the halt (for ``memory_limit``,
    #: the last sample before the kill, or the group's peak if there was none).
    rss_bytes: int
    budget_bytes: int | None
    #: The container reading that crossed the critical watermark (container halts only).
    memory: MemoryReading | None
    critical_watermark_percent: float
    #: One sentence an application may show its user.
    message: str
    #: The session's memory group's peak usage (``memory_limit`` halts only).
    group_peak_bytes: int | None = None

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def pid(self) -> int:
        return self.session.pid


#: Carries out a halt (``SessionWatchdog(halt=...)``), or is told of one after it
#: started (``on_halt=``, e.g. to tell the session's user why). May return an
#: awaitable, which the watchdog runs as a task.
HaltAction = Callable[[SessionHalt], "Awaitable[None] | None"]


class _Target:
    """Whom to signal: a whole process group, or a list of processes."""

    __slots__ = ("_warned", "pgid", "processes", "session_id")

    def __init__(self, pgid: int | None, processes: list[psutil.Process], session_id: str) -> None:
        self.pgid = pgid
        self.processes = processes
        self.session_id = session_id
        self._warned: set[str] = set()

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _cannot_signal(self, sig: int, whom: str) -> None:
        self._warn_once(
            "signal",
            "asgi-admission: cannot signal session %s (%s, %s: permission denied); it stays "
            "marked halted until its process is gone.",
            self.session_id,
            whom,
            signal.Signals(sig).name,
        )

    def send(self, sig: int) -> bool:
        """Signal everyone; false when nobody was left to receive it or none could be."""
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                return False
            except PermissionError:
                self._cannot_signal(sig, f"process group {self.pgid}")
                return False
            return True
        delivered = False
        for process in self.processes:
            try:
                process.send_signal(sig)  # psutil refuses a pid that was reused
            except psutil.AccessDenied:
                self._cannot_signal(sig, f"pid {process.pid}")
                continue
            except psutil.Error:
                continue
            delivered = True
        return delivered

    def alive(self) -> bool:
        if self.pgid is not None:
            # Signal 0 checks existence; an unreaped zombie still counts, and a
            # SIGKILL to it after the grace period is harmless.
            try:
                os.killpg(self.pgid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                # Cannot tell: assume it runs, so the SIGKILL is still tried.
                self._warn_once(
                    "alive",
                    "asgi-admission: cannot tell whether session %s (process group %d) still "
                    "runs (permission denied); sending SIGKILL after the grace period.",
                    self.session_id,
                    self.pgid,
                )
            return True
        for process in self.processes:
            with contextlib.suppress(psutil.Error):  # gone between the two calls
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    return True
        return False


def _target(session: HaltableSession) -> _Target | None:
    if not session.is_running():
        return None
    pid = session.pid
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return None
    if pgid == pid and pgid != os.getpgrp():
        return _Target(pgid, [], session.session_id)
    processes = [session.process]
    for child in session.descendant_pids:
        try:
            processes.append(psutil.Process(child))
        except psutil.Error:
            continue
    return _Target(None, processes, session.session_id)


class ProcessGroupHalt:
    """The default halt: SIGTERM to the session's process group, SIGKILL after ``grace_s``.

    Without a running event loop (``sample_once`` called from plain code) only the
    SIGTERM is sent.
    """

    __slots__ = ("grace_s", "poll_s")

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S, poll_s: float = 0.1) -> None:
        if not (math.isfinite(grace_s) and grace_s >= 0):
            raise ValueError(
                f"grace_s must be a finite number of seconds, 0 or more; got {grace_s!r}."
            )
        if not (math.isfinite(poll_s) and poll_s > 0):
            raise ValueError(f"poll_s must be a finite number of seconds above 0; got {poll_s!r}.")
        self.grace_s = grace_s
        self.poll_s = poll_s

    def __call__(self, halt: SessionHalt) -> Awaitable[None] | None:
        target = _target(halt.session)
        if target is None or not target.send(signal.SIGTERM):
            return None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return None
        return self._escalate(target)

    async def _escalate(self, target: _Target) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        try:
            while target.alive():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    target.send(signal.SIGKILL)
                    return
                await asyncio.sleep(min(self.poll_s, remaining))
        except asyncio.CancelledError:
            target.send(signal.SIGKILL)  # the watchdog is stopping: do not leave it running
            raise
