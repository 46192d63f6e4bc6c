"""``when_free`` after the caller's own first attempt (the request path tries once inline)."""

from __future__ import annotations

import asyncio

import pytest

from asgi_admission._admission.ledger.ledger import LedgerBusy, LedgerUnavailable, when_free

#: Internal on purpose: the ledger's retry helper, which has no public API.
INTERNAL = "the ledger's retry helper, which has no public API"


def test_a_busy_first_attempt_is_retried_after_an_await() -> None:
    """With the caller's LedgerBusy, the step runs again only after the loop got a turn."""
    order: list[str] = []

    def step() -> str:
        order.append("step")
        return "admitted"

    async def scenario() -> str:
        # Runs at the loop's next turn, before anything the retry's await wakes. (A task
        # here would need three turns, and on a loaded machine the retry's half-
        # millisecond timer can come due within them.)
        asyncio.get_running_loop().call_soon(order.append, "loop")
        return await when_free(step, tried=LedgerBusy("held by another worker"))

    assert asyncio.run(scenario()) == "admitted"
    assert order == ["loop", "step"]


def test_an_unavailable_first_attempt_is_raised_without_a_retry() -> None:
    """With the caller's LedgerUnavailable, the step is not run again and that error is raised."""
    calls: list[int] = []
    tried = LedgerUnavailable("the ledger's directory is gone")

    def step() -> str:
        calls.append(1)
        return "admitted"

    with pytest.raises(LedgerUnavailable) as raised:
        asyncio.run(when_free(step, tried=tried))
    assert raised.value is tried
    assert calls == []


def test_without_a_first_attempt_the_step_runs_at_once() -> None:
    """Without ``tried``, a free ledger answers from the first call, with no retry."""
    calls: list[int] = []

    def step() -> int:
        calls.append(1)
        return len(calls)

    assert asyncio.run(when_free(step)) == 1
    assert calls == [1]
