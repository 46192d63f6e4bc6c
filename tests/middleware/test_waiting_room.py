"""The bounded wait for capacity, through the middleware: who waits, is admitted, is refused.

The sessions are WebSockets that hold their count slot until they close, under a count
cap of 1 (or a settable reading), the requests raw ASGI calls on one event loop, with no
lifespan. A wait must be woken by what frees capacity, never by a polling loop: where a
test says a waiter is woken at once, the freed watch's interval (a quarter of a second)
is stretched to half a minute (``no_polling``), so an admission within a second of a
session's end was woken by the end itself, however loaded the machine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from mwkit import SettableReader, controller, environment
from prometheus_client import CollectorRegistry
from starlette.types import Message, Receive, Scope, Send
from waitkit import Socket, post

import asgi_admission._factory
from asgi_admission import AdmissionMiddleware, CapacityDecision
from asgi_admission._admission.decision.observer import Kind
from asgi_admission._admission.scheduling.queue import WaitQueue

INTERNAL = (
    "the guard's wait queue (how many wait, who wakes it), the waiters for a probe "
    "and the observer's request kinds"
)

#: A guard that woke nobody would leave these scenarios waiting for ever.
pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def no_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The freed watch reads every half minute instead of every quarter second: a waiter
    admitted within a second was woken by what freed the capacity, not by the watch."""
    monkeypatch.setattr(asgi_admission._factory, "SAMPLE_INTERVAL_S", 30.0)


class Observed:
    """The decisions the guard reported: (kind, reason or ``admitted``)."""

    def __init__(self) -> None:
        self.decisions: list[tuple[Kind, str]] = []

    def on_decision(self, kind: Kind, decision: CapacityDecision, seconds: float) -> None:
        self.decisions.append((kind, decision.reason or "admitted"))

    def on_check(self, decision: CapacityDecision) -> None:
        pass


