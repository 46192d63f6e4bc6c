"""The scheduler's four settings: their defaults, from_env, and a sentence for every bad value."""

from __future__ import annotations

import logging
import re

import pytest

from asgi_admission import AdmissionConfig, PriorityClass


def classes(**ceilings: float) -> tuple[PriorityClass, ...]:
    return tuple(PriorityClass(name=n, high_watermark_percent=c) for n, c in ceilings.items())


def test_the_defaults_wait_for_nothing_and_set_one_class_and_no_share() -> None:
    """Unset, nothing waits (the first release's behaviour), one default class, no share."""
    config = AdmissionConfig.from_env({})
    assert (config.queue_timeout_s, config.queue_limit) == (0.0, 256)
    assert (config.priority_classes, config.tenant_max_share) == ((), 1.0)
    assert config == AdmissionConfig()


def test_every_scheduling_variable_is_read(caplog: pytest.LogCaptureFixture) -> None:
    """Each of the four variables sets its field, the classes in the order given, no warning."""
    env = {
        "ADMISSION_QUEUE_TIMEOUT_SECONDS": " 10.5 ",
        "ADMISSION_QUEUE_LIMIT": "32",
        "ADMISSION_PRIORITY_CLASSES": " critical=90, standard = 80 ,batch=65.5",
        "ADMISSION_TENANT_MAX_SHARE": "0.5",
    }
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        config = AdmissionConfig.from_env(env)
    assert (config.queue_timeout_s, config.queue_limit, config.tenant_max_share) == (
        10.5,
        32,
        0.5,
    )
    assert config.priority_classes == classes(critical=90, standard=80, batch=65.5)
    assert caplog.records == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"queue_timeout_s": -1.0},
            "queue_timeout_s (ADMISSION_QUEUE_TIMEOUT_SECONDS) must be a number of seconds, 0 "
            "(refuse at once) or more; got -1.0.",
        ),
        (
            {"queue_timeout_s": float("inf")},
            "queue_timeout_s (ADMISSION_QUEUE_TIMEOUT_SECONDS) must be a number of seconds, 0 "
            "(refuse at once) or more; got inf.",
        ),
        (
            {"queue_limit": -1},
            "queue_limit (ADMISSION_QUEUE_LIMIT) must be a whole number of waiting requests, "
            "0 or more; got -1.",
        ),
        (
            {"queue_limit": 2.5},
            "queue_limit (ADMISSION_QUEUE_LIMIT) must be a whole number of waiting requests, "
            "0 or more; got 2.5.",
        ),
        (
            {"tenant_max_share": 0.0},
            "tenant_max_share (ADMISSION_TENANT_MAX_SHARE) must be a share above 0 and at "
            "most 1 (1 sets none); got 0.0.",
        ),
        (
            {"tenant_max_share": 1.5},
            "tenant_max_share (ADMISSION_TENANT_MAX_SHARE) must be a share above 0 and at "
            "most 1 (1 sets none); got 1.5.",
        ),
        (
            {"priority_classes": classes(critical=101)},
            "priority_classes (ADMISSION_PRIORITY_CLASSES): the class 'critical' has the "
            "ceiling 101; a ceiling must be a percentage of the memory limit above 10 (the gap "
            "between the high watermark and the resume threshold, where its latch clears) and "
            "at most 100.",
        ),
        (
            {"priority_classes": classes(batch=10)},
            "priority_classes (ADMISSION_PRIORITY_CLASSES): the class 'batch' has the ceiling "
            "10; a ceiling must be a percentage of the memory limit above 10 (the gap between "
            "the high watermark and the resume threshold, where its latch clears) and at most "
            "100.",
        ),
        (
            {"priority_classes": classes(**{"": 80})},
            "priority_classes (ADMISSION_PRIORITY_CLASSES): a class name must be a word of "
            "letters, digits, '_', '.' or '-' (at most 32, not empty); got ''.",
        ),
        (
            {"priority_classes": classes(a=90) + classes(a=80)},
            "priority_classes (ADMISSION_PRIORITY_CLASSES) names the class 'a' twice; each "
            "name once.",
        ),
        (
            {"priority_classes": classes(batch=65, critical=90)},
            "priority_classes (ADMISSION_PRIORITY_CLASSES): the class 'critical' (90) comes "
            "after 'batch' (65) but has a higher ceiling; classes are served in the order "
            "given, so list them from the highest ceiling down.",
        ),
        (
            {"priority_classes": [PriorityClass(name="a", high_watermark_percent=80)]},
            "priority_classes (ADMISSION_PRIORITY_CLASSES) must be a tuple of PriorityClass (an "
            "empty one for the single default class); got [PriorityClass(name='a', "
            "high_watermark_percent=80)].",
        ),
        (
            {"priority_classes": ("a=80",)},
            "priority_classes (ADMISSION_PRIORITY_CLASSES) must hold PriorityClass entries; "
            "got 'a=80'.",
        ),
    ],
)
def test_a_bad_scheduling_value_in_code_raises_a_sentence(
    kwargs: dict[str, object], message: str
) -> None:
    """Each bad value built in code raises ValueError with a sentence naming the setting."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        AdmissionConfig(**kwargs)  # type: ignore[arg-type]


def test_class_ceilings_are_checked_against_the_watermarks_in_force() -> None:
    """A ceiling must stay above the configured gap: 45 is fine with 80/70, not with 80/30."""
    assert AdmissionConfig(priority_classes=classes(batch=45)).priority_classes[0].name == "batch"
    with pytest.raises(ValueError, match="above 50 "):
        AdmissionConfig(resume_threshold_percent=30, priority_classes=classes(batch=45))


@pytest.mark.parametrize(
    ("variable", "value", "field", "default", "says"),
    [
        ("ADMISSION_QUEUE_TIMEOUT_SECONDS", "-1", "queue_timeout_s", 0.0, "0 or more"),
        ("ADMISSION_QUEUE_TIMEOUT_SECONDS", "nan", "queue_timeout_s", 0.0, "0 or more"),
        ("ADMISSION_QUEUE_TIMEOUT_SECONDS", "soon", "queue_timeout_s", 0.0, "not a valid"),
        ("ADMISSION_QUEUE_LIMIT", "-3", "queue_limit", 256, "below the minimum"),
        ("ADMISSION_QUEUE_LIMIT", "many", "queue_limit", 256, "not a valid"),
        ("ADMISSION_TENANT_MAX_SHARE", "0", "tenant_max_share", 1.0, "above 0 and at most 1"),
        ("ADMISSION_TENANT_MAX_SHARE", "1.5", "tenant_max_share", 1.0, "above 0 and at most 1"),
        ("ADMISSION_PRIORITY_CLASSES", "critical=190", "priority_classes", (), "at most 100"),
        ("ADMISSION_PRIORITY_CLASSES", "a=90,a=80", "priority_classes", (), "twice"),
        ("ADMISSION_PRIORITY_CLASSES", "=90", "priority_classes", (), "not empty"),
        ("ADMISSION_PRIORITY_CLASSES", "critical", "priority_classes", (), "name=percent"),
        ("ADMISSION_PRIORITY_CLASSES", "critical=high", "priority_classes", (), "name=percent"),
        ("ADMISSION_PRIORITY_CLASSES", "a=90,,b=80", "priority_classes", (), "name=percent"),
        ("ADMISSION_PRIORITY_CLASSES", "b=65,a=90", "priority_classes", (), "highest ceiling"),
    ],
)
def test_a_bad_scheduling_variable_falls_back_with_one_warning(
    caplog: pytest.LogCaptureFixture,
    variable: str,
    value: str,
    field: str,
    default: object,
    says: str,
) -> None:
    """from_env never fails on these: the default, with one warning naming the variable and
    what is wrong with its value."""
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        config = AdmissionConfig.from_env({variable: value})
    assert getattr(config, field) == default
    [record] = caplog.records
    assert variable in record.getMessage()
    assert says in record.getMessage()


def test_classes_from_the_environment_follow_the_watermarks_it_sets() -> None:
    """The classes are checked against the watermarks from_env settles on: 45 fits 80/70
    but not 80/30."""
    env = {"ADMISSION_PRIORITY_CLASSES": "standard=80,batch=45"}
    assert len(AdmissionConfig.from_env(env).priority_classes) == 2
    env["ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT"] = "30"
    assert AdmissionConfig.from_env(env).priority_classes == ()
