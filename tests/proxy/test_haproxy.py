"""Debian's HAProxy in front of three real uvicorn replicas, each in its own memory group
(224, 320 and 416 MiB), their agent checks on: sessions go where they fit.

With ``balance leastconn`` and ``agent-check`` each replica's weight is its capacity in
sessions; a replica with none drains, its open WebSockets living on; an agent that
dies leaves HAProxy on its last weight, and the 503 retry still saves the session.
The same burst round robin, with the same retry, costs more refused attempts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from haproxykit import (
    AGENT_INTER_MS,
    BALANCES,
    Balance,
    Burst,
    Relay,
    Replica,
    haproxy,
    haproxy_binary,
    replicas,
    settle,
)

pytestmark = [pytest.mark.real_cgroup, pytest.mark.real_server, pytest.mark.slow]

#: Between two sessions of a burst: a little more than two agent intervals.
PACE_S = 2.5 * AGENT_INTER_MS / 1000

Fleet = tuple[list[Replica], list[int]]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The three replicas, and the capacity each agent says while they are empty."""
    haproxy_binary()
    with replicas(tmp_path_factory.mktemp("replicas")) as started:
        capacities = [replica.admissible() for replica in started]
        yield started, capacities
        assert [replica.oom_kills() for replica in started] == [0, 0, 0]


def test_empty_replicas_say_their_capacity_in_sessions(fleet: Fleet) -> None:
    """Each agent says ``ready N%`` with N its admissible sessions, larger groups more."""
    _, capacities = fleet
    assert all(capacity >= 2 for capacity in capacities), capacities
    assert capacities == sorted(capacities), capacities
    assert capacities[0] < capacities[2], capacities


def test_a_burst_spreads_by_capacity_and_no_client_is_refused_while_one_has_capacity(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A burst of three more sessions than the three have capacity for lands in proportion
    to each one's capacity; a client sees a 503 (with a Retry-After) only once every replica
    drains, and no process is OOM-killed."""
    pods, capacities = fleet
    before = [pod.refused() for pod in pods]
    burst = Burst(pods)

    async def scenario() -> tuple[list[int], list[int]]:
        with haproxy(tmp_path, pods, balance="agent") as proxy:
            await burst.open(proxy.url, sum(capacities) + 3, pace_s=PACE_S)
            shares = [pod.sessions() for pod in pods]
            refused = [pod.refused() - old for pod, old in zip(pods, before, strict=True)]
            assert await burst.echo()
            await burst.close()
        return shares, refused

    shares, refused = asyncio.run(scenario())
    print(
        f"leastconn + agent-check: capacities {capacities}, shares {shares}, "
        f"refused attempts {refused}"
    )
    assert burst.refusals, "every session fitted: the burst never filled the replicas"
    assert all(said == ["drain\n"] * 3 for said in burst.refusals), burst.refusals
    assert None not in burst.retry_afters  # HAProxy's own 503 says when to come back
    assert all(
        abs(share - capacity) <= 1 for share, capacity in zip(shares, capacities, strict=True)
    ), (
        shares,
        capacities,
    )
    assert [pod.oom_kills() for pod in pods] == [0, 0, 0]
    settle(pods, capacities)


def test_a_full_replica_drains_keeps_its_websockets_and_comes_back(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A replica filled first drains within about two agent intervals: it receives no
    new session and its open WebSockets live on; once they end it gets sessions again."""
    pods, capacities = fleet
    full, others = pods[0], pods[1:]
    direct, burst, again = Burst(pods), Burst(pods), Burst(pods)

    async def scenario() -> float:
        with haproxy(tmp_path, pods, balance="agent") as proxy:
            assert await direct.fill(full) >= capacities[0] - 1
            drained_in = proxy.wait_for(full.name, "DRAIN")
            refused, taken = full.refused(), full.sessions()
            await burst.open(proxy.url, sum(capacities[1:]) - 2, pace_s=PACE_S)
            assert burst.refusals == []
            assert full.sessions() == taken
            assert full.refused() == refused  # HAProxy never sent it one
            assert sum(pod.sessions() for pod in others) == sum(capacities[1:]) - 2
            assert await direct.echo()

            await direct.close()
            proxy.wait_for(full.name, "UP")
            await again.open(proxy.url, 2, pace_s=PACE_S)
            assert again.refusals == []
            assert full.sessions() >= 1
            for opened in (burst, again):
                await opened.close()
        return drained_in

    drained_in = asyncio.run(scenario())
    print(f"{full.name} drained {drained_in:.2f} s after it refused")
    assert drained_in < 1.0
    settle(pods, capacities)


def test_a_dead_agent_leaves_the_last_weight_and_the_retry_saves_the_session(
    fleet: Fleet, tmp_path: Path
) -> None:
    """With one replica's agent gone HAProxy keeps its last weight; that replica, full
    meanwhile, refuses what HAProxy still sends it, and the 503 retry takes each such
    session to another replica: no client sees a 503."""
    pods, capacities = fleet
    blind = pods[2]
    relay = Relay(blind.agent_port)
    agents = [pods[0].agent_port, pods[1].agent_port, relay.port]
    direct, burst = Burst(pods), Burst(pods)

    async def scenario() -> None:
        with haproxy(tmp_path, pods, balance="agent", agents=agents) as proxy:
            weight = proxy.servers()[blind.name]["weight"]
            assert weight == str(capacities[2])
            relay.kill()
            await direct.fill(blind)
            await asyncio.sleep(5 * AGENT_INTER_MS / 1000)
            row = proxy.servers()[blind.name]
            assert (row["status"], row["weight"]) == ("UP", weight)
            refused, taken = blind.refused(), blind.sessions()
            await burst.open(proxy.url, 3, pace_s=PACE_S)
            assert burst.refusals == []
            assert blind.refused() > refused  # it was sent sessions, and refused them
            assert blind.sessions() == taken
            assert sum(pod.sessions() for pod in pods[:2]) == 3
            for opened in (direct, burst):
                await opened.close()

    try:
        asyncio.run(scenario())
    finally:
        relay.kill()
    settle(pods, capacities)


def test_round_robin_with_the_retry_costs_more_refused_attempts(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The same burst round robin, with the same 503 retry: clients still see a 503 only
    once every replica is full, but the replicas refuse more attempts than with the agent
    checks (the figures docs/containers.md compares)."""
    pods, capacities = fleet
    figures: dict[str, tuple[int, int, int]] = {}

    async def one(balance: Balance) -> Burst:
        before = sum(pod.refused() for pod in pods)
        burst = Burst(pods)
        with haproxy(tmp_path, pods, balance=balance) as proxy:
            await burst.open(proxy.url, sum(capacities) + 3, pace_s=PACE_S)
            refused = sum(pod.refused() for pod in pods) - before
            figures[balance] = (len(burst.sockets), len(burst.refusals), refused)
            await burst.close()
        return burst

    for balance in BALANCES:
        burst = asyncio.run(one(balance))
        assert all(said == ["drain\n"] * 3 for said in burst.refusals), burst.refusals
        assert None not in burst.retry_afters
        settle(pods, capacities)
    for name, (admitted, clients, refused) in figures.items():
        print(
            f"{name}: {sum(capacities) + 3} sessions, {admitted} admitted, {clients} refused "
            f"to the client, {refused} refused attempts"
        )
    assert figures["agent"][2] < figures["roundrobin"][2], figures
