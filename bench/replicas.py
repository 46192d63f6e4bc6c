"""Three replicas behind nginx, with and without the retry of refused session requests.

    sudo .venv/bin/python bench/replicas.py [--deadline 60]

Plays three pods of the chart's Deployment (512 MiB each, 64 MiB sessions) with podman,
measures one replica's capacity C by filling it directly, then for each nginx setting
(``proxy_next_upstream error timeout http_503 non_idempotent`` with 3 tries, and
nginx's default ``error timeout``) sends concurrent clients through nginx: 3C with
every replica empty, and 2C with one replica already full (its users stay). A refused
client waits the Retry-After it was given and tries again, up to the deadline.
Reports sessions admitted, 503s the clients saw, OOM kills, the time until every
client had a session, and the sessions admitted at the first try. Needs root, podman
(scripts/setup) and helm; builds the image with scripts/image.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "container"))

from containerkit import build_image, unavailable_reason
from replicakit import empty, fill, nginx, oom_kills, three_replicas


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: str
    mode: str
    clients: int
    admitted: int
    admitted_first_try: int
    client_503s: int
    oom_kills: int
    seconds_to_admit_all: float | None


async def client(url: str, http: httpx.AsyncClient, deadline: float) -> tuple[float | None, int]:
    """Opens one session, honouring Retry-After; (seconds until admitted or None, 503s seen)."""
    start = time.monotonic()
    refused = 0
    while time.monotonic() < deadline:
        response = await http.post(f"{url}/sessions")
        if response.status_code == 201:
            return time.monotonic() - start, refused
        refused += 1
        await asyncio.sleep(float(response.headers.get("retry-after", "1")))
    return None, refused


async def burst(url: str, clients: int, deadline_s: float) -> list[tuple[float | None, int]]:
    deadline = time.monotonic() + deadline_s
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        return await asyncio.gather(*(client(url, http, deadline) for _ in range(clients)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deadline", type=float, default=60, help="seconds per burst (60)")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        print(f"replicas: {reason}", file=sys.stderr)
        return 2
    build_image()
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp, three_replicas(Path(tmp)) as pods:
        capacity = fill(pods[0])
        print(f"one replica's capacity: {capacity} sessions of 64 MiB", file=sys.stderr)
        # Even: all three empty, a burst of 3C. Uneven: one replica already full (its
        # users stay), a burst of the 2C that still fits in the other two.
        scenarios = (
            ("even, burst 3C", False, 3 * capacity),
            ("one full, burst 2C", True, 2 * capacity),
        )
        for scenario, prefill, clients in scenarios:
            for retries in (True, False):
                empty(pods)
                if prefill:
                    fill(pods[0])
                mode = "retry http_503 non_idempotent" if retries else "nginx default"
                workdir = Path(tempfile.mkdtemp(dir=tmp))
                with nginx(workdir, upstreams=[p.port for p in pods], retries=retries) as url:
                    results = asyncio.run(burst(url, clients, args.deadline))
                times = [t for t, _ in results if t is not None]
                all_in = len(times) == len(results)
                outcomes.append(
                    Outcome(
                        scenario=scenario,
                        mode=mode,
                        clients=clients,
                        admitted=len(times),
                        admitted_first_try=sum(n == 0 and t is not None for t, n in results),
                        client_503s=sum(n for _, n in results),
                        oom_kills=oom_kills(pods),
                        seconds_to_admit_all=round(max(times), 2) if all_in else None,
                    )
                )
    print(json.dumps({"capacity": capacity, "outcomes": [asdict(o) for o in outcomes]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
