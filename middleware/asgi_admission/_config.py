"""All settings in one frozen dataclass, built in code or from the environment."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeGuard, get_args

from asgi_admission._admission.scheduling.priority import PriorityClass, check_priority_classes
from asgi_admission._config_env import (
    ENV_BODY_BUFFER_KB,
    ENV_BODY_TIMEOUT,
    ENV_CGROUP_ROOT,
    ENV_HIGH,
    ENV_LEARNING,
    ENV_LOAD_METRICS,
    ENV_MEMORY_SOURCE,
    ENV_PENDING_TIMEOUT,
    ENV_PROBE_SESSIONS,
    ENV_PROBE_WAIT,
    ENV_QUEUE_LIMIT,
    ENV_RECLAIMABLE,
    ENV_RESERVE_MB,
    ENV_RESERVE_MIN_MB,
    ENV_RESUME,
    ENV_RETRY_AFTER,
    ENV_SESSION_GROUPS,
    ENV_STUCK_AFTER,
    ENV_WEBSOCKET_REFUSAL,
    SHARED_DIR_AUTO,
    agent_port_from,
    choice,
    flag,
    liveness_path_from,
    max_sessions_from,
    number,
    priority_classes_from,
    queue_timeout_from,
    reserve_mb_from,
    seconds_from,
    setting_name,
    shared_dir_from,
    tenant_max_share_from,
    text,
)
from asgi_admission._memory.reading import Reclaimable

logger = logging.getLogger("asgi_admission")

MemorySource = Literal["cgroup", "host"]
Learning = Literal["raise", "adapt", "off"]
#: How a refused WebSocket handshake is answered (see ``AdmissionConfig.websocket_refusal``).
WebSocketRefusal = Literal["auto", "close", "deny"]
#: Whether process sessions get memory groups of their own (docs/session-groups.md).
SessionGroupsMode = Literal["auto", "off", "require"]

MIB: Final = 1024 * 1024
DEFAULT_HIGH_WATERMARK_PERCENT: Final = 80.0
DEFAULT_RESUME_THRESHOLD_PERCENT: Final = 70.0

DEFAULT_RETRY_AFTER_S: Final = 5
DEFAULT_RESERVE_MIN_MB: Final = 16
DEFAULT_PENDING_TIMEOUT_S: Final = 120.0
DEFAULT_BODY_TIMEOUT_S: Final = 10.0
DEFAULT_BODY_BUFFER_KB: Final = 64
DEFAULT_PROBE_SESSIONS: Final = 1
DEFAULT_PROBE_WAIT_S: Final = 5.0
DEFAULT_STUCK_AFTER_S: Final = 300.0
#: How many session requests may wait at once: a waiter costs a few KiB, and more than
#: this many waiting means capacity is not coming back within one wait.
DEFAULT_QUEUE_LIMIT: Final = 256


def watermarks_consistent(high: float, resume: float) -> bool:
    """Whether ``0 < resume <= high <= 100``, both finite."""
    return math.isfinite(high) and math.isfinite(resume) and 0 < resume <= high <= 100


def check_one_of(value: object, kind: object, setting: str) -> None:
    options = [repr(option) for option in get_args(kind)]
    if value not in get_args(kind):
        raise ValueError(
            f"{setting} must be {', '.join(options[:-1])} or {options[-1]}; got {value!r}."
        )


def _at_least_0(value: int, setting: str) -> None:
    if value < 0:
        raise ValueError(f"{setting} must be 0 or more; got {value!r}.")


def _seconds_above_0(value: float, setting: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{setting} must be a number of seconds above 0; got {value!r}.")


def _is_number(value: object) -> TypeGuard[float]:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def check_watermarks(high: float, resume: float, reserve_bytes: int | None) -> None:
    """Raise ``ValueError`` naming the setting unless the latch's settings are usable."""
    if not watermarks_consistent(high, resume):
        raise ValueError(
            "resume_threshold_percent and high_watermark_percent must satisfy "
            f"0 < resume <= high <= 100; got resume={resume!r}, high={high!r}."
        )
    if reserve_bytes is not None and reserve_bytes < 0:
        raise ValueError(
            "reserve_bytes must be 0 or more, or None to derive it from the memory limit; "
            f"got {reserve_bytes!r}."
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionConfig:
    """Every admission setting; invalid combinations raise ``ValueError``.

    ``reserve_bytes`` is the memory held back for each session admitted but not
    yet started, so the effective admission ceiling is the high watermark minus
    one reserve (more while sessions are pending); ``None`` derives it from the
    memory limit found (an eighth of it, at most 768 MiB). ``max_sessions`` caps
    active plus pending sessions whether memory is readable or not; ``None`` sets no
    cap while memory is readable and ``BLIND_MAX_SESSIONS`` while the guard is blind;
    ``0`` admits no session at all. docs/configuration.md describes every field (its
    table "``AdmissionConfig``") and the variable each is read from.
    """

    high_watermark_percent: float = DEFAULT_HIGH_WATERMARK_PERCENT
    resume_threshold_percent: float = DEFAULT_RESUME_THRESHOLD_PERCENT
    reserve_bytes: int | None = None
    max_sessions: int | None = None
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    cgroup_root: str | None = None
    memory_source: MemorySource = "cgroup"
    reclaimable: Reclaimable = "file"
    shared_dir: str = SHARED_DIR_AUTO
    reserve_learning: Learning = "raise"
    reserve_min_bytes: int = DEFAULT_RESERVE_MIN_MB * MIB
    pending_timeout_s: float = DEFAULT_PENDING_TIMEOUT_S
    websocket_refusal: WebSocketRefusal = "auto"
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    body_buffer_bytes: int = DEFAULT_BODY_BUFFER_KB * 1024
    probe_sessions: int = DEFAULT_PROBE_SESSIONS
    probe_wait_s: float = DEFAULT_PROBE_WAIT_S
    session_groups: SessionGroupsMode = "auto"
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S
    liveness_path: str | None = None
    agent_port: int | None = None
    load_metrics_header: bool = False
    queue_timeout_s: float = 0.0
    queue_limit: int = DEFAULT_QUEUE_LIMIT
    priority_classes: tuple[PriorityClass, ...] = ()
    tenant_max_share: float = 1.0

    def __post_init__(self) -> None:
        check_watermarks(
            self.high_watermark_percent, self.resume_threshold_percent, self.reserve_bytes
        )
        if self.max_sessions is not None:
            _at_least_0(self.max_sessions, "max_sessions")
        if self.retry_after_s < 1:
            raise ValueError(
                f"retry_after_s must be a whole number of seconds, 1 or more; "
                f"got {self.retry_after_s!r}."
            )
        check_one_of(self.memory_source, MemorySource, "memory_source")
        check_one_of(self.reserve_learning, Learning, "reserve_learning")
        _at_least_0(self.reserve_min_bytes, "reserve_min_bytes")
        _seconds_above_0(
            self.pending_timeout_s, "pending_timeout_s (ADMISSION_PENDING_TIMEOUT_SECONDS)"
        )
        _seconds_above_0(self.body_timeout_s, "body_timeout_s (ADMISSION_BODY_TIMEOUT_SECONDS)")
        _at_least_0(self.body_buffer_bytes, "body_buffer_bytes (ADMISSION_BODY_BUFFER_KB)")
        if not isinstance(self.shared_dir, str) or not self.shared_dir.strip():
            raise ValueError(
                "shared_dir (ADMISSION_SHARED_DIR) must be 'auto' (a private place the "
                "workers of this memory group find by themselves, the default), 'off' (each "
                f"process counts its sessions alone) or a directory; got {self.shared_dir!r}."
            )
        if isinstance(self.probe_sessions, bool) or not (
            isinstance(self.probe_sessions, int) and self.probe_sessions >= 0
        ):
            raise ValueError(
                "probe_sessions (ADMISSION_PROBE_SESSIONS) must be a whole number of "
                f"sessions, 0 or more; got {self.probe_sessions!r}."
            )
        _seconds_above_0(self.probe_wait_s, "probe_wait_s (ADMISSION_PROBE_WAIT_SECONDS)")
        check_one_of(
            self.session_groups, SessionGroupsMode, "session_groups (ADMISSION_SESSION_GROUPS)"
        )
        if not (math.isfinite(self.stuck_after_s) and self.stuck_after_s >= 0):
            raise ValueError(
                "stuck_after_s (ADMISSION_STUCK_AFTER_SECONDS) must be a number of seconds, "
                f"0 (never call the pressure stuck) or more; got {self.stuck_after_s!r}."
            )
        if self.liveness_path is not None and not (
            isinstance(self.liveness_path, str) and self.liveness_path.startswith("/")
        ):
            raise ValueError(
                "liveness_path (ADMISSION_LIVENESS_PATH) must be a path starting with '/', "
                f"or None for none; got {self.liveness_path!r}."
            )
        if self.agent_port is not None and (
            type(self.agent_port) is not int or not 0 < self.agent_port < 65536
        ):
            raise ValueError(
                "agent_port (ADMISSION_AGENT_PORT) must be a TCP port number (1-65535), or "
                f"None for no agent-check listener; got {self.agent_port!r}."
            )
        if not isinstance(self.load_metrics_header, bool):
            raise ValueError(
                "load_metrics_header (ADMISSION_LOAD_METRICS_HEADER) must be True or False; "
                f"got {self.load_metrics_header!r}."
            )
        if not (_is_number(self.queue_timeout_s) and self.queue_timeout_s >= 0):
            raise ValueError(
                "queue_timeout_s (ADMISSION_QUEUE_TIMEOUT_SECONDS) must be a number of "
                f"seconds, 0 (refuse at once) or more; got {self.queue_timeout_s!r}."
            )
        if type(self.queue_limit) is not int or self.queue_limit < 0:
            raise ValueError(
                "queue_limit (ADMISSION_QUEUE_LIMIT) must be a whole number of waiting "
                f"requests, 0 or more; got {self.queue_limit!r}."
            )
        check_priority_classes(
            self.priority_classes,
            high_watermark_percent=self.high_watermark_percent,
            resume_threshold_percent=self.resume_threshold_percent,
        )
        if not (_is_number(self.tenant_max_share) and 0 < self.tenant_max_share <= 1):
            raise ValueError(
                "tenant_max_share (ADMISSION_TENANT_MAX_SHARE) must be a share above 0 and "
                f"at most 1 (1 sets none); got {self.tenant_max_share!r}."
            )
        check_one_of(self.reclaimable, Reclaimable, "reclaimable")
        check_one_of(self.websocket_refusal, WebSocketRefusal, "websocket_refusal")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AdmissionConfig:
        """Build the configuration from ``ADMISSION_*`` (or legacy ``CODA_*``) variables.

        Nothing here disables the guard: a malformed number falls back to its
        default, a self-inconsistent set of watermarks falls back to the default
        watermarks and reserve, and a negative reserve counts as 0. Each fallback
        logs one warning naming the variable.
        """
        env = os.environ if environ is None else environ
        high = number(env, ENV_HIGH, DEFAULT_HIGH_WATERMARK_PERCENT, float)
        resume = number(env, ENV_RESUME, DEFAULT_RESUME_THRESHOLD_PERCENT, float)
        reserve_mb = reserve_mb_from(env)
        if reserve_mb is not None and reserve_mb < 0:
            logger.warning(
                "%s=%d is negative; using a reserve of 0 MB.",
                setting_name(env, ENV_RESERVE_MB),
                reserve_mb,
            )
            reserve_mb = 0
        if not watermarks_consistent(high, resume):
            logger.warning(
                "%s=%s and %s=%s are inconsistent (need 0 < resume <= high <= 100); "
                "using the default watermarks %s/%s and a reserve derived from the limit.",
                setting_name(env, ENV_HIGH),
                high,
                setting_name(env, ENV_RESUME),
                resume,
                DEFAULT_HIGH_WATERMARK_PERCENT,
                DEFAULT_RESUME_THRESHOLD_PERCENT,
            )
            high, resume = DEFAULT_HIGH_WATERMARK_PERCENT, DEFAULT_RESUME_THRESHOLD_PERCENT
            reserve_mb = None
        max_sessions = max_sessions_from(env)
        retry_after = number(env, ENV_RETRY_AFTER, DEFAULT_RETRY_AFTER_S, int, minimum=1)
        min_mb = number(env, ENV_RESERVE_MIN_MB, DEFAULT_RESERVE_MIN_MB, int, minimum=0)
        timeout = seconds_from(env, ENV_PENDING_TIMEOUT, DEFAULT_PENDING_TIMEOUT_S)
        body_timeout = seconds_from(env, ENV_BODY_TIMEOUT, DEFAULT_BODY_TIMEOUT_S)
        buffer_kb = number(env, ENV_BODY_BUFFER_KB, DEFAULT_BODY_BUFFER_KB, int, minimum=0)
        probes = number(env, ENV_PROBE_SESSIONS, DEFAULT_PROBE_SESSIONS, int, minimum=0)
        probe_wait = seconds_from(env, ENV_PROBE_WAIT, DEFAULT_PROBE_WAIT_S)
        stuck_after = number(env, ENV_STUCK_AFTER, DEFAULT_STUCK_AFTER_S, float, minimum=0.0)
        if not math.isfinite(stuck_after):
            logger.warning(
                "%s=%r is not a number of seconds; using the default %s.",
                ENV_STUCK_AFTER[0],
                stuck_after,
                DEFAULT_STUCK_AFTER_S,
            )
            stuck_after = DEFAULT_STUCK_AFTER_S
        return cls(
            high_watermark_percent=high,
            resume_threshold_percent=resume,
            reserve_bytes=None if reserve_mb is None else reserve_mb * MIB,
            max_sessions=max_sessions,
            retry_after_s=retry_after,
            cgroup_root=text(env, ENV_CGROUP_ROOT),
            memory_source=choice(env, ENV_MEMORY_SOURCE, get_args(MemorySource), "cgroup"),
            reclaimable=choice(env, ENV_RECLAIMABLE, get_args(Reclaimable), "file"),
            shared_dir=shared_dir_from(env),
            websocket_refusal=choice(
                env, ENV_WEBSOCKET_REFUSAL, get_args(WebSocketRefusal), "auto"
            ),
            reserve_learning=choice(env, ENV_LEARNING, get_args(Learning), "raise"),
            reserve_min_bytes=min_mb * MIB,
            pending_timeout_s=timeout,
            body_timeout_s=body_timeout,
            body_buffer_bytes=buffer_kb * 1024,
            probe_sessions=probes,
            probe_wait_s=probe_wait,
            session_groups=choice(env, ENV_SESSION_GROUPS, get_args(SessionGroupsMode), "auto"),
            stuck_after_s=stuck_after,
            liveness_path=liveness_path_from(env),
            agent_port=agent_port_from(env),
            load_metrics_header=flag(env, ENV_LOAD_METRICS, default=False),
            queue_timeout_s=queue_timeout_from(env),
            queue_limit=number(env, ENV_QUEUE_LIMIT, DEFAULT_QUEUE_LIMIT, int, minimum=0),
            priority_classes=priority_classes_from(env, high=high, resume=resume),
            tenant_max_share=tenant_max_share_from(env),
        )
