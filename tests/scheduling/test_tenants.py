"""Fair share: sessions counted per tenant, the share checked, and memory bounded."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asgi_admission._admission.scheduling.tenants import TenantShares, TenantSlot

#: Internal on purpose: the scheduler's per-tenant session counts.
INTERNAL = "the scheduler's per-tenant session counts"


def test_a_tenant_at_half_of_the_sessions_is_over_a_half_share() -> None:
    """With a share of 0.5, a tenant holding 2 of 4 may not take a third; the others may."""
    shares = TenantShares(max_share=0.5)
    for tenant in ("a", "a", "b", "c"):
        shares.admitted(tenant)
    assert shares.over_share("a", counted_total=4)
    assert not shares.over_share("b", counted_total=4)
    assert not shares.over_share("new", counted_total=4)


def test_a_tenant_may_always_hold_one_session() -> None:
    """The first session of a tenant is never over its share, however small the share."""
    shares = TenantShares(max_share=0.1)
    assert not shares.over_share("a", counted_total=0)
    shares.admitted("a")
    assert shares.over_share("a", counted_total=1)
    assert not shares.over_share("b", counted_total=1)


def test_no_share_and_no_tenant_are_never_over() -> None:
    """A share of 1 sets none, and a request without a tenant is never held to one."""
    off = TenantShares(max_share=1.0)
    off.admitted("a")
    assert not off.enabled
    assert not off.over_share("a", counted_total=1)
    assert not TenantShares(max_share=0.2).over_share(None, counted_total=50)


def test_a_tenant_is_forgotten_with_its_last_session() -> None:
    """Releasing every session of a tenant drops its entry: with room for one name, the
    next tenant is tracked by its own name again, not in the shared bucket."""
    shares = TenantShares(max_share=0.5, max_tenants=1)
    slots = [shares.admitted("a") for _ in range(3)]
    assert shares.over_share("a", counted_total=3)
    shares.released(shares.admitted("b"))
    for slot in slots:
        shares.released(slot)
    assert not shares.over_share("a", counted_total=0)
    assert shares.admitted("b") == TenantSlot("b")


def test_invented_tenant_names_grow_nothing_beyond_the_cap() -> None:
    """A client inventing a name per request: at most max_tenants are tracked, the rest
    share one bucket that is held to one share, and releasing empties everything."""
    shares = TenantShares(max_share=0.5, max_tenants=4)
    slots = [shares.admitted(f"invented-{n}") for n in range(1000)]
    assert slots[:4] == [TenantSlot(f"invented-{n}") for n in range(4)]
    assert set(slots[4:]) == {TenantSlot(None)}
    assert shares.over_share("another-new-name", counted_total=1000)
    for slot in slots:
        shares.released(slot)
    assert not shares.over_share("invented-999", counted_total=0)
    assert [shares.admitted(f"new-{n}") for n in range(4)] == [
        TenantSlot(f"new-{n}") for n in range(4)
    ]


@pytest.mark.parametrize("share", [0.0, -0.5, 1.01])
def test_a_share_outside_zero_to_one_is_refused(share: float) -> None:
    """A share must be above 0 and at most 1, and the error names the setting."""
    with pytest.raises(ValueError, match=r"ADMISSION_TENANT_MAX_SHARE"):
        TenantShares(max_share=share)
    with pytest.raises(ValueError, match="max_tenants must be 1 or more"):
        TenantShares(max_share=0.5, max_tenants=0)


def test_counts_survive_threads() -> None:
    """Admissions and releases from eight threads at once leave every count at zero."""
    shares = TenantShares(max_share=0.5, max_tenants=8)

    def churn(n: int) -> None:
        for i in range(500):
            shares.released(shares.admitted(f"t{(n + i) % 12}"))

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Nothing left tracked: eight new names each get their own count, and the shared
    # bucket (what an untracked name counts under once eight are tracked) is empty.
    assert [shares.admitted(f"new{n}") for n in range(8)] == [
        TenantSlot(f"new{n}") for n in range(8)
    ]
    assert not any(shares.over_share(f"t{n}", counted_total=1) for n in range(12))


@settings(max_examples=200, deadline=None)
@given(
    share=st.sampled_from([0.25, 0.5, 0.75]),
    program=st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 20)), max_size=60),
)
def test_admitting_only_within_share_keeps_every_tenant_within_it(
    share: float, program: list[tuple[bool, int, int]]
) -> None:
    """Where sessions are admitted only when not over share, after each admission the
    tenant holds at most its share of the counted sessions (or just the one)."""
    shares = TenantShares(max_share=share)
    held: list[tuple[str, TenantSlot]] = []
    for admit, tenant_number, pick in program:
        tenant = f"t{tenant_number}"
        if admit:
            if not shares.over_share(tenant, counted_total=len(held)):
                held.append((tenant, shares.admitted(tenant)))
                mine = sum(1 for name, _ in held if name == tenant)
                assert mine <= max(1, share * len(held))
        elif held:
            _, slot = held.pop(pick % len(held))
            shares.released(slot)
    for _, slot in held:
        shares.released(slot)
    assert not any(shares.over_share(f"t{n}", counted_total=0) for n in range(4))
