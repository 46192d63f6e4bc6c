"""Reading the settings from the environment: each setting's variables, and their readers.

Each setting is named by a pair ``(current name, legacy name or None)``; the legacy names
are those of the deployment this guard replaced (``CODA_*``). Nothing here raises: a
value that is not usable falls back to its default with one warning naming the variable
(``AdmissionConfig.from_env``, docs/configuration.md).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

from asgi_admission._admission.scheduling.priority import (
    PriorityClass,
    check_priority_classes,
    parse_priority_classes,
)

logger = logging.getLogger("asgi_admission")

#: A setting's variable names: (current name, legacy name or None).
EnvNames = tuple[str, "str | None"]

#: The count cap while the guard is blind (memory unreadable, or no limit to take a
#: percentage of) and no ``max_sessions`` is set; with memory readable, memory decides.
BLIND_MAX_SESSIONS: Final = 16
#: ``shared_dir`` values that name no directory: a private place of this user and
#: memory group, found by the guard (the default), or none (each process counts alone).
SHARED_DIR_AUTO: Final = "auto"
SHARED_DIR_OFF: Final = "off"
ENV_HIGH: Final = ("ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT", "CODA_MEMORY_HIGH_WATERMARK_PERCENT")
ENV_RESUME: Final = (
    "ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT",
    "CODA_MEMORY_RESUME_THRESHOLD_PERCENT",
)
ENV_RESERVE_MB: Final = ("ADMISSION_SESSION_RESERVE_MB", "CODA_BROWSER_SESSION_RESERVE_MB")
ENV_CGROUP_ROOT: Final = ("ADMISSION_CGROUP_ROOT", "CODA_CGROUP_V2_ROOT")
ENV_MAX_SESSIONS: Final = ("ADMISSION_MAX_SESSIONS", None)
ENV_RETRY_AFTER: Final = ("ADMISSION_RETRY_AFTER_SECONDS", None)
ENV_MEMORY_SOURCE: Final = ("ADMISSION_MEMORY_SOURCE", None)
ENV_SHARED_DIR: Final = ("ADMISSION_SHARED_DIR", None)
ENV_RECLAIMABLE: Final = ("ADMISSION_RECLAIMABLE", None)
ENV_LEARNING: Final = ("ADMISSION_SESSION_RESERVE_LEARNING", None)
ENV_RESERVE_MIN_MB: Final = ("ADMISSION_SESSION_RESERVE_MIN_MB", None)
ENV_PENDING_TIMEOUT: Final = ("ADMISSION_PENDING_TIMEOUT_SECONDS", None)
ENV_WEBSOCKET_REFUSAL: Final = ("ADMISSION_WEBSOCKET_REFUSAL", None)
ENV_BODY_TIMEOUT: Final = ("ADMISSION_BODY_TIMEOUT_SECONDS", None)
ENV_BODY_BUFFER_KB: Final = ("ADMISSION_BODY_BUFFER_KB", None)
ENV_PROBE_SESSIONS: Final = ("ADMISSION_PROBE_SESSIONS", None)
ENV_PROBE_WAIT: Final = ("ADMISSION_PROBE_WAIT_SECONDS", None)
ENV_SESSION_GROUPS: Final = ("ADMISSION_SESSION_GROUPS", None)
ENV_STUCK_AFTER: Final = ("ADMISSION_STUCK_AFTER_SECONDS", None)
ENV_LIVENESS_PATH: Final = ("ADMISSION_LIVENESS_PATH", None)
ENV_AGENT_PORT: Final = ("ADMISSION_AGENT_PORT", None)
ENV_LOAD_METRICS: Final = ("ADMISSION_LOAD_METRICS_HEADER", None)
ENV_QUEUE_TIMEOUT: Final = ("ADMISSION_QUEUE_TIMEOUT_SECONDS", None)
ENV_QUEUE_LIMIT: Final = ("ADMISSION_QUEUE_LIMIT", None)
ENV_PRIORITY_CLASSES: Final = ("ADMISSION_PRIORITY_CLASSES", None)
ENV_TENANT_MAX_SHARE: Final = ("ADMISSION_TENANT_MAX_SHARE", None)


_N = TypeVar("_N", int, float)


def setting_name(env: Mapping[str, str], names: EnvNames) -> str:
    """The variable actually in effect: the current name, or the legacy one if only it is set."""
    current, legacy = names
    if current not in env and legacy is not None and legacy in env:
        return legacy
    return current


def raw_value(env: Mapping[str, str], names: EnvNames) -> str | None:
    """The variable's text (current name first), warning once where a legacy name is used."""
    current, legacy = names
    if current in env:
        if legacy is not None and legacy in env:
            logger.warning("%s is set, so the legacy %s is ignored.", current, legacy)
        return env[current]
    if legacy is not None and legacy in env:
        logger.warning("%s is a legacy name; set %s instead.", legacy, current)
        return env[legacy]
    return None


