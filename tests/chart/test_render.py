"""Assertions on the chart's rendered objects: environment, requirements, labels, options."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from chartlib import (
    Manifest,
    env_of,
    helm_template,
    of_kind,
    one,
    parse_manifests,
    render,
    scenario_values,
    server_container,
)

from kits.suitekit import CHART

MEMORY = ("--set", "resources.limits.memory=1Gi")
SELECTOR_KEYS = {"app.kubernetes.io/name", "app.kubernetes.io/instance"}
STANDARD_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
    "helm.sh/chart",
}
ENV_OF_VALUE = {
    "highWatermarkPercent": "ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT",
    "resumeThresholdPercent": "ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT",
    "sessionReserveMB": "ADMISSION_SESSION_RESERVE_MB",
    "maxSessions": "ADMISSION_MAX_SESSIONS",
    "retryAfterSeconds": "ADMISSION_RETRY_AFTER_SECONDS",
    "memorySource": "ADMISSION_MEMORY_SOURCE",
    "cgroupRoot": "ADMISSION_CGROUP_ROOT",
    "reclaimable": "ADMISSION_RECLAIMABLE",
    "criticalWatermarkPercent": "ADMISSION_CRITICAL_WATERMARK_PERCENT",
    "watchdogIntervalSeconds": "ADMISSION_WATCHDOG_INTERVAL_SECONDS",
    "reserveLearning": "ADMISSION_SESSION_RESERVE_LEARNING",
    "reserveMinMB": "ADMISSION_SESSION_RESERVE_MIN_MB",
    "pendingTimeoutSeconds": "ADMISSION_PENDING_TIMEOUT_SECONDS",
    "sessionGroups": "ADMISSION_SESSION_GROUPS",
    "stuckAfterSeconds": "ADMISSION_STUCK_AFTER_SECONDS",
    "livenessPath": "ADMISSION_LIVENESS_PATH",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def defaults() -> dict[str, object]:
    loaded: dict[str, object] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def test_env_carries_the_admission_values(rendered: dict[str, list[Manifest]]) -> None:
    """Every admission value of the full scenario reaches the container as its ADMISSION_* env."""
    env = env_of(server_container(rendered["full"]))
    admission = scenario_values("full")["admission"]
    assert set(admission) == set(ENV_OF_VALUE)
    for key, name in ENV_OF_VALUE.items():
        assert env[name] == str(admission[key]), name
    assert env["LOG_LEVEL"] == "info"


def test_env_defaults_match_the_values_file(rendered: dict[str, list[Manifest]]) -> None:
    """With the defaults the environment holds values.yaml's settings and no optional variable."""
    env = env_of(server_container(rendered["default"]))
    admission = defaults()["admission"]
    assert isinstance(admission, dict)
    for key, name in ENV_OF_VALUE.items():
        if key not in ("cgroupRoot", "sessionReserveMB", "maxSessions", "livenessPath"):
            assert env[name] == str(admission[key]), name
    assert admission["sessionReserveMB"] is None
    assert admission["maxSessions"] is None
    assert admission["livenessPath"] == ""
    for absent in (
        "ADMISSION_LIVENESS_PATH",
        "ADMISSION_SESSION_RESERVE_MB",
        "ADMISSION_MAX_SESSIONS",
        "ADMISSION_CGROUP_ROOT",
        "ADMISSION_SHARED_DIR",
        "ADMISSION_METRICS_PORT",
        "PROMETHEUS_MULTIPROC_DIR",
    ):
        assert absent not in env


def test_shared_directories_are_memory_backed_mounts(rendered: dict[str, list[Manifest]]) -> None:
    """The ledger and multiprocess dirs are sized tmpfs emptyDirs, mounted where the env
    points (the ledger in a subdirectory of its mount, which the guard makes private)."""
    manifests = rendered["full"]
    container = server_container(manifests)
    env = env_of(container)
    volumes = {
        v["name"]: v for v in one(manifests, "Deployment")["spec"]["template"]["spec"]["volumes"]
    }
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    values = scenario_values("full")
    shared_mount, ledger = env["ADMISSION_SHARED_DIR"].rsplit("/", 1)
    assert ledger == "ledger"
    for mount_path, size in (
        (shared_mount, values["multiWorker"]["sizeLimit"]),
        (env["PROMETHEUS_MULTIPROC_DIR"], values["metrics"]["multiprocess"]["sizeLimit"]),
    ):
        volume = volumes[mounts[mount_path]]
        assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": size}


