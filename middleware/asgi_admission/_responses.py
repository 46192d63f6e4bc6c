"""What the guard answers itself: a refused client's answer, readiness and liveness.

What each kind of client receives, and why: docs/clients.md. Memory figures are
internals, so they go in the problem body only when the operator opts in
(``expose_details=True``); ``Cache-Control: no-store`` keeps a proxy from replaying a
refusal.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Final

from starlette.types import Receive, Scope, Send

from asgi_admission._admission.decision.latch import (
    CapacityDecision,
    Reason,
    count_cap,
    count_cap_from,
)
from asgi_admission._admission.service import AdmissionService
from asgi_admission._config import WebSocketRefusal

PROBLEM_TYPE_PREFIX: Final = "urn:asgi-admission:problem:"

_TITLES: Final[dict[str, str]] = {
    "memory_pressure": "Not enough memory for a new session",
    "session_limit": "Session limit reached",
    "telemetry_unavailable": "Session limit reached",
    "no_memory_limit": "Session limit reached",
    "ledger_busy": "Session count unavailable",
    "probing": "Measuring what a new session costs",
    "queue_timeout": "Not enough memory for a new session",
    "queue_full": "Too many session requests waiting",
    "tenant_share": "Your share of the sessions is in use",
}
_DETAILS: Final[dict[str, str]] = {
    "memory_pressure": (
        "The service is too close to its memory limit to start another session safely."
    ),
    "session_limit": "The service is already running as many sessions as it allows.",
    "telemetry_unavailable": (
        "Memory readings are unavailable, so the service admits only up to its fixed "
        "session limit, which is reached."
    ),
    "no_memory_limit": (
        "The service has no memory limit to measure against, so it admits only up to its "
        "fixed session limit, which is reached."
    ),
    "ledger_busy": (
        "The count of sessions shared by the service's workers could not be read in time, "
        "so no new session is started."
    ),
    "probing": (
        "The service is still measuring the memory of its first sessions of this kind, "
        "and this request's wait for that measurement ran out."
    ),
    "queue_timeout": (
        "The service had no capacity for another session, and this request's wait for "
        "capacity ran out."
    ),
    "queue_full": (
        "The service has no capacity for another session, and as many session requests as it "
        "lets wait are waiting already."
    ),
    "tenant_share": (
        "Others are waiting for a session, and yours already hold your share of the "
        "service's sessions."
    ),
}
_STATIC_HEADERS: Final = (
    (b"content-type", b"application/problem+json"),
    (b"cache-control", b"no-store"),
)
#: RFC 6455 §7.4.1 limits a close frame's reason to 123 bytes.
_MAX_CLOSE_REASON: Final = 123
WS_TRY_AGAIN_LATER: Final = 1013


@dataclass(slots=True, eq=False)
class Refusal:
    """The problem+json body of a refusal by ``service``'s guard; ``expose_details``: with
    its figures. A body without them is built once per reason and delay."""

    service: AdmissionService
    expose_details: bool
    _bodies: dict[tuple[str, int], bytes] = field(default_factory=dict, init=False)

    def body(
        self, decision: CapacityDecision, retry_after_s: int, counts: tuple[int, int]
    ) -> bytes:
        """The problem+json body; ``counts`` is ``(active, pending)``."""
        reason: Reason = decision.reason or "session_limit"
        if not self.expose_details:
            key = (reason, retry_after_s)
            cached = self._bodies.get(key)
            if cached is None:
                cached = self._encode(reason, retry_after_s, {})
                if len(self._bodies) < 512:
                    self._bodies[key] = cached
            return cached
        controller = self.service.controller
        reservations = self.service.reservations
        session_limit = self.service.session_limit
        memory = decision.memory
        blind = decision.state == "unavailable"
        details: dict[str, object] = {
            "state": decision.state,
            "memory": {
                "working_set_bytes": memory.used_bytes,
                "limit_bytes": memory.limit_bytes,
                "percent": memory.percent,
                "high_watermark_percent": controller.high_watermark_percent,
                "resume_threshold_percent": controller.resume_threshold_percent,
                "reserve_bytes": controller.reserve_for(memory.limit_bytes),
            },
            "sessions": {
                "active": counts[0],
                "pending": counts[1],
                "limit": count_cap(session_limit, blind),
                "limit_from": count_cap_from(session_limit, blind),
            },
            "learned": [estimate.shown() for estimate in reservations.estimates()],
            "probing": [dataclasses.asdict(status) for status in reservations.probe_status()],
        }
        return self._encode(reason, retry_after_s, details)

    @staticmethod
    def _encode(reason: Reason, retry_after_s: int, details: dict[str, object]) -> bytes:
        detail = f"{_DETAILS[reason]} Retry after {retry_after_s} seconds."
        return _problem(
            reason, _TITLES[reason], 503, detail, retry_after_s=retry_after_s, **details
        )


def _problem(reason: str, title: str, status: int, detail: str, **more: object) -> bytes:
    """A problem+json body naming the guard's ``reason``, then ``more``."""
    problem = {
        "type": PROBLEM_TYPE_PREFIX + reason,
        "title": title,
        "status": status,
        "detail": detail,
        "reason": reason,
        **more,
    }
    return json.dumps(problem, separators=(",", ":")).encode()


