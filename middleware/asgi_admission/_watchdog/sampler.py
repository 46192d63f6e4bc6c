"""Measuring one session's processes: resident memory and CPU share.

Notes:

- RSS comes from psutil (``/proc/<pid>/statm`` on Linux), the figure the kernel
  reports as ``VmRSS``. Summed over a process tree it over-counts pages the
  processes share (a forked interpreter, shared libraries), so the total is an
  upper bound: the right side to err on for a halt decision.
- CPU is psutil's ``cpu_percent(None)`` since the previous sample (percent of
  one CPU, so above 100 on a busy multi-core machine), divided by the number of
  logical CPUs to give a share of the whole machine. A process's first sample
  only sets psutil's baseline and reads 0.
- Descendants: ``Process.children(recursive=True)`` scans all of ``/proc`` per
  call; one scan per tick (``read_children_map``) serves every session instead
  (``bench/watchdog.md``), rebuilt each tick so a reused pid is never counted.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import psutil

#: Enough for any /proc/<pid>/stat line (52 fields of at most 20 digits and a 16-byte name).
_STAT_READ: Final = 4096

#: How many ``/proc`` entries ``read_children_map`` reads between two pauses.
PAUSE_EVERY: Final = 32

#: Parent pid -> the pids of its children, for every process on the machine.
ChildrenMap = Mapping[int, Sequence[int]]


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One measurement of a session's process (and its descendants, if counted)."""

    #: Resident set size in bytes, summed over the processes counted.
    rss_bytes: int
    #: CPU used since the previous sample, as a percentage of all logical CPUs (0-100).
    cpu_percent: float
    #: How many processes were measured: the session's own plus its live descendants.
    processes: int
    #: When the sample was taken, on the watchdog's clock.
    at: float
    #: The memory these processes alone map and made themselves: the least of their USS
    #: and their RSS less the pages mapped from files. Measured only for a session
    #: registered under its ticket; ``None`` otherwise or where the platform cannot.
    unique_bytes: int | None = None


def read_children_map(
    proc: str = "/proc", *, pause: Callable[[], None] | None = None
) -> dict[int, list[int]]:
    """Map every parent pid to its children's pids by reading ``<proc>/<pid>/stat``.

    ``pause`` is called after every ``PAUSE_EVERY`` processes (the watchdog's
    thread lets the event loop's thread have the GIL there).
    """
    children: defaultdict[int, list[int]] = defaultdict(list)
    try:
        names = os.listdir(proc)
    except OSError:
        return children
    for index, name in enumerate(names):
        if pause is not None and index % PAUSE_EVERY == PAUSE_EVERY - 1:
            pause()
        if not name.isdigit():
            continue
        # os.open/os.read rather than open(): half the cost, and this runs for every
        # process on the machine once per tick.
        try:
            fd = os.open(f"{proc}/{name}/stat", os.O_RDONLY)
        except OSError:  # exited while we looked
            continue
        try:
            data = os.read(fd, _STAT_READ)
        except OSError:
            continue
        finally:
            os.close(fd)
        # The command name in parentheses may hold spaces or ")"; the fields after
        # the last ")" are "state ppid ...".
        fields = data[data.rfind(b")") + 2 :].split(maxsplit=2)
        if len(fields) > 1 and fields[1].isdigit():
            children[int(fields[1])].append(int(name))
    return children


def _descendants(pid: int, children: ChildrenMap) -> list[int]:
    found: list[int] = []
    stack = list(children.get(pid, ()))
    seen = {pid}
    while stack:
        child = stack.pop()
        if child in seen:  # a pid reused while /proc was scanned can close a loop
            continue
        seen.add(child)
        found.append(child)
        stack.extend(children.get(child, ()))
    return found


class ProcessTreeSampler:
    """Samples one process, and optionally its descendants, on demand.

    Construction raises ``psutil.Error`` when the process is already gone; after
    that, a process that goes away is reported as ``None``, never raised.
    """

    __slots__ = ("_children", "_logical_cpus", "_root", "pid")

    def __init__(self, pid: int, *, logical_cpus: int) -> None:
        self.pid = pid
        self._logical_cpus = logical_cpus
        self._root = psutil.Process(pid)
        self._root.cpu_percent(None)  # psutil's baseline: the next call measures from here
        self._children: dict[int, psutil.Process] = {}

    @property
    def process(self) -> psutil.Process:
        """The session's own process (pid and creation time, so safe against pid reuse)."""
        return self._root

    @property
    def descendant_pids(self) -> tuple[int, ...]:
        """The descendants measured by the last sample that counted them."""
        return tuple(self._children)

    def alive(self) -> bool:
        """Whether the session's process still runs: not exited, reaped, reused or a zombie."""
        try:
            return self._root.is_running() and self._root.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def sample(
        self, children: ChildrenMap | None, at: float, *, unique: bool = False
    ) -> ProcessSample | None:
        """Measure now; ``children`` (from ``read_children_map``) also counts descendants,
        ``unique`` measures ``unique_bytes`` too.

        ``None`` means the process has gone, which is how a session normally ends.
        """
        try:
            # The halt action checks the creation time (``alive``) against pid reuse.
            with self._root.oneshot():
                if self._root.status() == psutil.STATUS_ZOMBIE:
                    return None
                rss, own = _memory(self._root, unique)
                cpu = float(self._root.cpu_percent(None))
        except psutil.Error:
            return None
        count = 1
        if children is not None:
            kept: dict[int, psutil.Process] = {}
            for pid in _descendants(self.pid, children):
                try:
                    child = self._children.get(pid) or psutil.Process(pid)
                    with child.oneshot():
                        child_rss, child_own = _memory(child, unique)
                        cpu += float(child.cpu_percent(None))
                    rss += child_rss
                    own = None if own is None or child_own is None else own + child_own
                except psutil.Error:  # exited between the scan and now
                    continue
                kept[pid] = child
                count += 1
            self._children = kept
        return ProcessSample(
            rss_bytes=rss,
            cpu_percent=round(cpu / self._logical_cpus, 2),
            processes=count,
            at=at,
            unique_bytes=own,
        )


def _memory(process: psutil.Process, unique: bool) -> tuple[int, int | None]:
    """A process's RSS and (``unique``) the memory it alone maps and made itself: a
    file only it maps is in its USS, but was in the page cache before it."""
    if not unique:
        return int(process.memory_info().rss), None
    try:
        info = process.memory_full_info()
    except psutil.AccessDenied:
        return int(process.memory_info().rss), None
    uss, shared = getattr(info, "uss", None), getattr(info, "shared", None)
    if uss is None or shared is None:
        return int(info.rss), None
    return int(info.rss), max(0, min(int(uss), int(info.rss) - int(shared)))


#: How long the measuring thread sleeps between sessions, so the loop gets the GIL.
GIL_PAUSE_S: Final = 0.0001


def let_the_loop_run() -> None:
    # A sleep, however short, hands the GIL to the event loop's thread if it waits
    # for it; without one, the loop could wait a whole switch interval (5 ms).
    time.sleep(GIL_PAUSE_S)
