"""The parts a :class:`~asgi_admission._admission.reservations.keeper.ReservationKeeper`
is made of, built together: they depend on one another in one direction only.

Notes:

- The order is the direction of their dependencies: the settling queue (this
  process's, or the workers' shared file), the probe board (whose store is shared
  too), the learned view over the learner and the board, the settler that asks the
  view what a route's sessions are expected to add, and the sharing of what was
  learned, which reads all of them.
- With ``ADMISSION_SHARED_DIR`` unset nothing here opens a file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from asgi_admission._admission.decision.latch import AdmissionController
from asgi_admission._admission.reservations.holds import HoldRegistry
from asgi_admission._admission.reservations.learned_sharing import LearnedSharing
from asgi_admission._admission.reservations.learned_view import LearnedView
from asgi_admission._admission.reservations.learning import SessionLearner
from asgi_admission._admission.reservations.probe_store import ProbeStore
from asgi_admission._admission.reservations.probing import ProbeBoard
from asgi_admission._admission.reservations.settle_queue import LocalSettleQueue, SettleQueue
from asgi_admission._admission.reservations.settling import Settler
from asgi_admission._admission.reservations.shared_files import SharedSettleQueue
from asgi_admission._admission.reservations.shared_probes import SharedProbeStore
from asgi_admission._config import Learning


class Tally:
    """A count told one at a time: the held tickets the pending timeout released."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0

    def __call__(self) -> None:
        self.total += 1


@dataclass(frozen=True)
class KeeperParts:
    """A keeper's collaborators (see the module notes for how they depend on one another)."""

    #: The latch the reserve is set on, and the clock every part is told the time by.
    controller: AdmissionController
    clock: Callable[[], float]
    learner: SessionLearner
    queue: SettleQueue
    #: Whether routes not learned yet are probed (``probing.py``).
    probing: bool
    #: The requests held for the probes' evidence (the service's, which waits them).
    holds: HoldRegistry
    board: ProbeBoard
    view: LearnedView
    settler: Settler
    sharing: LearnedSharing
    #: Held tickets never started that the timeout released, in this process.
    expired: Tally


def build_parts(
    *,
    controller: AdmissionController,
    learning: Learning,
    min_reserve_bytes: int,
    timeout_s: float,
    request_timeout_s: float | None = None,
    shared_dir: str | None = None,
    ledger_is_current: Callable[[], bool] | None = None,
    on_reserve: Callable[[int, int | None], None] = lambda learned, configured: None,
    clock: Callable[[], float] = time.monotonic,
    probe_sessions: int = 0,
    holds: HoldRegistry | None = None,
    learner: SessionLearner | None = None,
) -> KeeperParts:
    """The parts of one keeper, from the guard's settings.

    ``timeout_s`` bounds a reservation past its response (``request_timeout_s`` one
    whose request is in progress); ``shared_dir`` is ``ADMISSION_SHARED_DIR``;
    ``ledger_is_current()`` whether the shared ledger's file is still the one opened;
    ``on_reserve(learned, configured)`` is told when the learned reserve changes;
    ``learner`` is what learns the sessions' cost (a new one by default).
    """
    expired = Tally()
    if learner is None:
        learner = SessionLearner(timeout_s=timeout_s)
    queue: SettleQueue = LocalSettleQueue()
    if shared_dir is not None:
        queue = SharedSettleQueue(shared_dir, may_follow=ledger_is_current)
    probing = probe_sessions > 0 and learning != "off"
    holds = HoldRegistry() if holds is None else holds
    store: ProbeStore | None = None
    if shared_dir is not None and probing:
        store = SharedProbeStore(shared_dir)
    board = ProbeBoard(
        probe_sessions=probe_sessions,
        timeout_s=timeout_s,
        store=store,
        on_wake=holds.wake,
        waiting=holds.count,
    )
    view = LearnedView(
        learner=learner,
        board=board,
        controller=controller,
        learning=learning,
        min_reserve_bytes=min_reserve_bytes,
    )
    settler = Settler(
        queue=queue,
        timeout_s=timeout_s,
        request_timeout_s=request_timeout_s,
        ramp_s=view.ramp_s,
        min_ramp_s=view.min_ramp_s,
        footprint_bytes=view.footprint_bytes,
        on_expired=expired,
    )
    sharing = LearnedSharing(
        learner=learner,
        board=board,
        view=view,
        controller=controller,
        shared_dir=shared_dir if learning != "off" else None,
        probing=probing,
        on_reserve=on_reserve,
        clock=clock,
    )
    return KeeperParts(
        controller=controller,
        clock=clock,
        learner=learner,
        queue=queue,
        probing=probing,
        holds=holds,
        board=board,
        view=view,
        settler=settler,
        sharing=sharing,
        expired=expired,
    )
