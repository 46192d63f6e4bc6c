"""Where the workers of one memory group share their session ledger, found without being told.

Where, and what happens where no place will do: docs/operations.md, "Several workers
in one container"; the checks on each place: docs/trust.md. Notes:

- The name comes from the memory group the reader measures
  (``CgroupMemoryReader.group_directory``, or with ``memory_source="host"`` the
  machine); the group of any other reader cannot be told, so its guard counts alone.
- A base is passed over where ``safe_files`` refuses the name or any of the three
  files opened there first: a default place never stops the service.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from asgi_admission._admission.ledger.safe_files import UnsafeFileError, open_private_file
from asgi_admission._admission.ledger.shared_ledger import FILE_NAME
from asgi_admission._admission.reservations.shared_files import LEARNED_FILE, SETTLING_FILE
from asgi_admission._memory.discover import discover_cgroup
from asgi_admission._memory.host import HostMemoryReader
from asgi_admission._memory.reading import CgroupMemoryReader

logger = logging.getLogger("asgi_admission")

#: Where the search for other workers reads processes (a fixture tree in the tests).
PROC = "/proc"
BOOT_ID: Final = "/proc/sys/kernel/random/boot_id"
#: How long after the lifespan starts the search for other workers waits: a pre-forking
#: server starts its workers one after the other.
SEARCH_DELAY_S: Final = 1.0
#: The most processes of the group the search examines.
SEARCH_LIMIT: Final = 4096
_UNSAFE_NAME: Final = re.compile(r"[^A-Za-z0-9._-]+")
_NUMBERS: Final = re.compile(rb"[0-9]+")


@dataclass(frozen=True, slots=True)
class MemoryGroup:
    """The memory a guard protects, and what tells it from every other on the machine."""

    #: What the logs say: the cgroup directory, or ``"host"``.
    label: str
    identity: str
    #: The files that list the group's processes; ``None``: every process (the host).
    procs: tuple[str, ...] | None


def _boot_id(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def group_of(reader: object, *, boot_id: str = BOOT_ID) -> MemoryGroup | None:
    """The memory group ``reader`` measures; ``None`` where that cannot be told."""
    boot = _boot_id(boot_id)
    if isinstance(reader, HostMemoryReader):
        return MemoryGroup(label="host", identity=f"host boot {boot}", procs=None)
    if not isinstance(reader, CgroupMemoryReader):
        return None
    directory = reader.group_directory()
    if directory is None:
        return None
    try:
        info = os.stat(directory)
    except OSError:
        return None
    return MemoryGroup(
        label=directory,
        identity=f"cgroup {info.st_dev}:{info.st_ino} boot {boot}",
        procs=(os.path.join(directory, "cgroup.procs"),),
    )


def own_group_procs(*, proc: str = PROC) -> tuple[str, ...]:
    """The ``reading.procs`` files of this process's own memory cgroup (v1 first, then
    v2), for a guard whose reader does not say which group it measures."""
    location = discover_cgroup(
        proc_self_cgroup=os.path.join(proc, "self", "cgroup"),
        mountinfo=os.path.join(proc, "self", "mountinfo"),
        cgroup_namespace=os.path.join(proc, "self", "ns", "cgroup"),
    )
    places = [place[0] for place in (location.v1, location.v2) if place is not None]
    return tuple(os.path.join(place, "cgroup.procs") for place in places)


def default_bases() -> tuple[str, ...]:
    """The directories a default place is made under, in order, each named once."""
    candidates = [
        "/dev/shm",
        os.environ.get("XDG_RUNTIME_DIR", ""),
        f"/run/user/{os.geteuid()}",
        tempfile.gettempdir(),
    ]
    bases: list[str] = []
    for base in candidates:
        if os.path.isabs(base) and os.path.normpath(base) not in bases:
            bases.append(os.path.normpath(base))
    return tuple(bases)


def directory_name(group: MemoryGroup, *, uid: int | None = None) -> str:
    """``asgi-admission-<uid>-<the group's last name>-<16 hex digits of its identity>``."""
    uid = os.geteuid() if uid is None else uid
    last = os.path.basename(group.label.rstrip("/")) or "root"
    readable = _UNSAFE_NAME.sub("_", last)[:40]
    digest = hashlib.sha256(group.identity.encode()).hexdigest()[:16]
    return f"asgi-admission-{uid}-{readable}-{digest}"


@dataclass(frozen=True, slots=True)
class Place:
    """The directory chosen (``None``: none could be made) and why each base was not."""

    directory: str | None
    passed_over: tuple[str, ...] = ()


