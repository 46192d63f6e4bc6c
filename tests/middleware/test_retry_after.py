"""Retry-After: jittered whole seconds, and the adaptive mode's growth and decay."""

from __future__ import annotations

import random

import pytest

from asgi_admission import RetryAfterPolicy
from asgi_admission._admission.decision.latch import Reason
from asgi_admission._admission.decision.retry_after import coerce_policy
from asgi_admission._responses import _TITLES, close_reason

#: Internal on purpose: the refusal's titles, close reason and Retry-After policy coercion.
INTERNAL = "the refusal's titles, close reason and Retry-After policy coercion"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_jitter_stays_within_bounds_and_varies() -> None:
    """Jittered delays are integers within ±20% of the base (rounded) and not all equal."""
    policy = RetryAfterPolicy(10, jitter=0.2, rng=random.Random(1))
    delays = {policy.next_delay() for _ in range(500)}
    assert delays <= set(range(8, 13))
    assert len(delays) > 2


def test_delay_is_at_least_one_second() -> None:
    """A one-second base with heavy jitter never yields 0."""
    policy = RetryAfterPolicy(1, jitter=0.9, rng=random.Random(2))
    assert min(policy.next_delay() for _ in range(500)) == 1


def test_no_jitter_is_exact() -> None:
    """With jitter 0 the delay is the base."""
    assert RetryAfterPolicy(7, jitter=0).next_delay() == 7


def test_adaptive_grows_while_refusals_persist_and_decays_after() -> None:
    """Refusals lasting a whole delay double it up to max_s; quiet halves it back to base."""
    clock = Clock()
    policy = RetryAfterPolicy(5, jitter=0, adaptive=True, max_s=30, clock=clock)
    assert policy.next_delay() == 5
    for _ in range(40):  # refusals every second for 40 s
        clock.now += 1
        policy.next_delay()
    clock.now += 4  # a short lull is not quiet enough
    assert policy.next_delay() == 30
    clock.now += 10  # two quiet base periods: halve twice
    assert policy.next_delay() == 8  # 30 / 4 = 7.5 → 8
    clock.now += 60
    assert policy.next_delay() == 5


def test_non_adaptive_ignores_persistence() -> None:
    """Without adaptive mode the delay stays at the base however long refusals go on."""
    clock = Clock()
    policy = RetryAfterPolicy(5, jitter=0, clock=clock)
    for _ in range(30):
        clock.now += 1
        assert policy.next_delay() == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_s": 0}, "base_s"),
        ({"base_s": True}, "base_s"),
        ({"base_s": 5, "jitter": 1.0}, "jitter"),
        ({"base_s": 5, "max_s": 4}, "max_s"),
        ({"base_s": 5, "growth": 1.0}, "growth"),
    ],
)
def test_bad_settings_raise(kwargs: dict[str, object], message: str) -> None:
    """Each invalid setting is refused with a sentence naming it."""
    with pytest.raises(ValueError, match=message):
        RetryAfterPolicy(**kwargs)  # type: ignore[arg-type]


def test_coerce_policy() -> None:
    """None uses the config's base, an int becomes a policy, a policy passes through."""
    assert coerce_policy(None, 9).base_s == 9
    assert coerce_policy(3, 9).base_s == 3
    policy = RetryAfterPolicy(4)
    assert coerce_policy(policy, 9) is policy
    with pytest.raises(ValueError, match="retry_after must be"):
        coerce_policy("5", 9)  # type: ignore[arg-type]


@pytest.mark.parametrize("reason", ["memory_pressure", "session_limit", "telemetry_unavailable"])
def test_close_reason_fits_a_close_frame(reason: Reason) -> None:
    """The 1013 close reason is the delay, the reason and the title, within 123 bytes."""
    text = close_reason(12, reason)
    assert text.startswith(f"retry_after_s=12; reason={reason}; ")
    assert text.endswith(_TITLES[reason])
    assert len(close_reason(10**9, reason).encode()) <= 123
