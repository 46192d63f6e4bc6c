"""``wait_for``: the suite's one polling loop returns what held, or fails naming what."""

from __future__ import annotations

import itertools

import pytest

from kits.pollkit import wait_for


def test_it_returns_the_first_true_answer() -> None:
    answers = iter([0, None, 7, 9])
    assert wait_for(lambda: next(answers), 1, step=0) == 7


def test_a_tolerated_error_counts_as_a_false_answer() -> None:
    calls = itertools.count()

    def starting() -> str:
        if next(calls) < 2:
            raise ConnectionError("not yet")
        return "up"

    assert wait_for(starting, 1, step=0, tolerate=(ConnectionError,)) == "up"


def test_any_other_error_propagates() -> None:
    def broken() -> bool:
        raise KeyError("broken")

    with pytest.raises(KeyError):
        wait_for(broken, 1, step=0, tolerate=(ConnectionError,))


def test_it_fails_after_the_timeout_naming_what_and_the_last_answer() -> None:
    # An AssertionError: tests/v2/test_v2_bursts.py and the kit's offender wait for what
    # need not come under contextlib.suppress(AssertionError).
    with pytest.raises(AssertionError, match=r"waiting for the answer; last: \[\]"):
        wait_for(list, 0.05, "the answer", step=0.01)
