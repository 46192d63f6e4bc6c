"""Per-session memory groups: the kernel itself holds each process session to its budget.

Where the groups go, their limits, the wrapper and the leftovers of a worker that was
killed: docs/session-groups.md. The guard never moves the server's own processes. A
group's name, ``<worker pid>-<number>-<session id>``, tells a crashed worker's
leftovers; one is removed only when its worker is gone and it is empty.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from asgi_admission._admission.ledger.safe_files import process_alive
from asgi_admission._config import SessionGroupsMode
from asgi_admission._memory.discover import discover_cgroup

logger = logging.getLogger("asgi_admission")

GroupVersion = Literal["v1", "v2"]

#: The directory below which the guard makes its session groups.
GROUPS_DIR: Final = "asgi-admission"
#: Where this process finds its own cgroup (the test suite's conftest replaces it).
PROC_SELF_CGROUP = "/proc/self/cgroup"

#: Writes itself into the group ("$0" is its cgroup.procs), then becomes the command.
_JOIN_SH: Final = 'echo 0 > "$0" && exec "$@"'
_JOIN_PY: Final = (
    "import os, sys\n"
    "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
    "os.write(fd, b'0')\n"
    "os.close(fd)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
_UNSAFE_NAME: Final = re.compile(r"[^A-Za-z0-9_.]")


@dataclass(frozen=True, slots=True)
class GroupsPlace:
    """Where session groups can be made, or why they cannot (``parent`` is then None)."""

    version: GroupVersion | None
    #: The directory that holds ``asgi-admission/``.
    parent: str | None
    #: One sentence: where the groups go, or what is missing.
    reason: str

    @property
    def base(self) -> str | None:
        return None if self.parent is None else os.path.join(self.parent, GROUPS_DIR)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def find_place(
    *,
    proc_self_cgroup: str | None = None,
    mountinfo: str = "/proc/self/mountinfo",
    hostfs: str = "/",
    cgroup_namespace: str = "/proc/self/ns/cgroup",
) -> GroupsPlace:
    """Where this process may make session groups (docs/session-groups.md, "Where the
    groups go")."""
    location = discover_cgroup(
        proc_self_cgroup=PROC_SELF_CGROUP if proc_self_cgroup is None else proc_self_cgroup,
        mountinfo=mountinfo,
        hostfs=hostfs,
        cgroup_namespace=cgroup_namespace,
    )
    if location.how == "fallback":
        return GroupsPlace(None, None, "this process's own memory group could not be found")
    if location.v1 is not None:
        return _v1_place(location.v1[0])
    assert location.v2 is not None
    return _v2_place(*location.v2)


def _v1_place(own: str) -> GroupsPlace:
    if not os.path.exists(os.path.join(own, "memory.limit_in_bytes")):
        return GroupsPlace("v1", None, f"{own} is not a cgroup v1 memory group")
    if (_read(os.path.join(own, "memory.use_hierarchy")) or "1").strip() == "0":
        return GroupsPlace(
            "v1",
            None,
            f"{own} has memory.use_hierarchy 0, so memory used in groups below it would "
            "not count against the container's limit",
        )
    base = os.path.join(own, GROUPS_DIR)
    # access(2) also answers EROFS for a read-only mount, the usual container case.
    if not os.access(base if os.path.isdir(base) else own, os.W_OK):
        return GroupsPlace(
            "v1",
            None,
            f"cgroup v1 memory group {own} is not writable by this process (read-only, or "
            "not root)",
        )
    return GroupsPlace("v1", own, f"cgroup v1: session groups go under {base}")


def _controls_memory(directory: str) -> bool:
    return "memory" in (_read(os.path.join(directory, "cgroup.subtree_control")) or "").split()


def _v2_place(own: str, mount_point: str) -> GroupsPlace:
    own = os.path.normpath(own)
    if _controls_memory(own):
        # Only the real root may have processes and give memory to its children.
        parent = own
    elif own == os.path.normpath(mount_point):
        return GroupsPlace(
            "v2",
            None,
            f"cgroup v2: the server's processes are in {own}, the top of the hierarchy it "
            "sees, which gives no memory controller to groups below it (cgroup.subtree_control "
            "has no 'memory'), and the guard never moves the server's processes to make room",
        )
    else:
        parent = os.path.dirname(own)
        if not _controls_memory(parent):
            return GroupsPlace(
                "v2",
                None,
                f"cgroup v2: {own} holds the server's processes, and {parent} gives no memory "
                "controller to its children (cgroup.subtree_control has no 'memory'): no "
                "delegated subtree",
            )
    procs = os.path.join(parent, "cgroup.procs")
    if not (os.access(parent, os.W_OK) and os.access(procs, os.W_OK)):
        return GroupsPlace(
            "v2",
            None,
            f"cgroup v2: {parent} is not delegated to this process (it may not create "
            f"groups there, or not write {procs}), so the subtree is left alone",
        )
    return GroupsPlace("v2", parent, f"cgroup v2: session groups go under {parent}/{GROUPS_DIR}")


def _numbers(text: str | None) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            values[key] = int(value)
    return values


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


class SessionGroup:
    """One session's memory group: start its processes with :meth:`command`.

    Made by ``SessionWatchdog.session_group``; pass it to ``register(..., group=)`` so
    the watchdog reports its OOM kill and removes it when the session ends.
    """

    __slots__ = ("_wrapper", "budget_bytes", "path", "session_id", "version")

    def __init__(
        self,
        path: str,
        *,
        version: GroupVersion,
        session_id: str,
        budget_bytes: int,
        wrapper: Sequence[str],
    ) -> None:
        self.path = path
        self.version: GroupVersion = version
        self.session_id = session_id
        self.budget_bytes = budget_bytes
        self._wrapper = tuple(wrapper)

    def __repr__(self) -> str:
        return f"<SessionGroup {self.path!r} budget_bytes={self.budget_bytes}>"

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this group from its first instruction: a tiny wrapper joins
        the group, then execs it, so if joining fails it never runs. For
        ``subprocess.Popen``, ``asyncio.create_subprocess_exec`` and the like."""
        if not argv:
            raise ValueError("command() needs the command to run; got an empty argv.")
        return [*self._wrapper, self.procs_file, *argv]

    def join(self, pid: int) -> None:
        """Move an already running process in: what it allocated before stays charged
        where it was, so prefer :meth:`command`. Never the server itself."""
        if pid in (0, os.getpid()):
            raise ValueError(
                f"join() moves a session's process, never the server's own; got pid {pid}."
            )
        _write(self.procs_file, str(pid))

    def pids(self) -> tuple[int, ...]:
        """The processes in the group now (empty once it is removed)."""
        return tuple(int(p) for p in (_read(self.procs_file) or "").split() if p.isdigit())

    def oom_kills(self) -> int:
        """How many of its processes the kernel's OOM killer has killed."""
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        return _numbers(_read(os.path.join(self.path, name))).get("oom_kill", 0)

    def peak_bytes(self) -> int | None:
        """The group's highest usage since it was made (v1 ``memory.max_usage_in_bytes``,
        v2 ``memory.peak``); ``None`` where the kernel keeps no such figure."""
        name = "memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak"
        text = _read(os.path.join(self.path, name))
        try:
            return None if text is None else int(text.strip())
        except ValueError:
            return None


class SessionGroups:
    """The session groups of one worker: where they go, making and removing them."""

    def __init__(
        self,
        place: GroupsPlace,
        *,
        mode: SessionGroupsMode,
        remove_dir: Callable[[str], None] = os.rmdir,
    ) -> None:
        self.place = place
        self.mode: SessionGroupsMode = mode
        self._remove_dir = remove_dir
        self._lock = threading.Lock()
        self._next = 0
        self._pending: dict[str, SessionGroup] = {}
        shell = shutil.which("sh")
        self._wrapper: tuple[str, ...] = (
            (shell, "-c", _JOIN_SH) if shell else (sys.executable, "-I", "-S", "-c", _JOIN_PY)
        )

    @classmethod
    def find(cls, mode: SessionGroupsMode) -> SessionGroups:
        """Look for a place (unless ``mode`` is ``"off"``); ``"require"`` raises where none."""
        if mode == "off":
            place = GroupsPlace(None, None, "ADMISSION_SESSION_GROUPS is off")
        else:
            place = find_place()
        if mode == "require" and place.parent is None:
            raise RuntimeError(
                "ADMISSION_SESSION_GROUPS=require, but this process cannot make memory "
                f"groups for its sessions: {place.reason} (docs/session-groups.md says what "
                "a pod needs)."
            )
        return cls(place, mode=mode)

    @property
    def enabled(self) -> bool:
        return self.place.parent is not None

    def describe(self) -> str:
        """The one INFO line saying which way it went."""
        if self.enabled:
            return (
                f"asgi-admission: session memory groups on ({self.place.reason}): the kernel "
                "holds each process session with a budget to it."
            )
        return (
            f"asgi-admission: session memory groups off ({self.place.reason}); the watchdog "
            "alone enforces session budgets."
        )

    def create(self, session_id: str, budget_bytes: int) -> SessionGroup:
        """A new group limited to ``budget_bytes``; raises ``OSError`` (and leaves
        nothing behind) where the kernel refuses."""
        base, version = self.place.base, self.place.version
        if base is None or version is None:
            raise RuntimeError(f"Session memory groups are off here: {self.place.reason}.")
        with self._lock:
            self._next += 1
            number = self._next
        name = f"{os.getpid()}-{number}-{_UNSAFE_NAME.sub('_', session_id)[:64]}"
        path = os.path.join(base, name)
        if not os.path.isdir(base):
            with contextlib.suppress(FileExistsError):  # another worker made it meanwhile
                os.mkdir(base)
        if version == "v2" and "memory" not in (
            _read(os.path.join(base, "cgroup.subtree_control")) or ""
        ):
            _write(os.path.join(base, "cgroup.subtree_control"), "+memory")
        os.mkdir(path)
        try:
            if version == "v1":
                _write(os.path.join(path, "memory.limit_in_bytes"), str(budget_bytes))
                if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                    _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(budget_bytes))
            else:
                _write(os.path.join(path, "memory.max"), str(budget_bytes))
                # Reclaim starts a little before the kill; the kill takes the whole session.
                _write(os.path.join(path, "memory.high"), str(budget_bytes * 15 // 16))
                _write(os.path.join(path, "memory.oom.group"), "1")
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(os.path.join(path, "memory.swap.max"), "0")
        except OSError:
            with contextlib.suppress(OSError):
                self._remove_dir(path)
            raise
        return SessionGroup(
            path,
            version=version,
            session_id=session_id,
            budget_bytes=budget_bytes,
            wrapper=self._wrapper,
        )

    def remove(self, group: SessionGroup) -> bool:
        """Remove ``group`` now if it is empty, else at a later :meth:`retry` (true: gone)."""
        if group.pids() or not self._try_remove(group.path):
            with self._lock:
                self._pending[group.path] = group
            return False
        with self._lock:
            self._pending.pop(group.path, None)
        return True

    def _try_remove(self, path: str) -> bool:
        try:
            self._remove_dir(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def retry(self) -> None:
        """Remove the groups of ended sessions whose processes have gone since."""
        with self._lock:
            pending = list(self._pending.values())
        for group in pending:
            self.remove(group)

    @property
    def pending(self) -> tuple[SessionGroup, ...]:
        """Groups of ended sessions still waiting for their processes to go."""
        with self._lock:
            return tuple(self._pending.values())

    def clean_leftovers(self) -> tuple[int, int]:
        """Remove the empty groups of workers that are gone (crashed); returns (removed,
        kept because processes still run in them). A live worker's groups are never
        touched, empty or not."""
        base = self.place.base
        if base is None or not os.path.isdir(base):
            return 0, 0
        removed = kept = 0
        with contextlib.suppress(OSError), os.scandir(base) as entries:
            for entry in entries:
                worker, _, rest = entry.name.partition("-")
                if not (entry.is_dir(follow_symlinks=False) and worker.isdigit() and rest):
                    continue
                if process_alive(int(worker)):
                    continue
                if (_read(os.path.join(entry.path, "cgroup.procs")) or "").split():
                    kept += 1
                elif self._try_remove(entry.path):
                    removed += 1
        if removed or kept:
            logger.info(
                "asgi-admission: removed %d empty session group(s) left under %s by workers "
                "that are gone; kept %d that still have processes.",
                removed,
                base,
                kept,
            )
        return removed, kept