def test_separate_metrics_port_is_exposed_and_scraped(rendered: dict[str, list[Manifest]]) -> None:
    """metrics.port adds container and Service ports and the env; the monitor and test use it."""
    manifests = rendered["full"]
    container = server_container(manifests)
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in container["ports"]
    assert env_of(container)["ADMISSION_METRICS_PORT"] == "9100"
    service_ports = {p["name"]: p for p in one(manifests, "Service")["spec"]["ports"]}
    assert service_ports["metrics"]["port"] == 9100
    assert service_ports["metrics"]["targetPort"] == "metrics"
    assert one(manifests, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"
    test_env = env_of(one(manifests, "Pod")["spec"]["containers"][0])
    assert test_env["URL"] == "http://full-asgi-admission:9100/metrics"


def test_metrics_share_the_application_port_by_default(
    rendered: dict[str, list[Manifest]],
) -> None:
    """Without metrics.port there is one port, and the PodMonitor and helm test use it."""
    manifests = rendered["keda"]
    assert [p["name"] for p in server_container(manifests)["ports"]] == ["http"]
    assert [p["name"] for p in one(manifests, "Service")["spec"]["ports"]] == ["http"]
    assert one(manifests, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    test_env = env_of(one(manifests, "Pod")["spec"]["containers"][0])
    assert test_env["URL"] == "http://keda-asgi-admission:80/metrics"


def test_memory_limit_is_required_by_the_template(helm: str) -> None:
    """With the schema skipped, the render still fails with a sentence saying why."""
    proc = helm_template(helm, "r", "--skip-schema-validation", check=False)
    assert proc.returncode != 0
    assert "resources.limits.memory is required" in proc.stderr
    assert "cgroup memory limit" in proc.stderr


def test_memory_limit_is_required_by_the_schema(helm: str) -> None:
    """values.schema.json rejects values whose resources.limits has no memory."""
    proc = helm_template(helm, "r", "--set", "resources.limits.cpu=1", check=False)
    assert proc.returncode != 0
    assert "schema" in proc.stderr
    assert "memory" in proc.stderr
    schema = json.loads((CHART / "values.schema.json").read_text())
    limits = schema["properties"]["resources"]["properties"]["limits"]
    assert limits["required"] == ["memory"]
    assert "required" in limits["description"]


def test_schema_allows_subchart_keys_and_rejects_unknown_ones(helm: str) -> None:
    """global and enabled pass the schema; a misspelt key and an unknown memory source do not."""
    assert render(helm, "r", *MEMORY, "--set", "global.x=1", "--set", "enabled=true")
    typo = helm_template(helm, "r", *MEMORY, "--set", "replicaCont=3", check=False)
    assert typo.returncode != 0
    assert "replicaCont" in typo.stderr
    source = helm_template(helm, "r", *MEMORY, "--set", "admission.memorySource=proc", check=False)
    assert source.returncode != 0
    assert "memorySource" in source.stderr


def test_resume_threshold_above_high_watermark_fails(helm: str) -> None:
    """A resume threshold above the high watermark fails the render with a sentence."""
    proc = helm_template(
        helm, "r", *MEMORY, "--set", "admission.resumeThresholdPercent=90", check=False
    )
    assert proc.returncode != 0
    assert "resumeThresholdPercent is above admission.highWatermarkPercent" in proc.stderr


def test_critical_watermark_not_above_high_fails(helm: str) -> None:
    """A critical watermark at or below the high watermark fails the render with a sentence."""
    proc = helm_template(
        helm, "r", *MEMORY, "--set", "admission.criticalWatermarkPercent=80", check=False
    )
    assert proc.returncode != 0
    assert "criticalWatermarkPercent is not above admission.highWatermarkPercent" in proc.stderr


def test_reserve_that_cannot_fit_the_limit_fails(helm: str) -> None:
    """A 768 MiB reserve against a 512Mi limit fails the render, naming the value and the fix."""
    proc = helm_template(
        helm,
        "r",
        "--set",
        "resources.limits.memory=512Mi",
        "--set",
        "admission.sessionReserveMB=768",
        check=False,
    )
    assert proc.returncode != 0
    assert "admission.sessionReserveMB=768 cannot fit under the high watermark (80%)" in (
        proc.stderr
    )
    assert "resources.limits.memory=512Mi, which leaves 409.6 MiB" in proc.stderr
    assert "(an eighth of it, 64 MiB here)" in proc.stderr


@pytest.mark.parametrize(
    ("limit", "reserve", "fits"),
    [
        ("512Mi", "409", True),
        ("512Mi", "410", False),
        ("1G", "762", True),  # 1e9 B = 953.7 MiB; 80% = 762.9 MiB
        ("1G", "763", False),
        ("16Gi", "13107", True),
        ("16Gi", "13108", False),
        ("536870912", "409", True),
        ("536870912", "410", False),
    ],
)
def test_reserve_check_reads_memory_quantities(
    helm: str, limit: str, reserve: str, fits: bool
) -> None:
    """The render compares the reserve with 80% of the limit in binary and decimal units."""
    proc = helm_template(
        helm,
        "r",
        "--set-string",
        f"resources.limits.memory={limit}",
        "--set",
        f"admission.sessionReserveMB={reserve}",
        check=False,
    )
    assert (proc.returncode == 0) is fits, proc.stderr
    if fits:
        assert (
            env_of(server_container(parse_manifests(proc.stdout)))["ADMISSION_SESSION_RESERVE_MB"]
            == reserve
        )


def test_default_reserve_renders_at_512mi(helm: str) -> None:
    """With the default (derived) reserve a 512Mi pod renders, leaving the reserve unset."""
    env = env_of(server_container(render(helm, "r", "--set", "resources.limits.memory=512Mi")))
    assert "ADMISSION_SESSION_RESERVE_MB" not in env
    assert env["ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT"] == "80"


def test_count_cap_renders_only_when_set(helm: str) -> None:
    """By default no ADMISSION_MAX_SESSIONS is rendered (memory alone decides, and the NOTES
    say so); admission.maxSessions=20 renders it, and 0 or a string fails the schema."""
    default = helm_template(helm, "r", *MEMORY)
    assert "ADMISSION_MAX_SESSIONS" not in env_of(server_container(parse_manifests(default.stdout)))
    capped = render(helm, "r", *MEMORY, "--set", "admission.maxSessions=20")
    assert env_of(server_container(capped))["ADMISSION_MAX_SESSIONS"] == "20"
    for bad in ("admission.maxSessions=0", "admission.maxSessions=many"):
        failed = helm_template(helm, "r", *MEMORY, "--set", bad, check=False)
        assert failed.returncode != 0
        assert "maxSessions" in failed.stderr
    assert "No count cap is set: memory alone decides" in notes(helm, *MEMORY)
    assert "Each pod takes at most 20 sessions." in notes(
        helm, *MEMORY, "--set", "admission.maxSessions=20"
    )


def notes(helm: str, *args: str) -> str:
    """NOTES.txt as rendered by a client dry run (helm template skips it)."""
    proc = subprocess.run(
        [helm, "install", "notes", str(CHART), *args, "--dry-run=client"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return proc.stdout.split("NOTES:", 1)[1]


def test_chart_declares_its_licence() -> None:
    """Chart.yaml carries the project's Apache-2.0 licence as annotations."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["annotations"]["licenses"] == "Apache-2.0"
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"


def test_selectors_hold_only_name_and_instance(rendered: dict[str, list[Manifest]]) -> None:
    """Every selector names the app and the instance only, never helm.sh/chart or the version."""
    for manifests in rendered.values():
        for m in manifests:
            kind = m["kind"]
            if kind == "Service":
                selector = m["spec"]["selector"]
            elif kind in {"Deployment", "PodDisruptionBudget", "ServiceMonitor", "PodMonitor"}:
                selector = m["spec"]["selector"]["matchLabels"]
            else:
                continue
            assert set(selector) == SELECTOR_KEYS, (kind, selector)


def test_objects_carry_the_standard_labels_and_short_names(
    rendered: dict[str, list[Manifest]],
) -> None:
    """Every object has the app.kubernetes.io labels and helm.sh/chart, and a DNS-label name."""
    for manifests in rendered.values():
        for m in manifests:
            labels = m["metadata"]["labels"]
            expected = STANDARD_LABELS - (
                {"app.kubernetes.io/name"} if m["kind"] == "Pod" else set()
            )
            assert expected <= set(labels), (m["kind"], labels)
            assert len(m["metadata"]["name"]) <= 63
            assert DNS_LABEL.match(m["metadata"]["name"]), m["metadata"]["name"]


def test_long_names_are_truncated(rendered: dict[str, list[Manifest]]) -> None:
    """A full name past 63 characters is cut to 63, and suffixed names keep their suffix."""
    names = {m["kind"]: m["metadata"]["name"] for m in rendered["subchart"]}
    assert len(names["Deployment"]) == 63
    assert names["Pod"].endswith("-test-metrics")
    assert len(names["Pod"]) <= 63


def test_pod_template_labels_include_the_selector(rendered: dict[str, list[Manifest]]) -> None:
    """The Deployment's pods carry its selector labels, so the selector matches them."""
    for manifests in rendered.values():
        deployment = one(manifests, "Deployment")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_both_autoscalers_fail_the_render(helm: str) -> None:
    """Turning on both the HPA and KEDA fails the render with a sentence naming both."""
    proc = helm_template(
        helm,
        "r",
        *MEMORY,
        "--set",
        "autoscaling.hpa.enabled=true",
        "--set",
        "autoscaling.keda.enabled=true",
        check=False,
    )
    assert proc.returncode != 0
    assert "autoscaling.hpa.enabled and autoscaling.keda.enabled are both true" in proc.stderr


def test_both_monitors_fail_the_render(helm: str) -> None:
    """Turning on both the ServiceMonitor and the PodMonitor fails: every series would double."""
    proc = helm_template(
        helm,
        "r",
        *MEMORY,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
        check=False,
    )
    assert proc.returncode != 0
    assert "scraped twice" in proc.stderr


@pytest.mark.parametrize(
    ("scenario", "kind"), [("full", "HorizontalPodAutoscaler"), ("keda", "ScaledObject")]
)
def test_autoscaler_owns_the_replica_count(
    rendered: dict[str, list[Manifest]], scenario: str, kind: str
) -> None:
    """With an autoscaler on, the Deployment leaves replicas to it and the autoscaler targets it."""
    manifests = rendered[scenario]
    deployment = one(manifests, "Deployment")
    assert "replicas" not in deployment["spec"]
    target = one(manifests, kind)["spec"]["scaleTargetRef"]
    assert target["kind"] == "Deployment"
    assert target["name"] == deployment["metadata"]["name"]


def test_keda_query_selects_this_release_only(rendered: dict[str, list[Manifest]]) -> None:
    """The default KEDA query sums sessions over this release's pods in its namespace."""
    query = one(rendered["keda"], "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    assert query == (
        'sum(asgi_admission_sessions{namespace="shop",'
        'pod=~"keda-asgi-admission-[a-z0-9]+-[a-z0-9]+"})'
    )


def test_keda_can_scale_on_admissible_sessions(rendered: dict[str, list[Manifest]]) -> None:
    """scaleOn admissible: the pods needed for the sessions in use plus the headroom,
    in session units of this release's pods."""
    trigger = one(rendered["keda-admissible"], "ScaledObject")["spec"]["triggers"][0]
    sel = 'namespace="shop",pod=~"keda-admissible-asgi-admission-[a-z0-9]+-[a-z0-9]+"'
    assert trigger["metadata"]["query"] == (
        f"(sum(asgi_admission_sessions{{{sel}}}) + 6) / clamp_min("
        f"(sum(asgi_admission_sessions{{{sel}}}) + "
        f"sum(asgi_admission_admissible_sessions{{{sel}}})) / "
        f"count(asgi_admission_admissible_sessions{{{sel}}}), 1)"
    )
    assert trigger["metadata"]["threshold"] == "1"


@pytest.mark.parametrize(
    ("keda", "threshold"),
    [
        ({}, "12"),
        ({"scaleOn": "admissible"}, "1"),
        ({"scaleOn": "admissible", "threshold": "2"}, "2"),
        ({"threshold": 8}, "8"),
        ({"scaleOn": "admissible", "threshold": None}, "1"),
    ],
)
def test_keda_threshold_goes_with_scale_on_unless_set(
    helm: str, keda: dict[str, object], threshold: str
) -> None:
    """An empty threshold takes the one of its scaleOn (12 sessions per pod, or 1 pod's
    worth): flipping scaleOn alone never keeps the other mode's target."""
    settings = json.dumps({"enabled": True, **keda})
    manifests = render(helm, "keda", *MEMORY, "--set-json", f"autoscaling.keda={settings}")
    trigger = one(manifests, "ScaledObject")["spec"]["triggers"][0]
    assert trigger["metadata"]["threshold"] == threshold


def hpa_metric(manifests: list[Manifest]) -> Manifest:
    metrics: list[Manifest] = one(manifests, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert len(metrics) == 1
    return metrics[0]


def pods_metric(name: str, target: str) -> Manifest:
    return {
        "type": "Pods",
        "pods": {
            "metric": {"name": name},
            "target": {"type": "AverageValue", "averageValue": target},
        },
    }


def test_hpa_scales_on_memory_by_default(rendered: dict[str, list[Manifest]]) -> None:
    """Without scaleOn the HPA keeps its pods metric: the memory usage ratio, target 0.6."""
    assert "scaleOn" not in scenario_values("full")["autoscaling"]["hpa"]
    assert hpa_metric(rendered["full"]) == pods_metric("asgi_admission_memory_usage_ratio", "600m")


def test_hpa_can_scale_on_admissible_sessions(rendered: dict[str, list[Manifest]]) -> None:
    """scaleOn admissible: the HPA's pods metric is the session fullness, target 0.7."""
    hpa = one(rendered["hpa-admissible"], "HorizontalPodAutoscaler")
    assert hpa_metric(rendered["hpa-admissible"]) == pods_metric(
        "asgi_admission_session_fullness", "700m"
    )
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        # Flipping scaleOn alone brings that mode's metric and target along.
        (["scaleOn=admissible"], ("asgi_admission_session_fullness", "700m")),
        # A tuned memory target does not leak into the admissible mode, nor back.
        (
            ["scaleOn=admissible", "memory.targetAverageValue=500m"],
            ("asgi_admission_session_fullness", "700m"),
        ),
        (
            ["scaleOn=memory", "admissible.targetAverageValue=800m"],
            ("asgi_admission_memory_usage_ratio", "600m"),
        ),
        (
            ["scaleOn=admissible", "admissible.targetAverageValue=800m"],
            ("asgi_admission_session_fullness", "800m"),
        ),
        (
            ["scaleOn=admissible", "admissible.metricName=shop_session_fullness"],
            ("shop_session_fullness", "700m"),
        ),
    ],
)
def test_hpa_takes_the_metric_and_target_of_its_scale_on(
    helm: str, settings: list[str], expected: tuple[str, str]
) -> None:
    """The HPA's metric and target come from the block scaleOn names, as a pair."""
    args = [
        arg
        for setting in ["enabled=true", *settings]
        for arg in (
            "--set-string" if "Value=" in setting else "--set",
            f"autoscaling.hpa.{setting}",
        )
    ]
    manifests = render(helm, "r", *MEMORY, *args)
    assert hpa_metric(manifests) == pods_metric(*expected)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "autoscaling.hpa.scaleOn=sessions"],
            "at '/autoscaling/hpa/scaleOn': value must be one of 'memory', 'admissible'",
        ),
        (
            ["--set", "autoscaling.hpa.scaleOn=sessions", "--skip-schema-validation"],
            'autoscaling.hpa.scaleOn is "sessions": it must be "memory"',
        ),
        (
            ["--set", "autoscaling.hpa.metricName=asgi_admission_session_fullness"],
            "at '/autoscaling/hpa': additional properties 'metricName' not allowed",
        ),
        (
            ["--set", "autoscaling.hpa.admissible.targetAverageValue=most"],
            "/autoscaling/hpa/admissible/targetAverageValue",
        ),
        (
            [
                *("--set", "autoscaling.hpa.scaleOn=admissible"),
                *("--set", "autoscaling.hpa.admissible=null"),
            ],
            "autoscaling.hpa.admissible needs its metricName and targetAverageValue",
        ),
    ],
)
def test_bad_hpa_settings_fail_the_render(helm: str, args: list[str], message: str) -> None:
    """A scaleOn other than memory or admissible fails the render naming the setting (by the
    schema, and by the template when the schema is skipped), as do the old flat metric keys
    and a target that is not a quantity."""
    proc = helm_template(
        helm, "r", *MEMORY, "--set", "autoscaling.hpa.enabled=true", *args, check=False
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_monitors_rules_and_dashboard_appear_only_when_enabled(
    rendered: dict[str, list[Manifest]],
) -> None:
    """The default render has no monitoring objects; enabled ones carry their additionalLabels."""
    optional = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "Ingress"}
    assert not {m["kind"] for m in rendered["default"]} & optional
    assert not of_kind(rendered["full"], "PodMonitor")
    assert not of_kind(rendered["keda"], "ServiceMonitor")
    for scenario, kind in (
        ("full", "ServiceMonitor"),
        ("full", "PrometheusRule"),
        ("keda", "PodMonitor"),
    ):
        labels = one(rendered[scenario], kind)["metadata"]["labels"]
        assert labels["release"] == "kube-prometheus-stack"


