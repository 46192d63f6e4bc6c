"""What the workers of a container learned of each route, shared in ``ADMISSION_SHARED_DIR``:
``asgi-admission.learned``, JSON, beside the session ledger (the module notes of
``shared_files.py`` say how the shared files are opened and what a fault does).

Written under its own ``flock``: each worker adds what it observed to what the file
holds (a window, an end, a peak is added once), and the file's id says when it was
replaced, so that a worker then adds all it knows again. A file that cannot be used is
logged once and retried, each worker keeping what it learned meanwhile.
"""

from __future__ import annotations

import collections
import fcntl
import json
import logging
import os
import secrets
from typing import Any, Final, TypeVar

from asgi_admission._admission.reservations.attribution import Overlap, Window
from asgi_admission._admission.reservations.learning import (
    Observations,
    RouteObservations,
    empty_observations,
)
from asgi_admission._admission.reservations.shared_files import LEARNED_FILE, open_shared

logger = logging.getLogger("asgi_admission")

_T = TypeVar("_T")

#: Version 2 added each route's windows and ends; a version 1 file (footprints and
#: ramps alone) is read as it is, its values kept as the per-session ones they are.
LEARNED_VERSION: Final = 2


class LearnedStore:
    """What the workers learned, per route, in one JSON file that outlives them."""

    __slots__ = ("_broken", "_directory", "_identity", "moved", "path", "window")

    def __init__(self, directory: str, *, window: int) -> None:
        self._directory = directory
        self.path = os.path.join(directory, LEARNED_FILE)
        self.window = window
        self._broken = False
        #: Whether the last refresh found another file than this worker last wrote or
        #: read (deleted and made again, or replaced): then it adds what it knows.
        self.moved = False
        fd = open_shared(directory, LEARNED_FILE)
        try:
            self._identity: str | None = _file_id(_read_all(fd))
        finally:
            os.close(fd)

    def load(self) -> Observations:
        """The observations in the file; empty when it has none or is unreadable.

        ``ValueError`` naming ``ADMISSION_SHARED_DIR`` when the file cannot be opened
        (at startup and for ``probe``); a running service uses :meth:`refresh`.
        """
        return self._parse(_read_shared(open_shared(self._directory, LEARNED_FILE)))

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
                _append(merged.setdefault(route, empty_observations()), values, self.window)
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
            }
            _append(into, missing, self.window)

    def _open(self) -> int | None:
        try:
            fd = open_shared(self._directory, LEARNED_FILE)
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
            return {str(route): _from_json(values, self.window) for route, values in routes.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            logger.warning(
                "asgi-admission: %s is not a learned-sessions file this version reads; "
                "it is replaced by what is learned from now on.",
                self.path,
            )
            return {}


def _append(into: RouteObservations, values: RouteObservations, window: int) -> None:
    """Each of ``into``'s lists with ``values``' after it, kept to the last ``window``."""
    into["footprints"] = [*into["footprints"], *values["footprints"]][-window:]
    into["ramps"] = [*into["ramps"], *values["ramps"]][-window:]
    into["ends"] = [*into["ends"], *values["ends"]][-window:]
    into["exact"] = [*into["exact"], *values["exact"]][-window:]
    into["windows"] = [*into["windows"], *values["windows"]][-window:]


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
    }


def _from_json(values: Any, window: int) -> RouteObservations:
    """One route of the file; ``ValueError`` (or ``TypeError``) for anything malformed."""
    windows = []
    for growth, seconds, ramp_s, overlaps, exact in values.get("windows", [])[-window:]:
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
        "footprints": [float(v) for v in values["footprints"]][-window:],
        "ramps": [float(v) for v in values["ramps"]][-window:],
        "ends": [float(v) for v in values.get("ends", [])][-window:],
        "exact": [float(v) for v in values.get("exact", [])][-window:],
        "windows": windows,
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


def read_learned(directory: str, *, window: int) -> Observations | None:
    """The learned file in ``directory`` for ``probe``; ``None`` when there is none."""
    path = os.path.join(directory, LEARNED_FILE)
    if not os.path.isfile(path):
        return None
    return LearnedStore(directory, window=window).load()