def number(
    env: Mapping[str, str],
    names: EnvNames,
    default: _N,
    kind: Callable[[str], _N],
    *,
    minimum: _N | None = None,
) -> _N:
    """A number from the environment; the default (with one warning) when malformed or low."""
    raw = raw_value(env, names)
    if raw is None or not raw.strip():
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        logger.warning(
            "%s=%r is not a valid number; using the default %s.",
            setting_name(env, names),
            raw,
            default,
        )
        return default
    if minimum is not None and value < minimum:
        logger.warning(
            "%s=%r is below the minimum %s; using the default %s.",
            setting_name(env, names),
            raw,
            minimum,
            default,
        )
        return default
    return value


def text(env: Mapping[str, str], names: EnvNames) -> str | None:
    """The variable's stripped text, ``None`` when unset or blank."""
    raw = raw_value(env, names)
    return raw.strip() or None if raw is not None else None


_S = TypeVar("_S", bound=str)


def choice(env: Mapping[str, str], names: EnvNames, choices: tuple[_S, ...], default: _S) -> _S:
    """One of ``choices`` (case-insensitive); the default, with one warning, for anything else."""
    raw = raw_value(env, names)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    for option in choices:
        if value == option:
            return option
    logger.warning(
        "%s=%r is not one of %s; using the default %r.",
        setting_name(env, names),
        raw,
        ", ".join(choices),
        default,
    )
    return default


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(env: Mapping[str, str], names: EnvNames, *, default: bool) -> bool:
    """A yes/no setting (``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off``);
    the default, with one warning, for anything else."""
    raw = raw_value(env, names)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    logger.warning(
        "%s=%r is neither true nor false; using the default %s.",
        setting_name(env, names),
        raw,
        "true" if default else "false",
    )
    return default


def seconds_from(env: Mapping[str, str], names: EnvNames, default: float) -> float:
    """A number of seconds above 0 from ``names``; the default (with one warning) otherwise."""
    value = number(env, names, default, float)
    if not (math.isfinite(value) and value > 0):
        logger.warning(
            "%s=%r must be a number of seconds above 0; using the default %s.",
            names[0],
            value,
            default,
        )
        return default
    return value


def max_sessions_from(env: Mapping[str, str]) -> int | None:
    """The count cap variable; ``None`` (no cap while memory is readable) when unset or bad."""
    raw = raw_value(env, ENV_MAX_SESSIONS)
    if raw is None or not raw.strip():
        return None
    try:
        value: int | None = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < 0:
        logger.warning(
            "%s=%r is not a whole number of sessions, 0 or more; setting no count cap "
            "while memory is readable (%d while it is not).",
            setting_name(env, ENV_MAX_SESSIONS),
            raw,
            BLIND_MAX_SESSIONS,
        )
        return None
    return value


def liveness_path_from(env: Mapping[str, str]) -> str | None:
    """``ADMISSION_LIVENESS_PATH``: unset or blank is none; one not starting with ``/``
    is none too, with one warning (a liveness probe on it would never pass)."""
    value = text(env, ENV_LIVENESS_PATH)
    if value is None or value.startswith("/"):
        return value
    logger.warning(
        "%s=%r does not start with '/'; serving no liveness path.", ENV_LIVENESS_PATH[0], value
    )
    return None


def agent_port_from(env: Mapping[str, str]) -> int | None:
    """``ADMISSION_AGENT_PORT``: ``None`` (no listener) when unset, blank or no port number."""
    raw = text(env, ENV_AGENT_PORT)
    if raw is None:
        return None
    if raw.isdigit() and 0 < int(raw) < 65536:
        return int(raw)
    logger.warning(
        "%s=%r is not a TCP port number (1-65535); no agent-check listener is started.",
        ENV_AGENT_PORT[0],
        raw,
    )
    return None


def shared_dir_from(env: Mapping[str, str]) -> str:
    """``ADMISSION_SHARED_DIR``: unset or blank is ``auto``; ``auto`` and ``off`` in any case."""
    value = text(env, ENV_SHARED_DIR)
    if value is None:
        return SHARED_DIR_AUTO
    if value.lower() in (SHARED_DIR_AUTO, SHARED_DIR_OFF):
        return value.lower()
    return value


def reserve_mb_from(env: Mapping[str, str]) -> int | None:
    """The reserve variable in MiB; ``None`` (derive it from the limit) when unset or malformed."""
    raw = raw_value(env, ENV_RESERVE_MB)
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip())
    except ValueError:
        logger.warning(
            "%s=%r is not a whole number of MiB; deriving the reserve from the memory limit.",
            setting_name(env, ENV_RESERVE_MB),
            raw,
        )
        return None


def queue_timeout_from(env: Mapping[str, str]) -> float:
    """``ADMISSION_QUEUE_TIMEOUT_SECONDS``; 0 (refuse at once) when unset or unusable."""
    value = number(env, ENV_QUEUE_TIMEOUT, 0.0, float)
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
    raw = text(env, ENV_PRIORITY_CLASSES)
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
    value = number(env, ENV_TENANT_MAX_SHARE, 1.0, float)
    if math.isfinite(value) and 0 < value <= 1:
        return value
    logger.warning(
        "%s=%r must be a share above 0 and at most 1; setting no share (1).",
        ENV_TENANT_MAX_SHARE[0],
        value,
    )
    return 1.0
