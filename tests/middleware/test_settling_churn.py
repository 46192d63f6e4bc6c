"""Settling under churn: memory freed by sessions that end does not hide others' growth.

A session settles once its memory shows. When another session ends while it ramps,
the working set can stay flat although the ramping session's memory has all come:
these tests show that the end's freed memory counts for the sessions still settling
(docs/reservations.md, "Settling under churn"), and that what is not freed never does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator

from mwkit import SettableReader, TestClient, controller, environment
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from asgi_admission import AdmissionMiddleware, AdmissionTicket, MemoryReading, admission_ticket
from kits.pollkit import wait_for
from kits.suitekit import MIB

RESERVE_MB = 96


class Sessions:
    """An app that counts its own sessions (``current_sessions``), opened by POST and
    closed by DELETE, and keeps each one's admission ticket."""

    def __init__(self) -> None:
        self.live = 0
        self.tickets: list[AdmissionTicket] = []

    def app(self) -> Starlette:
        async def open_one(request: Request) -> Response:
            self.live += 1
            ticket = admission_ticket(request)
            assert ticket is not None
            self.tickets.append(ticket)
            return PlainTextResponse("open", status_code=201)

        async def close_one(request: Request) -> Response:
            self.live -= 1
            return PlainTextResponse("closed")

        return Starlette(
            routes=[
                Route("/sessions", open_one, methods=["POST"]),
                Route("/sessions", close_one, methods=["DELETE"]),
            ]
        )


def build(
    reader: SettableReader,
    sessions: Sessions,
    *,
    reserve_mb: int = RESERVE_MB,
    counted: bool = True,
) -> AdmissionMiddleware:
    """The guard with a ``reserve_mb`` reserve, no learning, no probing, a long pending
    timeout (so only memory can settle a session within these tests), and the app's
    count of its sessions where ``counted``."""
    settings = {
        "ADMISSION_SESSION_RESERVE_LEARNING": "off",
        "ADMISSION_PROBE_SESSIONS": "0",
        "ADMISSION_PENDING_TIMEOUT_SECONDS": "120",
    }
    with environment(settings):
        return AdmissionMiddleware(
            sessions.app(),
            session_routes=["POST /sessions"],
            controller=controller(reader, reserve_mb=reserve_mb),
            current_sessions=(lambda: sessions.live) if counted else None,
            registry=None,
        )


class RampingReader(SettableReader):
    """A reader whose working set, once :meth:`ramp` is called, grows at a steady rate
    until the amount given has come, whenever it is read: the rate between any two
    readings is the ramp's, as a test thread stepping the figure under CPU contention
    (a late sleep, two readings of one step) would not make it."""

    def __init__(self, used_mb: float, limit_mb: float) -> None:
        super().__init__(used_mb, limit_mb)
        self._ramp: tuple[float, int, int] | None = None  # start, bytes, bytes per second

    def ramp(self, mb: float, mb_per_s: float) -> None:
        self._ramp = (time.monotonic(), int(mb * MIB), int(mb_per_s * MIB))

    def fall(self, mb: float) -> None:
        """Memory freed at once, while the ramp goes on."""
        self.used -= int(mb * MIB)

    def ramped(self) -> bool:
        return self._ramp is not None and self._grown() == self._ramp[1]

    def _grown(self) -> int:
        if self._ramp is None:
            return 0
        start, total, rate = self._ramp
        return min(total, int(rate * (time.monotonic() - start)))

    def __call__(self) -> MemoryReading:
        reading = super().__call__()
        if reading.used_bytes is None:
            return reading
        return dataclasses.replace(reading, used_bytes=reading.used_bytes + self._grown())


@contextlib.contextmanager
def second_pending(
    sessions: Sessions | None = None, reader: SettableReader | None = None
) -> Iterator[tuple[SettableReader, AdmissionMiddleware, TestClient]]:
    """A guard whose first session has settled (its 96 MiB in) and whose second has just
    been admitted, pending: the reader, the guard and a client inside its lifespan."""
    reader = SettableReader(used_mb=100, limit_mb=2000) if reader is None else reader
    mw = build(reader, Sessions() if sessions is None else sessions)
    with TestClient(mw) as client:
        assert client.post("/sessions").status_code == 201
        reader.set_mb(100 + RESERVE_MB)
        wait_for(lambda: mw.session_counts() == (1, 0), 5, "the app to count it")
        assert client.post("/sessions").status_code == 201
        yield reader, mw, client


