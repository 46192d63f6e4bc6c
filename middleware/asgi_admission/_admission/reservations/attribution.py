"""Footprints from overlapping windows: a least-squares fit, and what each session added.

Notes:

- Every closed window is one equation: the growth over it is the session's own
  footprint plus, per route, the share of other sessions' footprints expected to have
  arrived in it (by their learned ramps). The recent exact windows of all routes are
  solved together by weighted least squares (larger windows are noisier), a few
  rounds of Huber's weights keeping one odd window from pulling the fit, separately
  for each group of routes whose windows overlapped. A route with fewer than
  ``MIN_OWN`` windows of its own is no unknown yet: the windows its sessions overlap
  wait.
- A route's fit is *determined* once its one-sided 95 % bound, from the residuals
  (never below the noise expected of each window), is within ``DETERMINED_SHARE`` of
  it.
- Each window also says, at most, what its session added: its growth less the least
  the others in it can have added (their fits' 95 % lower bounds, or the memory their
  sessions free at their ends, with the least share of them ramps that vary allow;
  nothing for a route not known yet), plus what memory drifting down may have hidden
  (``DRIFT_BYTES_PER_S``). Sessions of its own route not known yet share what is left
  equally. These bounds are what a route's footprint is taken from until its own fit
  is determined (``learning.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

#: The smallest noise assumed of one equation: a share of its growth (readings drift
#: and sessions vary) and a few readings' worth.
NOISE_FLOOR_BYTES: Final = 1024 * 1024
NOISE_SHARE: Final = 0.03
#: How fast memory is taken to drift down for other reasons, at most, when a single
#: window is all there is to go by (a fit averages drift out). Slow: a fall of more than
#: FREE_STEP_BYTES in one step is left out of the growth series anyway (session_windows.py).
DRIFT_BYTES_PER_S: Final = 256 * 1024
#: A fit whose one-sided 95 % bound is within this share of it is taken as known.
DETERMINED_SHARE: Final = 0.2
#: Windows of its own a route needs before its fit can be taken as known, and windows
#: beyond one per route its group needs, per route.
MIN_OWN: Final = 2
MIN_SPARE: Final = 1
_Z95: Final = 1.645
#: Huber's threshold, in expected noises, and the rounds of reweighting.
_HUBER: Final = 2.0
_ROUNDS: Final = 3
#: An overlap this small of a route not solved for is left in the growth as noise.
_NEGLIGIBLE: Final = 0.05
#: Standard errors above the fit a route's footprint is taken at (one-sided 84 %).
UPPER_Z: Final = 1.0
#: The most routes solved together; beyond, further routes in a group stay undetermined.
MAX_JOINT: Final = 16


@dataclass(frozen=True, slots=True)
class Fit:
    """A route's fitted footprint and its standard error (bytes)."""

    footprint: float
    error: float
    #: Known well enough to be taken from other sessions' windows.
    determined: bool

    def upper(self, z: float = UPPER_Z) -> float:
        """The fit plus ``z`` standard errors."""
        return self.footprint + z * self.error


@dataclass(frozen=True, slots=True)
class Overlap:
    """Other sessions of one route in a window."""

    route: str
    #: How much of their footprints is expected to have arrived in the window, by their
    #: learned ramps (in footprints), and the least that may have, ramps varying.
    share: float
    least: float
    #: What those of them that ramped alone inside the window were seen to add (bytes),
    #: and how much of ``least`` they are.
    seen: float = 0.0
    seen_share: float = 0.0


@dataclass(frozen=True, slots=True)
class Window:
    """One session's window, an equation: ``growth`` = own footprint + the sum of
    ``share x footprint`` over ``overlaps``."""

    #: What the growth series rose by over the window (bytes).
    growth: float
    #: How long the window was (seconds).
    seconds: float
    #: Seconds from admission until the session's own growth reached 90 % of its peak,
    #: ``None`` where sessions of unknown routes ramped in the window too.
    ramp_s: float | None
    #: The other sessions in the window, per route.
    overlaps: tuple[Overlap, ...]
    #: Every route in ``overlaps`` had a learned ramp (else the shares are lower
    #: bounds, and the window is not fitted).
    exact: bool


def fit(windows: Mapping[str, Sequence[Window]]) -> dict[str, Fit]:
    """The fits of the routes in ``windows`` that have one (enough exact windows)."""
    usable = _usable({route: [w for w in rows if w.exact] for route, rows in windows.items()})
    fits: dict[str, Fit] = {}
    for group in _groups(usable):
        fits.update(_solve(group, usable))
    return fits


def _usable(equations: Mapping[str, list[Window]]) -> dict[str, list[Window]]:
    """The equations that can be solved: every route whose sessions overlapped them has
    ``MIN_OWN`` such equations of its own (a route seen too little is no unknown yet,
    and the windows it overlapped wait)."""
    solvable = {route for route, rows in equations.items() if len(rows) >= MIN_OWN}
    while True:
        usable = {
            route: [
                row
                for row in equations[route]
                if all(o.route in solvable or o.share < _NEGLIGIBLE for o in row.overlaps)
            ]
            for route in solvable
        }
        kept = {route for route, rows in usable.items() if len(rows) >= MIN_OWN}
        if kept == solvable:
            return usable
        solvable = kept