def choose_place(group: MemoryGroup, *, bases: Sequence[str] | None = None) -> Place:
    """The first base under which this group's private directory can be used, made
    (mode 0700) if missing, with each of its files opened there once."""
    name = directory_name(group)
    passed_over: list[str] = []
    for base in default_bases() if bases is None else bases:
        if not os.path.isdir(base):
            passed_over.append(f"{base} is missing")
            continue
        path = os.path.join(base, name)
        existed = os.path.lexists(path)
        try:
            for file_name in (FILE_NAME, SETTLING_FILE, LEARNED_FILE):
                os.close(open_private_file(path, file_name))
        except UnsafeFileError as exc:
            passed_over.append(str(exc).split(" Point ", 1)[0])
            if existed:
                logger.warning(
                    "asgi-admission: %s cannot hold the shared session ledger, as something "
                    "else has its name or it is read-only (%s); trying the next place.",
                    path,
                    exc,
                )
            continue
        return Place(path, tuple(passed_over))
    return Place(None, tuple(passed_over))


def find_place(group: MemoryGroup, *, bases: Sequence[str] | None = None) -> str | None:
    """The group's private directory where one was made already (for ``probe``): the
    first base holding a directory of that name, without making anything."""
    name = directory_name(group)
    for base in default_bases() if bases is None else bases:
        path = os.path.join(base, name)
        if os.path.isdir(path) and not os.path.islink(path):
            return path
    return None


def _stat_fields(proc: str, pid: str) -> tuple[int, int] | None:
    """(pid, parent pid) from ``<proc>/<pid>/stat``; ``None`` where it cannot be read."""
    try:
        with open(os.path.join(proc, pid, "stat"), "rb") as f:
            text = f.read(512)
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    head, _, tail = text.rpartition(b")")
    fields = tail.split()
    try:
        return int(head.split(b" (", 1)[0]), int(fields[1])
    except (ValueError, IndexError):
        return None


def _exe(proc: str, pid: str) -> tuple[int, int] | None:
    try:
        info = os.stat(os.path.join(proc, pid, "exe"))
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _command(proc: str, pid: str) -> bytes | None:
    """The process's command line, its numbers left out: a pre-forking server's workers
    differ only in those (uvicorn's ``spawn_main(tracker_fd=5, pipe_handle=9)``), while
    a helper it also starts, such as multiprocessing's resource tracker, differs more."""
    try:
        with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
            return _NUMBERS.sub(b"", f.read(4096))
    except OSError:
        return None


def _group_pids(procs: tuple[str, ...] | None, proc: str) -> list[str]:
    if procs is None:
        try:
            return [name for name in os.listdir(proc) if name.isdigit()][:SEARCH_LIMIT]
        except OSError:
            return []
    for path in procs:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                return f.read().split()[:SEARCH_LIMIT]
        except OSError:
            continue
    return []


def other_workers(procs: tuple[str, ...] | None, *, proc: str = PROC) -> list[int]:
    """The other processes in the group that run this program with this command line
    (numbers aside) and share this one's parent: the other workers of a pre-forking
    server. Never raises."""
    me = _stat_fields(proc, "self")
    exe = _exe(proc, "self")
    command = _command(proc, "self")
    if me is None or exe is None or command is None:
        return []
    pid, parent = me
    found: list[int] = []
    for other in _group_pids(procs, proc):
        if other == str(pid):
            continue
        fields = _stat_fields(proc, other)
        if (
            fields is not None
            and fields[1] == parent
            and _exe(proc, other) == exe
            and _command(proc, other) == command
        ):
            found.append(fields[0])
    return found


class AloneCheck:
    """Warns once, at WARNING, when a guard that counts alone has sibling workers."""

    __slots__ = ("_label", "_pid", "_proc", "_procs", "_warned", "reason")

    def __init__(
        self, *, reason: str, label: str, procs: tuple[str, ...] | None, proc: str | None = None
    ) -> None:
        #: Why this guard counts alone, for the warning.
        self.reason = reason
        self._label = label
        self._procs = procs
        # Taken now: the search runs later, in a thread.
        self._proc = PROC if proc is None else proc
        self._pid = 0
        self._warned = False

    def start(self) -> None:
        """Search in a thread of its own, once per process, after ``SEARCH_DELAY_S``."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        timer = threading.Timer(SEARCH_DELAY_S, self.search)
        timer.daemon = True
        timer.start()

    def search(self) -> list[int]:
        """The other workers found, and the warning the first time there are any."""
        try:
            found = other_workers(self._procs, proc=self._proc)
        except Exception:  # a diagnostic must never take the service down
            logger.exception("asgi-admission: looking for other workers failed.")
            return []
        if found and not self._warned:
            self._warned = True
            logger.warning(
                "asgi-admission: this memory group (%s) runs more workers of this server "
                "(%d besides this one), but this guard counts its sessions alone: %s. Each "
                "worker may admit up to the whole capacity; set ADMISSION_SHARED_DIR to a "
                "directory they all reach (docs/operations.md), or run one worker.",
                self._label,
                len(found),
                self.reason,
            )
        return found
