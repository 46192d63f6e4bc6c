"""Fair share: the sessions each tenant holds, and whether one more would be beyond its share.

``tenant=callable(scope)`` names a request's tenant; ``ADMISSION_TENANT_MAX_SHARE`` is
the most of the counted sessions one tenant may hold while requests wait or are
refused (docs/configuration.md).

Notes:

- Bounded memory, whatever names clients invent: a tenant is tracked only while it
  holds a session, and at most ``max_tenants`` by name. Tenants first seen beyond that
  share one bucket, so together they hold at most one share. Each session keeps its
  :class:`TenantSlot`, so its release finds the count it was added to.
- A tenant may always hold one session: with ``share * total`` below one, a share
  would refuse even the first session of a tenant that holds none.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Final

#: How many tenants are tracked by name at most; beyond it they share one bucket.
DEFAULT_MAX_TENANTS: Final = 1024


@dataclass(frozen=True, slots=True)
class TenantSlot:
    """What one admitted session was counted under (``None``: the shared bucket)."""

    bucket: str | None


class TenantShares:
    """Sessions held per tenant, within a share of the counted sessions; thread-safe."""

    __slots__ = ("_counts", "_lock", "_shared", "max_share", "max_tenants")

    def __init__(self, *, max_share: float, max_tenants: int = DEFAULT_MAX_TENANTS) -> None:
        if not 0 < max_share <= 1:
            raise ValueError(
                "max_share (ADMISSION_TENANT_MAX_SHARE) must be above 0 and at most 1; "
                f"got {max_share!r}."
            )
        if max_tenants < 1:
            raise ValueError(f"max_tenants must be 1 or more; got {max_tenants!r}.")
        self.max_share = float(max_share)
        self.max_tenants = max_tenants
        self._counts: dict[str, int] = {}
        self._shared = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether a share is set (below 1): otherwise no tenant is ever over it."""
        return self.max_share < 1

    def admitted(self, tenant: str) -> TenantSlot:
        """Count one more session of ``tenant``; keep the slot with the session."""
        with self._lock:
            count = self._counts.get(tenant)
            if count is not None:
                self._counts[tenant] = count + 1
                return TenantSlot(tenant)
            if len(self._counts) < self.max_tenants:
                self._counts[tenant] = 1
                return TenantSlot(tenant)
            self._shared += 1
            return TenantSlot(None)

    def released(self, slot: TenantSlot) -> None:
        """One session counted under ``slot`` ended; a tenant left with none is forgotten."""
        with self._lock:
            bucket = slot.bucket
            if bucket is None:
                self._shared = max(0, self._shared - 1)
                return
            count = self._counts.get(bucket, 0) - 1
            if count > 0:
                self._counts[bucket] = count
            else:
                self._counts.pop(bucket, None)

    def held(self, tenant: str) -> int:
        """How many sessions the count for ``tenant`` holds (maybe the shared bucket's)."""
        with self._lock:
            return self._held(tenant)

    def _held(self, tenant: str) -> int:
        count = self._counts.get(tenant)
        if count is not None:
            return count
        return self._shared if len(self._counts) >= self.max_tenants else 0

    def over_share(self, tenant: str | None, counted_total: int) -> bool:
        """Whether one more session of ``tenant`` would hold more than its share of the
        ``counted_total`` sessions and one more."""
        if tenant is None or not self.enabled:
            return False
        with self._lock:
            after = self._held(tenant) + 1
        return after > max(1.0, self.max_share * (counted_total + 1))
