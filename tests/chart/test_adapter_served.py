"""The README's session-fullness rule evaluated by a real Prometheus on real scraped series.

Three demo servers under uvicorn on 127.0.0.1 stand for three pods, each reading its own
stand-in cgroup directory (memory figures the test sets) and holding at most four
sessions; a real Prometheus scrapes them with the ``namespace`` and ``pod`` labels a
Kubernetes scrape adds. The chart's HPA metric with ``scaleOn: admissible`` is the
prometheus-adapter rule of the chart README, filled as the adapter fills it; the HPA's
wanted replicas follow from its values and the chart's target.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from chartlib import one, render, require_tool

from kits.adapterkit import hpa_wanted, quantity, readme_rules
from kits.pollkit import wait_for
from kits.processkit import free_port, stop_process_group
from kits.suitekit import MIB

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

LIMIT_MB = 1000
MAX_SESSIONS = 4
NAMESPACE = "shop"
#: What a server still starting answers with while the test waits for it.
REFUSED = (httpx.HTTPError,)


@dataclass(frozen=True, slots=True)
class Pod:
    """One demo server standing for a pod: its name, URL and stand-in cgroup directory."""

    name: str
    url: str
    cgroup: Path

    def set_used_mb(self, used_mb: int) -> None:
        (self.cgroup / "memory.current").write_text(f"{used_mb * MIB}\n")

    def open_session(self) -> int:
        return httpx.post(f"{self.url}/sessions", timeout=10).status_code

    def exported(self) -> dict[str, float]:
        """The pod's admissible sessions and sessions in use, from its own /metrics."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        found = {"admissible": 0.0, "in_use": 0.0}
        for line in text.splitlines():
            if line.startswith("asgi_admission_admissible_sessions "):
                found["admissible"] = float(line.split()[-1])
            elif line.startswith("asgi_admission_sessions{"):
                found["in_use"] += float(line.split()[-1])
        return found


@contextlib.contextmanager
def demo_pods(root: Path, names: list[str]) -> Iterator[list[Pod]]:
    """One single-worker demo per name, each with its own stand-in cgroup at 100 MiB used."""
    pods: list[Pod] = []
    with contextlib.ExitStack() as stack:
        for name in names:
            cgroup = root / name
            cgroup.mkdir()
            (cgroup / "memory.max").write_text(f"{LIMIT_MB * MIB}\n")
            (cgroup / "memory.stat").write_text("inactive_file 0\nactive_file 0\n")
            port = free_port()
            env = {
                **os.environ,
                "ADMISSION_CGROUP_ROOT": str(cgroup),
                "ADMISSION_MAX_SESSIONS": str(MAX_SESSIONS),
                "ADMISSION_SESSION_RESERVE_MB": "10",
                "ADMISSION_SESSION_RESERVE_LEARNING": "off",
                # The demo's sessions allocate nothing here: count them active at once
                # rather than pending until memory that never comes.
                "ADMISSION_PENDING_TIMEOUT_SECONDS": "1e-9",
                "DEMO_SESSION_MB": "0",
            }
            for variable in ("ADMISSION_METRICS_PORT", "PROMETHEUS_MULTIPROC_DIR"):
                env.pop(variable, None)
            pod = Pod(name, f"http://127.0.0.1:{port}", cgroup)
            pod.set_used_mb(100)
            process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "uvicorn", "asgi_admission.demo:create_app"),
                    *("--factory", "--host", "127.0.0.1", "--port", str(port)),
                    *("--log-level", "warning"),
                ],
                env=env,
                start_new_session=True,
            )
            stack.callback(stop_process_group, process)
            pods.append(pod)
        for pod in pods:

            def started(pod: Pod = pod) -> bool:
                return httpx.get(f"{pod.url}/health").status_code == 200

            wait_for(started, 30, f"the demo {pod.name} to start", step=0.2, tolerate=REFUSED)
        yield pods


