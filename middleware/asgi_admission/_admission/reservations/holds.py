"""Requests held back while their route is probed, and what wakes them.

A session request of a route being probed (``probing.py``) is not refused: it is
*held* (a :class:`Hold`) until the probes' evidence is in, a probe's slot is
free, or its own deadline (``ADMISSION_PROBE_WAIT_SECONDS``) passes, and then
decided again. This is the one seam between the decision and the waiting: a
scheduler queue that orders waiters would take the place of :class:`HoldRegistry`.

Notes:

- No polling: a hold awaits one future, which the keeper resolves when something
  happens that may let it go on (under the ledger's lock, from whichever thread
  told it: a ticket's ``release()`` may come from a thread pool), or the loop's
  timer for its deadline fires.
- A hold that is woken leaves the registry; decided again, it either goes on or is
  registered anew, so the count of waiters is of requests actually waiting.
- A hold holds nothing: no count slot, no reserve. A client that leaves while
  waiting is simply forgotten.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class Hold:
    """One held request: its route, its deadline (``time.monotonic()``), its wake-up.

    Made inside the decision (with or without a running loop); the waiter's loop is
    taken when it first awaits :attr:`future`.
    """

    __slots__ = ("_future", "_lock", "_loop", "_woken", "deadline", "route")

    def __init__(self, route: str, deadline: float) -> None:
        self.route = route
        self.deadline = deadline
        self._lock = threading.Lock()
        self._woken = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: asyncio.Future[None] | None = None

    def rearm(self) -> None:
        """Ready for another wait (it was woken and must wait again)."""
        with self._lock:
            self._woken = False
            self._future = None

    def wake(self) -> None:
        """Let the waiter go on; from any thread."""
        with self._lock:
            self._woken = True
            future, loop = self._future, self._loop
        if future is None or loop is None:
            return  # its waiter finds it woken when it first looks
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            _resolve(future)
        else:
            loop.call_soon_threadsafe(_resolve, future)

    @property
    def future(self) -> asyncio.Future[None]:
        """Done once the hold is woken; on the waiter's loop."""
        with self._lock:
            if self._future is None:
                self._loop = asyncio.get_running_loop()
                self._future = self._loop.create_future()
                if self._woken:
                    self._future.set_result(None)
            return self._future


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class HoldRegistry:
    """The holds of one process, per route; thread-safe."""

    __slots__ = ("_holds", "_lock", "_on_wake")

    def __init__(self) -> None:
        self._holds: dict[str, list[Hold]] = {}
        self._lock = threading.Lock()
        self._on_wake: Callable[[], None] | None = None

    def tell_wakes(self, on_wake: Callable[[], None]) -> None:
        """Call ``on_wake`` whenever a route's requests may go on, from any thread: for a
        registry built before what it wakes (the wait queue, whose requests past their
        probe's wait may go on too, is built after the keeper these holds are part of)."""
        self._on_wake = on_wake

    def __bool__(self) -> bool:
        return bool(self._holds)

    def hold(self, route: str, deadline: float, again: Hold | None = None) -> Hold:
        """Register a request of ``route`` to wait until ``deadline`` (``again``: the hold
        it waited with before, which keeps its deadline)."""
        if again is None:
            hold = Hold(route, deadline)
        else:
            hold = again
            hold.rearm()
        with self._lock:
            self._holds.setdefault(route, []).append(hold)
        return hold

    def wake(self, route: str) -> None:
        """Every request waiting for ``route`` goes on to be decided again."""
        with self._lock:
            woken = self._holds.pop(route, ())
        for hold in woken:
            hold.wake()
        if self._on_wake is not None:
            self._on_wake()

    def leave(self, hold: Hold) -> None:
        """``hold`` waits no longer (decided, timed out, or its client left)."""
        with self._lock:
            holds = self._holds.get(hold.route)
            if holds is not None and hold in holds:
                holds.remove(hold)
                if not holds:
                    del self._holds[hold.route]

    def count(self, route: str) -> int:
        """How many requests of ``route`` wait here."""
        with self._lock:
            return len(self._holds.get(route, ()))

    def routes(self) -> list[str]:
        """The routes with requests waiting here."""
        with self._lock:
            return list(self._holds)

    def total(self) -> int:
        with self._lock:
            return sum(len(holds) for holds in self._holds.values())