def test_prometheus_rule_embeds_the_rules_file(rendered: dict[str, list[Manifest]]) -> None:
    """The PrometheusRule's groups are files/alerts.yaml's groups, templates left untouched."""
    rules_file = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    rule = one(rendered["full"], "PrometheusRule")
    assert rule["spec"]["groups"] == rules_file["groups"]
    assert "{{ $labels.pod }}" in json.dumps(rule)


def test_dashboard_configmap_is_labelled_for_the_sidecar(
    rendered: dict[str, list[Manifest]],
) -> None:
    """The dashboard ConfigMap has the sidecar label and folder, and holds files/dashboard.json."""
    configmap = one(rendered["full"], "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["labels"]["team"] == "platform"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Sessions"}
    (data,) = configmap["data"].values()
    assert json.loads(data) == json.loads((CHART / "files" / "dashboard.json").read_text())


def test_helm_test_pod_is_a_hook_outside_the_service(rendered: dict[str, list[Manifest]]) -> None:
    """The test pod is a helm test hook that greps /metrics, and no release selector picks it."""
    for manifests in rendered.values():
        pod = one(manifests, "Pod")
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        assert "asgi_admission_" in " ".join(pod["spec"]["containers"][0]["command"])
        selector = one(manifests, "Service")["spec"]["selector"]
        assert not selector.items() <= pod["metadata"]["labels"].items()


