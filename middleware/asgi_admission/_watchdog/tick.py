"""One watchdog tick: what it measures of each session, and what it decides from that.

Notes:

- The measuring (``measure``) is a ``/proc`` scan and a read per session process, so
  the running watchdog does it in a thread of its own. It changes no session.
- The decisions (``decide``) run on the loop. Two reasons to halt: a session over its
  own budget (``budget_exceeded``), and, while the container is at or above the
  critical watermark, the largest sessions first (``container_headroom``). A session
  being halted counts as freeing its last RSS until its process is gone, so one breach
  does not halt a second session while the first is still exiting.
- A session in a memory group is held to its budget by the kernel, so its sampled RSS
  (an upper bound) does not halt it; an OOM kill there is the halt ``memory_limit``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from asgi_admission._config import MIB
from asgi_admission._memory.reading import MemoryReader
from asgi_admission._watchdog.groups import SessionGroups
from asgi_admission._watchdog.halt import SessionHalt
from asgi_admission._watchdog.halter import Halter
from asgi_admission._watchdog.sampler import ProcessSample, read_children_map
from asgi_admission._watchdog.session import SessionWatch

#: A halted session that still runs, in a tick's measurements.
STILL: Final = "still running"
#: One session's measurement: the session, whether it was halted, its sample
#: (``None``: the process has gone; ``STILL``: halted and still running), and the OOM
#: kills counted in its memory group (0 without one).
Measured = tuple[SessionWatch, bool, "ProcessSample | str | None", int]


def measure(
    sessions: Sequence[SessionWatch],
    *,
    now: float,
    proc: str,
    session_groups: SessionGroups,
    pause: Callable[[], None] | None = None,
) -> list[Measured]:
    """The system calls of a tick, safe in a thread; ``pause`` is called between
    sessions and every few ``/proc`` entries."""
    children = (
        read_children_map(proc, pause=pause)
        if any(s.include_children and s.halt is None for s in sessions)
        else None
    )
    measured: list[Measured] = []
    for session in sessions:
        if pause is not None:
            pause()
        sampler = session.sampler
        assert sampler is not None  # only live sessions are in the table
        if session.ended:
            continue
        ooms = 0 if session.group is None else session.group.oom_kills()
        if session.halt is not None:  # only wait for it to go
            measured.append((session, True, None if not sampler.alive() else STILL, ooms))
            continue
        # A session registered under its ticket is measured by its own memory.
        unique = session.ticket is not None
        sample = sampler.sample(children if session.include_children else None, now, unique=unique)
        measured.append((session, False, sample, ooms))
    if session_groups.pending:
        session_groups.retry()
    return measured


def decide(
    sessions: Sequence[SessionWatch],
    measured: list[Measured],
    *,
    halter: Halter,
    memory_reader: MemoryReader,
    critical_percent: float,
    drop: Callable[[SessionWatch], None],
) -> tuple[SessionHalt, ...]:
    """The decisions of a tick, on the loop: record samples, end sessions, halt."""

    halts: list[SessionHalt] = []
    for session, was_halted, sample, ooms in measured:
        if session.ended:  # unregistered meanwhile (a callback, another thread)
            continue
        if ooms and not was_halted:
            if isinstance(sample, ProcessSample):
                session.record(sample, peak=False)
            halts.append(halter.memory_limit(session, critical_percent))
            was_halted = True
        if was_halted or sample is None:
            if sample is None:
                drop(session)
            continue
        assert isinstance(sample, ProcessSample)
        session.record(sample)
        ticket = session.ticket
        if ticket is not None and ticket.awaiting_memory and sample.unique_bytes is not None:
            ticket.measured(sample.unique_bytes)
        budget = session.budget_bytes
        if budget is not None and session.group is None and sample.rss_bytes > budget:
            halts.append(
                halter.halt(
                    session,
                    "budget_exceeded",
                    None,
                    f"The session was halted because it used {sample.rss_bytes / MIB:.0f} MiB "
                    f"of memory, over its budget of {budget / MIB:.0f} MiB.",
                    critical_percent=critical_percent,
                )
            )
    live = [s for s in sessions if not s.ended]
    if live:
        halts.extend(halter.container_halts(live, memory_reader(), critical_percent))
    return tuple(halts)
