"""Sessions arriving and leaving at random: how many the guard serves, against what was possible.

    sudo .venv/bin/python bench/churn.py [--minutes 1] [--load 1.5] [--seed 1]
        [--modes bare,cap,guard,learn[,wait,unmeasured]] [--trace PATH] [--replay PATH]
        [--json PATH] [--plot docs/img/churn.png]

Needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory. Draws
one arrival trace (``bench/churn_trace.py``: Poisson arrivals at ``--load`` times what
fits, exponential lifetimes of mean 10 s, for ``--minutes``) of two kinds of session,
equally likely: ``build``, ``POST /sessions`` holding 48 MiB built inside the request
(``DEMO_SESSION_MB``), and ``ramp``, ``POST /processes?hold_mb=92&ramp_s=2``, a child
process whose 96 MiB arrive over 2 s after its ``201``. Then it replays that trace, in
one go, against the demo under uvicorn in a fresh 768 MiB memory group (no swap), once
per mode:

- ``bare``: the app without the guard;
- ``cap``: the best fixed count cap, chosen with hindsight (the count cap that serves
  most of this trace on paper without the sessions' true sizes exceeding the limit),
  enforced by the guard's ``ADMISSION_MAX_SESSIONS`` with its memory reading pinned to
  a fixture that never moves and no reserve, so the count alone decides;
- ``guard``: the guard with its defaults;
- ``learn``: the guard with a reserve 12x too small (8 MiB) and learning (``raise``);
- ``unmeasured`` (only when asked for): the guard with its defaults, the ``ramp``
  sessions' processes registered with the watchdog by their route alone
  (``&measured=0``), not their admission ticket: their reservations settle by the
  container's working set, as for sessions the guard cannot measure one by one, and
  one closed before it settled is not released when its process is unregistered;
- ``wait`` (only when asked for): the guard with its defaults and a bounded wait of 10 s
  (``ADMISSION_QUEUE_TIMEOUT_SECONDS``): a session that does not fit waits for capacity
  instead of being refused, and once admitted lives its lifetime from its admission.

Each arrival is one attempt: a refused client does not retry, so every mode sees the
same offered sessions. An admitted session is closed (``DELETE``) at the end of its
lifetime (in ``wait``, counted from its admission), or at the window's end if that
comes first, and counts as **served** only if
the server still had it then (its process running and not halted by the watchdog, for
a ``ramp`` session). Printed per mode: served, refused, lost (admitted, then OOM-killed,
halted or gone with the server), the kernel's OOM kills for the group, the mean and peak
working set, served against the oracle (``churn_trace.oracle``: a clairvoyant admitter
that knows every session's peak, under the high watermark), and whether the working set
went above the high watermark by more than one session's footprint, and how long the
admitted sessions waited for their answer (median, 90th percentile, longest). The true sizes and
the baseline the oracle and the cap use are measured first, in a separate server.

``--trace`` writes the arrival trace as JSON and ``--replay`` runs a recorded one
instead of drawing it; ``--json`` writes the figures; ``--plot`` draws the working set
and the admissions over time, the guard against the fixed cap (needs matplotlib, a
bench/docs dependency only). ``tests/test_churn.py`` runs it for 0.3 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import httpx

from benchkit import (
    MIB,
    V1_MEMORY,
    free_port,
    joining,
    memory_group,
    oom_kills,
    server_alive,
    stop_process_group,
    working_set_bytes,
    write_v2_tree,
)
from churn_trace import (
    HIGH_WATERMARK_PERCENT,
    KINDS,
    NOMINAL_LIMIT_MB,
    CapChoice,
    Kind,
    Replay,
    Trace,
    hindsight_cap,
    make_trace,
    oracle,
)

Mode = Literal["bare", "cap", "guard", "learn", "wait", "unmeasured"]
MODES: tuple[Mode, ...] = get_args(Mode)
#: What runs unless ``--modes`` says otherwise.
DEFAULT_MODES: tuple[Mode, ...] = ("bare", "cap", "guard", "learn")
Outcome = Literal["served", "refused", "lost", "failed"]

BUILD_MB = 48
RAMP_HOLD_MB = 92  # with the child's interpreter, about 95 MiB in the group
RAMP_S = 2.0
LEARN_RESERVE_MB = 8  # the default reserve (an eighth of 768 MiB: 96) over 12
SAMPLE_S = 0.05
WAIT_S = 10.0
REQUEST_TIMEOUT_S = 30.0

_SERVE = """
import sys, uvicorn
from asgi_admission.demo import create_app
uvicorn.run(create_app(guarded=sys.argv[1] == "guarded"), host="127.0.0.1",
            port=int(sys.argv[2]), log_level="warning")
