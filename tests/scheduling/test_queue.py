"""The wait queue on a real asyncio loop: order, bounds, deadlines, departures, wakes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from queuekit import Admission, Capacity, queue, settle

from asgi_admission._admission.scheduling.queue import (
    Verdict,
    Waited,
    WaitQueue,
    WaitRecord,
)
from asgi_admission._session_requests import Listening

#: Internal on purpose: the scheduler's wait queue and the request path's client listener.
INTERNAL = "the scheduler's wait queue and the request path's client listener"


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


def test_waiters_are_served_by_class_then_in_arrival_order() -> None:
    """Slots freed one at a time go to critical's waiters first, each class in arrival order."""

    async def main() -> None:
        capacity = Capacity(free=0)
        line = queue(classes=("critical", "standard", "batch"))
        arrivals = [("b1", "batch"), ("s1", "standard"), ("b2", "batch"), ("c1", "critical")]
        arrivals += [("s2", "standard"), ("c2", "critical")]
        tasks = []
        for who, name in arrivals:
            tasks.append(
                asyncio.ensure_future(
                    line.wait(
                        class_name=name, attempt=capacity.attempt(who), give_back=capacity.give_back
                    )
                )
            )
            await settle()
        assert line.waiting() == {"critical": 2, "standard": 2, "batch": 2}
        for _ in arrivals:
            capacity.free += 1
            line.wake()
            await settle()
        assert capacity.admitted == ["c1", "c2", "s1", "s2", "b1", "b2"]
        results = await asyncio.gather(*tasks)
        assert [r.outcome for r in results] == ["admitted"] * 6
        assert line.total() == 0

    run(main)


def test_nobody_jumps_a_waiter_that_does_not_fit() -> None:
    """A head waiter needing two slots holds back a one-slot waiter behind it, in its class
    and below; a higher class is still served."""

    async def main() -> None:
        capacity = Capacity(free=0)
        line = queue(classes=("critical", "standard"))
        big = asyncio.ensure_future(
            line.wait(
                class_name="standard",
                attempt=capacity.attempt("big", 2),
                give_back=capacity.give_back,
            )
        )
        small = asyncio.ensure_future(
            line.wait(
                class_name="standard",
                attempt=capacity.attempt("small"),
                give_back=capacity.give_back,
            )
        )
        await settle()
        capacity.free = 1
        line.wake()
        await settle()
        assert capacity.admitted == []
        urgent = await line.wait(
            class_name="critical", attempt=capacity.attempt("urgent"), give_back=capacity.give_back
        )
        assert urgent.outcome == "admitted"
        capacity.free = 3
        line.wake()
        assert [(await big).outcome, (await small).outcome] == ["admitted", "admitted"]
        assert capacity.admitted == ["urgent", "big", "small"]

    run(main)


def test_a_deferred_waiter_keeps_its_place_and_the_next_is_tried() -> None:
    """A waiter whose turn it is not (its tenant over share) lets the next go, and goes
    first once it may."""

    async def main() -> None:
        capacity = Capacity(free=0)
        line = queue()
        allowed = {"first": False}

        def first() -> Admission | Verdict:
            return capacity.attempt("first")() if allowed["first"] else Verdict.DEFERRED

        a = asyncio.ensure_future(
            line.wait(class_name="default", attempt=first, give_back=capacity.give_back)
        )
        b = asyncio.ensure_future(
            line.wait(
                class_name="default",
                attempt=capacity.attempt("second"),
                give_back=capacity.give_back,
            )
        )
        await settle()
        capacity.free = 1
        line.wake()
        assert (await b).outcome == "admitted"
        assert not a.done()
        allowed["first"] = True
        capacity.free = 1
        line.wake()
        assert (await a).outcome == "admitted"
        assert capacity.admitted == ["second", "first"]

    run(main)


def test_beyond_the_limit_a_request_is_refused_at_once() -> None:
    """With the limit waiting, one more gets ``full`` without waiting or being tried."""

    async def main() -> None:
        capacity = Capacity(free=0)
        line = queue(limit=2)
        waits = [
            asyncio.ensure_future(
                line.wait(
                    class_name="default", attempt=capacity.attempt(w), give_back=capacity.give_back
                )
            )
            for w in ("a", "b")
        ]
        await settle()
        tried = capacity.attempts
        assert await line.wait(
            class_name="default", attempt=capacity.attempt("c"), give_back=capacity.give_back
        ) == Waited("full", None, 0.0)
        assert capacity.attempts == tried
        assert await queue(limit=0).wait(
            class_name="default", attempt=capacity.attempt("d"), give_back=capacity.give_back
        ) == Waited("full", None, 0.0)
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)

    run(main)