def guarded(
    *,
    wait_s: str = "5",
    limit: str = "256",
    max_sessions: int = 1,
    reader: SettableReader | None = None,
    observer: Observed | None = None,
    registry: CollectorRegistry | None = None,
    shared_dir: str = "off",
) -> AdmissionMiddleware:
    """The guard over an app whose ``WS /terminal`` accepts and waits for the close and
    whose ``POST /sessions`` answers 201, with the wait queue on (``wait_s``)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] == "websocket":
            assert (await receive())["type"] == "websocket.connect"
            await send({"type": "websocket.accept"})
            while (await receive())["type"] != "websocket.disconnect":
                pass
            return
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    settings = {
        "ADMISSION_QUEUE_TIMEOUT_SECONDS": wait_s,
        "ADMISSION_QUEUE_LIMIT": limit,
        "ADMISSION_PROBE_SESSIONS": "0",
        "ADMISSION_PENDING_TIMEOUT_SECONDS": "1e-9",
        "ADMISSION_SHARED_DIR": shared_dir,
    }
    with environment(settings):
        return AdmissionMiddleware(
            app,
            session_routes=["POST /sessions", "WS /terminal"],
            controller=controller(reader or SettableReader(used_mb=100), reserve_mb=10),
            max_sessions=max_sessions,
            retry_after=5,
            registry=registry,
            observer=observer,
        )


async def lifespan_shutdown(mw: AdmissionMiddleware) -> None:
    """The guard's lifespan, started and then shut down."""
    messages: list[Message] = [{"type": "lifespan.shutdown"}, {"type": "lifespan.startup"}]

    async def receive() -> Message:
        return messages.pop()

    async def send(message: Message) -> None:
        pass

    await mw({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)


def waiting(mw: AdmissionMiddleware) -> int:
    """INTERNAL: how many wait in the guard's queue."""
    queue = mw.service.wait_queue
    assert queue is not None
    return queue.total()


@pytest.mark.usefixtures("no_polling")
def test_a_waiter_is_admitted_the_moment_a_session_ends() -> None:
    """At the count cap a second WebSocket waits before its accept, holding nothing, and
    is accepted as soon as the first closes (woken by its end, not by a poll)."""

    async def scenario() -> tuple[int, tuple[int, int], float, list[Message]]:
        mw = guarded()
        first = Socket(mw)
        await first.opened.wait()
        second = Socket(mw)
        await asyncio.sleep(0.5)
        assert second.sent == []
        held = waiting(mw), mw.session_counts()
        closed = time.monotonic()
        first.leave.set()
        await asyncio.wait_for(second.opened.wait(), timeout=2)
        latency = time.monotonic() - closed
        await first.task
        await second.close()
        return held[0], held[1], latency, second.sent

    queued, counts, latency, sent = asyncio.run(scenario())
    assert queued == 1
    assert counts == (1, 0)  # the waiter holds no slot
    assert latency < 1.0
    assert sent[0]["type"] == "websocket.accept"


def test_waiters_are_admitted_in_arrival_order() -> None:
    """Four WebSockets wait at a cap of 1; as each session ends the next to arrive opens."""

    async def scenario() -> list[int]:
        mw = guarded()
        current = Socket(mw)
        await current.opened.wait()
        sockets = []
        for _ in range(4):
            sockets.append(Socket(mw))
            await asyncio.sleep(0.02)
        order: list[int] = []
        for _ in range(4):
            await current.close()
            await asyncio.sleep(0.1)
            opened = [i for i, s in enumerate(sockets) if s.opened.is_set() and i not in order]
            assert len(opened) == 1
            order.append(opened[0])
            current = sockets[opened[0]]
        await current.close()
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_a_wait_that_runs_out_is_refused_with_queue_timeout() -> None:
    """An HTTP request that waits past the timeout gets the 503 with reason
    ``queue_timeout`` and a Retry-After; counted once, as that refusal."""
    observer = Observed()

    async def scenario() -> tuple[dict[str, Any], float, int]:
        mw = guarded(wait_s="0.3", observer=observer)
        first = Socket(mw)
        await first.opened.wait()
        start = time.monotonic()
        answer = await post(mw)
        seconds = time.monotonic() - start
        left = waiting(mw)
        await first.close()
        return answer, seconds, left

    answer, seconds, left = asyncio.run(scenario())
    assert answer["status"] == 503
    assert answer["body"]["reason"] == "queue_timeout"
    assert int(answer["headers"]["retry-after"]) >= 1
    assert 0.3 <= seconds < 1.0
    assert left == 0
    assert observer.decisions == [("websocket", "admitted"), ("http", "queue_timeout")]


def test_a_websocket_that_times_out_is_closed_with_1013() -> None:
    """A WebSocket whose wait runs out is closed with 1013 naming ``queue_timeout``."""

    async def scenario() -> list[Message]:
        mw = guarded(wait_s="0.2")
        first = Socket(mw)
        await first.opened.wait()
        second = Socket(mw)
        await asyncio.wait_for(second.task, timeout=2)
        await first.close()
        return second.sent

    sent = asyncio.run(scenario())
    # No denial response extension here: the refusal is an accept and the 1013 close.
    assert [m["type"] for m in sent] == ["websocket.accept", "websocket.close"]
    assert sent[1]["code"] == 1013
    assert "reason=queue_timeout" in sent[1]["reason"]


def test_a_full_queue_refuses_at_once_with_queue_full() -> None:
    """With one waiting already and a limit of 1, the next is refused at once (queue_full)."""

    async def scenario() -> tuple[dict[str, Any], float]:
        mw = guarded(limit="1")
        first = Socket(mw)
        await first.opened.wait()
        second = Socket(mw)
        await asyncio.sleep(0.05)
        start = time.monotonic()
        answer = await post(mw)
        seconds = time.monotonic() - start
        await first.close()
        await asyncio.wait_for(second.opened.wait(), timeout=2)
        await second.close()
        return answer, seconds

    answer, seconds = asyncio.run(scenario())
    assert answer["status"] == 503
    assert answer["body"]["reason"] == "queue_full"
    assert seconds < 1.0  # against a wait of 5 s


def test_a_client_that_leaves_while_waiting_leaves_the_queue() -> None:
    """A waiting HTTP client that disconnects is answered nothing and waits no longer;
    the slot freed after goes to the one behind it."""

    async def scenario() -> tuple[dict[str, Any], int, dict[str, Any], tuple[int, int]]:
        mw = guarded()
        first = Socket(mw)
        await first.opened.wait()
        gone = asyncio.Event()
        leaver = asyncio.create_task(post(mw, gone))
        await asyncio.sleep(0.05)
        behind = asyncio.create_task(post(mw))
        await asyncio.sleep(0.05)
        gone.set()
        left = await leaver
        still = waiting(mw)
        await first.close()
        admitted = await asyncio.wait_for(behind, timeout=2)
        return left, still, admitted, mw.session_counts()

    left, still, admitted, counts = asyncio.run(scenario())
    assert left["status"] is None
    assert still == 1
    assert admitted["status"] == 201
    assert counts == (0, 0)


def test_a_new_request_goes_behind_those_waiting() -> None:
    """While one waits, a request that arrives the instant memory frees is not decided
    ahead of it: the waiter opens first."""
    reader = SettableReader(used_mb=795)  # 80 % of 1000 MiB less a 10 MiB reserve: full

    async def scenario() -> list[str]:
        mw = guarded(reader=reader, max_sessions=10)
        opened: list[str] = []
        early = Socket(mw)
        await asyncio.sleep(0.05)
        assert waiting(mw) == 1
        reader.set_mb(700)  # room again, and before the freed watch reads, a new one
        late = Socket(mw)

        async def note(name: str, socket: Socket) -> None:
            await socket.opened.wait()
            opened.append(name)

        await asyncio.wait_for(asyncio.gather(note("early", early), note("late", late)), timeout=2)
        await early.close()
        await late.close()
        return opened

    assert asyncio.run(scenario()) == ["early", "late"]


def test_without_a_wait_a_refusal_is_at_once() -> None:
    """``ADMISSION_QUEUE_TIMEOUT_SECONDS`` 0 (the default) builds no queue: refused at once."""

    async def scenario() -> tuple[dict[str, Any], float, object]:
        mw = guarded(wait_s="0")
        first = Socket(mw)
        await first.opened.wait()
        start = time.monotonic()
        answer = await post(mw)
        seconds = time.monotonic() - start
        await first.close()
        return answer, seconds, mw.service.wait_queue

    answer, seconds, queue = asyncio.run(scenario())
    assert queue is None
    assert answer["status"] == 503
    assert answer["body"]["reason"] == "session_limit"
    assert seconds < 1.0  # against a wait of 5 s


def test_a_first_burst_waits_for_its_probe_in_the_queue() -> None:
    """A waiter for a probe's evidence past ``ADMISSION_PROBE_WAIT_SECONDS`` waits on
    in the queue instead of being refused with ``probing``, and is admitted once the
    probe's session ends (its ticket released from a worker thread)."""

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], int, float]:
        held: list[Any] = []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            ticket = scope.get("asgi_admission.ticket")
            if ticket is not None and not held:
                ticket.hold()
                held.append(ticket)
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        settings = {
            "ADMISSION_QUEUE_TIMEOUT_SECONDS": "5",
            "ADMISSION_PROBE_SESSIONS": "1",
            "ADMISSION_PROBE_WAIT_SECONDS": "0.2",
            "ADMISSION_SESSION_RESERVE_LEARNING": "raise",
        }
        with environment(settings):
            mw = AdmissionMiddleware(
                app,
                session_routes=["POST /sessions"],
                controller=controller(SettableReader(used_mb=100), reserve_mb=10),
                max_sessions=100,
                retry_after=5,
                registry=None,
            )
        probe = await post(mw)
        waiter = asyncio.create_task(post(mw))
        await asyncio.sleep(0.5)  # past its probe wait: in the queue now
        queued = waiting(mw)
        released = time.monotonic()
        await asyncio.to_thread(held[0].release)
        answer = await asyncio.wait_for(waiter, timeout=2)
        return probe, answer, queued, time.monotonic() - released

    probe, answer, queued, latency = asyncio.run(scenario())
    assert probe["status"] == 201
    assert queued == 1
    assert answer["status"] == 201
    assert latency < 0.2


