"""The probes: a route's probes, the evidence they give, and who is woken when."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asgi_admission._admission.reservations.learning import SessionLearner
from asgi_admission._admission.reservations.probing import CONFIRM_S, SOLO_S, Probes
from asgi_admission._admission.reservations.shared_files import SharedProbeStore, read_probing
from kits.suitekit import MIB

INTERNAL = "the probes and its shared file, on synthetic readings"

ROUTE = "POST /sessions"
OTHER = "WS /terminal"
GUESS = 10 * MIB
BASE = 300 * MIB


class ProbeKit:
    """The probes over a learner, recording whom it woke; readings at fake times."""

    def __init__(self, *, probes: int = 1, store: SharedProbeStore | None = None) -> None:
        self.woken: list[str] = []
        self.learner = SessionLearner(timeout_s=120.0)
        self.probes = Probes(
            probe_sessions=probes, timeout_s=120.0, store=store, on_wake=self.woken.append
        )

    def admit(self, seq: int, used: int, now: float, route: str = ROUTE) -> None:
        self.learner.on_admit(route, used, now)
        self.probes.add(route, seq, used, GUESS, now)

    def read(self, used: int, now: float) -> None:
        self.learner.on_reading(used, now)
        self.probes.on_reading(used, now, self.learner)


def ramp(
    b: ProbeKit,
    *,
    start: float,
    growth: int,
    ramp_s: float,
    until: float,
    first: float | None = None,
) -> None:
    """Readings at 4 Hz of memory arriving linearly over ``ramp_s`` after ``start``, from
    ``first`` (``start`` by default) to ``until``."""
    t = start if first is None else first
    while t <= until:
        arrived = growth * min(1.0, (t - start) / ramp_s)
        b.read(BASE + int(arrived), t)
        t += 0.25


def test_one_probe_at_a_time_and_the_others_wait() -> None:
    """The first session of a route not learned yet is its probe; the next ones wait."""
    b = ProbeKit()
    assert b.probes.probe_answer(ROUTE, 0.0) == "probe"
    b.admit(1, BASE, 0.0)
    assert b.probes.probe_answer(ROUTE, 0.01) == "wait"


def test_one_route_is_probed_at_a_time() -> None:
    """Another route not learned yet waits while the first route's probe ramps (its growth
    would be taken for the other's), and is probed once that probe's evidence is in, or
    beside it once the first has ramped for longer than a learner's window watches."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    assert b.probes.probe_answer(OTHER, 0.01) == "wait"
    b.probes.responded(1, BASE, 0.05)
    ramp(b, start=0.05, growth=100 * MIB, ramp_s=2.0, until=3.5)
    assert b.woken == [ROUTE]
    assert b.probes.probe_answer(OTHER, 3.5) == "probe"
    slow = ProbeKit()
    slow.admit(1, BASE, 0.0)
    assert slow.probes.probe_answer(OTHER, SOLO_S - 0.1) == "wait"
    assert slow.probes.probe_answer(OTHER, SOLO_S) == "probe"


def test_the_evidence_is_in_once_the_memory_has_stopped_growing() -> None:
    """Not when the growth reaches the guess: after a quiet spell past the last peak, the
    learner's episode closes with the probe's footprint and the waiters are woken."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    b.probes.responded(1, BASE, 0.05)
    ramp(b, start=0.05, growth=100 * MIB, ramp_s=2.0, until=2.5)
    assert b.woken == []  # far past the 10 MiB guess, and still growing until 2.05 s
    assert b.probes.probe_answer(ROUTE, 2.5) == "wait"
    ramp(b, start=0.05, growth=100 * MIB, ramp_s=2.0, until=3.5, first=2.55)
    assert b.woken == [ROUTE]
    [estimate] = b.learner.estimates()
    assert estimate.route == ROUTE
    # What arrived, and what drift may have hidden over the trial (256 KiB a second).
    assert 100 * MIB <= estimate.footprint_bytes <= 101 * MIB
    assert 1.5 <= estimate.ramp_s <= 2.25
    assert b.probes.estimates() == {}  # learned: nothing provisional is left
    assert not b.probes.busy


def test_growth_past_the_guess_raises_the_estimate_at_once() -> None:
    """While its memory arrives, a probe's growth beyond its reserve is a provisional
    footprint already (the reserve the latch uses follows it)."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    b.probes.responded(1, BASE, 0.01)
    version = b.probes.version
    b.read(BASE + 5 * MIB, 0.25)
    assert b.probes.estimates() == {}  # within the guess
    b.read(BASE + 40 * MIB, 0.5)
    assert b.probes.estimates()[ROUTE].footprint_bytes == 40 * MIB
    assert b.probes.version > version
    b.read(BASE + 80 * MIB, 0.75)
    assert b.probes.estimates()[ROUTE].footprint_bytes == 80 * MIB
    assert b.woken == []