def test_a_waiter_times_out_at_its_deadline_holding_nothing() -> None:
    """A waiter that never fits leaves at its deadline with ``timeout``, measured by the
    queue's clock, and is counted for the metrics."""

    async def main() -> None:
        capacity = Capacity(free=0)
        now = [100.0]
        records: list[WaitRecord] = []
        line: WaitQueue[Admission] = WaitQueue(
            classes=("default",),
            limit=4,
            # Long enough that no stall of a loaded machine lets the deadline pass
            # before the queue's clock is moved on below.
            timeout_s=0.5,
            clock=lambda: now[0],
            on_wait_end=records.append,
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = asyncio.ensure_future(
            line.wait(
                class_name="default", attempt=capacity.attempt("a"), give_back=capacity.give_back
            )
        )
        await settle()
        now[0] = 102.5
        waited = await task
        assert loop.time() - started >= 0.5
        assert waited == Waited("timeout", None, 2.5)
        assert (line.total(), capacity.holding) == (0, {})
        assert records == [WaitRecord("default", "timeout", 2.5)]

    run(main)


class Client:
    """A client of a real ``Listening``: its messages arrive on an asyncio queue."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.listening = Listening(self.messages.get)


def test_a_client_that_leaves_leaves_the_queue() -> None:
    """A disconnect while waiting ends the wait (``cancelled``) with nothing held, and the
    waiter behind is served at once."""

    async def main() -> None:
        capacity = Capacity(free=0)
        line = queue()
        client = Client()
        gone = asyncio.ensure_future(
            line.wait(
                class_name="default",
                attempt=capacity.attempt("gone", 2),
                give_back=capacity.give_back,
                listening=client.listening,
            )
        )
        behind = asyncio.ensure_future(
            line.wait(
                class_name="default",
                attempt=capacity.attempt("behind"),
                give_back=capacity.give_back,
            )
        )
        await settle()
        capacity.free = 1
        line.wake()
        await settle()
        assert capacity.admitted == []
        await client.messages.put({"type": "http.disconnect"})
        assert (await gone).outcome == "cancelled"
        assert (await behind).outcome == "admitted"
        assert capacity.admitted == ["behind"]
        client.listening.close()

    run(main)


def test_a_message_other_than_a_disconnect_is_kept_and_the_wait_goes_on() -> None:
    """A WebSocket message read while waiting is kept for the app and the waiter still waits."""

    async def main() -> None:
        capacity = Capacity(free=0)
        line = queue()
        client = Client()
        task = asyncio.ensure_future(
            line.wait(
                class_name="default",
                attempt=capacity.attempt("a"),
                give_back=capacity.give_back,
                listening=client.listening,
            )
        )
        await client.messages.put({"type": "websocket.receive", "text": "hi"})
        await settle()
        assert not task.done()
        capacity.free = 1
        line.wake()
        assert (await task).outcome == "admitted"
        assert await client.listening.receive() == {"type": "websocket.receive", "text": "hi"}

    run(main)


def test_a_wake_from_another_thread_admits_on_the_loop() -> None:
    """A release on a thread pool's thread wakes the queue; the attempt runs on the loop."""

    async def main() -> None:
        loop_thread = threading.get_ident()
        capacity = Capacity(free=0)
        line = queue()
        threads: list[int] = []
        attempt = capacity.attempt("a")

        def on_loop() -> Admission | Verdict:
            threads.append(threading.get_ident())
            return attempt()

        task = asyncio.ensure_future(
            line.wait(class_name="default", attempt=on_loop, give_back=capacity.give_back)
        )
        await settle()

        def release() -> None:
            capacity.free = 1
            line.wake()

        await asyncio.to_thread(release)
        assert (await asyncio.wait_for(task, 2)).outcome == "admitted"
        assert set(threads) == {loop_thread}

    run(main)


def test_a_burst_of_wakes_costs_one_pass() -> None:
    """A hundred wakes before the loop runs again try the head waiter once, not a hundred
    times: no busy wakeups."""

    async def main() -> None:
        capacity = Capacity(free=0)
        line = queue()
        task = asyncio.ensure_future(
            line.wait(
                class_name="default", attempt=capacity.attempt("a"), give_back=capacity.give_back
            )
        )
        await settle()
        tried = capacity.attempts
        for _ in range(100):
            line.wake()
        await settle()
        assert capacity.attempts == tried + 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main)


