"""Parsing cgroup memory files: value files, ``memory.stat`` counters and PSI.

Nothing here raises on bad data: a malformed value is ``None`` and a malformed
``memory.stat`` counter counts as 0, so bad data can only make the guard more
conservative.
"""

from __future__ import annotations

from typing import Final


def parse_cgroup_memory_value(value: str, *, allow_max: bool = False) -> int | None:
    """Parse one cgroup byte value: a base-10 integer, else ``None``.

    Negative numbers and junk give ``None``; so does ``"max"``, but only with
    ``allow_max`` (where it means "no limit"). Only plain ASCII digits count:
    Python's ``int`` would also take ``1_000``, ``+5`` or other scripts' digits,
    none of which the kernel writes.
    """
    value = value.strip()
    if allow_max and value == "max":
        return None
    return parse_bytes_value(value) if value.isascii() else None


def parse_bytes_value(text: str | bytes) -> int | None:
    """A value file's content as a non-negative integer, ``None`` for anything else.

    ``isdigit`` on bytes is ASCII-only: no sign, no ``1_000``, nothing ``int()``
    would stretch to. This runs on every decision.
    """
    text = text.strip()
    if not text.isdigit():
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() accepts (sys.get_int_max_str_digits)
        return None


MALFORMED: Final = -1


def stat_key(key: bytes) -> tuple[bytes, bytes]:
    """The two spellings of ``key`` at a line start in ``memory.stat``: first line, later line."""
    return key + b" ", b"\n" + key + b" "


def find_stat(data: bytes, key: tuple[bytes, bytes]) -> int | None:
    """The counter ``key`` (from :func:`stat_key`) in ``memory.stat`` text, ``None`` when absent.

    The first line whose first field is the key counts. A value that is not a
    non-negative integer gives ``MALFORMED``, so callers can tell "absent" (fall
    back to another key) from "present but unusable" (count as 0).
    """
    first, later = key
    # The common case is a single C-level scan: the key found at a line start.
    found = data.find(first)
    if found < 0:
        return None
    if found > 0 and data[found - 1] != 0x0A:
        # A match inside another line ("inactive_file " inside "total_inactive_file ").
        found = data.find(later, found)
        if found < 0:
            return None
        found += 1
    start = found + len(first)
    end = data.find(b"\n", start)
    value = parse_bytes_value(data[start:] if end < 0 else data[start:end])
    return MALFORMED if value is None else value


HIERARCHICAL_LIMIT: Final = stat_key(b"hierarchical_memory_limit")
_INACTIVE: Final = stat_key(b"inactive_file")
_ACTIVE: Final = stat_key(b"active_file")
_TOTAL_INACTIVE: Final = stat_key(b"total_inactive_file")
_TOTAL_ACTIVE: Final = stat_key(b"total_active_file")

# The counters to subtract, as (preferred key, fallback key or None), per mode and version.
StatKeys = tuple[tuple[tuple[bytes, bytes], tuple[bytes, bytes] | None], ...]
RECLAIMABLE_KEYS: Final[dict[tuple[str, bool], StatKeys]] = {
    ("file", False): ((_INACTIVE, None), (_ACTIVE, None)),
    ("inactive", False): ((_INACTIVE, None),),
    ("file", True): ((_TOTAL_INACTIVE, _INACTIVE), (_TOTAL_ACTIVE, _ACTIVE)),
    ("inactive", True): ((_TOTAL_INACTIVE, _INACTIVE),),
}


def reclaimable_bytes(stat: bytes, keys: StatKeys) -> int:
    total = 0
    for preferred, fallback in keys:
        value = find_stat(stat, preferred)
        if value is None and fallback is not None:
            value = find_stat(stat, fallback)
        if value is not None and value > 0:
            total += value
    return total


def parse_pressure_some_avg10(data: bytes) -> float | None:
    """PSI ``some avg10`` (percent) from a ``memory.pressure`` file; ``None`` if absent."""
    for line in data.splitlines():
        if line.startswith(b"some "):
            for field in line.split()[1:]:
                name, _, value = field.partition(b"=")
                if name == b"avg10":
                    try:
                        parsed = float(value)
                    except ValueError:
                        return None
                    return parsed if 0.0 <= parsed <= 100.0 else None
    return None