"""


def available() -> bool:
    """Whether this machine can run the bench: root and a writable v1 memory hierarchy."""
    return (
        os.geteuid() == 0
        and (V1_MEMORY / "memory.limit_in_bytes").is_file()
        and os.access(V1_MEMORY, os.W_OK)
    )


def _open(kind: Kind, *, measured: bool = True) -> tuple[str, dict[str, float]]:
    if kind == "build":
        return "/sessions", {}
    return "/processes", {"hold_mb": RAMP_HOLD_MB, "ramp_s": RAMP_S, "measured": int(measured)}


@dataclass(frozen=True, slots=True)
class Attempt:
    """What became of one arrival in a real run."""

    index: int
    kind: Kind
    outcome: Outcome
    #: 201, 503, another status, or the name of the exception the request raised.
    status: int | str
    #: Seconds into the run at which the 201 arrived.
    admitted_at: float | None = None
    #: Seconds from the request to its 201 (a wait for capacity, in ``wait``).
    waited_s: float | None = None
    halted: bool = False
    #: Closed at the window's end, before its lifetime was over.
    cut: bool = False
    #: Why a 503 was given (its body's ``reason``).
    reason: str | None = None


@dataclass
class Run:
    """One mode's replay of the trace: every arrival's fate and the group's working set."""

    mode: Mode
    baseline_bytes: int
    attempts: list[Attempt]
    oom_kills: int
    server_alive: bool
    window_s: float
    cap: int | None = None
    #: (seconds into the run, working set in bytes) every SAMPLE_S.
    samples: list[tuple[float, int]] = field(default_factory=list)
    #: The guard's learned footprints and reserve at the end (MiB), from its metrics.
    learned: dict[str, float] = field(default_factory=dict)

    def count(self, outcome: Outcome, kind: Kind | None = None) -> int:
        return sum(1 for a in self.attempts if a.outcome == outcome and kind in (None, a.kind))

    def working_set_mb(self) -> tuple[float, float]:
        """The mean and the peak working set over the window, in MiB."""
        inside = [used for t, used in self.samples if t <= self.window_s] or [0]
        return sum(inside) / len(inside) / MIB, max(inside) / MIB


@dataclass(frozen=True, slots=True)
class Sizes:
    """What the server and each kind of session add to a memory group, measured."""

    baseline: int
    session: Mapping[Kind, int]


class _Sampler(threading.Thread):
    """The group's working set every SAMPLE_S, from a thread, from the moment it starts."""

    def __init__(self, group: Path) -> None:
        super().__init__(daemon=True)
        self.group = group
        self.samples: list[tuple[float, int]] = []
        self.stop_event = threading.Event()
        self.start_at = time.monotonic()

    def run(self) -> None:
        while not self.stop_event.wait(SAMPLE_S):
            with contextlib.suppress(OSError, ValueError):
                self.samples.append(
                    (time.monotonic() - self.start_at, working_set_bytes(self.group))
                )


def _env(mode: Mode, group: Path, fixture: Path, cap: int | None) -> dict[str, str]:
    # Settings inherited from the caller's shell would make the modes something else.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMISSION_", "DEMO_"))}
    env["DEMO_SESSION_MB"] = str(BUILD_MB)
    env["ADMISSION_CGROUP_ROOT"] = str(group)
    if mode == "cap":
        if cap is None:
            raise ValueError("The cap mode needs its count cap: pass run_mode a cap.")
        env["ADMISSION_CGROUP_ROOT"] = str(fixture)
        env["ADMISSION_MAX_SESSIONS"] = str(cap)
        env["ADMISSION_SESSION_RESERVE_MB"] = "0"
        env["ADMISSION_SESSION_RESERVE_LEARNING"] = "off"
    elif mode == "learn":
        env["ADMISSION_SESSION_RESERVE_MB"] = str(LEARN_RESERVE_MB)
        env["ADMISSION_SESSION_RESERVE_LEARNING"] = "raise"
    elif mode == "wait":
        env["ADMISSION_QUEUE_TIMEOUT_SECONDS"] = str(WAIT_S)
    return env


