"""Waiting for a condition in a test: one polling loop for the whole suite."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    timeout: float,
    what: str = "the condition",
    *,
    step: float = 0.02,
    tolerate: tuple[type[Exception], ...] = (),
) -> T:
    """Call ``check`` every ``step`` seconds until it returns something true, and return
    that; after ``timeout`` seconds raise ``AssertionError`` naming ``what`` and the last
    value (an assertion, so that a caller may wait for what need not come, and go on).

    An exception of a type in ``tolerate`` (a server still starting, say) counts as a
    false answer; any other propagates.
    """
    deadline = time.monotonic() + timeout
    while True:
        last: object
        try:
            value = check()
        except tolerate as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")
        time.sleep(step)