@contextlib.contextmanager
def prometheus(binary: str, root: Path, pods: list[Pod]) -> Iterator[str]:
    """A real Prometheus scraping each pod every second, labelled as Kubernetes would."""
    port = free_port()
    static = "".join(
        f'      - targets: ["{pod.url.removeprefix("http://")}"]\n'
        f'        labels: {{namespace: "{NAMESPACE}", pod: "{pod.name}"}}\n'
        for pod in pods
    )
    config = root / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: pods\n    static_configs:\n{static}"
    )
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: httpx.get(f"{url}/-/ready").status_code == 200,
            30,
            "Prometheus",
            step=0.2,
            tolerate=REFUSED,
        )
        yield url
    finally:
        stop_process_group(process)


def per_pod(url: str, promql: str) -> dict[str, float]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert answer["status"] == "success", answer
    return {r["metric"]["pod"]: float(r["value"][1]) for r in answer["data"]["result"]}


def wait_for_values(url: str, promql: str, expected: dict[str, float]) -> None:
    """Waits until the query's value per pod is ``expected`` (scrapes are 1 s apart)."""
    served: dict[str, float] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        served = per_pod(url, promql)
        if served == pytest.approx(expected):
            return
        time.sleep(0.2)
    pytest.fail(f"{promql} served {served}, never {expected}")


def fullness(exported: dict[str, float]) -> float:
    """The documented formula: 1 - admissible / max(in use + admissible, 1)."""
    return 1 - exported["admissible"] / max(exported["in_use"] + exported["admissible"], 1)


def test_fullness_rule_on_scraped_demos_drives_the_hpa(helm: str, tmp_path: Path) -> None:
    """Idle pods are 0 full and the HPA wants fewer than 3; a pod at its session limit and a
    latched pod holding no session are 1, a half-used one 0.5, and it wants more than 3."""
    hpa = one(
        render(
            helm,
            "web",
            *("--set", "resources.limits.memory=1Gi", "--set", "autoscaling.hpa.enabled=true"),
            *("--set", "autoscaling.hpa.scaleOn=admissible"),
        ),
        "HorizontalPodAutoscaler",
    )
    metric = hpa["spec"]["metrics"][0]["pods"]
    rule = readme_rules()[metric["metric"]["name"]]
    target = quantity(metric["target"]["averageValue"])
    names = [f"web-asgi-admission-5d8f7c9b4-{suffix}" for suffix in ("a1b2c", "d3e4f", "g5h6i")]
    promql = rule.query(namespace=NAMESPACE, pods=names)

    with (
        demo_pods(tmp_path, names) as pods,
        prometheus(require_tool("prometheus"), tmp_path, pods) as prom,
    ):

        def served_as_exported() -> dict[str, float] | None:
            served = per_pod(prom, promql)
            expected = {pod.name: fullness(pod.exported()) for pod in pods}
            return served if served == pytest.approx(expected) else None

        def until_served_as_exported() -> None:
            wait_for(
                served_as_exported,
                30,
                "the served fullness to match the pods' own figures",
                step=0.2,
                tolerate=REFUSED,
            )

        wait_for_values(prom, promql, dict.fromkeys(names, 0.0))
        until_served_as_exported()
        idle = per_pod(prom, promql)
        assert hpa_wanted(list(idle.values()), target=target) < 3

        # Pod 0 at its session limit, pod 1 at half of it, pod 2 latched with no session.
        assert [pods[0].open_session() for _ in range(MAX_SESSIONS + 1)] == [201] * 4 + [503]
        assert [pods[1].open_session() for _ in range(MAX_SESSIONS // 2)] == [201] * 2
        pods[2].set_used_mb(900)
        assert pods[2].open_session() == 503
        wait_for_values(prom, promql, {names[0]: 1.0, names[1]: 0.5, names[2]: 1.0})
        assert pods[2].exported() == {"admissible": 0.0, "in_use": 0.0}
        until_served_as_exported()
        busy = per_pod(prom, promql)
        assert hpa_wanted(list(busy.values()), target=target) > 3
