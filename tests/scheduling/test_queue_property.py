"""A property over random arrivals, departures, disconnects, cancellations, timeouts and
classes, on a real asyncio loop: nothing is reserved twice, no waiter is left behind,
class order is never inverted and arrival order holds within a class.

Each example plays one program against a capacity of slots, the way the admission
service uses the queue: an arrival with nobody ahead of it (``ahead``) is decided at
once and waits only if it does not fit; otherwise it joins the line. Every change of
capacity wakes the queue. At the end the capacity is made ample, every wait ends and
every session ends: every count is back to where it started.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from queuekit import Admission, Capacity, settle

from asgi_admission._admission.scheduling.queue import Verdict, WaitQueue
from asgi_admission._waiting import Listening

#: Internal on purpose: the scheduler's wait queue and the request path's client listener.
INTERNAL = "the scheduler's wait queue and the request path's client listener"

CLASSES = ("critical", "standard", "batch")
TIMEOUT_S = 0.02

Arrive = tuple[str, int, int, bool]  # ("arrive", class index, slots, listening)
Event = tuple[str, int]

events = st.one_of(
    st.tuples(
        st.just("arrive"),
        st.integers(0, len(CLASSES) - 1),
        st.integers(1, 2),
        st.booleans(),
    ),
    st.tuples(st.just("depart"), st.integers(0, 50)),
    st.tuples(st.just("disconnect"), st.integers(0, 50)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("grow"), st.integers(1, 3)),
    st.tuples(st.just("sleep"), st.integers(0, 30)),
)


@dataclass
class Request:
    seq: int
    klass: int
    slots: int
    messages: asyncio.Queue[dict[str, object]] | None
    waiting: bool = False
    admitted: Admission | None = None
    task: asyncio.Task[None] | None = None


@dataclass
class World:
    capacity: Capacity
    line: WaitQueue[Admission]
    requests: list[Request] = field(default_factory=list)
    #: The queue's admissions in order: (class index, seq).
    served: list[tuple[int, int]] = field(default_factory=list)

    def still_waiting(self) -> list[Request]:
        return [r for r in self.requests if r.waiting and r.admitted is None]

    def attempt(self, request: Request, *, queued: bool) -> Admission | Verdict:
        tried = self.capacity.attempt(f"r{request.seq}", request.slots)()
        if isinstance(tried, Admission):
            # Class order and arrival order: nobody still waiting comes before it.
            before = [
                r
                for r in self.still_waiting()
                if r is not request and (r.klass, r.seq) < (request.klass, request.seq)
            ]
            assert before == [], f"r{request.seq} admitted ahead of {before}"
            request.admitted = tried
            if queued:
                self.served.append((request.klass, request.seq))
        return tried

    def give_back(self, admission: Admission) -> None:
        self.capacity.give_back(admission)
        self.line.wake()

    async def arrive(self, request: Request) -> None:
        if self.line.ahead(CLASSES[request.klass]) == 0 and isinstance(
            self.attempt(request, queued=False), Admission
        ):
            return
        listening = None if request.messages is None else Listening(request.messages.get)
        request.waiting = True
        try:
            waited = await self.line.wait(
                class_name=CLASSES[request.klass],
                attempt=lambda: self.attempt(request, queued=True),
                give_back=self.give_back,
                listening=listening,
            )
        except asyncio.CancelledError:
            # A cancelled wait holds nothing: what it was handed is given back.
            if request.admitted is not None:
                assert request.admitted.released
                request.admitted = None
            raise
        finally:
            request.waiting = False
            if listening is not None:
                listening.close()
        assert (waited.outcome == "admitted") == (waited.admission is not None)
        if waited.outcome == "admitted":
            assert waited.admission is request.admitted
        else:
            assert request.admitted is None
            assert waited.outcome in ("timeout", "cancelled")

    def check_nobody_left_behind(self) -> None:
        """Once the loop is quiet, the first waiter in serving order does not fit."""
        waiting = sorted(self.still_waiting(), key=lambda r: (r.klass, r.seq))
        if waiting:
            assert waiting[0].slots > self.capacity.free, f"r{waiting[0].seq} left behind"


async def play(program: list[Arrive | Event], free: int) -> None:
    capacity = Capacity(free=free)
    total = free
    line: WaitQueue[Admission] = WaitQueue(classes=CLASSES, limit=6, timeout_s=TIMEOUT_S)
    world = World(capacity, line)
    for event in program:
        kind = event[0]
        if kind == "arrive":
            _, klass, slots, listens = event  # type: ignore[misc]
            request = Request(
                len(world.requests), klass, slots, asyncio.Queue() if listens else None
            )
            world.requests.append(request)
            request.task = asyncio.ensure_future(world.arrive(request))
        elif kind == "depart":
            held = [r for r in world.requests if r.admitted is not None and not r.waiting]
            if held:
                request = held[event[1] % len(held)]
                assert request.admitted is not None
                world.give_back(request.admitted)
                request.admitted = None
        elif kind in ("disconnect", "cancel"):
            waiting = world.still_waiting()
            if waiting:
                request = waiting[event[1] % len(waiting)]
                if kind == "cancel":
                    assert request.task is not None
                    request.task.cancel()
                elif request.messages is not None:
                    await request.messages.put({"type": "http.disconnect"})
        elif kind == "grow":
            capacity.free += event[1]
            total += event[1]
            line.wake()
        else:
            await asyncio.sleep(event[1] / 1000)
        await settle()
        world.check_nobody_left_behind()
    # Quiesce: ample capacity, every wait ends, every session ends.
    capacity.free += 100
    total += 100
    line.wake()
    tasks = [r.task for r in world.requests if r.task is not None]
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    for request in world.requests:
        if request.admitted is not None:
            world.give_back(request.admitted)
            request.admitted = None
    await settle()
    assert line.total() == 0
    assert line.waiting() == dict.fromkeys(CLASSES, 0)
    assert capacity.holding == {}
    assert capacity.free == total
    assert [r for r in world.requests if r.waiting] == []
    for klass in range(len(CLASSES)):
        seqs = [seq for k, seq in world.served if k == klass]
        assert seqs == sorted(seqs)


@settings(max_examples=80, deadline=None)
@given(program=st.lists(events, min_size=1, max_size=30), free=st.integers(0, 3))
def test_the_queue_keeps_its_order_and_loses_nothing(
    program: list[Arrive | Event], free: int
) -> None:
    """Over random programs: no slot taken twice or given back twice, no waiter left while
    it fits, nobody admitted ahead of a waiter before it in class or arrival order, and
    every count back at the end."""
    asyncio.run(play(program, free))
