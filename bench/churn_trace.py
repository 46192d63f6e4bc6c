"""The churn bench's arrival trace, and what a trace allows: the oracle and the hindsight cap.

No server and no cgroup here: ``bench/churn.py`` replays a trace against real servers and
judges them against the two admitters below, which replay the same trace on paper with
every session's true size known from the start.

- A **trace** is Poisson arrivals of two kinds of session over a window, each with an
  exponential lifetime, drawn from a seed. A session ends at its arrival plus its
  lifetime, or at the window's end if that comes first: every run lasts the window.
- The **oracle** is a clairvoyant admitter that knows every session's peak: in arrival
  order, it admits a session iff the baseline plus the peaks of the sessions live then
  plus this one's peak stay at or under the high watermark.
- A **count cap** admits a session iff fewer than ``cap`` are live; the **hindsight cap**
  is the cap that serves most on this trace while the baseline plus the live sessions'
  peaks never exceed the memory limit (the best ``uvicorn --limit-concurrency``-style
  setting an operator could have picked, had they known the trace).
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

Kind = Literal["build", "ramp"]
KINDS: tuple[Kind, ...] = get_args(Kind)

#: The sizes the arrival rate is worked out from, so that a seed alone fixes a trace:
#: a 48 MiB session built in its request, a 96 MiB one ramping after its response, and
#: the demo server's own working set, in a 768 MiB group with an 80 % high watermark.
NOMINAL_MB: Mapping[Kind, float] = {"build": 48.0, "ramp": 96.0}
NOMINAL_BASELINE_MB = 40.0
NOMINAL_LIMIT_MB = 768
HIGH_WATERMARK_PERCENT = 80.0


@dataclass(frozen=True, slots=True)
class Arrival:
    """One attempt to open a session: when (seconds into the trace), of which kind, for how long."""

    t: float
    kind: Kind
    lifetime_s: float

    def end(self, window_s: float) -> float:
        """When the session, if admitted, is closed: its lifetime, cut at the window's end."""
        return min(self.t + self.lifetime_s, window_s)


@dataclass(frozen=True, slots=True)
class Trace:
    """Arrivals in time order over ``window_s`` seconds, and how they were drawn."""

    arrivals: tuple[Arrival, ...]
    window_s: float
    rate_per_s: float
    mean_lifetime_s: float
    load: float
    seed: int | None

    def to_json(self) -> dict[str, object]:
        return {
            "seed": self.seed,
            "load": self.load,
            "rate_per_s": self.rate_per_s,
            "mean_lifetime_s": self.mean_lifetime_s,
            "window_s": self.window_s,
            "arrivals": [
                {"t": a.t, "kind": a.kind, "lifetime_s": a.lifetime_s} for a in self.arrivals
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object], *, source: str = "the trace") -> Trace:
        """A trace written by :meth:`to_json`; a malformed one raises ``ValueError``."""
        try:
            raw = data["arrivals"]
            if not isinstance(raw, list):
                raise ValueError("'arrivals' is not a list")
            arrivals = tuple(
                Arrival(t=_number(a, "t"), kind=_kind(a), lifetime_s=_number(a, "lifetime_s"))
                for a in raw
            )
            seed = data.get("seed")
            trace = cls(
                arrivals=arrivals,
                window_s=_number(data, "window_s"),
                rate_per_s=_number(data, "rate_per_s"),
                mean_lifetime_s=_number(data, "mean_lifetime_s"),
                load=_number(data, "load"),
                seed=None if seed is None else int(_number(data, "seed")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source} is not a churn trace: {exc}.") from exc
        times = [a.t for a in arrivals]
        if times != sorted(times) or any(a.lifetime_s < 0 for a in arrivals):
            raise ValueError(
                f"{source} is not a churn trace: arrivals must be in time order, "
                "with lifetimes of 0 or more."
            )
        return trace

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load_file(cls, path: Path) -> Trace:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path} cannot be read as a churn trace: {exc}.") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path} is not a churn trace: no JSON object at its top.")
        return cls.from_json(data, source=str(path))


def _number(data: object, key: str) -> float:
    value = data.get(key) if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key!r} is {value!r}, not a number")
    return float(value)


def _kind(data: object) -> Kind:
    value = data.get("kind") if isinstance(data, dict) else None
    for kind in KINDS:
        if value == kind:
            return kind
    raise ValueError(f"'kind' is {value!r}, not one of {', '.join(KINDS)}")


