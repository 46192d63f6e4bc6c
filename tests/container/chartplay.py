"""Playing the chart's rendered Deployment with ``podman kube play``.

``helm template`` renders the chart with the local image; the Deployment is played as
Kubernetes would run one of its pods, with two stand-ins for what a cluster adds:

- no Service: the pod's ``http`` port is published on 127.0.0.1 (``hostPort``), and a
  ``hostAliases`` entry makes the Service's name resolve to the pod itself, so that the
  ``helm test`` pod's URL (Service name and port) reaches it from inside the pod;
- no kubelet probing: podman 4.3 turns a liveness probe into a healthcheck that runs
  ``curl`` on port 0 (it does not resolve named ports), so the tests resolve the named
  port and GET each probe's path themselves.

Podman 4.3 plays one pod per Deployment whatever ``replicas`` says, and mounts an
``emptyDir`` with ``medium: Memory`` as a plain directory; replicas are played as
copies of the Deployment with their own names and ports.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from containerkit import free_port, podman, remove_pod, wait_http

from kits.suitekit import CHART, ROOT

NAMESPACE = "default"
RELEASE = f"t{os.getpid()}"

Manifest = dict[str, Any]


def helm_binary() -> str:
    found = shutil.which("helm") or shutil.which(str(ROOT / ".tools" / "bin" / "helm"))
    if found is None:
        raise RuntimeError("helm is not on PATH: run scripts/setup (it builds .tools/bin/helm)")
    return found


def render(values: dict[str, Any], *, release: str = RELEASE) -> list[Manifest]:
    """``helm template`` of the chart with ``values``; the parsed objects."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        yaml.safe_dump(values, file)
        file.flush()
        command = [helm_binary(), "template", release, str(CHART), f"--namespace={NAMESPACE}"]
        proc = subprocess.run(
            [*command, f"--values={file.name}"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"helm template failed:\n{proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(deployment: Manifest) -> Manifest:
    spec: Manifest = deployment["spec"]["template"]["spec"]
    return spec


def server(deployment: Manifest) -> Manifest:
    container: Manifest = pod_spec(deployment)["containers"][0]
    return container


@dataclass(frozen=True, slots=True)
class PlayedPod:
    """One played pod of the chart's Deployment, its ``http`` port on 127.0.0.1:``port``."""

    pod: str
    container: str
    port: int
    deployment: Manifest

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def probe_url(self, probe: str) -> str:
        """Where a kubelet would send the container's ``probe`` (e.g. readinessProbe)."""
        get = server(self.deployment)[probe]["httpGet"]
        named = {p["name"]: p["containerPort"] for p in server(self.deployment)["ports"]}
        port = named.get(get["port"], get["port"])
        assert port == server(self.deployment)["ports"][0]["containerPort"], (
            f"{probe} uses port {port}, which is not the published http port"
        )
        return f"{self.url}{get['path']}"


def playable(deployment: Manifest, *, name: str, port: int) -> Manifest:
    """The rendered Deployment as one pod named ``name``, with the two stand-ins above."""
    played = copy.deepcopy(deployment)
    service_name = deployment["metadata"]["name"]
    played["metadata"]["name"] = name
    http = server(played)["ports"][0]
    http.update(hostPort=port, hostIP="127.0.0.1")
    pod_spec(played)["hostAliases"] = [{"ip": "127.0.0.1", "hostnames": [service_name]}]
    return played


@contextlib.contextmanager
def played(deployment: Manifest, *, name: str, workdir: Path) -> Iterator[PlayedPod]:
    """``podman kube play`` of the Deployment as pod ``<name>-pod-0``; removed afterwards."""
    port = free_port()
    manifest = playable(deployment, name=name, port=port)
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    pod = f"{name}-pod-0"
    container = f"{pod}-{server(manifest)['name']}"
    try:
        podman("kube", "play", str(path))
        played_pod = PlayedPod(pod=pod, container=container, port=port, deployment=manifest)

        def alive() -> bool:
            state = podman("inspect", "--format", "{{.State.Running}}", container, check=False)
            return state.stdout.strip() == "true"

        wait_http(f"{played_pod.url}/health", alive=alive)
        yield played_pod
    finally:
        podman("kube", "down", str(path), check=False)
        remove_pod(pod)


def run_helm_test_pod(test_pod: Manifest, *, into: PlayedPod) -> subprocess.CompletedProcess[str]:
    """Runs the chart's ``helm test`` pod's container inside the played pod's network."""
    spec = test_pod["spec"]
    (container,) = spec["containers"]
    security = spec["securityContext"]
    env = [f"--env={e['name']}={e['value']}" for e in container.get("env", [])]
    read_only = container.get("securityContext", {}).get("readOnlyRootFilesystem", False)
    return podman(
        "run",
        "--rm",
        f"--pod={into.pod}",
        f"--user={security['runAsUser']}:{security['runAsGroup']}",
        *(["--read-only"] if read_only else []),
        "--cap-drop=all",
        *env,
        container["image"],
        *container["command"],
        check=False,
    )
