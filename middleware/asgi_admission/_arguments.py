"""``AdmissionMiddleware``'s arguments: checked, then resolved.

Each argument about admission left out is the configuration's
(``AdmissionConfig.from_env()`` when no ``config`` is given); a bad argument is a
``ValueError`` naming it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import Scope

from asgi_admission._admission.decision.latch import AdmissionController
from asgi_admission._admission.decision.retry_after import RetryAfterPolicy, coerce_policy
from asgi_admission._config import AdmissionConfig, WebSocketRefusal, check_one_of
from asgi_admission._factory import build_controller
from asgi_admission._watchdog.watchdog import SessionWatchdog

logger = logging.getLogger("asgi_admission")


@dataclass(frozen=True, slots=True)
class Arguments:
    """What the guard is built with, every default filled in."""

    config: AdmissionConfig
    controller: AdmissionController
    #: The configured count cap; ``None``: none while memory is readable.
    session_limit: int | None
    retry_after: RetryAfterPolicy
    websocket_refusal: WebSocketRefusal
    liveness_path: str | None


def check_watchdog(watchdog: object) -> None:
    """A ``watchdog`` is a ``SessionWatchdog`` or ``None``."""
    if watchdog is not None and not isinstance(watchdog, SessionWatchdog):
        raise ValueError(f"watchdog must be a SessionWatchdog or None; got {watchdog!r}.")


def check_callables(
    *,
    routes: bool,
    session_predicate: Callable[[Scope], bool] | None,
    priority: Callable[[Scope], str] | None,
    tenant: Callable[[Scope], str | None] | None,
) -> None:
    """The callables that pick and sort session requests, each a callable or ``None``,
    and something to guard: session ``routes`` (true: some) or a predicate."""
    if session_predicate is not None and not callable(session_predicate):
        raise ValueError(
            f"session_predicate must be a callable taking the ASGI scope; "
            f"got {session_predicate!r}."
        )
    if not routes and session_predicate is None:
        raise ValueError(
            "AdmissionMiddleware needs session_routes (e.g. ['POST /sessions']) or a "
            "session_predicate; without either it would guard nothing."
        )
    if priority is not None and not callable(priority):
        raise ValueError(
            f"priority must be a callable taking the ASGI scope and returning a priority "
            f"class's name; got {priority!r}."
        )
    if tenant is not None and not callable(tenant):
        raise ValueError(
            f"tenant must be a callable taking the ASGI scope and returning the tenant's "
            f"name or None; got {tenant!r}."
        )


def check_arguments(
    *,
    config: AdmissionConfig | None,
    controller: AdmissionController | None,
    current_sessions: Callable[[], int] | None,
    max_sessions: int | None,
    retry_after: RetryAfterPolicy | int | None,
    readiness_path: str | None,
    liveness_path: str | None,
    websocket_refusal: WebSocketRefusal | None,
    agent_port: int | None,
) -> Arguments:
    """The arguments checked, in the order the constructor takes them, and resolved."""
    if current_sessions is not None and not callable(current_sessions):
        raise ValueError(
            f"current_sessions must be a callable returning an int; got {current_sessions!r}."
        )
    if readiness_path is not None and not (
        isinstance(readiness_path, str) and readiness_path.startswith("/")
    ):
        raise ValueError(f"readiness_path must start with '/'; got {readiness_path!r}.")
    if config is not None and controller is not None:
        raise ValueError(
            "Pass config or controller, not both: the controller carries its own "
            "thresholds, reserve and reader, and config would describe different ones."
        )
    config = config if config is not None else AdmissionConfig.from_env()
    if agent_port is not None:
        config = dataclasses.replace(config, agent_port=agent_port)
    if liveness_path is None:
        liveness_path = config.liveness_path
    elif not (isinstance(liveness_path, str) and liveness_path.startswith("/")):
        raise ValueError(f"liveness_path must start with '/'; got {liveness_path!r}.")
    if liveness_path is not None and liveness_path == readiness_path:
        raise ValueError(
            f"liveness_path and readiness_path are both {liveness_path!r}; give them "
            "different paths (liveness_path comes from ADMISSION_LIVENESS_PATH when not "
            "given): the readiness path fails whenever the latch is set, and a liveness "
            "probe on it would restart the pod each time."
        )
    if controller is None:
        controller = build_controller(config)
    # None: no count cap while memory is readable, the fallback one while blind.
    limit = config.max_sessions if max_sessions is None else max_sessions
    if limit is not None and (type(limit) is not int or limit < 0):  # bool is not int here
        raise ValueError(f"max_sessions must be a whole number, 0 or more; got {limit!r}.")
    if limit == 0:
        logger.warning(
            "asgi-admission: max_sessions is 0, so every session request is refused "
            "(reason session_limit) while other requests pass."
        )
    policy = coerce_policy(retry_after, config.retry_after_s)
    if websocket_refusal is None:
        websocket_refusal = config.websocket_refusal
    else:
        check_one_of(websocket_refusal, WebSocketRefusal, "websocket_refusal")
    return Arguments(config, controller, limit, policy, websocket_refusal, liveness_path)