def test_probes_follow_the_readiness_choice(rendered: dict[str, list[Manifest]]) -> None:
    """Liveness is on /health; readiness is on the admission path unless switched to /health."""
    default = server_container(rendered["default"])
    assert default["livenessProbe"]["httpGet"]["path"] == "/health"
    assert default["readinessProbe"]["httpGet"]["path"] == "/admission/ready"
    assert server_container(rendered["keda"])["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "startupProbe" not in server_container(rendered["subchart"])


def test_a_liveness_path_moves_the_liveness_probe_onto_it(helm: str) -> None:
    """admission.livenessPath sets ADMISSION_LIVENESS_PATH and the probe's path, keeping the
    probe's other settings; with livenessProbe null there is still no probe."""
    args = (*MEMORY, "--set", "admission.livenessPath=/admission/alive")
    container = server_container(render(helm, "stuck", *args))
    assert env_of(container)["ADMISSION_LIVENESS_PATH"] == "/admission/alive"
    probe = container["livenessProbe"]
    assert probe["httpGet"] == {"path": "/admission/alive", "port": "http"}
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (10, 3)
    assert defaults()["livenessProbe"]["httpGet"]["path"] == "/health"  # type: ignore[index]
    removed = server_container(render(helm, "stuck", *args, "--set", "livenessProbe=null"))
    assert "livenessProbe" not in removed
    failed = helm_template(
        helm, "stuck", *MEMORY, "--set", "admission.livenessPath=alive", check=False
    )
    assert failed.returncode != 0
    assert "livenessPath" in failed.stderr


def test_image_defaults_to_the_demo_at_app_version(rendered: dict[str, list[Manifest]]) -> None:
    """The default image is the demo tagged with appVersion; a digest replaces the tag."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    default = server_container(rendered["default"])
    assert default["image"] == f"ghcr.io/asgi-admission/demo:{chart['appVersion']}"
    assert "command" not in default
    assert "args" not in default
    assert server_container(rendered["subchart"])["image"].startswith(
        "ghcr.io/asgi-admission/demo@sha256:"
    )
    full = server_container(rendered["full"])
    assert full["command"] == ["asgi-admission"]
    assert full["args"][0] == "demo"


def test_dashboard_is_well_formed() -> None:
    """The dashboard has a fixed uid, unique ids, non-overlapping panels and the asked-for views."""
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    assert dashboard["uid"] == "asgi-admission"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        area = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not area & cells, p["title"]
        assert g["x"] + g["w"] <= 24
        cells |= area
    titles = " / ".join(p["title"] for p in panels).lower()
    for topic in (
        "watermarks",
        "latch state",
        "active / pending vs cap",
        "outcome and reason",
        "latency",
        "psi",
    ):
        assert topic in titles, topic


def test_session_groups_values_reach_the_pod(rendered: dict[str, list[Manifest]]) -> None:
    """The full scenario's session-group values give the pod CRI-O's writable-cgroup
    annotation and the RuntimeClass; the defaults give neither, and auto in the env."""
    full = one(rendered["full"], "Deployment")["spec"]["template"]
    assert full["metadata"]["annotations"]["io.kubernetes.cri-o.cgroup2-mount-hierarchy-rw"] == (
        "true"
    )
    assert full["spec"]["runtimeClassName"] == "cgroup-writable"
    default = one(rendered["default"], "Deployment")["spec"]["template"]
    assert "io.kubernetes.cri-o.cgroup2-mount-hierarchy-rw" not in default["metadata"].get(
        "annotations", {}
    )
    assert "runtimeClassName" not in default["spec"]
    assert env_of(server_container(rendered["default"]))["ADMISSION_SESSION_GROUPS"] == "auto"


def test_the_proxy_report_renders_the_agent_port_and_the_header(
    rendered: dict[str, list[Manifest]],
) -> None:
    """roomReport.agentPort adds the "agent" container port and ADMISSION_AGENT_PORT, and
    loadMetricsHeader ADMISSION_LOAD_METRICS_HEADER; by default neither is rendered."""
    container = server_container(rendered["full"])
    assert {"name": "agent", "containerPort": 9001, "protocol": "TCP"} in container["ports"]
    env = env_of(container)
    assert env["ADMISSION_AGENT_PORT"] == "9001"
    assert env["ADMISSION_LOAD_METRICS_HEADER"] == "true"
    default = server_container(rendered["default"])
    assert "agent" not in [port["name"] for port in default["ports"]]
    assert "ADMISSION_AGENT_PORT" not in env_of(default)
    assert "ADMISSION_LOAD_METRICS_HEADER" not in env_of(default)


@pytest.mark.parametrize("taken", ["containerPort=9001", "metrics.port=9001"])
def test_an_agent_port_shared_with_another_fails_the_render(helm: str, taken: str) -> None:
    """The agent port equal to the application's or the metrics' fails with a sentence."""
    proc = helm_template(
        helm, "r", *MEMORY, "--set", "roomReport.agentPort=9001", "--set", taken, check=False
    )
    assert proc.returncode != 0
    assert "roomReport.agentPort equals containerPort or metrics.port" in proc.stderr


@pytest.mark.parametrize("port", ["0", "65536", "agent"])
def test_the_schema_refuses_an_agent_port_that_is_no_port(helm: str, port: str) -> None:
    """values.schema.json takes a port number (or null) for roomReport.agentPort."""
    proc = helm_template(helm, "r", *MEMORY, "--set", f"roomReport.agentPort={port}", check=False)
    assert proc.returncode != 0
    assert "agentPort" in proc.stderr