def refusal_headers(retry_after_s: int, body: bytes) -> list[tuple[bytes, bytes]]:
    return [
        *_STATIC_HEADERS,
        (b"retry-after", str(retry_after_s).encode()),
        (b"content-length", str(len(body)).encode()),
    ]


async def send_http_refusal(send: Send, retry_after_s: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": refusal_headers(retry_after_s, body),
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_request_timeout(send: Send, timeout_s: float) -> None:
    """``408`` for a session request whose body did not arrive in time; the connection
    closes, since the rest of the body may still be on its way."""
    detail = f"The request's body did not arrive within {timeout_s:g} seconds."
    body = _problem("body_timeout", "Request body not received in time", 408, detail)
    await send(
        {
            "type": "http.response.start",
            "status": 408,
            "headers": [
                *_STATIC_HEADERS,
                (b"connection", b"close"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def answer_readiness(service: AdmissionService, scope: Scope, send: Send) -> None:
    """The readiness answer: 200 while sessions can be admitted, 503 while latched or
    while the shared ledger is held, with the latch state in a small JSON body."""
    state = await service.checks.readiness()
    ready = state not in ("pressured", "ledger_busy")
    body = b'{"ready":true,"state":"%s"}' if ready else b'{"ready":false,"state":"%s"}'
    body = body % state.encode()
    await _send_json(scope, send, 200 if ready else 503, body)


async def answer_liveness(service: AdmissionService, scope: Scope, send: Send) -> None:
    """The liveness answer: 200, or 503 while the pressure has been stuck long enough
    that the pod should be restarted, with how long the latch has been held."""
    status = service.checks.liveness()
    failing = status.liveness_failing
    if failing:
        body = b'{"alive":false,"stuck":true,"held_s":%d}' % int(status.held_s)
    else:
        body = b'{"alive":true}'
    await _send_json(scope, send, 503 if failing else 200, body)


async def _send_json(scope: Scope, send: Send, status: int, body: bytes) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"cache-control", b"no-store"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


def close_reason(retry_after_s: int, reason: Reason) -> str:
    """The 1013 close reason: ``retry_after_s=N; reason=R; <title>``, at most 123 bytes."""
    text = f"retry_after_s={retry_after_s}; reason={reason}; {_TITLES[reason]}"
    return text.encode()[:_MAX_CLOSE_REASON].decode(errors="ignore")


def websocket_denial(mode: WebSocketRefusal, scope: Scope) -> bool:
    """Whether to refuse this handshake with the 503 denial response, not accept + 1013."""
    if mode == "close" or "websocket.http.response" not in (scope.get("extensions") or {}):
        return False
    if mode == "deny":
        return True
    return not any(name == b"origin" for name, _ in scope["headers"])


async def send_websocket_refusal(
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    denial: bool,
    retry_after_s: int,
    reason: Reason,
    body: bytes,
) -> None:
    # The server sends websocket.connect first; a client that already left gets nothing.
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if denial:
        await send(
            {
                "type": "websocket.http.response.start",
                "status": 503,
                "headers": refusal_headers(retry_after_s, body),
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
        return
    # A browser that asked for subprotocols fails an accept that names none (1006).
    subprotocols = scope.get("subprotocols") or ()
    await send(
        {"type": "websocket.accept", "subprotocol": subprotocols[0] if subprotocols else None}
    )
    await send(
        {
            "type": "websocket.close",
            "code": WS_TRY_AGAIN_LATER,
            "reason": close_reason(retry_after_s, reason),
        }
    )
