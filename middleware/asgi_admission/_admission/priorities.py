"""Which priority class a session request is of (the ``priority`` callable, its route's
class, or the default one) and which tenant (``tenant``), docs/configuration.md,
"Waiting and priority".

Notes:

- ``session_routes`` may map each pattern to a class name (a plain list: every route
  of the default class); ``priority(scope)``, where given, picks the class of each
  request and wins over its route's. A ``priority`` that raises or names no
  configured class gives the request its route's class, and is logged once.
- The default class is the one named ``default`` where one is configured (and with no
  classes configured, the only one), else the last, the lowest served: a request
  nobody classified never takes the headroom kept for higher ones.
- Class names come from the configuration only, so the metrics' ``class`` label is a
  bounded set however requests are classified.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from starlette.types import Scope

from asgi_admission._admission.ledger.ledger import Reservation
from asgi_admission._admission.scheduling.priority import DEFAULT_CLASS
from asgi_admission._admission.scheduling.queue import WaitQueue
from asgi_admission._admission.scheduling.tenants import TenantShares, TenantSlot

logger = logging.getLogger("asgi_admission")


def default_class(names: tuple[str, ...]) -> str:
    """The class of a request nobody classified: ``default`` where configured, else the last."""
    return DEFAULT_CLASS if DEFAULT_CLASS in names else names[-1]


def check_route_classes(route_classes: Mapping[str, str], names: tuple[str, ...]) -> None:
    """A ``ValueError`` naming the first route mapped to a class that is not configured."""
    for pattern, name in route_classes.items():
        if name not in names:
            raise ValueError(
                f"session_routes maps {pattern!r} to the priority class {name!r}, which is "
                f"not one of the classes in force {list(names)!r} "
                "(ADMISSION_PRIORITY_CLASSES, or priority_classes in AdmissionConfig)."
            )


class Priorities:
    """The class of each session request, from ``priority`` and the route's class."""

    __slots__ = ("_default", "_logged", "_names", "_priority", "_routes")

    def __init__(
        self,
        *,
        names: tuple[str, ...],
        route_classes: Mapping[str, str],
        priority: Callable[[Scope], str] | None,
    ) -> None:
        check_route_classes(route_classes, names)
        self._names = frozenset(names)
        self._default = default_class(names)
        self._routes = dict(route_classes)
        self._priority = priority
        self._logged = False

    def of(self, scope: Scope | None, route: str) -> str:
        """The class of the request of ``scope`` that came by the pattern ``route``."""
        by_route = self._routes.get(route, self._default)
        priority = self._priority
        if priority is None or scope is None:
            return by_route
        try:
            name = priority(scope)
        except Exception:
            if not self._logged:
                self._logged = True
                logger.exception(
                    "asgi-admission: the priority callable failed; such requests are of "
                    "their route's class (%r here). Logged once.",
                    by_route,
                )
            return by_route
        if name in self._names:
            return name
        if not self._logged:
            self._logged = True
            logger.warning(
                "asgi-admission: the priority callable named the class %r, which is not one "
                "of %s; such requests are of their route's class (%r here). Logged once.",
                name,
                sorted(self._names),
                by_route,
            )
        return by_route


class Tenants:
    """Each session request's tenant (``tenant(scope)``) and the sessions each holds
    (``TenantShares``): a tenant that raises is none, logged once."""

    __slots__ = ("_logged", "_refusing_until", "_tenant", "shares")

    def __init__(self, *, tenant: Callable[[Scope], str | None], shares: TenantShares) -> None:
        self._tenant = tenant
        self.shares = shares
        self._logged = False
        # Until then requests are being refused (monotonic seconds).
        self._refusing_until = 0.0

    def refusing(self, for_s: float) -> None:
        """A request was refused: requests are being refused for ``for_s`` (the delay a
        refused client is told to come back after)."""
        self._refusing_until = time.monotonic() + for_s

    def beyond(
        self, tenant: str, counted: int, queue: WaitQueue[Any] | None, waiting: bool
    ) -> bool:
        """Whether one more session of ``tenant`` is beyond its share of the ``counted``
        sessions while others wait in ``queue`` (besides a ``waiting`` request itself) or
        requests are being refused; otherwise the share does not bind."""
        contended = (queue is not None and queue.total() > int(waiting)) or (
            time.monotonic() < self._refusing_until
        )
        return contended and self.shares.over_share(tenant, counted)

    def of(self, scope: Scope | None) -> str | None:
        """The tenant of the request of ``scope`` (``None``: none, never over a share)."""
        if scope is None:
            return None
        try:
            name = self._tenant(scope)
        except Exception:
            if not self._logged:
                self._logged = True
                logger.exception(
                    "asgi-admission: the tenant callable failed; such requests have no "
                    "tenant (no share applies to them). Logged once."
                )
            return None
        return name if isinstance(name, str) else None

    def hold(self, reservation: Reservation, tenant: str) -> Reservation:
        """``reservation`` counted for ``tenant`` until it is released."""
        return TenantReservation(reservation, self.shares, self.shares.admitted(tenant))


class TenantReservation:
    """A reservation that counts its tenant's session until it is released (once)."""

    __slots__ = ("_inner", "_released", "_shares", "_slot")

    def __init__(self, inner: Reservation, shares: TenantShares, slot: TenantSlot) -> None:
        self._inner = inner
        self._shares = shares
        self._slot = slot
        self._released = False

    def activate(self) -> None:
        self._inner.activate()

    def release(self) -> None:
        # Counted out before the ledger's release wakes the waiters, so they see it.
        if not self._released:
            self._released = True
            self._shares.released(self._slot)
        self._inner.release()