def test_memory_visible_at_the_response_is_confirmed_by_one_sample() -> None:
    """Built inside the request: its memory is there at the response, and one sample later
    with no new peak the waiters go on, without waiting a whole quiet spell."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    b.read(BASE + 30 * MIB, 0.4)
    b.probes.responded(1, BASE + 50 * MIB, 0.5)
    b.read(BASE + 50 * MIB, 0.5 + CONFIRM_S / 2)
    assert b.woken == []
    b.read(BASE + 50 * MIB, 0.5 + CONFIRM_S)
    assert b.woken == [ROUTE]
    assert abs(b.learner.estimates()[0].footprint_bytes - 50 * MIB) <= MIB


def test_memory_still_growing_after_the_response_waits_for_the_quiet_spell() -> None:
    """Part of the memory at the response and more after it: no early conclusion."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    b.probes.responded(1, BASE + 20 * MIB, 0.2)
    b.read(BASE + 60 * MIB, 0.2 + CONFIRM_S)
    b.read(BASE + 90 * MIB, 0.2 + 2 * CONFIRM_S)
    assert b.woken == []
    for step in range(3, 12):
        b.read(BASE + 90 * MIB, 0.2 + step * CONFIRM_S)
    assert b.woken == [ROUTE]
    # What arrived, and what drift may have hidden over the trial (256 KiB a second).
    assert 90 * MIB <= b.learner.estimates()[0].footprint_bytes <= 91 * MIB


def test_a_probe_that_opened_nothing_frees_its_slot() -> None:
    """An error answer: nothing is learned, the waiters are woken, the next is a probe."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    b.probes.left(1, opened=False, now=0.1)
    assert b.woken == [ROUTE]
    assert b.probes.probe_answer(ROUTE, 0.2) == "probe"
    assert b.probes.estimates() == {}
    assert not b.probes.busy


def test_with_two_probes_one_failing_leaves_the_other() -> None:
    """probe_sessions=2: two at once; one failing frees one slot and the trial goes on."""
    b = ProbeKit(probes=2)
    b.admit(1, BASE, 0.0)
    assert b.probes.probe_answer(ROUTE, 0.0) == "probe"
    b.admit(2, BASE, 0.01)
    assert b.probes.probe_answer(ROUTE, 0.02) == "wait"
    b.probes.left(2, opened=False, now=0.1)
    assert b.woken == [ROUTE]
    assert b.probes.probe_answer(ROUTE, 0.2) == "probe"
    assert b.probes.busy


def test_a_probe_whose_session_ended_concludes_never_below_the_guess() -> None:
    """Its memory may be gone before it all arrived: the route is decided on the guess at
    least, and nothing is learned from it."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    b.probes.responded(1, BASE, 0.01)
    b.read(BASE + 4 * MIB, 0.25)
    b.probes.left(1, opened=True, now=0.3)
    assert b.woken == [ROUTE]
    assert b.probes.probe_answer(ROUTE, 0.4) == "known"
    assert b.probes.estimates() == {}  # the guess itself: no estimate to show
    assert b.learner.estimates() == []


def test_a_session_ending_elsewhere_makes_the_probe_larger_not_smaller() -> None:
    """Memory freed meanwhile could hide a probe's growth: the step with the end is taken
    to have grown as the faster of the two before it did, so what is learned is more
    than was seen."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    b.probes.responded(1, BASE, 0.01)
    b.read(BASE + 6 * MIB, 0.25)
    b.learner.on_session_end(0.3, count=1)  # the reservations tell both
    b.probes.session_ended(0.3)
    b.read(BASE, 0.5)  # the other session's memory is gone
    for step in range(3, 10):
        b.read(BASE, step * 0.25)
    assert b.woken == [ROUTE]
    assert b.probes.probe_answer(ROUTE, 3.0) == "known"
    [estimate] = b.learner.estimates()
    assert estimate.footprint_bytes >= 12 * MIB


def test_another_admission_makes_the_footprint_provisional_and_larger() -> None:
    """Another session's growth counts as the probe's: the larger footprint, not learned."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    b.probes.responded(1, BASE, 0.01)
    b.learner.on_admit("POST /other", BASE, 0.1)
    b.probes.other_admitted(0.1)
    for step in range(1, 10):
        b.read(BASE + 60 * MIB, step * 0.25)
    assert b.woken == [ROUTE]
    assert b.probes.estimates()[ROUTE].footprint_bytes == 60 * MIB
    assert b.probes.estimates()[ROUTE].observations == 0
    assert ROUTE in b.probes.concluded()


