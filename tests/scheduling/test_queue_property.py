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

from hypothesis import event, given, settings
from hypothesis import strategies as st
from queuekit import Admission, Capacity, settle

from asgi_admission._admission.scheduling.queue import Verdict, WaitQueue
from asgi_admission._session_requests import Listening

#: Internal on purpose: the scheduler's wait queue and the request path's client listener.
INTERNAL = "the scheduler's wait queue and the request path's client listener"

CLASSES = ("critical", "standard", "batch")
TIMEOUT_S = 0.02

Arrive = tuple[str, int, int, bool]  # ("arrive", class index, slots, listening)
Event = tuple[str, int]

BUILDERS: dict[str, st.SearchStrategy[Arrive | Event]] = {
    "arrive": st.tuples(
        st.just("arrive"), st.integers(0, len(CLASSES) - 1), st.integers(1, 2), st.booleans()
    ),
    "depart": st.tuples(st.just("depart"), st.integers(0, 50)),
    "disconnect": st.tuples(st.just("disconnect"), st.integers(0, 50)),
    "cancel": st.tuples(st.just("cancel"), st.integers(0, 50)),
    # A session ends and, before the loop runs again, the head waiter's task is cancelled:
    # the pass hands it the slot in the very instant it leaves.
    "depart-cancel": st.tuples(st.just("depart-cancel"), st.integers(0, 50)),
    "grow": st.tuples(st.just("grow"), st.integers(1, 2)),
    # Milliseconds: none, less than a wait's deadline (TIMEOUT_S), or past it.
    "sleep": st.tuples(st.just("sleep"), st.sampled_from([0, 5, 25])),
}
#: Arrivals most often, so that lines form; departures and growth seldom enough that
#: waiters also run out of time or leave.
WEIGHTS = {
    "arrive": 4,
    "depart": 2,
    "disconnect": 2,
    "cancel": 1,
    "depart-cancel": 1,
    "grow": 1,
    "sleep": 2,
}
events = st.sampled_from([k for k, n in WEIGHTS.items() for _ in range(n)]).flatmap(
    BUILDERS.__getitem__
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
            event("a wait ended: task cancelled")
            # A cancelled wait holds nothing: what it was handed is given back.
            if request.admitted is not None:
                assert request.admitted.released
                request.admitted = None
            raise
        finally:
            request.waiting = False
            if listening is not None:
                listening.close()
        event(f"a wait ended: {waited.outcome}")
        assert (waited.outcome == "admitted") == (waited.admission is not None)
        if waited.outcome == "admitted":
            assert waited.admission is request.admitted
        else:
            assert request.admitted is None
            assert waited.outcome in ("timeout", "cancelled", "full")

    async def check_nobody_left_behind(self) -> None:
        """Once the loop is quiet, the first waiter in serving order does not fit.

        A wait's deadline can pass in the middle of a settle (a loaded machine stalls
        the loop for milliseconds), leaving the pass it triggers a turn or two still to
        run: a head that fits gets a few more settles before it counts as left behind.
        A waiter really left behind stays behind however long the loop runs."""
        for _ in range(4):
            head = self.head()
            if head is None or head.slots > self.capacity.free:
                return
            await settle()
        head = self.head()
        assert head is None or head.slots > self.capacity.free, f"r{head.seq} left behind"

    def head(self) -> Request | None:
        """The first waiter in serving order (class, then arrival), if anyone waits."""
        return min(self.still_waiting(), key=lambda r: (r.klass, r.seq), default=None)


async def play(program: list[Arrive | Event], free: int) -> None:
    capacity = Capacity(free=free)
    total = free
    line: WaitQueue[Admission] = WaitQueue(classes=CLASSES, limit=6, timeout_s=TIMEOUT_S)
    world = World(capacity, line)
    for step in program:
        kind = step[0]
        if kind == "arrive":
            _, klass, slots, listens = step  # type: ignore[misc]
            request = Request(
                len(world.requests), klass, slots, asyncio.Queue() if listens else None
            )
            world.requests.append(request)
            request.task = asyncio.ensure_future(world.arrive(request))
        elif kind in ("depart", "depart-cancel"):
            held = [r for r in world.requests if r.admitted is not None and not r.waiting]
            if held:
                request = held[step[1] % len(held)]
                assert request.admitted is not None
                world.give_back(request.admitted)
                request.admitted = None
            head = world.head()
            if kind == "depart-cancel" and head is not None:
                assert head.task is not None
                head.task.cancel()
        elif kind in ("disconnect", "cancel"):
            waiting = world.still_waiting()
            if waiting:
                request = waiting[step[1] % len(waiting)]
                if kind == "cancel":
                    assert request.task is not None
                    request.task.cancel()
                elif request.messages is not None:
                    await request.messages.put({"type": "http.disconnect"})
        elif kind == "grow":
            capacity.free += step[1]
            total += step[1]
            line.wake()
        else:
            await asyncio.sleep(step[1] / 1000)
        await settle()
        await world.check_nobody_left_behind()
    # Quiesce: ample capacity, every wait ends, every session ends.
    capacity.free += 100
    total += 100
    line.wake()
    tasks = [r.task for r in world.requests if r.task is not None]
    ended = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    failed = [e for e in ended if e is not None and not isinstance(e, asyncio.CancelledError)]
    assert failed == []
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


@settings(max_examples=100, deadline=None)
@given(program=st.lists(events, min_size=10, max_size=40), free=st.integers(0, 3))
def test_the_queue_keeps_its_order_and_loses_nothing(
    program: list[Arrive | Event], free: int
) -> None:
    """Over random programs: no slot taken twice or given back twice, no waiter left while
    it fits, nobody admitted ahead of a waiter before it in class or arrival order, and
    every count back at the end."""
    asyncio.run(play(program, free))
