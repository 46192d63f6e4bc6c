"""Three replicas behind Debian's nginx, configured as the chart README tells ingress-nginx
users, and a real Prometheus evaluating the chart's autoscaling queries (KEDA's, and the
HPA's prometheus-adapter rules of the chart README, on memory and on session fullness).

With ``proxy_next_upstream ... http_503 non_idempotent`` a refused session request is
tried on the next replica, so clients see 503 only once every replica is full; without
it, a client is refused by a full replica while others have room. No OOM kill anywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from replicakit import (
    Wanted,
    autoscaling,
    empty,
    fill,
    nginx,
    oom_kills,
    prometheus,
    refuses,
    sequential,
    sessions_of,
    three_replicas,
    wait_for_scrape,
    wanted_replicas,
)

from kits.pollkit import wait_for

pytestmark = [pytest.mark.container, pytest.mark.usefixtures("podman_ready")]

BURST = 24


def first_refusal(statuses: list[int]) -> int:
    assert 503 in statuses, f"{BURST} sessions fitted in three replicas: {statuses}"
    return statuses.index(503)


def test_retries_through_nginx_refuse_only_when_all_replicas_are_full(
    image: str, tmp_path: Path
) -> None:
    """One replica pre-filled; a sequential burst through nginx: 201s, then only 503s."""
    scaling = autoscaling()
    with three_replicas(tmp_path) as pods:
        targets = dict(zip(scaling.pod_names(3), (pod.port for pod in pods), strict=True))
        with prometheus(tmp_path, targets=targets) as prom:
            wait_for_scrape(prom, "up", lambda values: values == [1.0, 1.0, 1.0])
            idle = wanted_replicas(prom, scaling, current=3)

            # With retries: a full replica passes the request on to one with room.
            assert fill(pods[0]) >= 1
            with nginx(tmp_path, upstreams=[p.port for p in pods], retries=True) as proxy:
                responses = sequential(proxy, BURST)
            statuses = [r.status_code for r in responses]
            first = first_refusal(statuses)
            assert set(statuses[:first]) == {201}
            assert set(statuses[first:]) == {503}, statuses
            assert all(r.headers.get("retry-after") for r in responses[first:])
            # Each replica, asked directly, is full: the clients saw 503 only then.
            assert all(refuses(pod) for pod in pods)
            assert all(sessions_of(pod) for pod in pods[1:])

            wait_for_scrape(
                prom,
                scaling.keda_query,
                lambda values: values and values[0] >= sum(len(sessions_of(p)) for p in pods),
            )
            full = wanted_replicas(prom, scaling, current=3)
            assert full.keda > 3, full
            assert full.hpa > 3, full
            assert full.hpa_admissible > 3, full

            # Without retries: the full replica's 503 reaches the client while others
            # still have room (a later request is admitted).
            empty(pods)
            assert fill(pods[0]) >= 1
            with nginx(tmp_path, upstreams=[p.port for p in pods], retries=False) as proxy:
                plain = [r.status_code for r in sequential(proxy, BURST)]
            first = first_refusal(plain)
            assert 201 in plain[first:], plain

            empty(pods)
            wait_for_scrape(prom, scaling.keda_query, lambda values: values == [0.0])

            # The session count is 0 at the first scrape after the sessions close; a pod's
            # fullness falls only once its latch lets go, which that scrape may predate.
            def scaled_down() -> Wanted | None:
                wanted = wanted_replicas(prom, scaling, current=3)
                return wanted if wanted.hpa_admissible < 3 else None

            after = wait_for(
                scaled_down, 30, "fullness to fall after the sessions closed", step=0.5
            )
            assert after.keda < 3, after
            assert after.hpa < 3, after
            assert after.hpa_admissible < 3, after
            assert idle.keda < 3
            assert idle.hpa_admissible < 3, idle
        assert oom_kills(pods) == 0
