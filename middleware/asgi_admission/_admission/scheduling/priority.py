"""Priority classes: their names and ceilings, as configured (``ADMISSION_PRIORITY_CLASSES``).

A class is a name and its own high watermark (``latch.ClassCeilings`` decides with it);
the first class is served first (docs/configuration.md). This module imports only
``_env``, so the configuration can use it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeGuard

from asgi_admission import _env

#: The one class there is when none are configured; its ceiling is the high watermark.
DEFAULT_CLASS: Final = "default"

# Names become the value of a metric label and appear in problem bodies: a short word.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_SETTING: Final = "priority_classes (ADMISSION_PRIORITY_CLASSES)"


@dataclass(frozen=True, slots=True, kw_only=True)
class PriorityClass:
    """One priority class: its name and the high watermark percent its requests fit under."""

    name: str
    high_watermark_percent: float


def check_priority_classes(
    classes: object, *, high_watermark_percent: float, resume_threshold_percent: float
) -> None:
    """Raise ``ValueError`` naming the setting unless ``classes`` is usable."""
    if not isinstance(classes, tuple):
        raise ValueError(
            f"{_SETTING} must be a tuple of PriorityClass (an empty one for the single "
            f"default class); got {classes!r}."
        )
    gap = high_watermark_percent - resume_threshold_percent
    seen: set[str] = set()
    above: PriorityClass | None = None
    for entry in classes:
        if not isinstance(entry, PriorityClass):
            raise ValueError(f"{_SETTING} must hold PriorityClass entries; got {entry!r}.")
        name, ceiling = entry.name, entry.high_watermark_percent
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"{_SETTING}: a class name must be a word of letters, digits, '_', '.' or "
                f"'-' (at most 32, not empty); got {name!r}."
            )
        if name in seen:
            raise ValueError(f"{_SETTING} names the class {name!r} twice; each name once.")
        seen.add(name)
        if (
            isinstance(ceiling, bool)
            or not isinstance(ceiling, (int, float))
            or not math.isfinite(ceiling)
            or not gap < ceiling <= 100
        ):
            raise ValueError(
                f"{_SETTING}: the class {name!r} has the ceiling {ceiling!r}; a ceiling must "
                f"be a percentage of the memory limit above {gap:g} (the gap between "
                "the high watermark and the resume threshold, where its latch clears) and "
                "at most 100."
            )
        if above is not None and ceiling > above.high_watermark_percent:
            raise ValueError(
                f"{_SETTING}: the class {name!r} ({ceiling:g}) comes after {above.name!r} "
                f"({above.high_watermark_percent:g}) but has a higher ceiling; classes are "
                "served in the order given, so list them from the highest ceiling down."
            )
        above = entry


def parse_priority_classes(text: str) -> tuple[PriorityClass, ...]:
    """``"critical=90,standard=80,batch=65"`` as classes, in that order."""
    classes: list[PriorityClass] = []
    for entry in text.split(","):
        name, equals, percent = entry.partition("=")
        try:
            ceiling = float(percent.strip()) if equals else math.nan
        except ValueError:
            ceiling = math.nan
        if math.isnan(ceiling):
            raise ValueError(
                f"{_SETTING}: {entry.strip()!r} is not name=percent, as in "
                "'critical=90,standard=80,batch=65'."
            )
        classes.append(PriorityClass(name=name.strip(), high_watermark_percent=ceiling))
    return tuple(classes)


def classes_in_force(
    classes: tuple[PriorityClass, ...], *, high_watermark_percent: float
) -> tuple[PriorityClass, ...]:
    """The classes configured; none: one ``DEFAULT_CLASS`` at the high watermark."""
    if classes:
        return classes
    return (PriorityClass(name=DEFAULT_CLASS, high_watermark_percent=high_watermark_percent),)


# --------------------------------------------------------------------------------------
# The scheduling settings. Read from the environment they never raise: a value that is
# not usable gives its default with one warning, as every setting does.

logger = logging.getLogger("asgi_admission")

ENV_QUEUE_TIMEOUT: Final = ("ADMISSION_QUEUE_TIMEOUT_SECONDS", None)
ENV_QUEUE_LIMIT: Final = ("ADMISSION_QUEUE_LIMIT", None)
ENV_PRIORITY_CLASSES: Final = ("ADMISSION_PRIORITY_CLASSES", None)
ENV_TENANT_MAX_SHARE: Final = ("ADMISSION_TENANT_MAX_SHARE", None)

#: How many session requests may wait at once: a waiter costs a few KiB, and more than
#: this many waiting means capacity is not coming back within one wait.
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
    """``ADMISSION_QUEUE_TIMEOUT_SECONDS``; 0 (refuse at once) when unset or unusable."""
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
    """``ADMISSION_PRIORITY_CLASSES``; the one default class when unset or unusable."""
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
    """``ADMISSION_TENANT_MAX_SHARE``; 1.0 (no share) when unset or unusable."""
    value = _env.number(env, ENV_TENANT_MAX_SHARE, 1.0, float)
    if math.isfinite(value) and 0 < value <= 1:
        return value
    logger.warning(
        "%s=%r must be a share above 0 and at most 1; setting no share (1).",
        ENV_TENANT_MAX_SHARE[0],
        value,
    )
    return 1.0
