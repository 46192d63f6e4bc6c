"""Property tests: the parsers never raise, and garbage can only make the guard more cautious."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from asgi_admission import CgroupMemoryReader
from asgi_admission._memory.reading import (
    MALFORMED,
    RECLAIMABLE_KEYS,
    find_stat,
    parse_bytes_value,
    parse_pressure_some_avg10,
    reclaimable_bytes,
    stat_key,
)

#: Internal on purpose: the memory.stat and value parsers, property-tested on their own.
INTERNAL = "the memory.stat and value parsers, property-tested on their own"


def reclaimable_file_bytes(
    stat: bytes, *, reclaimable: str = "file", prefer_total: bool = False
) -> int:
    """The reclaimable file cache the reader subtracts, for one mode and version."""
    return reclaimable_bytes(stat, RECLAIMABLE_KEYS[reclaimable, prefer_total])


SETTINGS = settings(max_examples=400, deadline=None)
KEYS = [b"inactive_file", b"active_file", b"total_inactive_file", b"total_active_file"]
counters = st.integers(min_value=0, max_value=2**62)
# A garbage value stays on its line (no newline) and is not a plain run of ASCII digits.
garbage = st.binary(max_size=24).filter(lambda b: b"\n" not in b and not b.strip().isdigit())


@SETTINGS
@given(st.binary())
def test_value_parser_never_raises(data: bytes) -> None:
    """Any bytes give None or a non-negative int, never an exception."""
    value = parse_bytes_value(data)
    assert value is None or value >= 0


@SETTINGS
@given(counters, st.sampled_from(["", " ", "\n", " \n"]))
def test_value_parser_round_trips_integers(value: int, padding: str) -> None:
    """A non-negative integer as the kernel writes it parses back to itself."""
    assert parse_bytes_value(f"{padding}{value}{padding}".encode()) == value


@SETTINGS
@given(st.binary(max_size=2048), st.sampled_from([*KEYS, b"hierarchical_memory_limit"]))
def test_stat_value_never_raises(data: bytes, key: bytes) -> None:
    """find_stat on arbitrary bytes gives None, the malformed marker, or a count."""
    value = find_stat(data, stat_key(key))
    assert value is None or value == MALFORMED or value >= 0


@SETTINGS
@given(st.binary(max_size=2048), st.sampled_from(["file", "inactive"]), st.booleans())
def test_reclaimable_never_raises(data: bytes, reclaimable: str, prefer_total: bool) -> None:
    """reclaimable_file_bytes on arbitrary bytes is a non-negative int."""
    total = reclaimable_file_bytes(data, reclaimable=reclaimable, prefer_total=prefer_total)
    assert total >= 0


@SETTINGS
@given(st.binary(max_size=512))
def test_pressure_parser_never_raises(data: bytes) -> None:
    """PSI parsing of arbitrary bytes gives None or a percentage."""
    value = parse_pressure_some_avg10(data)
    assert value is None or 0.0 <= value <= 100.0


def _stat_text(values: dict[bytes, bytes], filler: list[tuple[bytes, int]]) -> bytes:
    lines = [key + b" " + str(count).encode() for key, count in filler]
    lines += [key + b" " + value for key, value in values.items()]
    return b"\n".join(lines) + b"\n"


@SETTINGS
@given(
    st.dictionaries(st.sampled_from(KEYS), counters, min_size=1),
    st.data(),
    st.lists(st.tuples(st.sampled_from([b"anon", b"shmem", b"file", b"cache"]), counters)),
    st.sampled_from(["file", "inactive"]),
    st.booleans(),
)
def test_garbage_counter_never_lowers_working_set(
    valid: dict[bytes, int],
    data: st.DataObject,
    filler: list[tuple[bytes, int]],
    reclaimable: str,
    prefer_total: bool,
) -> None:
    """Replacing one counter with garbage never subtracts more than the valid counters did."""
    key = data.draw(st.sampled_from(sorted(valid)))
    junk = data.draw(garbage)
    good = {k: str(v).encode() for k, v in valid.items()}
    bad = {**good, key: junk}
    assert reclaimable_file_bytes(
        _stat_text(bad, filler), reclaimable=reclaimable, prefer_total=prefer_total
    ) <= reclaimable_file_bytes(
        _stat_text(good, filler), reclaimable=reclaimable, prefer_total=prefer_total
    )


@settings(max_examples=150, deadline=None)
@given(
    usage=counters,
    inactive=counters,
    active=counters,
    junk=garbage,
    which=st.sampled_from(["inactive_file", "active_file"]),
)
def test_garbage_counter_through_the_reader(
    usage: int, inactive: int, active: int, junk: bytes, which: str
) -> None:
    """Through the reader, a garbage memory.stat counter gives a working set at least as high."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "memory.current").write_text(str(usage))
        (root / "memory.max").write_text("max")
        values = {"inactive_file": str(inactive).encode(), "active_file": str(active).encode()}
        (root / "memory.stat").write_bytes(
            b"".join(k.encode() + b" " + v + b"\n" for k, v in values.items())
        )
        reader = CgroupMemoryReader(root)
        valid = reader().used_bytes
        values[which] = junk
        (root / "memory.stat").write_bytes(
            b"".join(k.encode() + b" " + v + b"\n" for k, v in values.items())
        )
        degraded = reader()
        reader.close()
    assert valid is not None
    assert valid == max(0, usage - inactive - active)
    assert degraded.available
    assert degraded.used_bytes is not None
    assert degraded.used_bytes >= valid