def test_a_waiter_cancelled_as_it_is_admitted_gives_its_admission_back() -> None:
    """A task cancelled in the very instant a pass admits it returns the slot it was given,
    and the wait is counted as cancelled."""

    async def main() -> None:
        capacity = Capacity(free=0)
        records: list[WaitRecord] = []
        line = queue(on_wait_end=records.append)
        task = asyncio.ensure_future(
            line.wait(
                class_name="default", attempt=capacity.attempt("a"), give_back=capacity.give_back
            )
        )
        await settle()
        capacity.free = 1
        line.wake()
        task.cancel()  # delivered after the pass, which runs first
        with pytest.raises(asyncio.CancelledError):
            await task
        assert capacity.admitted == ["a"]
        assert (capacity.free, capacity.holding) == (1, {})
        assert [(r.class_name, r.outcome) for r in records] == [("default", "cancelled")]

    run(main)


def test_an_attempt_that_raises_ends_that_wait_only() -> None:
    """The error reaches its waiter; the waiter behind it is still served in that pass."""

    async def main() -> None:
        capacity = Capacity(free=0)
        records: list[WaitRecord] = []
        line = queue(on_wait_end=records.append)

        def broken() -> Admission | Verdict:
            raise OSError("the ledger is gone")

        bad = asyncio.ensure_future(
            line.wait(class_name="default", attempt=broken, give_back=capacity.give_back)
        )
        good = asyncio.ensure_future(
            line.wait(
                class_name="default", attempt=capacity.attempt("good"), give_back=capacity.give_back
            )
        )
        capacity.free = 1
        await settle()
        with pytest.raises(OSError, match="the ledger is gone"):
            await bad
        assert (await good).outcome == "admitted"
        assert [r.outcome for r in records].count("cancelled") == 1

    run(main)


def test_ahead_counts_the_waiters_a_new_request_must_let_go_first() -> None:
    """``ahead`` counts its class and those served before it; an unknown class is an error."""

    async def main() -> None:
        capacity = Capacity(free=0)
        line = queue(classes=("critical", "batch"))
        task = asyncio.ensure_future(
            line.wait(
                class_name="batch", attempt=capacity.attempt("b"), give_back=capacity.give_back
            )
        )
        await settle()
        assert (line.ahead("critical"), line.ahead("batch")) == (0, 1)
        with pytest.raises(ValueError, match="'gold' is not one of the classes"):
            line.ahead("gold")
        with pytest.raises(ValueError, match="'gold' is not one of the classes"):
            await line.wait(
                class_name="gold", attempt=capacity.attempt("g"), give_back=capacity.give_back
            )
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(main)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"classes": ()}, "classes must name at least one class"),
        ({"classes": ("a", "a")}, "classes must name at least one class, each once"),
        ({"limit": -1}, "limit must be 0 or more"),
        ({"timeout_s": 0.0}, "timeout_s must be above 0"),
    ],
)
def test_a_queue_that_cannot_work_is_refused(kwargs: dict[str, Any], message: str) -> None:
    """Building a queue with no class, a negative limit or no wait raises a sentence."""
    settings: dict[str, Any] = {"classes": ("default",), "limit": 1, "timeout_s": 1.0}
    with pytest.raises(ValueError, match=message):
        WaitQueue(**{**settings, **kwargs})


def test_a_queue_outlives_a_loop_that_stopped_with_a_pass_scheduled() -> None:
    """A wake left unserved by a loop that closed does not keep the next loop's waiters
    from being tried."""
    capacity = Capacity(free=0)
    line = queue(timeout_s=0.2)

    async def first() -> None:
        assert (
            await line.wait(
                class_name="default",
                attempt=capacity.attempt("early", 5),
                give_back=capacity.give_back,
            )
        ).outcome == "timeout"

    old = asyncio.new_event_loop()
    old.run_until_complete(first())
    line.wake()  # from outside the loop, which never runs again
    old.close()

    async def second() -> None:
        capacity.free = 1
        waited = await line.wait(
            class_name="default", attempt=capacity.attempt("late"), give_back=capacity.give_back
        )
        assert waited.outcome == "admitted"

    run(second)