def sessions_that_fit() -> float:
    """How many sessions of the nominal mix fit under the high watermark, on average."""
    mean_mb = sum(NOMINAL_MB.values()) / len(NOMINAL_MB)
    ceiling_mb = NOMINAL_LIMIT_MB * HIGH_WATERMARK_PERCENT / 100
    return (ceiling_mb - NOMINAL_BASELINE_MB) / mean_mb


def make_trace(
    *, minutes: float, load: float, seed: int | None, mean_lifetime_s: float = 10.0
) -> Trace:
    """Poisson arrivals offering ``load`` times what fits (sessions wanted at once, on
    average: rate times mean lifetime), each kind equally likely, exponential lifetimes."""
    if minutes <= 0 or load <= 0 or mean_lifetime_s <= 0:
        raise ValueError("--minutes, --load and the mean lifetime must each be above 0.")
    rng = random.Random(seed)
    window_s = minutes * 60
    rate = load * sessions_that_fit() / mean_lifetime_s
    arrivals = []
    t = rng.expovariate(rate)
    while t < window_s:
        kind = KINDS[rng.randrange(len(KINDS))]
        arrivals.append(
            Arrival(
                t=round(t, 3), kind=kind, lifetime_s=round(rng.expovariate(1 / mean_lifetime_s), 3)
            )
        )
        t += rng.expovariate(rate)
    return Trace(
        arrivals=tuple(arrivals),
        window_s=window_s,
        rate_per_s=round(rate, 4),
        mean_lifetime_s=mean_lifetime_s,
        load=load,
        seed=seed,
    )


@dataclass(frozen=True, slots=True)
class Replay:
    """What an admitter on paper did with a trace."""

    admitted: tuple[int, ...]
    #: The most the baseline plus the live sessions' sizes reached.
    peak_bytes: int

    @property
    def served(self) -> int:
        """Every session admitted on paper lives its lifetime: nothing is lost."""
        return len(self.admitted)


def replay(
    trace: Trace,
    *,
    sizes: Mapping[Kind, int],
    baseline: int,
    admits: Callable[[int, int, int], bool],
) -> Replay:
    """Replay ``trace`` in arrival order; ``admits(live, used, size)`` decides each arrival
    from the live sessions' count, the baseline plus their sizes, and its own size.
    Sessions ending at or before an arrival are gone when it is decided."""
    ends: list[tuple[float, int]] = []  # (end, size) of the live sessions
    used = peak = baseline
    admitted = []
    for index, arrival in enumerate(trace.arrivals):
        while ends and ends[0][0] <= arrival.t:
            used -= heapq.heappop(ends)[1]
        size = sizes[arrival.kind]
        if admits(len(ends), used, size):
            admitted.append(index)
            heapq.heappush(ends, (arrival.end(trace.window_s), size))
            used += size
            peak = max(peak, used)
    return Replay(admitted=tuple(admitted), peak_bytes=peak)


def oracle(
    trace: Trace,
    *,
    sizes: Mapping[Kind, int],
    baseline: int,
    limit: int,
    high_watermark_percent: float = HIGH_WATERMARK_PERCENT,
) -> Replay:
    """The clairvoyant admitter: every session's peak known, none above the high watermark."""
    ceiling = limit * high_watermark_percent / 100
    return replay(
        trace, sizes=sizes, baseline=baseline, admits=lambda _, used, size: used + size <= ceiling
    )


def count_cap(trace: Trace, *, sizes: Mapping[Kind, int], baseline: int, cap: int) -> Replay:
    """A fixed count cap: admitted iff fewer than ``cap`` sessions are live."""
    return replay(trace, sizes=sizes, baseline=baseline, admits=lambda live, _, __: live < cap)


@dataclass(frozen=True, slots=True)
class CapChoice:
    cap: int
    replay: Replay


def hindsight_cap(
    trace: Trace, *, sizes: Mapping[Kind, int], baseline: int, limit: int
) -> CapChoice:
    """The count cap that serves most of ``trace`` without the sessions' sizes ever
    exceeding ``limit`` (the smallest such cap on a tie)."""
    best = CapChoice(cap=0, replay=count_cap(trace, sizes=sizes, baseline=baseline, cap=0))
    for cap in range(1, len(trace.arrivals) + 1):
        run = count_cap(trace, sizes=sizes, baseline=baseline, cap=cap)
        if run.peak_bytes <= limit and run.served > best.replay.served:
            best = CapChoice(cap=cap, replay=run)
    return best