def test_a_session_ending_while_another_ramps_does_not_hold_the_ramping_one() -> None:
    """The first session settles; the second is admitted and ramps at 64 MiB a second;
    the first closes mid-ramp and frees its 96 MiB at once, so the working set falls. The
    second settles once its 96 MiB are in, not at the 120 s timeout."""
    reader = RampingReader(used_mb=100, limit_mb=2000)
    with second_pending(reader=reader) as (_reader, mw, client):
        assert mw.session_counts() == (1, 1)  # counted once, as pending
        time.sleep(0.3)
        reader.ramp(RESERVE_MB, mb_per_s=64)  # 1.5 s
        time.sleep(0.8)
        assert client.delete("/sessions").status_code == 200
        reader.fall(RESERVE_MB)
        assert not reader.ramped()  # the end came while the second still ramped
        wait_for(reader.ramped, 5, "the second's memory to come")
        assert reader().used_bytes == (100 + RESERVE_MB) * MIB  # the second's, not the first's
        wait_for(lambda: mw.session_counts() == (1, 0), 3, "the app to count it")


def test_memory_not_freed_at_an_end_frees_nothing() -> None:
    """The first session closes but its memory stays (a server keeping a kernel for a
    reconnect): the second, whose memory has not come, stays pending."""
    with second_pending() as (_reader, mw, client):
        time.sleep(0.6)
        assert client.delete("/sessions").status_code == 200
        time.sleep(2.0)
        assert mw.session_counts() == (0, 1)  # still pending: nothing showed


def test_a_fall_at_an_end_is_not_taken_for_growth_that_never_came() -> None:
    """The second session has not grown at all when the first frees its 96 MiB: after
    the fall it stays pending, and settles only once its own 96 MiB have come on top."""
    with second_pending() as (reader, mw, client):
        time.sleep(0.6)
        assert client.delete("/sessions").status_code == 200
        reader.set_mb(100)
        time.sleep(1.0)
        reader.set_mb(100 + 48)  # half of the second's memory
        time.sleep(1.0)
        assert mw.session_counts() == (0, 1)
        reader.set_mb(100 + RESERVE_MB)
        wait_for(lambda: mw.session_counts() == (1, 0), 3, "the app to count it")


def test_a_pending_session_holds_back_only_what_it_has_still_to_add() -> None:
    """A 200 MiB reserve, 1000 MiB limit (high watermark 800 MiB), working set 300 MiB:
    the first session is pending and has grown 150 MiB. One more fits (450 + the 50 still
    to come + 200 = 700 MiB), where counting the pending one at its whole reserve on top
    of the 150 it holds already (850 MiB) refused it; a third does not fit."""
    reader = SettableReader(used_mb=300, limit_mb=1000)
    mw = build(reader, Sessions(), reserve_mb=200, counted=False)
    with TestClient(mw) as client:
        assert client.post("/sessions").status_code == 201
        reader.set_mb(450)
        time.sleep(0.6)  # a sample or two see its growth
        assert mw.session_counts() == (0, 1)
        assert client.post("/sessions").status_code == 201
        time.sleep(0.6)
        # 450 + 50 + 200 (the second, all to come) + 200 more = 900 MiB: no.
        assert client.post("/sessions").status_code == 503


def test_a_ticket_told_its_sessions_own_memory_settles_it_while_an_end_hides_its_growth() -> None:
    """The second session's 96 MiB come exactly as the first's go: the working set never
    moves, so nothing in it shows the second's memory. Told its own memory (as the session
    watchdog tells it of a registered process), its ticket settles it once that is 90 % of
    its reserve, not at the 120 s timeout; before that it stays pending."""
    sessions = Sessions()
    with second_pending(sessions) as (_reader, mw, client):
        second = sessions.tickets[1]
        time.sleep(0.3)
        assert client.delete("/sessions").status_code == 200  # the first frees its 96 MiB
        second.measured(48 * MIB)
        time.sleep(0.6)
        assert mw.session_counts() == (0, 1)  # half of it: still pending
        second.measured(RESERVE_MB * MIB)
        wait_for(lambda: mw.session_counts() == (1, 0), 1, "the app to count it")


def test_a_pending_session_holds_back_only_what_its_own_memory_has_still_to_add() -> None:
    """A 200 MiB reserve, 1000 MiB limit (high watermark 800 MiB), working set 300 MiB
    throughout (other sessions' ends free as much as the first one grows). Told that its
    own memory is 150 MiB, the first session holds back only the 50 MiB still to come:
    two more fit (300 + 50 + 200 + 200 = 750 MiB), where at its whole reserve the second
    of them did not (900 MiB); a fourth does not fit."""
    reader = SettableReader(used_mb=300, limit_mb=1000)
    sessions = Sessions()
    mw = build(reader, sessions, reserve_mb=200, counted=False)
    with TestClient(mw) as client:
        assert client.post("/sessions").status_code == 201
        sessions.tickets[0].measured(150 * MIB)
        assert [client.post("/sessions").status_code for _ in range(3)] == [201, 201, 503]
        assert mw.session_counts() == (0, 3)
