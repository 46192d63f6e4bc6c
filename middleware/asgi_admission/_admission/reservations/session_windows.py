"""The working set as growth alone, and one window on it per admitted session.

Notes:

- Readings become a *growth series*: each step between two readings adds what the
  working set rose by, except a step in which memory was freed (it fell by more than
  ``FREE_STEP_BYTES``, or a session end was reported in it). Such a step adds the
  larger growth of the two steps before it instead: sessions still ramping are taken
  to have gone on growing, and what was freed is left out. Memory freed, promptly at a
  session's end or seconds later, therefore never makes another session look
  smaller; memory that grows for other reasons (caches, drift) makes sessions look
  larger, the safe side for a reserve.
- Each admitted session gets a *window*: from the reading before its admission until
  its memory has arrived. A route with a learned ramp is watched for one and a half
  times that ramp and half a second more; before, a window no session of a route of
  unknown footprint ramped in closes once the series, less what the other sessions
  are expected to add, has made no new peak for a quiet spell; any window closes at
  ``HORIZON_S``. A closed window says how much the series grew over it and which part
  of the other sessions' ramps fell inside it, per route (``attribution.Overlap``,
  worked out in ``recent_ramps.py``), which is one equation for the footprints
  (``attribution.py``).
- A session whose own growth had stopped (for more readings than it ever paused)
  when another session came keeps that ramp as its own, and what it added alone is the
  least it adds to any later window it lies in.
- A step in which sessions of one route were reported ended and nothing else was
  ramping says how much memory one of them freed: evidence of its footprint too.
- Other workers' sessions (a shared ledger) are in the working set but not in this
  worker's admissions: while one of them may still be ramping (it is on the shared
  settling queue, or within the longest known ramp of its admission), no window can
  tell its own session's growth from theirs: the windows open over that time are
  dropped (unless the working set did not grow over them: that bounds their sessions
  all the same), and the steps in it, or in which another worker's session ended (the
  container's count fell by more than the app's own), teach no freed memory. Each
  worker learns footprints
  from the spells its own sessions had to themselves; ramps, which say when memory
  comes rather than how much, still come from every step (``ramp_profile.py``).
- Bounded: at most ``MAX_OPEN`` open windows and the admissions of the last
  ``2 x HORIZON_S`` (at most ``MAX_RECENT``); a reading costs a pass over the recent
  admissions for each open window, and asks what is known of each route once. An
  admission beyond ``MAX_RECENT`` is not remembered: like another worker's session,
  it crowds every window open while it may ramp (they are dropped unless nothing grew),
  so the reading's cost stays bounded however fast sessions are admitted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TypeVar

from asgi_admission._admission.reservations.recent_ramps import (
    any_ramping,
    most_added,
    others_added,
    overlaps,
)
from asgi_admission._admission.reservations.window_records import (
    FREE_STEP_BYTES,
    HORIZON_S,
    MAX_OPEN,
    MAX_RECENT,
    MAX_STEP_S,
    PEAK_SHARE,
    PEAK_STEP,
    QUIET_S,
    Admission,
    ClosedWindow,
    Expected,
    Freed,
    Lengths,
    OpenWindow,
    Step,
    quick,
)

T = TypeVar("T")


class GrowthWindows:
    """The growth series and the open windows; pure, fed readings and events with times."""

    __slots__ = (
        "_ended",
        "_foreign_ended",
        "_foreign_until",
        "_growth",
        "_last",
        "_last_rises",
        "_open",
        "_recent",
        "horizon_s",
    )

    def __init__(self, *, horizon_s: float = HORIZON_S) -> None:
        self.horizon_s = min(HORIZON_S, horizon_s)
        self._last: tuple[int, float] | None = None
        self._growth = 0.0
        #: The last two steps that freed nothing (a step that did carries the larger on).
        self._last_rises = (0.0, 0.0)
        self._open: list[OpenWindow] = []
        self._recent: deque[Admission] = deque()
        #: Session ends reported since the last reading: route and weight.
        self._ended: list[tuple[str, float]] = []
        #: Until when another worker's session may still be ramping, and whether one
        #: ended since the last reading.
        self._foreign_until = float("-inf")
        self._foreign_ended = False

    @property
    def open(self) -> int:
        """How many windows are still open."""
        return len(self._open)

    def admit(
        self,
        route: str,
        used_bytes: int | None,
        now: float,
        expected: Expected,
        *,
        responded: bool = True,
    ) -> None:
        """A session of ``route`` was admitted at working set ``used_bytes`` (exact or a
        bound); ``responded=False``: its response is still to come (:meth:`respond`)."""
        last = self._last
        if (last is None or now - last[1] > MAX_STEP_S) and used_bytes is not None:
            # No recent reading: the admission's own starts the series afresh. A bound
            # above the working set only shows as a drop at the next exact reading.
            self._restart(used_bytes, now)
            last = self._last
        admission = Admission(route, now, now if responded else None)
        if len(self._recent) >= MAX_RECENT:
            # Too many to follow: its growth is unknown to every window it may ramp in.
            self._foreign_until = max(self._foreign_until, now + self.horizon_s + QUIET_S)
            return
        self._recent.append(admission)
        if last is None or len(self._open) >= MAX_OPEN or now - last[1] > MAX_STEP_S:
            return
        self._open.append(OpenWindow(admission, last[1], self._growth))

    def others(self, admitted: tuple[float, ...], now: float, ramp_s: float) -> None:
        """Other workers' sessions admitted at ``admitted`` were still settling at the last
        look: each may grow until ``ramp_s`` after its admission, and for a quiet spell
        after it was last seen settling."""
        if admitted:
            until = max(now, max(admitted) + ramp_s) + QUIET_S
            self._foreign_until = max(self._foreign_until, until)

    def foreign_end(self) -> None:
        """Another worker's session ended: the next step's drop is not only this worker's."""
        self._foreign_ended = True

    def crowded(self, since: float) -> bool:
        """Whether another worker's session may have been ramping after ``since``."""
        return since < self._foreign_until

    def end(self, route: str, weight: float, now: float, admitted_at: float | None) -> None:
        """A session of ``route`` ended (``weight`` below 1: possibly, one of several routes)."""
        self._ended.append((route, weight))
        if admitted_at is None:
            return
        # Most ends are of recent sessions: looked for from the newest (admission order).
        for admission in reversed(self._recent):
            if admission.at < admitted_at:
                break
            if admission.route == route and admission.at == admitted_at:
                admission.ended = now
                break
        # A session that ended before its memory had all arrived teaches nothing.
        if any(w.admission.at == admitted_at for w in self._open):
            self._open = [
                w
                for w in self._open
                if not (w.admission.route == route and w.admission.at == admitted_at)
            ]

    def respond(self, admitted_at: float, now: float) -> None:
        """The session admitted at ``admitted_at`` answered: its window may close from
        now on (its memory usually starts to arrive then)."""
        for admission in reversed(self._recent):
            if admission.at < admitted_at:
                break
            if admission.at == admitted_at:
                if admission.responded is None:
                    admission.responded = now
                return

    def failed(self, admitted_at: float) -> str | None:
        """The session admitted at ``admitted_at`` opened nothing: it is forgotten. Its
        route, or ``None`` when it is no longer remembered."""
        for admission in reversed(self._recent):
            if admission.at < admitted_at:
                break
            if admission.at == admitted_at:
                self._recent.remove(admission)
                self._open = [w for w in self._open if w.admission is not admission]
                return admission.route
        return None

    def close_route(self, route: str, expected: Expected, lengths: Lengths) -> list[ClosedWindow]:
        """A probe saw the memory of ``route``'s sessions stop growing: their windows
        close at the last reading, without waiting for a quiet spell of their own."""
        if self._last is None:
            return []
        closing = [w for w in self._open if w.admission.route == route]
        if not closing:
            return []
        self._open = [w for w in self._open if w.admission.route != route]
        now = self._last[1]
        expected, lengths = _once_per_route(expected), _once_per_route(lengths)
        closed = [self._closed(window, now, expected, lengths) for window in closing]
        return [w for w in closed if w is not None]

    def sessions(self) -> list[tuple[str, float, float | None]]:
        """The recent admissions: ``(route, admitted_at, ended_at)``."""
        return [(a.route, a.at, a.ended) for a in self._recent]

    def reading(
        self, used_bytes: int, now: float, expected: Expected, lengths: Lengths
    ) -> tuple[list[ClosedWindow], list[Freed], Step | None]:
        """An exact working set: the windows it closes, the memory freed at reported ends,
        and the step it made (``None`` after a gap)."""
        last = self._last
        ended, self._ended = self._ended, []
        foreign_ended, self._foreign_ended = self._foreign_ended, False
        # What is known of a route does not change during a reading: asked once each.
        expected, lengths = _once_per_route(expected), _once_per_route(lengths)
        if last is None or not 0 < now - last[1] <= MAX_STEP_S:
            self._restart(used_bytes, now)
            return [], [], None
        self._last = (used_bytes, now)
        rise = float(used_bytes - last[0])
        freed: list[Freed] = []
        carried_over = rise < -FREE_STEP_BYTES or bool(ended) or foreign_ended
        if carried_over:
            carried = max(0.0, *self._last_rises)
            going_on = (
                None if self.crowded(last[1]) else most_added(self._recent, last[1], now, expected)
            )
            if going_on is not None:
                # What may still be growing is all known: no more than it adds goes on
                # (a session's memory built in its request came at once, and is done).
                carried = min(carried, going_on)
            mine = not foreign_ended and not self.crowded(last[1])
            if mine and not any_ramping(self._recent, now, expected):
                # Growth in the same step would hide part of what was freed.
                freed = _freed(ended, carried - rise)
            rise = carried
        else:
            self._last_rises = (self._last_rises[1], rise)
        self._growth += rise
        horizon = now - 2 * self.horizon_s
        while self._recent and self._recent[0].at < horizon:
            self._recent.popleft()
        if self._open and self.crowded(self._open[0].start):
            for window in self._open:
                window.crowded = window.crowded or self.crowded(window.start)
        closed = self._close_due(last[1], now, expected, lengths)
        return (
            [w for w in closed if w is not None],
            freed,
            Step(rise, last[1], now, seen=not carried_over),
        )

    # -- internals -------------------------------------------------------------------

    def _restart(self, used_bytes: int, now: float) -> None:
        # Growth across a gap is unknown: windows open across it are dropped.
        self._last = (used_bytes, now)
        self._last_rises = (0.0, 0.0)
        self._open = []

    def _close_due(
        self, start: float, now: float, expected: Expected, lengths: Lengths
    ) -> list[ClosedWindow | None]:
        """Windows due to close at the reading at ``now`` (the step began at ``start``)."""
        if not self._open:
            return []
        # Sessions still ramping, until when, and whether their footprint is known: a
        # window a session of unknown footprint ramps in cannot tell its own growth
        # apart (it is not closed when quiet); one that any other ramps in cannot time
        # it (its ramp is not its own).
        ramping: list[tuple[Admission, float, bool]] = []
        for admission in self._recent:
            footprint, ramp_s = expected(admission.route)
            if admission.ended is None:
                ramping.append((admission, admission.at + max(ramp_s, QUIET_S), bool(footprint)))
        closed: list[ClosedWindow | None] = []
        still: list[OpenWindow] = []
        for window in self._open:
            admission = window.admission
            # The session's own growth: the series less what the others were expected to add.
            mine = self._growth - window.base - others_added(self._recent, window, now, expected)
            # Against the last new peak, not the highest reading since: growth that comes
            # slowly, a little each step, still makes new peaks.
            last_peak = window.peaks[-1][1] if window.peaks else 0.0
            rising = mine > last_peak + max(PEAK_STEP, PEAK_SHARE * last_peak)
            for other, until, known in ramping:
                if other is not admission and other.at < now and until > window.start:
                    if known and quick(lengths(other.route)):
                        # Its memory came inside its request, where its known share is
                        # taken away: it hides neither this session's growth nor its ramp.
                        continue
                    quiet = window.quiet + (0 if rising else 1)
                    if window.alone and window.peaks and quiet >= 2 and quiet > window.pauses:
                        # Its own growth had stopped before company came, for more
                        # readings than it ever paused: that ramp and that growth are
                        # its own, whatever the others add from now on.
                        window.own_ramp = window.ramp_s()
                        admission.seen, admission.seen_until = window.peak, start
                    window.alone = False
                    window.clean = window.clean and known
            if rising:
                if window.peaks:
                    window.pauses = max(window.pauses, window.quiet)
                window.quiet = 0
                window.peak_at = now
                window.peaks.append((now, mine))
            else:
                window.quiet += 1
            window.peak = max(window.peak, mine)
            age = now - admission.at
            length = lengths(admission.route)
            if admission.responded is None:
                # Still in its request: what it builds after its response is to come.
                due = False
            elif length is not None:
                due = age >= length
            elif window.clean:
                spell = max(QUIET_S, 0.5 * (window.peak_at - admission.at))
                due = now - max(window.peak_at, admission.responded) >= spell
            else:
                due = False
            # The horizon counts from the response: memory built in a long request
            # is the session's, and so is what comes in the horizon after it.
            if due or (
                admission.responded is not None and now - admission.responded >= self.horizon_s
            ):
                closed.append(self._closed(window, now, expected, lengths))
            else:
                still.append(window)
        self._open = still
        return closed

    def _closed(
        self, window: OpenWindow, now: float, expected: Expected, lengths: Lengths
    ) -> ClosedWindow | None:
        """What ``window`` says; ``None`` when another worker's growth may be in it (all
        but a window in which nothing grew: that one bounds its session all the same)."""
        own = window.admission
        if window.crowded and self._growth - window.base > FREE_STEP_BYTES:
            return None
        if window.alone:
            own.seen, own.seen_until = window.peak, now
        company, exact = overlaps(self._recent, window, now, self.horizon_s, expected, lengths)
        return ClosedWindow(
            route=own.route,
            growth=self._growth - window.base,
            seconds=now - window.start,
            ramp_s=window.ramp_s() if window.alone else window.own_ramp,
            overlaps=company,
            exact=exact,
        )


def _once_per_route(ask: Callable[[str], T]) -> Callable[[str], T]:
    """``ask``, remembering its answer for each route (for the length of one reading)."""
    answers: dict[str, T] = {}

    def once(route: str) -> T:
        if route not in answers:
            answers[route] = ask(route)
        return answers[route]

    return once


def _freed(ended: list[tuple[str, float]], freed_bytes: float) -> list[Freed]:
    # Only when every end reported in the step was of one route can the drop be told apart.
    routes = {route for route, _weight in ended}
    if len(routes) != 1 or freed_bytes < FREE_STEP_BYTES:
        return []
    weight = sum(w for _route, w in ended)
    if weight <= 0:
        return []
    return [Freed(route=routes.pop(), bytes_per_session=freed_bytes / weight)]
