"""The session reserve for a memory limit, and the configurations that can never admit.

Unset, the reserve follows the container's size: an eighth of the limit, at most
768 MiB. Every use of the reserve goes through ``AdmissionController.reserve_for``,
the one place that says what "the reserve for this limit" is.
"""

from __future__ import annotations

from typing import Final

from asgi_admission._config import MIB

#: The largest derived reserve, and the reserve shown while no limit is known.
RESERVE_CAP_BYTES: Final = 768 * MIB
#: A derived reserve is this fraction of the limit.
RESERVE_SHARE_OF_LIMIT: Final = 8


def derived_reserve_bytes(limit_bytes: int | None) -> int:
    """An eighth of ``limit_bytes``, at most 768 MiB; 768 MiB without a limit."""
    if not limit_bytes or limit_bytes <= 0:
        return RESERVE_CAP_BYTES
    share = limit_bytes // RESERVE_SHARE_OF_LIMIT
    return share if share < RESERVE_CAP_BYTES else RESERVE_CAP_BYTES


def never_admits(
    *,
    limit_bytes: int | None,
    high_watermark_percent: float,
    reserve_bytes: int,
    reserve_configured: bool,
) -> str | None:
    """Why nothing can ever be admitted at this limit, naming the setting; ``None`` if it can.

    One reserve at or above the admission ceiling (the high watermark's share of
    the limit) refuses every session whatever the working set. Without a limit
    there is no ceiling and nothing to say.
    """
    if not limit_bytes or reserve_bytes < limit_bytes * high_watermark_percent / 100:
        return None
    ceiling_mib = limit_bytes * high_watermark_percent / 100 / MIB
    if reserve_configured:
        return (
            f"ADMISSION_SESSION_RESERVE_MB (reserve_bytes) is {reserve_bytes / MIB:.0f} MiB, at or "
            f"above the admission ceiling of the memory limit {limit_bytes / MIB:.1f} MiB "
            f"({high_watermark_percent:g}% high watermark = {ceiling_mib:.1f} MiB): no session "
            f"can ever be admitted. Set it below {ceiling_mib:.0f} MiB, or unset it to derive "
            f"the reserve from the limit ({derived_reserve_bytes(limit_bytes) / MIB:.0f} MiB "
            "here)."
        )
    return (
        f"ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT (high_watermark_percent) is "
        f"{high_watermark_percent:g}%, which leaves {ceiling_mib:.1f} MiB of the memory limit "
        f"{limit_bytes / MIB:.1f} MiB, not more than the derived session reserve "
        f"{reserve_bytes / MIB:.1f} MiB: no session can ever be admitted. Raise the high "
        "watermark, or set ADMISSION_SESSION_RESERVE_MB to what one session needs."
    )