@contextlib.contextmanager
def _serving(
    mode: Mode, *, limit_mb: int, cap: int | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """The demo in a fresh memory group in ``mode``, ready: (base URL, process, group)."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with (
        memory_group(limit_mb, f"churn_{mode}") as group,
        tempfile.TemporaryFile() as log,
        tempfile.TemporaryDirectory() as tmp,
    ):
        fixture = write_v2_tree(Path(tmp) / "cgroup", used_mb=100, limit_mb=64 * 1024)
        argv = [*joining(group), sys.executable, "-c", _SERVE]
        proc = subprocess.Popen(
            [*argv, "bare" if mode == "bare" else "guarded", str(port)],
            env=_env(mode, group, fixture, cap),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not _healthy(base_url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"The {mode} server did not start: {log.read()[-2000:]!r}")
                time.sleep(0.2)
            time.sleep(0.5)  # imports and the first requests' allocations settle
            yield base_url, proc, group
        finally:
            stop_process_group(proc)


def _healthy(base_url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(base_url + "/health", timeout=1).status_code == 200
    return False


def measure_sizes() -> Sizes:
    """The guarded demo's idle working set and what one session of each kind adds to it,
    in a group large enough that nothing is refused."""
    with (
        _serving("guard", limit_mb=4096) as (base_url, _, group),
        httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client,
    ):
        baseline = working_set_bytes(group)
        session: dict[Kind, int] = {}
        for kind in KINDS:
            path, params = _open(kind)
            before = working_set_bytes(group)
            opened = client.post(path, params=params)
            opened.raise_for_status()
            time.sleep(0.5 if kind == "build" else RAMP_S + 2.5)
            session[kind] = working_set_bytes(group) - before
            client.delete(f"{path}/{opened.json()['id']}").raise_for_status()
            time.sleep(0.5)
    return Sizes(baseline=baseline, session=session)


async def _replay(
    base_url: str,
    trace: Trace,
    start_at: float,
    *,
    from_admission: bool = False,
    measured: bool = True,
) -> list[Attempt]:
    """Every arrival of ``trace`` as one attempt; an admitted session lives its lifetime
    from its arrival, or (``from_admission``) from its admission, cut at the window; a
    ``ramp`` session's process is ``measured`` by the watchdog for its reservation."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=32)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=REQUEST_TIMEOUT_S, limits=limits
    ) as client:
        loop = asyncio.get_running_loop()
        # Both clocks are CLOCK_MONOTONIC: the samples and the trace share one origin.
        t0 = loop.time() - (time.monotonic() - start_at)

        async def attempt(index: int) -> Attempt:
            arrival = trace.arrivals[index]
            await asyncio.sleep(max(0.0, t0 + arrival.t - loop.time()))
            path, params = _open(arrival.kind, measured=measured)
            try:
                response = await client.post(path, params=params)
            except httpx.HTTPError as exc:
                return Attempt(index, arrival.kind, "failed", type(exc).__name__)
            if response.status_code != 201:
                outcome: Outcome = "refused" if response.status_code == 503 else "failed"
                reason = None
                if outcome == "refused":
                    with contextlib.suppress(ValueError, AttributeError):
                        reason = str(response.json().get("reason"))
                return Attempt(index, arrival.kind, outcome, response.status_code, reason=reason)
            admitted_at = loop.time() - t0
            session = f"{path}/{response.json()['id']}"
            end = arrival.end(trace.window_s)
            if from_admission:
                end = min(admitted_at + arrival.lifetime_s, trace.window_s)
            await asyncio.sleep(max(0.0, t0 + end - loop.time()))
            there, halted = await _still_there(client, arrival.kind, session)
            return Attempt(
                index,
                arrival.kind,
                "served" if there else "lost",
                201,
                admitted_at=round(admitted_at, 3),
                waited_s=round(admitted_at - arrival.t, 3),
                halted=halted,
                cut=end < (admitted_at if from_admission else arrival.t) + arrival.lifetime_s,
            )

        return await asyncio.gather(*(attempt(i) for i in range(len(trace.arrivals))))


