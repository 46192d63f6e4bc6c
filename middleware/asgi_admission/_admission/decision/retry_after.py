"""How long a refused client is told to wait: ``Retry-After``, jittered, optionally adaptive.

Jitter keeps refused clients from coming back in lockstep. The adaptive mode
follows Kubernetes API Priority and Fairness: while refusals persist the delay
grows (clients told to wait came back and were refused again), and once they
stop it shrinks back towards the base, always within ``[1, max_s]``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable


class RetryAfterPolicy:
    """The ``Retry-After`` seconds for each refusal: jittered, optionally adaptive.

    ``jitter`` is the fraction either side of the delay (0.2 → ±20%). With
    ``adaptive``, the delay is multiplied by ``growth`` each time refusals have
    persisted for a whole current delay, up to ``max_s``, and divided by
    ``growth`` for each quiet ``base_s`` since the last refusal, down to ``base_s``.
    ``rng`` and ``clock`` are injectable for tests. Not thread-safe on its own:
    the admission service calls it inside its lock.
    """

    __slots__ = (
        "_clock",
        "_first_refusal",
        "_last_refusal",
        "_level",
        "_rng",
        "adaptive",
        "base_s",
        "growth",
        "jitter",
        "max_s",
    )

    def __init__(
        self,
        base_s: int = 5,
        *,
        jitter: float = 0.2,
        adaptive: bool = False,
        max_s: int = 60,
        growth: float = 2.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(base_s, bool) or not isinstance(base_s, int) or base_s < 1:
            raise ValueError(f"Retry-After base_s must be an integer of 1 or more; got {base_s!r}.")
        if not 0 <= jitter < 1:
            raise ValueError(f"Retry-After jitter must be at least 0 and below 1; got {jitter!r}.")
        if max_s < base_s:
            raise ValueError(f"Retry-After max_s ({max_s!r}) must be at least base_s ({base_s!r}).")
        if not growth > 1:
            raise ValueError(f"Retry-After growth must be greater than 1; got {growth!r}.")
        self.base_s = base_s
        self.jitter = float(jitter)
        self.adaptive = adaptive
        self.max_s = max_s
        self.growth = float(growth)
        self._rng = rng or random.Random()
        self._clock = clock
        self._level = float(base_s)
        self._first_refusal: float | None = None
        self._last_refusal: float | None = None

    def next_delay(self) -> int:
        """Record one refusal and return the whole seconds to send with it."""
        if self.adaptive:
            self._adapt(self._clock())
        return self.delay_for(self._level)

    def delay_for(self, seconds: float) -> int:
        """Whole seconds to send for an expected wait of ``seconds``: jittered, 1 to ``max_s``."""
        delay = seconds
        if self.jitter:
            delay *= self._rng.uniform(1 - self.jitter, 1 + self.jitter)
        return max(1, min(self.max_s, round(delay)))

    def _adapt(self, now: float) -> None:
        last = self._last_refusal
        if last is not None:
            quiet = now - last
            if quiet >= self.base_s:
                steps = int(quiet // self.base_s)
                self._level = max(float(self.base_s), self._level / self.growth**steps)
                self._first_refusal = now
            elif self._first_refusal is not None and now - self._first_refusal >= self._level:
                self._level = min(float(self.max_s), self._level * self.growth)
                self._first_refusal = now
        else:
            self._first_refusal = now
        self._last_refusal = now


def coerce_policy(retry_after: RetryAfterPolicy | int | None, base_s: int) -> RetryAfterPolicy:
    """The policy for the middleware's ``retry_after=`` argument."""
    if retry_after is None:
        return RetryAfterPolicy(base_s)
    if isinstance(retry_after, RetryAfterPolicy):
        return retry_after
    if isinstance(retry_after, bool) or not isinstance(retry_after, int):
        raise ValueError(
            "retry_after must be a RetryAfterPolicy or a whole number of seconds; "
            f"got {retry_after!r}."
        )
    return RetryAfterPolicy(retry_after)
