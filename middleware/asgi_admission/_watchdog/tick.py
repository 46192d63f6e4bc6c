"""One watchdog tick: what it measures of each session, and what it decides from that.

Notes:

- The measuring (``measure``) is a ``/proc`` scan and a read per session process,
  whose cost grows with the sessions: the running watchdog does it in a thread of its
  own, so many sessions never hold the loop. It changes no session.
- The decisions (``decide``) are cheap and run on the loop: record each sample, end
  the sessions whose process has gone, halt. Two reasons to halt, checked every tick:
  a session whose RSS exceeds its own budget (``budget_exceeded``), and, while the
  container's working set is at or above the critical watermark, the largest sessions
  first until the memory they are expected to free brings it back under
  (``container_headroom``, picked by ``halter.Halter``). A session being halted counts
  as freeing its last RSS until its process is gone, so one breach does not halt a
  second session while the first is still exiting.
- A session in a memory group is held to its budget by the kernel, so the sampled
  RSS (an upper bound) does not halt it; an OOM kill in its group is reported as the
  halt ``memory_limit`` by the tick that sees it.
- The session handles' state is the watchdog's own (``session.py``): the tick
  records each sample in it (``SessionWatch.record``) as the halter records a halt.
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
    """The system calls of a tick, safe in a thread: each session's sample at ``now``,
    or ``None`` for a process that has gone. Changes no session.

    ``pause`` is called between sessions and every few ``/proc`` entries.
    """
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
        if session.halt is not None:
            # Halted: only wait for it to go; its RSS no longer decides anything.
            measured.append((session, True, None if not sampler.alive() else STILL, ooms))
            continue
        # A session registered under its ticket is measured by its own memory all its life:
        # while pending, its ticket is told it (``decide``); its peak is what is learned.
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
    """The decisions of a tick, on the loop: record samples, end sessions (``drop``
    takes one whose process has gone out of the table), halt."""
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