async def _still_there(client: httpx.AsyncClient, kind: Kind, session: str) -> tuple[bool, bool]:
    """Whether the server still has ``session`` running at the end of its lifetime (and
    whether the watchdog halted it); the session is closed either way."""
    try:
        if kind == "build":
            return (await client.delete(session)).status_code == 204, False
        shown = await client.get(session)
        await client.delete(session)
    except httpx.HTTPError:
        return False, False
    if shown.status_code != 200:
        return False, False
    body = shown.json()
    halted = body["halt"] is not None
    return bool(body["running"]) and not halted, halted


def run_mode(mode: Mode, trace: Trace, *, limit_mb: int, cap: int | None = None) -> Run:
    """Replay ``trace`` against a fresh server in ``mode`` and report what became of it."""
    with _serving(mode, limit_mb=limit_mb, cap=cap) as (base_url, proc, group):
        baseline = working_set_bytes(group)
        sampler = _Sampler(group)
        sampler.start()
        try:
            attempts = asyncio.run(
                _replay(
                    base_url,
                    trace,
                    sampler.start_at,
                    from_admission=mode == "wait",
                    measured=mode != "unmeasured",
                )
            )
        finally:
            sampler.stop_event.set()
            sampler.join(timeout=2)
        learned = _learned(base_url) if mode not in ("bare", "cap") else {}
        return Run(
            mode=mode,
            baseline_bytes=baseline,
            attempts=attempts,
            oom_kills=oom_kills(group),
            server_alive=server_alive(proc, base_url),
            window_s=trace.window_s,
            cap=cap,
            samples=sampler.samples,
            learned=learned,
        )


