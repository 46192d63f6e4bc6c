"""A first burst of sessions of unknown cost, in a real memory group: probed, not guessed.

    sudo .venv/bin/python bench/probe_burst.py [--cases default,small] [--sessions 24]
        [--ramp-s 2] [--probe-sessions 1]

Needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory.
Serves the demo under uvicorn inside a fresh memory group (no swap) with learning
at its default (``raise``) and nothing learned yet, and fires one burst of
``--sessions`` concurrent ``POST /processes?hold_mb=&ramp_s=``: each answers
``201`` as soon as its child process is spawned, and the child's memory arrives
over ``--ramp-s`` seconds after that. No warm-up, and no client tries again.
Cases:

- ``default``: no reserve configured (an eighth of a 512 MiB limit: 64 MiB) and
  sessions of about twice that (128 MiB);
- ``small``: a reserve 12x too small for sessions of about 96 MiB, in 768 MiB.

For each it prints the true capacity (what fits under the high watermark above
the baseline), how many were admitted, the kernel's OOM kills, whether the server
lived, whether every refusal was a 503 with ``Retry-After``, the refusal
reasons, and how long each admitted request took (the first is the probe; the
others waited for its evidence). ``--probe-sessions 0`` runs the guard without
probing, trusting the reserve as before. tests/middleware/test_probe_burst.py
runs the same code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Literal, cast

import httpx

import ramp_burst
from benchkit import (
    MIB,
    burst_outcome,
    free_port,
    memory_group,
    oom_kills,
    server_alive,
    stop_process_group,
    working_set_bytes,
)

Case = Literal["default", "small"]
CASES: tuple[Case, ...] = ("default", "small")
#: (limit MiB, MiB each session holds, configured reserve: None = derived, or the
#: footprint divided by this).
SETUP: dict[Case, tuple[int, int, int | None]] = {
    "default": (512, 125, None),
    "small": (768, 92, 12),
}


@dataclass
class ProbeResult:
    case: Case
    probe_sessions: int | None
    limit_mb: int
    reserve_mb: float
    footprint_mb: float
    baseline_mb: float
    capacity: int
    statuses: list[int | str]
    #: Seconds each admitted request took, in the order they answered.
    waits_s: list[float]
    reasons: dict[str, int]
    oom_kills: int
    server_alive: bool
    retry_after_ok: bool
    learned_footprint_mb: float | None = None
    retry_after_s: list[int] = field(default_factory=list)

    @property
    def admitted(self) -> int:
        return self.statuses.count(201)

    @property
    def refused(self) -> int:
        return self.statuses.count(503)

    def summary(self) -> dict[str, object]:
        return {
            "case": self.case,
            "probe_sessions": self.probe_sessions,
            "limit_mb": self.limit_mb,
            "reserve_mb": round(self.reserve_mb, 1),
            "footprint_mb": round(self.footprint_mb, 1),
            "baseline_mb": self.baseline_mb,
            "capacity": self.capacity,
            "admitted": self.admitted,
            "refused_503": self.refused,
            "failed": len(self.statuses) - self.admitted - self.refused,
            "reasons": self.reasons,
            "retry_after_s": sorted(set(self.retry_after_s)),
            "admitted_waits_s": [round(w, 2) for w in self.waits_s],
            "oom_kills": self.oom_kills,
            "server_alive": self.server_alive,
            "retry_after_ok": self.retry_after_ok,
            "learned_footprint_mb": self.learned_footprint_mb,
        }


async def _burst(
    base_url: str, n: int, params: dict[str, int | float]
) -> list[tuple[httpx.Response | str, float]]:
    """``n`` concurrent session requests, each with the seconds it took."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:

        async def one(i: int) -> tuple[httpx.Response | str, float]:
            await asyncio.sleep(i * 0.005)
            start = time.monotonic()
            try:
                response: httpx.Response | str = await client.post("/processes", params=params)
            except httpx.HTTPError as exc:
                response = type(exc).__name__
            return response, time.monotonic() - start

        return await asyncio.gather(*(one(i) for i in range(n)))


