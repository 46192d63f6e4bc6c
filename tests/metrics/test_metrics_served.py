"""The demo under uvicorn with two workers in multiprocess mode, scraped by a real Prometheus."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from metricskit import STARTING, free_port
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from kits.pollkit import wait_for
from kits.processkit import stop_process_group
from kits.suitekit import MIB

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

LIMIT = 1000 * MIB


class Demo:
    """The demo service, its fake cgroup and its multiprocess directory."""

    def __init__(self, url: str, cgroup: Path, multiproc: Path) -> None:
        self.url = url
        self.cgroup = cgroup
        self.multiproc = multiproc
        self.admitted = 0
        self.refused = 0
        self.last = ""

    def set_used(self, used: int) -> None:
        (self.cgroup / "memory.current").write_text(f"{used}\n")

    def open_session(self) -> int:
        # A fresh connection each time, so the kernel may hand it to either worker.
        response = httpx.post(f"{self.url}/sessions", headers={"connection": "close"})
        status = response.status_code
        self.last = response.text
        if status == 201:
            self.admitted += 1
        else:
            self.refused += 1
        return status

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(f"{self.url}/metrics").text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def admitted_by_worker(self) -> dict[str, float]:
        """Admitted HTTP decisions each worker wrote to its own counter file."""
        totals: dict[str, float] = {}
        for path in glob.glob(str(self.multiproc / "counter_*.db")):
            pid = Path(path).stem.split("_")[1]
            for family in MultiProcessCollector.merge([path]):  # type: ignore[no-untyped-call]
                for s in family.samples:
                    if s.name == "asgi_admission_decisions_total" and s.labels == {
                        "kind": "http",
                        "outcome": "admitted",
                        "reason": "none",
                    }:
                        totals[pid] = s.value
        return totals


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    root = tmp_path_factory.mktemp("served")
    cgroup, multiproc = root / "cgroup", root / "multiproc"
    cgroup.mkdir()
    multiproc.mkdir()
    (cgroup / "memory.max").write_text(f"{LIMIT}\n")
    (cgroup / "memory.stat").write_text("inactive_file 0\nactive_file 0\n")
    (cgroup / "memory.pressure").write_text(
        "some avg10=1.50 avg60=0.00 avg300=0.00 total=0\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    port = free_port()
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
        "ADMISSION_CGROUP_ROOT": str(cgroup),
        "ADMISSION_MAX_SESSIONS": "100000",
        # Small: the first test opens sessions until both workers have admitted one, and
        # each stays pending (nothing ever shows its memory); with 10 MiB, 70 pending
        # reach the ceiling, which one worker taking connection after connection on a
        # busy machine can do first.
        "ADMISSION_SESSION_RESERVE_MB": "1",
        # The tests move the fixture's memory by hundreds of MiB right after sessions
        # open: learning would take that for what the sessions cost (it is not what
        # these tests are about), and on a slow machine it does.
        "ADMISSION_SESSION_RESERVE_LEARNING": "off",
        "DEMO_SESSION_MB": "0",
    }
    env.pop("ADMISSION_METRICS_PORT", None)
    server = Demo(f"http://127.0.0.1:{port}", cgroup, multiproc)
    server.set_used(100 * MIB)
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "asgi_admission.demo:create_app", "--factory"),
            *("--workers", "2", "--host", "127.0.0.1", "--port", str(port)),
            *("--log-level", "warning"),
        ],
        env=env,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: httpx.get(f"{server.url}/health").status_code == 200,
            30,
            "the demo to start",
            step=0.1,
            tolerate=STARTING,
        )
        # Both workers have built their guard once each holds a counter file.
        wait_for(
            lambda: len(glob.glob(str(multiproc / "counter_*.db"))) == 2,
            30,
            "2 workers",
            step=0.1,
            tolerate=STARTING,
        )
        yield server
    finally:
        stop_process_group(process)


def test_two_workers_add_up_in_one_scrape(demo: Demo) -> None:
    """Admitted and refused decisions of both workers are summed; memory is read once."""
    demo.set_used(100 * MIB)

    def both_workers_admitted() -> bool:
        assert demo.open_session() == 201
        by_worker = demo.admitted_by_worker()
        return len(by_worker) == 2 and all(by_worker.values())

    wait_for(
        both_workers_admitted, 30, "each worker to admit a session", step=0.1, tolerate=STARTING
    )
    demo.set_used(900 * MIB)
    for _ in range(6):
        assert demo.open_session() == 503

    def settled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        # Each worker republishes its live session counts when they change (a session
        # settling after its response is one such change): a scrape can come first.
        samples = demo.scrape()
        active = samples.get(("asgi_admission_sessions", (("state", "active"),)))
        return samples if active == demo.admitted else None

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = wait_for(
        settled,
        10,
        "both workers' live session counts to be published",
        step=0.1,
        tolerate=STARTING,
    )

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    admitted = value(
        "asgi_admission_decisions_total", kind="http", outcome="admitted", reason="none"
    )
    assert admitted == demo.admitted == sum(demo.admitted_by_worker().values())
    refused = value(
        "asgi_admission_decisions_total", kind="http", outcome="rejected", reason="memory_pressure"
    )
    assert refused == demo.refused == 6
    assert value("asgi_admission_decision_duration_seconds_count") == demo.admitted + 6
    # Each worker's latch set once it saw the pressure (one or two transitions in all).
    assert value("asgi_admission_latch_transitions_total", to="pressured") in (1.0, 2.0)
    # Sessions are per worker and summed live; the sessions the demo holds are all open.
    assert value("asgi_admission_sessions", state="active") == demo.admitted
    assert value("asgi_admission_sessions", state="pending") == 0
    # The container is read once, not summed per worker.
    assert value("asgi_admission_memory_working_set_bytes") == 900 * MIB
    assert value("asgi_admission_memory_limit_bytes") == LIMIT
    assert value("asgi_admission_memory_pressure_stall_ratio") == pytest.approx(0.015)
    assert value("asgi_admission_state", state="pressured") in (0.0, 1.0)
    assert value("asgi_admission_session_limit") == 100000


def test_real_prometheus_scrapes_the_demo(demo: Demo, prometheus: str, tmp_path: Path) -> None:
    """A real Prometheus scrapes the demo and its API returns the ratio and the decisions."""
    demo.set_used(100 * MIB)
    # The latch of each worker clears on its next decision below resume.
    deadline = time.monotonic() + 30
    while demo.open_session() != 201:
        assert time.monotonic() < deadline, f"no session admitted in 30 s; last: {demo.last}"
    demo.set_used(950 * MIB)
    demo.open_session()
    port = free_port()
    target = demo.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: demo\n    static_configs:\n"
        f"      - targets: ['{target}']\n"
    )
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    api = f"http://127.0.0.1:{port}/api/v1/query"

    def query(expr: str) -> list[dict[str, Any]]:
        body = httpx.get(api, params={"query": expr}).json()
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    try:
        ratio = wait_for(
            lambda: query('asgi_admission_memory_usage_ratio{job="demo"}'),
            30,
            "the ratio",
            step=0.1,
            tolerate=STARTING,
        )
        assert float(ratio[0]["value"][1]) == pytest.approx(0.95)
        refused = wait_for(
            lambda: query(
                'asgi_admission_decisions_total{job="demo",kind="http",'
                'outcome="rejected",reason="memory_pressure"} > 0'
            ),
            30,
            "refused decisions",
            step=0.1,
            tolerate=STARTING,
        )
        assert refused[0]["metric"]["instance"] == target
        admitted = query(
            'asgi_admission_decisions_total{kind="http",outcome="admitted",reason="none"}'
        )
        assert float(admitted[0]["value"][1]) == demo.admitted
        series = query("count by (kind, outcome, reason) (asgi_admission_decisions_total)")
        assert len(series) == 20  # every reachable combination (2 kinds x 10), pre-initialised
    finally:
        stop_process_group(process)
