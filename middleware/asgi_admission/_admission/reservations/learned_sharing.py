"""What the keeper learned, handed on: to the controller's reserve, and to the workers.

Whenever the learner or the probes have something new, the reserve the latch uses is
set again (``learned_view.py``: the configured reserve raised or replaced by what was
learned), the probes of routes learned meanwhile are over, and, with a shared
directory, the new observations go into the learned file that every worker reads
(``learned_file.LearnedStore``). What the other workers learned is taken in every
``SHARED_REFRESH_S``, or at every sample while requests wait for another worker's probe.
Everything here runs inside the ledger's critical section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from asgi_admission._admission.decision.latch import AdmissionController
from asgi_admission._admission.reservations.learned_file import LearnedStore
from asgi_admission._admission.reservations.learned_view import LearnedView
from asgi_admission._admission.reservations.learning import WINDOW, SessionLearner
from asgi_admission._admission.reservations.probing import ProbeBoard

#: How often a worker takes in what the other workers learned.
SHARED_REFRESH_S: Final = 2.0


class LearnedSharing:
    """Hands on what ``learner`` and ``board`` learned (see the module notes)."""

    __slots__ = (
        "_board",
        "_clock",
        "_controller",
        "_learner",
        "_next_refresh",
        "_on_reserve",
        "_probing",
        "_seen",
        "_store",
        "_view",
    )

    def __init__(
        self,
        *,
        learner: SessionLearner,
        board: ProbeBoard,
        view: LearnedView,
        controller: AdmissionController,
        shared_dir: str | None,
        probing: bool,
        on_reserve: Callable[[int, int | None], None],
        clock: Callable[[], float],
    ) -> None:
        self._learner = learner
        self._board = board
        self._view = view
        self._controller = controller
        self._probing = probing
        self._on_reserve = on_reserve
        self._clock = clock
        self._store: LearnedStore | None = None
        if shared_dir is not None:
            self._store = LearnedStore(shared_dir, window=WINDOW)
            learner.merge(self._store.load())
        self._next_refresh = 0.0
        #: The learner's and the board's versions the reserve was last set from.
        self._seen = (-1, -1)
        self.update()

    def publish(self) -> None:
        """After new observations: share them (with a shared directory), update the reserve."""
        if self._versions() == self._seen:
            return
        new = self._learner.take_new()
        if self._store is not None and new:
            merged = self._store.add(new, known=self._learner.observations())
            if merged is not None:  # None: the file is unusable for now (logged once)
                self._learner.merge(merged)
        self.update()

    def refresh(self, now: float, *, urgent: bool = False) -> None:
        """Take in what the other workers learned, when it is due (``urgent``: now)."""
        store = self._store
        if store is None or not (urgent or now >= self._next_refresh):
            return
        self._next_refresh = now + SHARED_REFRESH_S
        loaded = store.refresh()
        if loaded is not None and store.moved:
            # Another file than last time (deleted and made again, or replaced): this
            # worker adds what it knows that the file lacks, before taking it in.
            loaded = store.add({}, known=self._learner.observations())
        if loaded is None:
            return  # unusable for now (logged once): this worker keeps what it learned
        self._learner.merge(loaded)
        if self._versions() != self._seen:
            self.update()

    def update(self) -> None:
        """Hand the controller what was learned: it raises or replaces the reserve; the
        probes of routes learned now are over."""
        board = self._board
        if self._probing:
            board.learned(board.watched() & self._learner.routes(), self._clock())
        self._seen = self._versions()
        self._view.forget()
        learned, controller = self._view.reserve_bytes(), self._controller
        if controller.learned(learned, replaces=self._view.mode == "adapt") and learned is not None:
            self._on_reserve(learned, controller.reserve_bytes)

    def _versions(self) -> tuple[int, int]:
        return self._learner.version, self._board.version
