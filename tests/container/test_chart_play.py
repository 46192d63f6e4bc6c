"""The chart's rendered Deployment played with ``podman kube play`` (see chartplay.py).

Its environment, memory limit, security context, volumes and probes take effect in the
running pod, the readiness endpoint follows the latch, and the chart's ``helm test``
pod passes against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from chartplay import RELEASE, one, played, render, run_helm_test_pod, server
from containerkit import HELM_TEST_IMAGE, LIMIT, TAG, container_memory, podman, sample

pytestmark = [pytest.mark.container, pytest.mark.usefixtures("podman_ready")]

SESSION_MB = 64
VALUES: dict[str, Any] = {
    "image": {"repository": "localhost/asgi-admission-demo", "tag": TAG},
    "replicaCount": 1,
    "resources": {"limits": {"memory": "512Mi"}, "requests": {"memory": "256Mi"}},
    "admission": {"sessionReserveMB": SESSION_MB, "maxSessions": 64, "retryAfterSeconds": 2},
    "multiWorker": {"enabled": True},
    # No Service here: the helm test pod's URL names the Service port, so make it the pod's.
    "service": {"port": 8000},
    "extraEnv": [{"name": "DEMO_SESSION_MB", "value": str(SESSION_MB)}],
    "helmTest": {"image": HELM_TEST_IMAGE},
}


def test_the_rendered_deployment_runs_as_the_chart_says(
    image: str, helm_test_image: str, tmp_path: Path
) -> None:
    """Env, limit, user, read-only root, volumes, probes, readiness, /metrics, helm test."""
    manifests = render(VALUES)
    deployment = one(manifests, "Deployment")
    rendered = server(deployment)
    assert rendered["image"] == image
    with played(deployment, name=f"{RELEASE}-play", workdir=tmp_path) as pod:
        config = json.loads(podman("inspect", pod.container).stdout)[0]
        env = dict(item.split("=", 1) for item in config["Config"]["Env"])
        for item in rendered["env"]:
            assert env.get(item["name"]) == item["value"], item["name"]
        assert config["HostConfig"]["Memory"] == LIMIT
        assert container_memory(pod.container).limit_bytes == LIMIT
        assert config["Config"]["User"] == "10001:10001"
        assert config["HostConfig"]["ReadonlyRootfs"] is True
        mounted = {m["Destination"] for m in config["Mounts"]}
        assert {m["mountPath"] for m in rendered["volumeMounts"]} <= mounted

        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert httpx.get(pod.probe_url(probe), timeout=5).status_code == 200, probe

        # Sessions until one is refused: the latch is set and readiness says so.
        opened: list[str] = []
        for _ in range(16):
            response = httpx.post(f"{pod.url}/sessions", timeout=30)
            if response.status_code == 503:
                break
            assert response.status_code == 201
            opened.append(response.json()["id"])
        assert response.status_code == 503, "16 sessions of 64 MiB fitted in 512 MiB"
        assert opened
        ready = httpx.get(pod.probe_url("readinessProbe"), timeout=5)
        assert ready.status_code == 503
        assert ready.json() == {"ready": False, "state": "pressured"}
        # The shared ledger is in the chart's multiWorker volume.
        listing = podman("exec", pod.container, "ls", env["ADMISSION_SHARED_DIR"]).stdout
        assert "asgi-admission.ledger" in listing.split()
        metrics = httpx.get(f"{pod.url}/metrics", timeout=10).text
        assert sample(metrics, "asgi_admission_memory_limit_bytes") == LIMIT
        assert sample(metrics, "asgi_admission_state", state="pressured") == 1

        helm_test = run_helm_test_pod(one(manifests, "Pod"), into=pod)
        assert helm_test.returncode == 0, helm_test.stdout + helm_test.stderr
        assert "serves asgi_admission_ metrics" in helm_test.stdout

        # Closing the sessions frees their memory: the latch resumes, readiness follows.
        for session_id in opened:
            assert httpx.delete(f"{pod.url}/sessions/{session_id}", timeout=10).status_code == 204
        ready = httpx.get(pod.probe_url("readinessProbe"), timeout=5)
        assert ready.status_code == 200, ready.text
        assert container_memory(pod.container).oom_kills == 0
