"""The reservation state the workers of a container share in files beside the ledger:
the settling queue, what was learned of each route, and the routes being probed.

Notes (the directory and how its files are opened: docs/trust.md, "The shared
directory and its files"):

- The settling and probing files are read and written inside the ledger's critical
  section (its ``flock`` serialises the workers); the learned file under its own.
- Once the service runs, a fault never raises out of them; startup still fails with the
  error naming ``ADMISSION_SHARED_DIR``. A malformed settling file is rebuilt empty (its
  reservations then settle by time); a malformed learned or probing file is replaced.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import logging
import os
import secrets
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

from asgi_admission._admission.ledger.safe_files import open_private_file, process_alive
from asgi_admission._admission.ledger.shared_ledger import LINK_CHECK_INTERVAL_S
from asgi_admission._admission.reservations.learning import (
    Observations,
    Overlap,
    RouteObservations,
    Window,
    empty_observations,
)
from asgi_admission._admission.reservations.probing import Probe, ProbeTrial
from asgi_admission._admission.reservations.settling import QueueRecord

logger = logging.getLogger("asgi_admission")

_T = TypeVar("_T")

SETTLING_FILE: Final = "asgi-admission.settling"
LEARNED_FILE: Final = "asgi-admission.learned"
SETTLING_MAGIC: Final = b"ASGISET1"
#: Rows in the settling file: far more unsettled sessions than one container holds.
SETTLING_CAPACITY: Final = 4096

#: magic, capacity, rows in use, the working set accounted for (-1: none).
_HEADER: Final = struct.Struct("=8sIIq")
#: pid, seq, admitted at, base, expected, left early.
_ROW: Final = struct.Struct("=qqdqq?7x")


class SharedSettleQueue:
    """The settling queue of every worker, in one file; used inside the ledger's lock."""

    __slots__ = (
        "_broken",
        "_directory",
        "_fd",
        "_known",
        "_may_follow",
        "_next_check",
        "_others",
        "_pid",
        "_rows",
        "path",
    )

    # Plain attributes, not methods that forward: the settler asks them on every pass.
    shared: Final = True
    owner_alive = staticmethod(process_alive)

    def __init__(self, directory: str, *, may_follow: Callable[[], bool] | None = None) -> None:
        # Whether this worker's ledger is the file now at its path. The queue is used
        # under the ledger's lock, so it may move to a new file only once the ledger
        # has: until then the workers already in the new ledger would write the new
        # queue under a lock this worker does not hold.
        self._may_follow = may_follow
        self._directory = directory
        self.path = os.path.join(directory, SETTLING_FILE)
        self._fd = open_private_file(directory, SETTLING_FILE)
        self._next_check = time.monotonic() + LINK_CHECK_INTERVAL_S
        self._broken = False
        self._pid = os.getpid()
        self._others: tuple[float, ...] | None = ()
        self._rows = b""
        #: The rows at the last load or store, and the records made of them (``_load``).
        self._known: tuple[bytes, list[QueueRecord]] = (b"", [])
        with self._exclusive():
            header = os.pread(self._fd, _HEADER.size, 0)
            if not self._usable(header):
                self._reset(None if not header else "an unreadable header")

    def _usable(self, header: bytes) -> bool:
        if len(header) < _HEADER.size:
            return False
        magic, capacity, count, _accounted = _HEADER.unpack(header)
        return bool(magic == SETTLING_MAGIC and capacity == SETTLING_CAPACITY and count <= capacity)

    def _reset(self, problem: str | None) -> None:
        if problem is not None:
            logger.warning(
                "asgi-admission: the shared settling queue %s was unusable (%s); starting "
                "it afresh. Sessions in it settle by time.",
                self.path,
                problem,
            )
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, _HEADER.pack(SETTLING_MAGIC, SETTLING_CAPACITY, 0, -1), 0)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def load(self) -> tuple[int | None, list[QueueRecord]]:
        now = time.monotonic()
        if now >= self._next_check:
            # An fstat per decision would show in its cost: asked at most every
            # LINK_CHECK_INTERVAL_S, as the shared ledger beside it is (ledger/shared_ledger.py).
            self._next_check = now + LINK_CHECK_INTERVAL_S
            if os.fstat(self._fd).st_nlink == 0:
                if self._following_allowed():
                    self._follow()
                else:
                    self._next_check = 0.0  # look again at the next load
        return self._load()

    def _following_allowed(self) -> bool:
        if self._may_follow is None:
            return True
        try:
            return self._may_follow()
        except OSError:
            return False

    def _load(self) -> tuple[int | None, list[QueueRecord]]:
        header = os.pread(self._fd, _HEADER.size, 0)
        if not self._usable(header):
            self._reset("an unreadable header")
            return None, []
        _magic, _capacity, count, accounted = _HEADER.unpack(header)
        if not count:
            self._others = ()
            return None, []
        data = os.pread(self._fd, count * _ROW.size, _HEADER.size)
        rows = self._rows = data[: len(data) - len(data) % _ROW.size]
        self._others = None
        known, records = self._known
        if rows != known or _encode_rows(records) != rows:
            # Made again only when the rows changed since this worker last loaded or
            # stored them (another worker's pass, or records changed and not stored):
            # the settler loads the queue several times in one critical section.
            records = [
                QueueRecord(pid, seq, admitted_at, base, expected, left_early)
                for pid, seq, admitted_at, base, expected, left_early in _ROW.iter_unpack(rows)
            ]
            self._known = rows, records
        return (None if accounted < 0 else accounted), records

    def store(self, accounted: int | None, records: list[QueueRecord]) -> None:
        if len(records) > SETTLING_CAPACITY:
            logger.warning(
                "asgi-admission: the shared settling queue %s is full; the oldest entries "
                "are dropped and settle by time.",
                self.path,
            )
            records = records[-SETTLING_CAPACITY:]
        rows = _encode_rows(records)
        header = _HEADER.pack(
            SETTLING_MAGIC, SETTLING_CAPACITY, len(records), -1 if accounted is None else accounted
        )
        os.pwrite(self._fd, header + rows, 0)
        self._known = rows, records

    def _follow(self) -> None:
        """The file was deleted or replaced: move to the one at the path now, carrying
        over this worker's own rows (each live worker carries its own: a row another
        worker has since dropped must not come back). If it cannot be opened, the old
        file still serves this worker; logged once."""
        try:
            fd = open_private_file(self._directory, SETTLING_FILE)
        except (OSError, ValueError) as exc:
            if not self._broken:
                self._broken = True
                logger.warning(
                    "asgi-admission: the shared settling queue %s was deleted and cannot be "
                    "made again (%s); this worker settles its own sessions until it can.",
                    self.path,
                    exc,
                )
            return
        accounted, records = self._load()
        old, self._fd = self._fd, fd
        try:
            with self._exclusive():
                header = os.pread(fd, _HEADER.size, 0)
                if not self._usable(header):
                    self._reset(None)
                new_accounted, new_records = self._load()
                known = {(r.pid, r.seq) for r in new_records}
                pid = os.getpid()
                moved = [r for r in records if r.pid == pid and (r.pid, r.seq) not in known]
                if moved:
                    # Those left early first (they are a prefix), then in admission order.
                    merged = sorted(new_records + moved, key=_queue_order)
                    self.store(new_accounted if new_accounted is not None else accounted, merged)
        except OSError:
            # The new file failed under us (a full disk): stay in the old one for now.
            self._fd = old
            os.close(fd)
            self._next_check = 0.0
            return
        self._broken = False
        os.close(old)
        logger.warning(
            "asgi-admission: the shared settling queue %s was deleted or replaced; this "
            "worker moved to the file now at that path.",
            self.path,
        )

    @property
    def others(self) -> tuple[float, ...]:
        """The other workers' admission times at the last load (its bytes, not its records)."""
        if self._others is None:
            pid = self._pid
            self._others = tuple(r[2] for r in _ROW.iter_unpack(self._rows) if r[0] != pid)
        return self._others

    def after_fork(self) -> None:
        # flock belongs to the open file description: a child opens its own. Never
        # raises (a fork hook has no caller to tell): if the file cannot be opened now,
        # the child keeps the parent's and looks again at its next load.
        self._others = self.others  # made with the pid of that load: the parent's
        self._pid = os.getpid()
        try:
            fd = open_private_file(self._directory, SETTLING_FILE)
        except (OSError, ValueError):
            self._next_check = 0.0
            return
        os.close(self._fd)
        self._fd = fd

    def close(self) -> None:
        os.close(self._fd)