def attributed(
    route: str,
    equation: Window,
    fits: Mapping[str, Fit],
    floors: Mapping[str, float],
) -> float:
    """What ``equation``'s session of ``route`` added, at most: its window's growth less
    the least the others can have added (their fits' 95 % lower bounds, the memory their
    sessions free at their ends, or what they were seen to add ramping alone, whichever
    says most; nothing where unknown), and more for memory that may have drifted down.
    Where ``route`` itself is not known yet, the window's other sessions of ``route``
    share what is left with it equally instead."""
    others = 0.0
    own = 0.0
    for overlap in equation.overlaps:
        known = fits.get(overlap.route)
        least = floors.get(overlap.route, 0.0)
        if known is not None:
            least = max(least, known.footprint - _Z95 * known.error)
        if overlap.route == route and least <= 0:
            # Its own route's other sessions, not known yet: those seen alone are taken
            # at what they were seen to add, the others share what is left equally.
            others += overlap.seen
            own += max(0.0, overlap.least - overlap.seen_share)
        else:
            others += max(overlap.least * least, overlap.seen)
    # Memory drifting down over the window may have hidden some of the session's.
    allowance = DRIFT_BYTES_PER_S * equation.seconds
    return max(0.0, equation.growth + allowance - others) / (1.0 + own)


def _groups(equations: Mapping[str, Sequence[Window]]) -> list[list[str]]:
    """Routes linked by overlapping windows, each group sorted, at most MAX_JOINT routes."""
    parent = {route: route for route in equations}

    def root(route: str) -> str:
        while parent[route] != route:
            parent[route] = parent[parent[route]]
            route = parent[route]
        return route

    for route, rows in equations.items():
        for row in rows:
            for overlap in row.overlaps:
                if overlap.route in parent:
                    parent[root(overlap.route)] = root(route)
    groups: dict[str, list[str]] = {}
    for route in sorted(equations):
        groups.setdefault(root(route), []).append(route)
    return [members[:MAX_JOINT] for members in groups.values()]


def _solve(routes: list[str], equations: Mapping[str, Sequence[Window]]) -> dict[str, Fit]:
    index = {route: i for i, route in enumerate(routes)}
    n = len(routes)
    rows: list[tuple[list[tuple[int, float]], float, float]] = []
    for route in routes:
        for equation in equations[route]:
            terms: dict[int, float] = {index[route]: 1.0}  # own footprint
            for overlap in equation.overlaps:
                i = index.get(overlap.route)
                if i is not None:
                    terms[i] = terms.get(i, 0.0) + overlap.share
            # Larger windows are noisier (drift over them, sessions that vary): each
            # equation is weighed by the noise expected of it.
            noise = NOISE_FLOOR_BYTES + NOISE_SHARE * abs(equation.growth)
            rows.append((list(terms.items()), equation.growth, noise))
    dof = len(rows) - n
    if dof < MIN_SPARE * n:
        # Routes whose windows overlap can trade their footprints against each other
        # while only a few windows are there: a fit needs some to spare per route.
        return {}
    # Huber's weights, a few rounds: one window far off the others (a session cut
    # short, memory from elsewhere) counts as a few noises off, not as its square.
    robust = [1.0] * len(rows)
    solved = None
    for _round in range(_ROUNDS):
        solved = _weighted(rows, robust, n)
        if solved is None:
            return {}
        theta = solved[0]
        for k, (row, growth, noise) in enumerate(rows):
            off = abs(growth - sum(a * theta[i] for i, a in row)) / noise
            robust[k] = 1.0 if off <= _HUBER else _HUBER / off
    assert solved is not None
    theta, inverse = solved
    squares = 0.0
    for (row, growth, noise), weight in zip(rows, robust, strict=True):
        residual = (growth - sum(a * theta[i] for i, a in row)) / noise
        squares += weight * residual * residual
    # The noise is never taken as smaller than expected of each equation.
    scale = max(1.0, squares / dof)
    fits: dict[str, Fit] = {}
    for route, i in index.items():
        error = math.sqrt(max(0.0, scale * inverse[i][i]))
        determined = theta[i] > 0 and _Z95 * error <= max(
            DETERMINED_SHARE * theta[i], _Z95 * NOISE_FLOOR_BYTES
        )
        fits[route] = Fit(theta[i], error, determined)
    return fits


def _weighted(
    rows: list[tuple[list[tuple[int, float]], float, float]], robust: list[float], n: int
) -> tuple[list[float], list[list[float]]] | None:
    """Weighted least squares: the fit and the inverse of its normal matrix."""
    normal = [[0.0] * n for _ in range(n)]
    rhs = [0.0] * n
    for (row, growth, noise), extra in zip(rows, robust, strict=True):
        weight = extra / (noise * noise)
        for i, a in row:
            rhs[i] += weight * a * growth
            for j, b in row:
                normal[i][j] += weight * a * b
    inverse = _inverse(normal)
    if inverse is None:
        return None
    return [sum(inverse[i][j] * rhs[j] for j in range(n)) for i in range(n)], inverse


def _inverse(matrix: list[list[float]]) -> list[list[float]] | None:
    """Gauss-Jordan with partial pivoting; ``None`` for a singular matrix."""
    n = len(matrix)
    scale = max((abs(v) for row in matrix for v in row), default=0.0)
    if scale == 0:
        return None
    work = [[*row, *(1.0 if i == j else 0.0 for j in range(n))] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(work[r][col]))
        if abs(work[pivot][col]) <= 1e-9 * scale:
            return None
        work[col], work[pivot] = work[pivot], work[col]
        head = work[col]
        inv = 1.0 / head[col]
        for k in range(2 * n):
            head[k] *= inv
        for r in range(n):
            if r != col:
                factor = work[r][col]
                if factor:
                    row = work[r]
                    for k in range(col, 2 * n):
                        row[k] -= factor * head[k]
    return [row[n:] for row in work]