def test_the_waiters_for_a_probe_wake_the_queue_when_woken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guard wires its wait queue to the waiters for a probe's evidence: a wake
    of those (a probe's evidence, a probe's slot free) wakes the queue too, whose waiters
    past their probe's wait may go on as well."""
    wakes: list[WaitQueue[Any]] = []

    def wake(queue: WaitQueue[Any]) -> None:
        wakes.append(queue)

    monkeypatch.setattr(WaitQueue, "wake", wake)
    mw = guarded()
    assert wakes == []
    mw.reservations.probe_waiters.wake("POST /sessions")
    assert wakes == [mw.service.wait_queue]


def test_the_metrics_show_who_waits_and_how_each_wait_ended() -> None:
    """``asgi_admission_queue_waiting`` counts the waiter while it waits; the wait seconds
    histogram observes an admitted wait and a timed-out one; the decisions counter has the
    admissions and the one ``queue_timeout``, no refusal for the decisions while waiting."""
    registry = CollectorRegistry()

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    async def scenario() -> float | None:
        mw = guarded(registry=registry, wait_s="1")
        first = Socket(mw)
        await first.opened.wait()
        second = Socket(mw)
        await asyncio.sleep(0.2)
        during = sample("asgi_admission_queue_waiting", **{"class": "default"})
        await first.close()
        await second.opened.wait()
        await post(mw)  # waits its 1 s: the slot stays held
        await second.close()
        return during

    assert asyncio.run(scenario()) == 1
    assert sample("asgi_admission_queue_waiting", **{"class": "default"}) == 0
    for outcome, count in (("admitted", 1), ("timeout", 1), ("cancelled", 0)):
        labels = {"class": "default", "outcome": outcome}
        assert sample("asgi_admission_queue_wait_seconds_count", **labels) == count, outcome
    assert (
        1
        <= (
            sample(
                "asgi_admission_queue_wait_seconds_sum",
                **{"class": "default", "outcome": "timeout"},
            )
            or 0
        )
        < 1.5
    )
    decisions = "asgi_admission_decisions_total"
    assert sample(decisions, kind="websocket", outcome="admitted", reason="none") == 2
    assert sample(decisions, kind="http", outcome="rejected", reason="queue_timeout") == 1
    assert sample(decisions, kind="websocket", outcome="rejected", reason="session_limit") == 0
    assert sample(decisions, kind="http", outcome="rejected", reason="session_limit") == 0


