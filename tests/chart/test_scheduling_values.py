"""The chart's waiting and priority values: rendered into the settings the guard reads, and
impossible ones refused by the schema or the template with a sentence."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from chartlib import Manifest, env_of, helm_template, render, server_container

from asgi_admission import AdmissionConfig, PriorityClass

MEMORY = ("--set", "resources.limits.memory=1Gi")
SCHEDULING_ENV = (
    "ADMISSION_QUEUE_TIMEOUT_SECONDS",
    "ADMISSION_QUEUE_LIMIT",
    "ADMISSION_PRIORITY_CLASSES",
    "ADMISSION_TENANT_MAX_SHARE",
)


def classes_arg(*entries: tuple[str, float]) -> tuple[str, str]:
    value = [{"name": name, "highWatermarkPercent": ceiling} for name, ceiling in entries]
    return ("--set-json", f"scheduling.priorityClasses={json.dumps(value)}")


def config_of(manifests: list[Manifest], caplog: pytest.LogCaptureFixture) -> AdmissionConfig:
    """The configuration the guard builds from the rendered environment, with no warning."""
    env = {k: v for k, v in env_of(server_container(manifests)).items() if v is not None}
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        config = AdmissionConfig.from_env(env)
    assert caplog.records == []
    return config


def test_the_full_scenario_reaches_the_guard_as_set(
    rendered: dict[str, list[Manifest]], caplog: pytest.LogCaptureFixture
) -> None:
    """The full scenario's four values become the settings AdmissionConfig.from_env reads,
    the classes in their order."""
    config = config_of(rendered["full"], caplog)
    assert (config.queue_timeout_s, config.queue_limit, config.tenant_max_share) == (10, 64, 0.5)
    assert config.priority_classes == (
        PriorityClass(name="critical", high_watermark_percent=92.5),
        PriorityClass(name="standard", high_watermark_percent=85),
        PriorityClass(name="batch", high_watermark_percent=65),
    )


def test_the_defaults_render_the_guards_defaults(
    rendered: dict[str, list[Manifest]], caplog: pytest.LogCaptureFixture
) -> None:
    """By default nothing waits, there is one class (no variable rendered) and no share."""
    env = env_of(server_container(rendered["default"]))
    assert "ADMISSION_PRIORITY_CLASSES" not in env
    config = config_of(rendered["default"], caplog)
    assert (config.queue_timeout_s, config.queue_limit) == (0, 256)
    assert (config.priority_classes, config.tenant_max_share) == ((), 1)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (classes_arg(("critical", 101)), "highWatermarkPercent"),
        (classes_arg(("critical", 0)), "highWatermarkPercent"),
        (classes_arg(("", 80)), "name"),
        (("--set-json", 'scheduling.priorityClasses=[{"name": "a"}]'), "highWatermarkPercent"),
        (("--set", "scheduling.tenantMaxShare=0"), "tenantMaxShare"),
        (("--set", "scheduling.tenantMaxShare=1.5"), "tenantMaxShare"),
        (("--set", "scheduling.queueTimeoutSeconds=-1"), "queueTimeoutSeconds"),
        (("--set", "scheduling.queueLimit=-1"), "queueLimit"),
        (("--set", "scheduling.queueLimit=2.5"), "queueLimit"),
        (("--set", "scheduling.queueTimeout=10"), "queueTimeout"),
    ],
)
def test_the_schema_refuses_impossible_values(helm: str, args: tuple[str, ...], names: str) -> None:
    """A class ceiling over 100 or at 0, a class without a name or a ceiling, a share
    outside (0, 1], a negative wait or limit and a misspelt key fail the render."""
    proc = helm_template(helm, "r", *MEMORY, *args, check=False)
    assert proc.returncode != 0
    assert "schema" in proc.stderr
    assert names in proc.stderr


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            (("a", 90), ("a", 80)),
            'scheduling.priorityClasses names the class "a" twice',
        ),
        (
            (("batch", 65), ("critical", 90)),
            'the class "critical" (90) comes after "batch" (65) but has a higher ceiling',
        ),
        (
            (("standard", 80), ("tiny", 10)),
            'the class "tiny" has the ceiling 10, at or below 10 (admission.highWatermarkPercent '
            "less admission.resumeThresholdPercent)",
        ),
    ],
)
@pytest.mark.parametrize("schema", [True, False], ids=["schema", "no-schema"])
def test_the_template_refuses_classes_the_guard_would_refuse(
    helm: str, entries: tuple[tuple[str, float], ...], message: str, schema: bool
) -> None:
    """Duplicate names, a ceiling above the one before it and one at or below the latch's
    gap fail the render with a sentence, as AdmissionConfig refuses them; the same values
    made consistent render."""
    skip = () if schema else ("--skip-schema-validation",)
    proc = helm_template(helm, "r", *MEMORY, *classes_arg(*entries), *skip, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr
    with pytest.raises(ValueError, match="priority_classes"):
        AdmissionConfig(
            priority_classes=tuple(
                PriorityClass(name=n, high_watermark_percent=c) for n, c in entries
            )
        )


def test_a_ceiling_follows_the_watermarks_set(helm: str) -> None:
    """A class at 45 renders with the default 80/70 and fails with a resume threshold of 30."""
    args = (*MEMORY, *classes_arg(("standard", 80), ("batch", 45)))
    env = env_of(server_container(render(helm, "r", *args)))
    assert env["ADMISSION_PRIORITY_CLASSES"] == "standard=80,batch=45"
    proc = helm_template(
        helm, "r", *args, "--set", "admission.resumeThresholdPercent=30", check=False
    )
    assert proc.returncode != 0
    assert 'the class "batch" has the ceiling 45, at or below 50' in proc.stderr


def test_a_large_queue_limit_renders_as_a_whole_number(
    helm: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A limit of two million from a values file (a float to Helm) renders as digits the
    guard reads, not as 2e+06."""
    values = tmp_path / "values.yaml"
    values.write_text("scheduling:\n  queueLimit: 2000000\n")
    config = config_of(render(helm, "r", *MEMORY, "-f", str(values)), caplog)
    assert config.queue_limit == 2_000_000
