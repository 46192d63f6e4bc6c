"""The settings' environment variables: where each setting comes from, with the readers
of the settings that need more than ``_env``'s: each falls back to its default with one
warning naming the variable, and never raises (``AdmissionConfig.from_env``,
docs/configuration.md)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Final

from asgi_admission import _env
from asgi_admission._admission.scheduling.priority import (
    ENV_PRIORITY_CLASSES,
    ENV_QUEUE_LIMIT,
    ENV_QUEUE_TIMEOUT,
    ENV_TENANT_MAX_SHARE,
)

logger = logging.getLogger("asgi_admission")

#: The count cap while the guard is blind (memory unreadable, or no limit to take a
#: percentage of) and no ``max_sessions`` is set; with memory readable, memory decides.
BLIND_MAX_SESSIONS: Final = 16
#: ``shared_dir`` values that name no directory: a private place of this user and
#: memory group, found by the guard (the default), or none (each process counts alone).
SHARED_DIR_AUTO: Final = "auto"
SHARED_DIR_OFF: Final = "off"
# (current name, legacy name from the deployment this guard replaced, or None)
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
#: Each field of AdmissionConfig and the variables from_env reads it from (the
#: documentation's configuration reference is checked against this).
ENVIRONMENT: Final[Mapping[str, tuple[str, str | None]]] = {
    "high_watermark_percent": ENV_HIGH,
    "resume_threshold_percent": ENV_RESUME,
    "reserve_bytes": ENV_RESERVE_MB,
    "max_sessions": ENV_MAX_SESSIONS,
    "retry_after_s": ENV_RETRY_AFTER,
    "cgroup_root": ENV_CGROUP_ROOT,
    "memory_source": ENV_MEMORY_SOURCE,
    "reclaimable": ENV_RECLAIMABLE,
    "shared_dir": ENV_SHARED_DIR,
    "websocket_refusal": ENV_WEBSOCKET_REFUSAL,
    "reserve_learning": ENV_LEARNING,
    "reserve_min_bytes": ENV_RESERVE_MIN_MB,
    "pending_timeout_s": ENV_PENDING_TIMEOUT,
    "body_timeout_s": ENV_BODY_TIMEOUT,
    "body_buffer_bytes": ENV_BODY_BUFFER_KB,
    "probe_sessions": ENV_PROBE_SESSIONS,
    "probe_wait_s": ENV_PROBE_WAIT,
    "session_groups": ENV_SESSION_GROUPS,
    "stuck_after_s": ENV_STUCK_AFTER,
    "liveness_path": ENV_LIVENESS_PATH,
    "agent_port": ENV_AGENT_PORT,
    "load_metrics_header": ENV_LOAD_METRICS,
    "queue_timeout_s": ENV_QUEUE_TIMEOUT,
    "queue_limit": ENV_QUEUE_LIMIT,
    "priority_classes": ENV_PRIORITY_CLASSES,
    "tenant_max_share": ENV_TENANT_MAX_SHARE,
}


def seconds_from(env: Mapping[str, str], names: _env.EnvNames, default: float) -> float:
    """A number of seconds above 0 from ``names``; the default (with one warning) otherwise."""
    value = _env.number(env, names, default, float)
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
    raw = _env.raw_value(env, ENV_MAX_SESSIONS)
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
            _env.setting_name(env, ENV_MAX_SESSIONS),
            raw,
            BLIND_MAX_SESSIONS,
        )
        return None
    return value


def liveness_path_from(env: Mapping[str, str]) -> str | None:
    """``ADMISSION_LIVENESS_PATH``: unset or blank is none; one not starting with ``/``
    is none too, with one warning (a liveness probe on it would never pass)."""
    value = _env.text(env, ENV_LIVENESS_PATH)
    if value is None or value.startswith("/"):
        return value
    logger.warning(
        "%s=%r does not start with '/'; serving no liveness path.", ENV_LIVENESS_PATH[0], value
    )
    return None


def agent_port_from(env: Mapping[str, str]) -> int | None:
    """``ADMISSION_AGENT_PORT``: ``None`` (no listener) when unset, blank or no port number."""
    raw = _env.text(env, ENV_AGENT_PORT)
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
    value = _env.text(env, ENV_SHARED_DIR)
    if value is None:
        return SHARED_DIR_AUTO
    if value.lower() in (SHARED_DIR_AUTO, SHARED_DIR_OFF):
        return value.lower()
    return value


def reserve_mb_from(env: Mapping[str, str]) -> int | None:
    """The reserve variable in MiB; ``None`` (derive it from the limit) when unset or malformed."""
    raw = _env.raw_value(env, ENV_RESERVE_MB)
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip())
    except ValueError:
        logger.warning(
            "%s=%r is not a whole number of MiB; deriving the reserve from the memory limit.",
            _env.setting_name(env, ENV_RESERVE_MB),
            raw,
        )
        return None