def test_a_session_ending_in_another_worker_admits_the_waiter(tmp_path: Path) -> None:
    """Two guards sharing their ledger (two workers), one slot: a waiter of the second is
    admitted once the first's session ends, seen by its freed watch every sample interval."""
    shared = str(tmp_path / "shared")

    async def scenario() -> tuple[int, float]:
        first = guarded(shared_dir=shared)
        second = guarded(shared_dir=shared)
        holder = Socket(first)
        await holder.opened.wait()
        waiter = Socket(second)
        await asyncio.sleep(0.3)
        queued = waiting(second)
        closed = time.monotonic()
        await holder.close()
        await asyncio.wait_for(waiter.opened.wait(), timeout=2)
        latency = time.monotonic() - closed
        await waiter.close()
        return queued, latency

    queued, latency = asyncio.run(scenario())
    assert queued == 1
    assert latency < 0.6  # within two reads of a quarter of a second


@pytest.mark.usefixtures("no_polling")
def test_a_session_ending_in_another_worker_wakes_that_waiter_at_once(tmp_path: Path) -> None:
    """Two guards sharing their ledger (two workers), one slot: as the first's session
    ends, the second's waiter is rung and admitted at once, not at its freed watch's next
    read of the ledger; at the guards' shutdown their wake sockets go."""
    shared = tmp_path / "shared"

    async def scenario() -> tuple[list[float], list[str]]:
        guards = [guarded(shared_dir=str(shared)), guarded(shared_dir=str(shared))]
        holder = Socket(guards[0])
        await holder.opened.wait()
        latencies = []
        for turn in range(6):  # the slot passes back and forth between the two
            waiter = Socket(guards[(turn + 1) % 2])
            await asyncio.sleep(0.02)
            closed = time.monotonic()
            await holder.close()
            await asyncio.wait_for(waiter.opened.wait(), timeout=2)
            latencies.append(time.monotonic() - closed)
            holder = waiter
        await holder.close()
        sockets = sorted(p.name for p in shared.iterdir() if p.is_socket())
        for mw in guards:
            await lifespan_shutdown(mw)
        return latencies, sockets

    latencies, sockets = asyncio.run(scenario())
    assert max(latencies) < 1.0, latencies
    assert len(sockets) == 2, sockets  # one wake socket per guard with waiters
    assert [p.name for p in shared.iterdir() if p.is_socket()] == []