def test_a_probe_with_no_growth_concludes_with_next_to_no_footprint() -> None:
    """A fixed reading: after the quiet spell the route is learned to cost next to nothing."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    b.probes.responded(1, BASE, 0.01)
    for step in range(1, 6):
        b.read(BASE, step * 0.25)
    assert b.woken == [ROUTE]
    # Nothing arrived; only what drift may have hidden over the trial (256 KiB a second).
    assert b.learner.estimates()[0].footprint_bytes <= MIB


def test_a_probe_that_never_answers_keeps_its_trial_open() -> None:
    """The evidence needs every probe's answer: memory quiet before it proves nothing."""
    b = ProbeKit()
    b.admit(1, BASE, 0.0)
    for step in range(1, 20):
        b.read(BASE, step * 0.25)
    assert b.woken == []
    assert b.probes.probe_answer(ROUTE, 5.0) == "wait"
    assert b.probes.retry_after_s(ROUTE, 5.0) == 5.0
    [status] = b.probes.status(5.0)
    assert (status.route, status.probes, status.since_s) == (ROUTE, 1, 5.0)


def test_the_pending_timeout_ends_a_trial() -> None:
    """A probe that never answers does not hold its route back for ever."""
    b = ProbeKit()
    b.probes.timeout_s = 10.0
    b.admit(1, BASE, 0.0)
    assert b.probes.probe_answer(ROUTE, 10.0) == "known"
    assert b.woken == [ROUTE]


def test_workers_count_their_probes_together(tmp_path: Path) -> None:
    """Over one shared file: one probe in the container, the other worker's requests wait,
    and go on once its evidence is in."""
    directory = str(tmp_path / "shared")
    first = ProbeKit(store=SharedProbeStore(directory))
    second = ProbeKit(store=SharedProbeStore(directory))
    first.admit(1, BASE, 0.0)
    assert second.probes.probe_answer(ROUTE, 0.01) == "wait"
    first.probes.responded(1, BASE, 0.02)
    ramp(first, start=0.02, growth=50 * MIB, ramp_s=1.0, until=1.0)
    assert second.probes.ready([ROUTE], (), 1.0) == []
    ramp(first, start=0.02, growth=50 * MIB, ramp_s=1.0, until=2.5)
    assert first.woken == [ROUTE]
    assert second.probes.ready([ROUTE], (), 2.5) == [ROUTE]
    assert second.probes.probe_answer(ROUTE, 2.5) == "known"
    assert abs(second.probes.estimates()[ROUTE].footprint_bytes - 50 * MIB) <= MIB
    shown = read_probing(directory)
    assert shown is not None
    assert shown[ROUTE].footprint_bytes == second.probes.estimates()[ROUTE].footprint_bytes


def test_a_dead_workers_probe_frees_its_slot(tmp_path: Path) -> None:
    """A worker that died took its probe with it: the next request becomes the probe."""
    directory = str(tmp_path / "shared")
    probes = ProbeKit(store=SharedProbeStore(directory))
    probes.admit(1, BASE, 0.0)
    trials = read_probing(directory)
    assert trials is not None
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    trials[ROUTE].probes[0].pid = int(gone.stdout)
    SharedProbeStore(directory).store(trials)
    other = ProbeKit(store=SharedProbeStore(directory))
    assert other.probes.probe_answer(ROUTE, 0.5) == "probe"
    assert read_probing(directory) == {}


def test_an_unreadable_probing_file_leaves_each_worker_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A garbled file is replaced; until then each worker goes on with what it saw."""
    directory = tmp_path / "shared"
    probes = ProbeKit(store=SharedProbeStore(str(directory)))
    probes.admit(1, BASE, 0.0)
    (directory / "asgi-admission.probing").write_text("{not json")
    assert probes.probes.probe_answer(ROUTE, 0.1) == "probe"  # replaced: a fresh start
    assert "not a probing file" in caplog.text
    assert os.stat(directory / "asgi-admission.probing").st_mode & 0o077 == 0
