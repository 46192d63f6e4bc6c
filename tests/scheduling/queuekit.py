"""Capacity for the wait queue's tests: slots taken by attempts and given back, counted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from asgi_admission._admission.scheduling.queue import Verdict, WaitQueue, WaitRecord

#: Internal on purpose: the scheduler's wait queue, driven with a capacity of slots.
INTERNAL = "the scheduler's wait queue, driven with a capacity of slots"


@dataclass
class Admission:
    """One admitted request: who, and how many slots it took."""

    who: str
    slots: int
    released: bool = False


@dataclass
class Capacity:
    """Slots that attempts take (in the order they are admitted) and give back."""

    free: int
    admitted: list[str] = field(default_factory=list)
    attempts: int = 0
    holding: dict[str, Admission] = field(default_factory=dict)

    def attempt(self, who: str, slots: int = 1) -> Callable[[], Admission | Verdict]:
        def attempt() -> Admission | Verdict:
            self.attempts += 1
            if self.free < slots:
                return Verdict.FULL
            assert who not in self.holding, f"{who} admitted twice"
            self.free -= slots
            self.admitted.append(who)
            admission = Admission(who, slots)
            self.holding[who] = admission
            return admission

        return attempt

    def give_back(self, admission: Admission) -> None:
        assert not admission.released, f"{admission.who} released twice"
        admission.released = True
        del self.holding[admission.who]
        self.free += admission.slots


async def settle() -> None:
    """Let every callback scheduled so far (a wake's pass, the waiters it woke) run."""
    for _ in range(5):
        await asyncio.sleep(0)


def queue(
    *,
    classes: tuple[str, ...] = ("default",),
    limit: int = 16,
    timeout_s: float = 5.0,
    on_wait_end: Callable[[WaitRecord], None] | None = None,
) -> WaitQueue[Admission]:
    return WaitQueue(classes=classes, limit=limit, timeout_s=timeout_s, on_wait_end=on_wait_end)