@pytest.mark.usefixtures("no_polling")
def test_the_order_across_workers_outlives_a_lifespan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two guards sharing their ledger whose lifespans end and start again (an app served
    twice by one process): in the second lifespan a session ending in one still rings
    the other's waiter at once, and nothing warns of an unreadable order."""
    shared = tmp_path / "shared"
    guards = [guarded(shared_dir=str(shared)), guarded(shared_dir=str(shared))]

    async def lifespan() -> float:
        holder = Socket(guards[0])
        await holder.opened.wait()
        waiter = Socket(guards[1])
        await asyncio.sleep(0.02)
        closed = time.monotonic()
        await holder.close()
        await asyncio.wait_for(waiter.opened.wait(), timeout=2)
        latency = time.monotonic() - closed
        await waiter.close()
        for mw in guards:
            await lifespan_shutdown(mw)
        return latency

    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        latencies = [asyncio.run(lifespan()), asyncio.run(lifespan())]
    assert max(latencies) < 1.0, latencies
    assert [r.getMessage() for r in caplog.records if "waiting order" in r.getMessage()] == []
    assert [p.name for p in shared.iterdir() if p.is_socket()] == []


def test_a_request_in_another_worker_goes_behind_the_containers_first_waiter(
    tmp_path: Path,
) -> None:
    """Two guards sharing their ledger, one slot: with a waiter in the second, a request
    reaching the first as the slot frees is not decided ahead of it (it waits behind it
    however empty its own guard's queue): the second's waiter gets the slot."""
    shared = str(tmp_path / "shared")

    async def scenario() -> tuple[bool, bool, int]:
        first = guarded(shared_dir=shared)
        second = guarded(shared_dir=shared)
        holder = Socket(first)
        await holder.opened.wait()
        waiter = Socket(second)
        await asyncio.sleep(0.05)
        await holder.close()
        newcomer = Socket(first)
        await asyncio.sleep(0.1)
        waiter_in, newcomer_in = waiter.opened.is_set(), newcomer.opened.is_set()
        behind = waiting(first)
        await waiter.close()
        await asyncio.wait_for(newcomer.opened.wait(), timeout=2)
        await newcomer.close()
        return waiter_in, newcomer_in, behind

    waiter_in, newcomer_in, behind = asyncio.run(scenario())
    assert (waiter_in, newcomer_in, behind) == (True, False, 1)