def run_probe_burst(
    case: Case,
    *,
    sessions: int = 24,
    ramp_s: float = 2.0,
    probe_sessions: int | None = None,
    footprint: int | None = None,
    workers: int = 1,
) -> ProbeResult:
    """Serve the demo in a fresh memory group for ``case``, fire the first burst, report.

    ``probe_sessions`` sets ``ADMISSION_PROBE_SESSIONS`` (``None``: the default); with
    several ``workers`` they share a temporary ``ADMISSION_SHARED_DIR``.
    """
    limit_mb, hold_mb, too_small = SETUP[case]
    footprint = footprint if footprint is not None else ramp_burst.session_footprint(hold_mb)
    footprint_mb = footprint / MIB
    reserve_mb: float = limit_mb / 8
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with (
        memory_group(limit_mb, f"probe_{case}") as group,
        tempfile.TemporaryFile() as log,
        tempfile.TemporaryDirectory() as tmp,
    ):
        env = {
            **os.environ,
            "ADMISSION_CGROUP_ROOT": str(group),
            "ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT": str(ramp_burst.HIGH_WATERMARK),
            "ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT": str(ramp_burst.RESUME),
            "ADMISSION_MAX_SESSIONS": "1000",
        }
        for name in ("ADMISSION_SESSION_RESERVE_MB", "ADMISSION_SESSION_RESERVE_LEARNING"):
            env.pop(name, None)
        if too_small is not None:
            reserve_mb = max(1, round(footprint_mb / too_small))
            env["ADMISSION_SESSION_RESERVE_MB"] = str(int(reserve_mb))
        if workers > 1:
            env["ADMISSION_SHARED_DIR"] = os.path.join(tmp, "shared")
        if probe_sessions is not None:
            env["ADMISSION_PROBE_SESSIONS"] = str(probe_sessions)
        else:
            env.pop("ADMISSION_PROBE_SESSIONS", None)
        proc = subprocess.Popen(
            ramp_burst._serve_argv(group, port, workers, True),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            ramp_burst._wait_ready(base_url, proc, workers)
            time.sleep(0.5)
            baseline = working_set_bytes(group)
            ceiling = limit_mb * MIB * ramp_burst.HIGH_WATERMARK / 100
            capacity = max(0, math.floor((ceiling - baseline) / footprint))
            answered = asyncio.run(
                _burst(base_url, sessions, {"hold_mb": hold_mb, "ramp_s": ramp_s})
            )
            # Every admitted session has built its memory (see bench/ramp_burst.py).
            time.sleep(ramp_s + 2.5)
            responses = [response for response, _ in answered]
            statuses, retry_after_ok = burst_outcome(responses)
            reasons: dict[str, int] = {}
            retry_after: list[int] = []
            for response in responses:
                if not isinstance(response, str) and response.status_code == 503:
                    reason = str(response.json().get("reason"))
                    reasons[reason] = reasons.get(reason, 0) + 1
                    retry_after.append(int(response.headers.get("retry-after", "0")))
            waits = sorted(
                took
                for response, took in answered
                if not isinstance(response, str) and response.status_code == 201
            )
            return ProbeResult(
                case=case,
                probe_sessions=probe_sessions,
                limit_mb=limit_mb,
                reserve_mb=reserve_mb,
                footprint_mb=footprint_mb,
                baseline_mb=round(baseline / MIB, 1),
                capacity=capacity,
                statuses=statuses,
                waits_s=waits,
                reasons=reasons,
                oom_kills=oom_kills(group),
                server_alive=server_alive(proc, base_url),
                retry_after_ok=retry_after_ok,
                learned_footprint_mb=ramp_burst._learned_mb(base_url),
                retry_after_s=retry_after,
            )
        finally:
            stop_process_group(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--ramp-s", type=float, default=2.0)
    parser.add_argument("--probe-sessions", type=int, default=None)
    args = parser.parse_args()
    if not ramp_burst.available():
        print("needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
        return 2
    for case in args.cases.split(","):
        if case not in CASES:
            parser.error(f"--cases takes {', '.join(CASES)}; got {case!r}")
        result = run_probe_burst(
            cast(Case, case),
            sessions=args.sessions,
            ramp_s=args.ramp_s,
            probe_sessions=args.probe_sessions,
        )
        print(json.dumps(result.summary()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