def _learned(base_url: str) -> dict[str, float]:
    """The guard's learned footprints (MiB) and reserve at the end, from its metrics."""
    found: dict[str, float] = {}
    try:
        text = httpx.get(f"{base_url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return found
    for line in text.splitlines():
        if line.startswith(
            ("asgi_admission_session_footprint_bytes{", "asgi_admission_session_reserve_bytes ")
        ):
            name, value = line.rsplit(" ", 1)
            found[name.removeprefix("asgi_admission_session_")] = round(float(value) / MIB, 1)
    return found


@dataclass(frozen=True, slots=True)
class Churn:
    """Every mode's run on one trace, and what the trace allowed."""

    trace: Trace
    sizes: Sizes
    limit_mb: int
    oracle: Replay
    cap: CapChoice
    #: The hindsight cap had it been held to the high watermark too, for comparison.
    cap_under_watermark: CapChoice
    runs: list[Run]

    @property
    def ceiling_bytes(self) -> float:
        return self.limit_mb * MIB * HIGH_WATERMARK_PERCENT / 100

    def row(self, run: Run) -> dict[str, object]:
        mean_mb, peak_mb = run.working_set_mb()
        over_mb = peak_mb - self.ceiling_bytes / MIB
        largest_mb = max(self.sizes.session.values()) / MIB
        served = run.count("served")
        return {
            "mode": run.mode if run.cap is None else f"{run.mode} {run.cap}",
            "served": served,
            "refused": run.count("refused"),
            "lost": run.count("lost"),
            "failed": run.count("failed"),
            "halted_by_watchdog": sum(a.halted for a in run.attempts),
            "oom_kills": run.oom_kills,
            "server_alive": run.server_alive,
            "baseline_mb": round(run.baseline_bytes / MIB, 1),
            "mean_working_set_mb": round(mean_mb, 1),
            "peak_working_set_mb": round(peak_mb, 1),
            "served_over_oracle": round(served / self.oracle.served, 2)
            if self.oracle.served
            else None,
            "above_watermark_by_more_than_a_session": over_mb > largest_mb,
            "served_by_kind": {kind: run.count("served", kind) for kind in KINDS},
            "learned_mb": run.learned,
            "waited_s": _waits(run),
            "served_cut_by_window": sum(a.cut for a in run.attempts if a.outcome == "served"),
            "refused_by_reason": dict(
                collections.Counter(str(a.reason) for a in run.attempts if a.outcome == "refused")
            ),
        }

    def summary(self) -> dict[str, object]:
        """The trace, the oracle, the hindsight cap and a :meth:`row` per run."""
        arrivals = self.trace.arrivals
        return {
            "minutes": round(self.trace.window_s / 60, 3),
            "load": self.trace.load,
            "seed": self.trace.seed,
            "rate_per_s": self.trace.rate_per_s,
            "arrivals": len(arrivals),
            "arrivals_by_kind": {k: sum(a.kind == k for a in arrivals) for k in KINDS},
            "limit_mb": self.limit_mb,
            "high_watermark_mb": round(self.ceiling_bytes / MIB, 1),
            "baseline_mb": round(self.sizes.baseline / MIB, 1),
            "session_mb": {k: round(v / MIB, 1) for k, v in self.sizes.session.items()},
            "oracle_served": self.oracle.served,
            "oracle_peak_mb": round(self.oracle.peak_bytes / MIB, 1),
            "hindsight_cap": self.cap.cap,
            "hindsight_cap_served_on_paper": self.cap.replay.served,
            "hindsight_cap_peak_mb_on_paper": round(self.cap.replay.peak_bytes / MIB, 1),
            "hindsight_cap_under_watermark": self.cap_under_watermark.cap,
            "hindsight_cap_under_watermark_served_on_paper": self.cap_under_watermark.replay.served,
            "runs": [self.row(run) for run in self.runs],
        }


def _waits(run: Run) -> dict[str, float] | None:
    """How long the admitted sessions waited for their 201: median, 90th percentile, longest."""
    waits = sorted(a.waited_s for a in run.attempts if a.waited_s is not None)
    if not waits:
        return None
    return {
        "median": waits[len(waits) // 2],
        "p90": waits[min(len(waits) - 1, int(len(waits) * 0.9))],
        "max": waits[-1],
    }


def run_churn(
    trace: Trace, *, modes: tuple[Mode, ...] = DEFAULT_MODES, limit_mb: int = NOMINAL_LIMIT_MB
) -> Churn:
    """Measure the sizes, work out the oracle and the hindsight cap, run every mode."""
    sizes = measure_sizes()
    limit = limit_mb * MIB
    best = oracle(trace, sizes=sizes.session, baseline=sizes.baseline, limit=limit)
    cap = hindsight_cap(trace, sizes=sizes.session, baseline=sizes.baseline, limit=limit)
    cap_hw = hindsight_cap(
        trace,
        sizes=sizes.session,
        baseline=sizes.baseline,
        limit=int(limit * HIGH_WATERMARK_PERCENT / 100),
    )
    runs = [
        run_mode(mode, trace, limit_mb=limit_mb, cap=cap.cap if mode == "cap" else None)
        for mode in modes
    ]
    return Churn(trace, sizes, limit_mb, best, cap, cap_hw, runs)


COLUMNS = (
    ("mode", "mode"),
    ("served", "served"),
    ("refused", "refused (503)"),
    ("lost", "lost"),
    ("oom_kills", "OOM kills"),
    ("mean_working_set_mb", "mean working set (MiB)"),
    ("peak_working_set_mb", "peak (MiB)"),
    ("served_over_oracle", "served / oracle"),
    ("above_watermark_by_more_than_a_session", "> watermark + a session"),
    ("waited_s", "waited (s): median / p90 / max"),
)


def table(churn: Churn) -> str:
    """The figures as a Markdown table, the oracle last."""
    lines = [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for run in churn.runs:
        row = churn.row(run)
        if row["failed"]:
            row["lost"] = f"{row['lost']} (+{row['failed']} failed)"
        if not row["server_alive"]:
            row["oom_kills"] = f"{row['oom_kills']} (server killed)"
        if row["halted_by_watchdog"]:
            row["lost"] = f"{row['lost']} ({row['halted_by_watchdog']} halted)"
        lines.append("| " + " | ".join(_cell(row[key]) for key, _ in COLUMNS) + " |")
    arrivals = len(churn.trace.arrivals)
    oracle_row = [
        "oracle",
        str(churn.oracle.served),
        str(arrivals - churn.oracle.served),
        "0",
        "-",
        "-",
        f"{churn.oracle.peak_bytes / MIB:.1f} (on paper)",
        "1.00",
        "no",
        "-",
    ]
    lines.append("| " + " | ".join(oracle_row) + " |")
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return " / ".join(f"{v:.2f}" for v in value.values())
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 10 else f"{value:.1f}"
    return str(value)


def plot(churn: Churn, path: Path) -> None:
    """The working set (above) and the sessions admitted so far (below) over time, the
    guard with its defaults against the fixed cap, the oracle's admissions dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (memory, admitted) = plt.subplots(
        2, 1, sharex=True, figsize=(8, 6), dpi=110, height_ratios=(3, 2)
    )
    colours = {"guard": "tab:green", "cap": "tab:blue"}
    for run in churn.runs:
        if run.mode not in colours:
            continue
        row = churn.row(run)
        label = (
            f"{row['mode']}: {row['served']} served, {row['lost']} lost, "
            f"{row['oom_kills']} OOM kills"
        )
        memory.plot(
            [t for t, _ in run.samples],
            [used / MIB for _, used in run.samples],
            color=colours[run.mode],
            linewidth=1,
            label=label,
        )
        times = sorted(a.admitted_at for a in run.attempts if a.admitted_at is not None)
        admitted.step(
            [0.0, *times, run.window_s],
            [*range(len(times) + 1), len(times)],
            where="post",
            color=colours[run.mode],
            label=f"{row['mode']}: {len(times)} admitted",
        )
    oracle_times = [churn.trace.arrivals[i].t for i in churn.oracle.admitted]
    admitted.step(
        [0.0, *oracle_times, churn.trace.window_s],
        [*range(len(oracle_times) + 1), len(oracle_times)],
        where="post",
        color="grey",
        linestyle=":",
        label=f"oracle: {churn.oracle.served} admitted (on paper)",
    )
    limit_mb = churn.limit_mb
    memory.axhline(limit_mb, color="black", linewidth=1, label=f"limit ({limit_mb} MiB)")
    memory.axhline(
        churn.ceiling_bytes / MIB,
        color="grey",
        linestyle="--",
        linewidth=1,
        label=f"high watermark ({HIGH_WATERMARK_PERCENT:.0f} %)",
    )
    memory.set_ylim(0, limit_mb * 1.08)
    memory.set_ylabel("working set (MiB)")
    memory.legend(loc="lower right", fontsize="small")
    kinds = {kind: round(size / MIB) for kind, size in churn.sizes.session.items()}
    memory.set_title(
        f"{len(churn.trace.arrivals)} sessions arriving at {churn.trace.load}x what fits "
        f"(built in-request {kinds['build']} MiB, ramping {kinds['ramp']} MiB)",
        fontsize="medium",
    )
    admitted.set_ylabel("sessions admitted")
    admitted.set_xlabel("seconds into the run")
    admitted.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--load", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES))
    parser.add_argument("--trace", type=Path, help="write the arrival trace to this JSON file")
    parser.add_argument("--replay", type=Path, help="run this recorded trace instead")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="draw the runs into this file")
    args = parser.parse_args()
    requested = args.modes.split(",")
    modes = tuple(mode for mode in MODES if mode in requested)
    unknown = [m for m in requested if m not in MODES]
    if unknown:
        parser.error(f"--modes: {', '.join(unknown)} is not one of {', '.join(MODES)}.")
    try:
        trace = (
            Trace.load_file(args.replay)
            if args.replay
            else make_trace(minutes=args.minutes, load=args.load, seed=args.seed)
        )
    except ValueError as exc:
        parser.error(str(exc))
    if not available():
        print("needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
        return 2
    if args.trace:
        trace.save(args.trace)
    churn = run_churn(trace, modes=modes)
    summary = churn.summary()
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    print(table(churn))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    if args.plot:
        plot(churn, args.plot)
        print(f"plotted to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
