"""Three replicas of the chart's Deployment behind Debian's nginx, scraped by Prometheus.

Used by tests/container/test_replicas.py and bench/replicas.py. Each replica is its own
pod (``podman kube play``, 512 MiB limit each); nginx is configured as the chart README
tells ingress-nginx users, with or without the retry of refused session requests; a
real Prometheus scrapes the three and evaluates the chart's autoscaling queries.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from chartplay import RELEASE, PlayedPod, one, played, render
from containerkit import TAG, container_memory, free_port, wait_http

from kits.adapterkit import AdapterRule, hpa_wanted, quantity, readme_rules
from kits.processkit import stop_process_group

SESSION_MB = 64
VALUES: dict[str, Any] = {
    "image": {"repository": "localhost/asgi-admission-demo", "tag": TAG},
    "resources": {"limits": {"memory": "512Mi"}, "requests": {"memory": "256Mi"}},
    "admission": {"sessionReserveMB": SESSION_MB, "maxSessions": 64, "retryAfterSeconds": 1},
    "extraEnv": [{"name": "DEMO_SESSION_MB", "value": str(SESSION_MB)}],
    # About five 64 MiB sessions fit in one replica: ask for a pod per four sessions.
    "autoscaling": {"keda": {"enabled": True, "threshold": "4", "minReplicaCount": 1}},
}
# With http_503 listed, a 503 counts as a failed attempt: max_fails=0 (on each server)
# keeps a replica that refused in the rotation instead of leaving it out for fail_timeout.
RETRY = "proxy_next_upstream error timeout http_503 non_idempotent;\n"
RETRY_TRIES = "proxy_next_upstream_tries 3;\n"


def nginx_conf(prefix: Path, *, port: int, upstreams: list[int], retries: bool) -> str:
    servers = "".join(f"        server 127.0.0.1:{p} max_fails=0;\n" for p in upstreams)
    retry = (RETRY + RETRY_TRIES) if retries else ""
    return f"""\