def _encode_rows(records: list[QueueRecord]) -> bytes:
    return b"".join(
        _ROW.pack(r.pid, r.seq, r.admitted_at, r.base_bytes, r.expected_bytes, r.left_early)
        for r in records
    )


def _queue_order(record: QueueRecord) -> tuple[bool, float]:
    return not record.left_early, record.admitted_at


# --------------------------------------------------------------------------------------
# What the workers of a container learned of each route: ``asgi-admission.learned``, JSON.
#
# Each worker adds what it observed to what the file holds (a window, an end, a peak is
# added once), and the file's id says when it was replaced, so that a worker then adds
# all it knows again.


#: A version 1 file (footprints and ramps, no windows or ends) is read as it is.
LEARNED_VERSION: Final = 2


class LearnedStore:
    """What the workers learned, per route, in one JSON file that outlives them."""

    __slots__ = ("_broken", "_directory", "_identity", "keep", "moved", "path")

    def __init__(self, directory: str, *, keep: int) -> None:
        self._directory = directory
        self.path = os.path.join(directory, LEARNED_FILE)
        #: How many of each kind of a route's observations are kept (the last ones).
        self.keep = keep
        self._broken = False
        #: Whether the last refresh found another file than this worker last wrote or
        #: read (deleted and made again, or replaced): then it adds what it knows.
        self.moved = False
        fd = open_private_file(directory, LEARNED_FILE)
        try:
            self._identity: str | None = _file_id(_read_all(fd))
        finally:
            os.close(fd)

    def load(self) -> Observations:
        """The observations in the file; empty when it has none or is unreadable.

        ``ValueError`` naming ``ADMISSION_SHARED_DIR`` when the file cannot be opened
        (at startup and for ``probe``); a running service uses :meth:`refresh`.
        """
        return self._parse(_read_shared(open_private_file(self._directory, LEARNED_FILE)))

    def refresh(self) -> Observations | None:
        """:meth:`load` for a running service: ``None`` when the file cannot be used now."""
        fd = self._open()
        if fd is None:
            return None
        data = _read_shared(fd)
        self.moved = _file_id(data) != self._identity
        return self._parse(data)

    def add(self, new: Observations, *, known: Observations | None = None) -> Observations | None:
        """Append ``new`` (per route, the values to add); the merged result, or ``None``
        when the file cannot be used now (logged once until it can).

        ``known``, all this worker has learned (``new`` included), goes into a file
        other than the one this worker last used (deleted and made again, or
        replaced): each worker adds what the file lacks of it, so what any of them
        learned is not lost with the old file.
        """
        fd = self._open()
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = _read_all(fd)
            merged = self._parse(data)
            identity = _file_id(data)
            if known is not None and identity != self._identity:
                self._add_missing(merged, known)
                new = {}  # in known already
            for route, values in new.items():
                _append(merged.setdefault(route, empty_observations()), values, self.keep)
            # A file without an id is new (or unreadable): it gets one, which tells the
            # workers that used another file to add what they know (inode numbers are
            # reused, so they cannot tell a file made again from the one before).
            identity = identity or secrets.token_hex(8)
            document = {
                "version": LEARNED_VERSION,
                "id": identity,
                "routes": {route: _to_json(values) for route, values in merged.items()},
            }
            data = json.dumps(document, separators=(",", ":")).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            self._identity, self.moved = identity, False
            return merged
        except OSError as exc:
            self._unusable(exc)
            return None
        finally:
            os.close(fd)

    def _add_missing(self, merged: Observations, known: Observations) -> None:
        """Append to ``merged`` the values of ``known`` it lacks, counted as multisets:
        what both hold (shared before the file changed) is not added twice."""
        for route, values in known.items():
            into = merged.setdefault(route, empty_observations())
            missing: RouteObservations = {
                "footprints": _missing(into["footprints"], values["footprints"]),
                "ramps": _missing(into["ramps"], values["ramps"]),
                "ends": _missing(into["ends"], values["ends"]),
                "exact": _missing(into["exact"], values["exact"]),
                "windows": _missing(into["windows"], values["windows"]),
                "probed": _missing(into["probed"], values["probed"]),
            }
            _append(into, missing, self.keep)

    def _open(self) -> int | None:
        try:
            fd = open_private_file(self._directory, LEARNED_FILE)
        except (OSError, ValueError) as exc:
            self._unusable(exc)
            return None
        if self._broken:
            self._broken = False
            logger.warning(
                "asgi-admission: the learned-sessions file %s is usable again.", self.path
            )
        return fd

    def _unusable(self, exc: BaseException) -> None:
        if not self._broken:
            self._broken = True
            logger.warning(
                "asgi-admission: the learned-sessions file %s cannot be used (%s); each "
                "worker keeps what it learns and shares it once the file can be used again.",
                self.path,
                exc,
            )

    def _parse(self, data: bytes) -> Observations:
        if not data.strip():
            return {}
        try:
            routes = json.loads(data)["routes"]
            return {str(route): _from_json(values, self.keep) for route, values in routes.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            logger.warning(
                "asgi-admission: %s is not a learned-sessions file this version reads; "
                "it is replaced by what is learned from now on.",
                self.path,
            )
            return {}


def _append(into: RouteObservations, values: RouteObservations, keep: int) -> None:
    """Each of ``into``'s lists with ``values``' after it, kept to the last ``keep``."""
    into["footprints"] = [*into["footprints"], *values["footprints"]][-keep:]
    into["ramps"] = [*into["ramps"], *values["ramps"]][-keep:]
    into["ends"] = [*into["ends"], *values["ends"]][-keep:]
    into["exact"] = [*into["exact"], *values["exact"]][-keep:]
    into["windows"] = [*into["windows"], *values["windows"]][-keep:]
    into["probed"] = [*into["probed"], *values["probed"]][-keep:]


def _missing(held: list[_T], values: list[_T]) -> list[_T]:
    """The values ``held`` lacks, counted as multisets."""
    counts = collections.Counter(held)
    missing = []
    for value in values:
        if counts[value] > 0:
            counts[value] -= 1
        else:
            missing.append(value)
    return missing


def _to_json(values: RouteObservations) -> dict[str, list[Any]]:
    return {
        "footprints": values["footprints"],
        "ramps": values["ramps"],
        "ends": values["ends"],
        "exact": values["exact"],
        "windows": [
            [
                w.growth,
                w.seconds,
                w.ramp_s,
                [[o.route, o.share, o.least, o.seen, o.seen_share] for o in w.overlaps],
                w.exact,
            ]
            for w in values["windows"]
        ],
        "probed": values["probed"],
    }


def _from_json(values: Any, keep: int) -> RouteObservations:
    """One route of the file; ``ValueError`` (or ``TypeError``) for anything malformed."""
    windows = []
    for growth, seconds, ramp_s, overlaps, exact in values.get("windows", [])[-keep:]:
        if not isinstance(exact, bool):
            raise ValueError("a window's exactness is not a boolean")
        windows.append(
            Window(
                growth=float(growth),
                seconds=float(seconds),
                ramp_s=None if ramp_s is None else float(ramp_s),
                overlaps=tuple(
                    Overlap(str(r), float(s), float(m), float(n), float(ns))
                    for r, s, m, n, ns in overlaps
                ),
                exact=exact,
            )
        )
    return {
        "footprints": [float(v) for v in values["footprints"]][-keep:],
        "ramps": [float(v) for v in values["ramps"]][-keep:],
        "ends": [float(v) for v in values.get("ends", [])][-keep:],
        "exact": [float(v) for v in values.get("exact", [])][-keep:],
        "windows": windows,
        "probed": [float(v) for v in values.get("probed", [])][-keep:],
    }


def _file_id(data: bytes) -> str | None:
    """The id a learned file was given when it was first written; ``None`` for none."""
    try:
        found = json.loads(data).get("id")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def _read_shared(fd: int) -> bytes:
    """All of ``fd`` under a shared ``flock``; closes it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        return _read_all(fd)
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size, 0)


def read_learned(directory: str, *, keep: int) -> Observations | None:
    """The learned file in ``directory`` for ``probe``; ``None`` when there is none."""
    path = os.path.join(directory, LEARNED_FILE)
    if not os.path.isfile(path):
        return None
    return LearnedStore(directory, keep=keep).load()


# --------------------------------------------------------------------------------------
# The probes of every worker in one file (docs/reservations.md, "Probing a route
# nothing is known of": several workers).
#
# Notes:
#
# - JSON, small (a trial per route being probed), read and written only inside the
# ledger's critical section, so the workers never race on it; its own ``flock``
# (exclusive to write, shared to read) keeps ``asgi-admission probe`` from reading half
# a write.
# - A file that cannot be used is logged once; each worker then probes on its own with
# the trials it last saw.
# - Only touched while something is being probed: a decision for a route not learned
# yet, and the samples of a worker with probes or waiters of its own.

PROBING_FILE: Final = "asgi-admission.probing"


def encode(trials: dict[str, ProbeTrial]) -> bytes:
    """The file's contents for ``trials``."""
    routes = {
        route: {
            "started_at": w.started_at,
            "base": w.base_bytes,
            "guess": w.guess_bytes,
            "peak": w.peak_bytes,
            "last_peak_at": w.last_peak_at,
            "last_event_at": w.last_event_at,
            "probes": [[p.pid, p.seq, p.responded] for p in w.probes],
            "admitted": w.admitted,
            "peaks": [[t, used] for t, used in w.peaks],
            "mixed": w.mixed,
            "ended": w.ended,
            "visible_at": w.visible_at,
            "footprint": w.footprint_bytes,
            "ramp_s": w.ramp_s,
            "concluded_at": w.concluded_at,
            "waiting": {str(pid): n for pid, n in w.waiting.items()},
        }
        for route, w in trials.items()
    }
    return json.dumps({"version": 1, "routes": routes}, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, ProbeTrial]:
    """The trials in the file's contents; ``ValueError`` when they are not a probing file."""
    if not data.strip():
        return {}
    try:
        routes: dict[str, Any] = json.loads(data)["routes"]
        return {str(route): _trial(str(route), values) for route, values in routes.items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a probing file this version reads ({exc!r})") from None


def _trial(route: str, v: dict[str, Any]) -> ProbeTrial:
    def optional(key: str) -> float | None:
        value = v.get(key)
        return None if value is None else float(value)

    footprint = v.get("footprint")
    return ProbeTrial(
        route=route,
        started_at=float(v["started_at"]),
        base_bytes=int(v["base"]),
        guess_bytes=int(v["guess"]),
        peak_bytes=int(v["peak"]),
        last_peak_at=float(v["last_peak_at"]),
        last_event_at=float(v["last_event_at"]),
        probes=[Probe(int(pid), int(seq), bool(done)) for pid, seq, done in v["probes"]],
        admitted=int(v["admitted"]),
        peaks=[(float(t), int(used)) for t, used in v["peaks"]],
        mixed=bool(v["mixed"]),
        ended=bool(v["ended"]),
        visible_at=optional("visible_at"),
        footprint_bytes=None if footprint is None else int(footprint),
        ramp_s=float(v["ramp_s"]),
        concluded_at=optional("concluded_at"),
        waiting={int(pid): int(n) for pid, n in v["waiting"].items()},
    )


class SharedProbeStore:
    """The trials of every worker, in one file; used inside the ledger's lock.

    Its descriptor stays open, as the ledger's and the settling queue's do: a file
    deleted or replaced is opened again at the next load or store, and so is the file
    in a forked worker (``flock`` belongs to the open file description).
    """

    __slots__ = ("_broken", "_directory", "_fd", "_known", "_pid", "path")

    # Plain attributes, not methods that forward: the probes ask them on every load.
    shared: Final = True
    owner_alive = staticmethod(process_alive)

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self.path = os.path.join(directory, PROBING_FILE)
        self._broken = False
        #: The file's contents at the last load or store, and the trials made of them.
        self._known: tuple[bytes, dict[str, ProbeTrial]] = (b"", {})
        # At startup a file that cannot be used is an error naming the setting.
        self._fd = open_private_file(directory, PROBING_FILE)
        self._pid = os.getpid()

    def load(self) -> dict[str, ProbeTrial] | None:
        fd = self._current()
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                data = _read_all(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            self._unusable(exc)
            return None
        known, trials = self._known
        if data == known and encode(trials) == data:
            # Unchanged since this worker last loaded or stored it (the probes load the
            # file several times in one critical section): the same trials again.
            return trials
        try:
            trials = decode(data)
        except ValueError:
            logger.warning(
                "asgi-admission: %s is not a probing file this version reads; it is "
                "replaced by the probes from now on.",
                self.path,
            )
            return {}
        self._known = data, trials
        return trials

    def store(self, trials: dict[str, ProbeTrial]) -> None:
        fd = self._current()
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                data = encode(trials)
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            self._unusable(exc)
            return
        self._known = data, trials

    def close(self) -> None:
        os.close(self._fd)

    def _current(self) -> int | None:
        """The descriptor of the file at the path now, this process's own: the one open,
        or the file there opened again (deleted or replaced since, or opened before a
        fork); ``None`` when it cannot be used."""
        try:
            pid = os.getpid()
            if pid != self._pid or os.fstat(self._fd).st_nlink == 0:
                fd = open_private_file(self._directory, PROBING_FILE)
                os.close(self._fd)
                self._fd, self._pid = fd, pid
        except (OSError, ValueError) as exc:
            self._unusable(exc)
            return None
        if self._broken:
            self._broken = False
            logger.warning("asgi-admission: the probing file %s is usable again.", self.path)
        return self._fd

    def _unusable(self, exc: BaseException) -> None:
        if not self._broken:
            self._broken = True
            logger.warning(
                "asgi-admission: the probing file %s cannot be used (%s); each worker "
                "probes on its own until it can.",
                self.path,
                exc,
            )


def read_probing(directory: str) -> dict[str, ProbeTrial] | None:
    """The probing file in ``directory`` for ``probe``; ``None`` when there is none.

    ``OSError`` or ``ValueError`` when it cannot be read.
    """
    if not os.path.isfile(os.path.join(directory, PROBING_FILE)):
        return None
    return decode(_read_shared(open_private_file(directory, PROBING_FILE)))
