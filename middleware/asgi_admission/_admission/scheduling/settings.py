"""The scheduler's settings: their variables, their checks, and reading them from the environment.

``AdmissionConfig`` holds them (``queue_timeout_s``, ``queue_limit``,
``priority_classes``, ``tenant_max_share``) and calls :func:`check_scheduling`;
``from_env`` reads them with the functions below, which never raise: a value that
is not usable gives its default with one warning naming the variable, as every other
setting does (docs/configuration.md).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Final, TypeGuard

from asgi_admission import _env
from asgi_admission._admission.scheduling.priority import (
    PriorityClass,
    check_priority_classes,
    parse_priority_classes,
)

logger = logging.getLogger("asgi_admission")

ENV_QUEUE_TIMEOUT: Final = ("ADMISSION_QUEUE_TIMEOUT_SECONDS", None)
ENV_QUEUE_LIMIT: Final = ("ADMISSION_QUEUE_LIMIT", None)
ENV_PRIORITY_CLASSES: Final = ("ADMISSION_PRIORITY_CLASSES", None)
ENV_TENANT_MAX_SHARE: Final = ("ADMISSION_TENANT_MAX_SHARE", None)

#: How many session requests may wait for capacity at once. A waiter costs a few KiB
#: (its connection, a task, a future), so 256 stay well under a MiB; more than that
#: many waiting means capacity is not coming back within one wait, where refusing at
#: once (``queue_full``) serves a client better than a longer line.
DEFAULT_QUEUE_LIMIT: Final = 256


def _is_number(value: object) -> TypeGuard[float]:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def check_scheduling(
    *,
    queue_timeout_s: object,
    queue_limit: object,
    priority_classes: object,
    tenant_max_share: object,
    high_watermark_percent: float,
    resume_threshold_percent: float,
) -> None:
    """Raise ``ValueError`` with a sentence naming the setting unless all four are usable."""
    if not (_is_number(queue_timeout_s) and queue_timeout_s >= 0):
        raise ValueError(
            "queue_timeout_s (ADMISSION_QUEUE_TIMEOUT_SECONDS) must be a number of "
            f"seconds, 0 (refuse at once) or more; got {queue_timeout_s!r}."
        )
    if type(queue_limit) is not int or queue_limit < 0:
        raise ValueError(
            "queue_limit (ADMISSION_QUEUE_LIMIT) must be a whole number of waiting "
            f"requests, 0 or more; got {queue_limit!r}."
        )
    check_priority_classes(
        priority_classes,
        high_watermark_percent=high_watermark_percent,
        resume_threshold_percent=resume_threshold_percent,
    )
    if not (_is_number(tenant_max_share) and 0 < tenant_max_share <= 1):
        raise ValueError(
            "tenant_max_share (ADMISSION_TENANT_MAX_SHARE) must be a share above 0 and "
            f"at most 1 (1 sets none); got {tenant_max_share!r}."
        )


def queue_timeout_from(env: Mapping[str, str]) -> float:
    """``ADMISSION_QUEUE_TIMEOUT_SECONDS``: 0 (refuse at once) when unset, or with one
    warning when it is no number of seconds, 0 or more."""
    value = _env.number(env, ENV_QUEUE_TIMEOUT, 0.0, float)
    if math.isfinite(value) and value >= 0:
        return value
    logger.warning(
        "%s=%r must be a number of seconds, 0 or more; refusing at once (0).",
        ENV_QUEUE_TIMEOUT[0],
        value,
    )
    return 0.0


def priority_classes_from(
    env: Mapping[str, str], *, high: float, resume: float
) -> tuple[PriorityClass, ...]:
    """``ADMISSION_PRIORITY_CLASSES`` against the watermarks in force: unset or blank is
    the one default class, and so is a value that is not usable, with one warning
    saying what is wrong with it."""
    raw = _env.text(env, ENV_PRIORITY_CLASSES)
    if raw is None:
        return ()
    try:
        classes = parse_priority_classes(raw)
        check_priority_classes(
            classes, high_watermark_percent=high, resume_threshold_percent=resume
        )
    except ValueError as error:
        logger.warning(
            "%s=%r is not usable: %s Using the one default class at the high watermark.",
            ENV_PRIORITY_CLASSES[0],
            raw,
            error,
        )
        return ()
    return classes


def tenant_max_share_from(env: Mapping[str, str]) -> float:
    """``ADMISSION_TENANT_MAX_SHARE``: 1.0 (no share) when unset, or with one warning when
    it is not above 0 and at most 1."""
    value = _env.number(env, ENV_TENANT_MAX_SHARE, 1.0, float)
    if math.isfinite(value) and 0 < value <= 1:
        return value
    logger.warning(
        "%s=%r must be a share above 0 and at most 1; setting no share (1).",
        ENV_TENANT_MAX_SHARE[0],
        value,
    )
    return 1.0
