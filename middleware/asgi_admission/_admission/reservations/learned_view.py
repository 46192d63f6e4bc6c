"""What the decisions and settling expect of each route, from what was learned.

``LearnedView`` puts together the learner's estimates and the probe board's
provisional footprints (a concluded probe's, or an open probe's growth past its
guess: ``probing.py``) into the figures the keeper hands on: each route's reserve
(``effective_reserve`` of the configured or derived one), its footprint and ramp for
settling, and the routes decided on an estimate rather than probed first (with
``raise``, what was learned floors a configured reserve and replaces a derived one). They are
computed once per change of what was learned (the learner's and the board's
versions), not on every decision.
"""

from __future__ import annotations

from asgi_admission._admission.decision.latch import AdmissionController
from asgi_admission._admission.decision.reserve import derived_reserve_bytes
from asgi_admission._admission.reservations.growth import RAMP_MARGIN
from asgi_admission._admission.reservations.learning import (
    RouteEstimate,
    SessionLearner,
    effective_reserve,
)
from asgi_admission._admission.reservations.probing import ProbeBoard
from asgi_admission._config import Learning


class LearnedView:
    """Per-route estimates for one keeper (called inside the ledger's lock)."""

    __slots__ = (
        "_board",
        "_board_version",
        "_controller",
        "_estimates",
        "_expected",
        "_known",
        "_learner",
        "_learner_version",
        "learning",
        "min_reserve_bytes",
    )

    def __init__(
        self,
        *,
        learner: SessionLearner,
        board: ProbeBoard,
        controller: AdmissionController,
        learning: Learning,
        min_reserve_bytes: int,
    ) -> None:
        self._learner = learner
        self._board = board
        self._controller = controller
        self.learning: Learning = learning
        self.min_reserve_bytes = min_reserve_bytes
        self._learner_version = -1
        self._board_version = -1
        self._estimates: dict[str, RouteEstimate] = {}
        #: Routes decided on an estimate (learned, or a probe's provisional footprint).
        self._known: dict[str, RouteEstimate | None] = {}
        self._expected: dict[tuple[str, int | None], int] = {}

    def expected_bytes(self, route: str, limit_bytes: int | None) -> int:
        """The route's own reserve under the limit ``limit_bytes``: the one configured or
        derived from the limit, raised or replaced by what was learned of this route (a
        session smaller than it settles by its ramp). Asked on every admission."""
        self.estimates()
        key = (route, limit_bytes)
        expected = self._expected.get(key)
        if expected is None:
            estimate = self._estimates.get(route)
            base = self._controller.reserve_bytes
            expected = self._expected[key] = effective_reserve(
                derived_reserve_bytes(limit_bytes) if base is None else base,
                () if estimate is None else (estimate,),
                mode=self.mode,
                min_bytes=self.min_reserve_bytes,
            )
        return expected

    @property
    def mode(self) -> Learning:
        """How what was learned acts on the reserve: ``raise`` floors only a configured
        reserve; a reserve derived from the limit is a guess, which what was learned
        replaces (never below the minimum), as with ``adapt``."""
        if self.learning == "raise" and self._controller.reserve_bytes is None:
            return "adapt"
        return self.learning

    def ramp_s(self, route: str) -> float | None:
        """How long settling waits by time for a session of ``route``; ``None`` unknown."""
        # Only a concluded estimate has a ramp: an open probe's is still growing.
        estimate = self.known().get(route)
        return None if estimate is None else estimate.ramp_s * RAMP_MARGIN

    def footprint_bytes(self, route: str) -> int | None:
        estimate = self.estimates().get(route)
        return None if estimate is None else estimate.footprint_bytes

    def min_ramp_s(self) -> float | None:
        ramps = (e.ramp_s * RAMP_MARGIN for e in self.known().values() if e is not None)
        return min(ramps, default=None)

    def estimates(self) -> dict[str, RouteEstimate]:
        """Every route's estimate: learned, else a probe's provisional one."""
        learner, board = self._learner, self._board
        if self._learner_version != learner.version or self._board_version != board.version:
            self._learner_version = learner.version
            self._board_version = board.version
            off = self.learning == "off"
            learned = {} if off else {e.route: e for e in learner.estimates()}
            # A probe's provisional footprint stands in until the learner has one.
            provisional = {} if off else board.estimates()
            for route in learned:
                provisional.pop(route, None)
            self._estimates = {**learned, **provisional}
            self._known = {**board.concluded(), **learned}
            self._expected = {}
        return self._estimates

    def known(self) -> dict[str, RouteEstimate | None]:
        """The routes whose sessions are decided on an estimate, not probed first."""
        self.estimates()
        return self._known

    def reserve_bytes(self) -> int | None:
        """The reserve what was learned sets (``None``: nothing learned, or learning off):
        the largest footprint, an open probe's growth past its guess included, never below
        the minimum where it replaces the reserve."""
        largest = max((e.footprint_bytes for e in self.estimates().values()), default=None)
        mode = self.mode
        if largest is None or mode == "off":
            return None
        return max(largest, self.min_reserve_bytes) if mode == "adapt" else largest

    def forget(self) -> None:
        """The configured or learned reserve changed: recompute each route's."""
        self._expected = {}