user root;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    upstream replicas {{
{servers}    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replicas;
            {retry}
        }}
    }}
}}
"""


@contextlib.contextmanager
def nginx(workdir: Path, *, upstreams: list[int], retries: bool) -> Iterator[str]:
    """Debian's nginx on 127.0.0.1 in front of ``upstreams``; yields its URL."""
    prefix = workdir / ("nginx-retry" if retries else "nginx-plain")
    prefix.mkdir()
    port = free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(nginx_conf(prefix, port=port, upstreams=upstreams, retries=retries))
    proc = subprocess.Popen(
        ["nginx", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", alive=lambda: proc.poll() is None)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process_group(proc)


@dataclass(frozen=True, slots=True)
class HpaMetric:
    """One way the chart's HPA can scale: the README's prometheus-adapter rule serving
    its pods metric, and the target average the chart renders for it."""

    rule: AdapterRule
    target: float


@dataclass(frozen=True, slots=True)
class Autoscaling:
    """The chart's autoscaling targets: KEDA's query and threshold, the HPA's metrics by
    ``autoscaling.hpa.scaleOn``."""

    keda_query: str
    keda_threshold: float
    hpa: dict[str, HpaMetric]
    fullname: str

    def pod_names(self, count: int) -> list[str]:
        """Pod names as a Deployment's ReplicaSet gives them, which the queries select."""
        return [f"{self.fullname}-5d8f7c9b4-r{i}" for i in range(count)]


def autoscaling() -> Autoscaling:
    scaled_object = one(render(VALUES), "ScaledObject")
    keda = scaled_object["spec"]["triggers"][0]["metadata"]
    rules = readme_rules()
    hpa = {}
    for scale_on in ("memory", "admissible"):
        values = {**VALUES, "autoscaling": {"hpa": {"enabled": True, "scaleOn": scale_on}}}
        pods = one(render(values), "HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]
        hpa[scale_on] = HpaMetric(
            rule=rules[pods["metric"]["name"]], target=quantity(pods["target"]["averageValue"])
        )
    return Autoscaling(
        keda_query=keda["query"],
        keda_threshold=float(keda["threshold"]),
        hpa=hpa,
        fullname=scaled_object["metadata"]["name"],
    )


@contextlib.contextmanager
def prometheus(workdir: Path, *, targets: dict[str, int]) -> Iterator[str]:
    """A real Prometheus scraping each ``{pod name: port}`` every second; yields its URL."""
    port = free_port()
    config = workdir / "prometheus.yml"
    static = "".join(
        f"""      - targets: ["127.0.0.1:{p}"]
        labels: {{namespace: "default", pod: "{pod}"}}
"""
        for pod, p in targets.items()
    )
    config.write_text(
        f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: asgi-admission
    static_configs:
{static}"""
    )
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/-/ready", alive=lambda: proc.poll() is None)
        yield url
    finally:
        stop_process_group(proc)


def query(url: str, promql: str) -> list[tuple[dict[str, str], float]]:
    """An instant query's vector: each series' labels and value."""
    answer = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert answer["status"] == "success", answer
    return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]


@dataclass(frozen=True, slots=True)
class Wanted:
    """Replicas each autoscaler would ask for, from Prometheus, and what it saw."""

    keda: int
    hpa: int
    hpa_admissible: int
    sessions: float
    ratios: tuple[float, ...]
    fullness: tuple[float, ...]


def wanted_replicas(url: str, scaling: Autoscaling, *, current: int) -> Wanted:
    """KEDA: ceil(query / threshold). The HPA, on each of its metrics: ceil(sum of the
    per-pod values / target), the values being what the chart README's prometheus-adapter
    rule serves for the ``current`` pods, evaluated by this Prometheus."""
    (sessions,) = [value for _, value in query(url, scaling.keda_query)] or [0.0]
    pods = scaling.pod_names(current)
    served = {
        scale_on: tuple(
            value for _, value in query(url, metric.rule.query(namespace="default", pods=pods))
        )
        for scale_on, metric in scaling.hpa.items()
    }
    return Wanted(
        keda=math.ceil(sessions / scaling.keda_threshold),
        hpa=hpa_wanted(served["memory"], target=scaling.hpa["memory"].target),
        hpa_admissible=hpa_wanted(served["admissible"], target=scaling.hpa["admissible"].target),
        sessions=sessions,
        ratios=served["memory"],
        fullness=served["admissible"],
    )


def wait_for_scrape(
    url: str, promql: str, predicate: Callable[[list[float]], object], *, timeout: float = 30
) -> None:
    """Waits until ``predicate(values)`` holds for the query's values (scrapes are 1 s)."""
    deadline = time.monotonic() + timeout
    values: list[float] = []
    while time.monotonic() < deadline:
        values = [value for _, value in query(url, promql)]
        if predicate(values):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{promql} never satisfied the condition; last values {values}")


@contextlib.contextmanager
def three_replicas(workdir: Path) -> Iterator[list[PlayedPod]]:
    """Three pods of the chart's Deployment, each with its own 512 MiB limit."""
    deployment = one(render(VALUES), "Deployment")
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(played(deployment, name=f"{RELEASE}-r{i}", workdir=workdir))
            for i in range(3)
        ]


def fill(pod: PlayedPod) -> int:
    """Opens sessions directly on one replica until it refuses; returns how many it took."""
    for opened in range(64):
        status = httpx.post(f"{pod.url}/sessions", timeout=30).status_code
        if status == 503:
            return opened
        assert status == 201, status
    raise AssertionError("64 sessions of 64 MiB fitted in one 512 MiB replica")


def sessions_of(pod: PlayedPod) -> list[str]:
    ids: list[str] = httpx.get(f"{pod.url}/sessions", timeout=10).json()["sessions"]
    return ids


def empty(pods: list[PlayedPod], *, timeout: float = 30) -> None:
    """Closes every session on every replica and waits until each is ready again."""
    for pod in pods:
        for session_id in sessions_of(pod):
            httpx.delete(f"{pod.url}/sessions/{session_id}", timeout=10)
    deadline = time.monotonic() + timeout
    for pod in pods:
        while httpx.get(pod.probe_url("readinessProbe"), timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pod.pod} stayed latched after its sessions closed")
            time.sleep(0.2)


def refuses(pod: PlayedPod) -> bool:
    """Whether the replica, asked directly, refuses a new session (a 201 is closed again)."""
    response = httpx.post(f"{pod.url}/sessions", timeout=30)
    if response.status_code == 201:
        httpx.delete(f"{pod.url}/sessions/{response.json()['id']}", timeout=10)
        return False
    return response.status_code == 503


def oom_kills(pods: list[PlayedPod]) -> int:
    return sum(container_memory(pod.container).oom_kills for pod in pods)


def sequential(url: str, count: int) -> list[httpx.Response]:
    """``count`` session openings through ``url``, one after the other."""
    with httpx.Client(timeout=30) as client:
        return [client.post(f"{url}/sessions") for _ in range(count)]
