"""Finding this process's memory cgroup: from ``/proc/self/cgroup`` with mountinfo.

Notes:

- ``/proc/self/cgroup`` names our cgroup path per hierarchy and
  ``/proc/self/mountinfo`` says where each hierarchy is mounted and which part of
  it the mount shows (its root field). The cgroup directory is the mount point
  plus our path relative to the mount root, the way the JDK and Go's cgroup
  libraries resolve it. Inside a cgroup namespace the mount root is our own
  cgroup, so the directory is the mount point itself.
- A path that climbs out of its mount (``0::/../..``, seen with some cgroup
  namespaces) or does not lie under any mount root cannot be resolved; the JDK
  falls back to the mount point and so do we, with one warning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final, Literal

DEFAULT_CGROUP_MOUNT: Final = "/sys/fs/cgroup"


def on_host(hostfs: str, path: str) -> str:
    """The absolute ``path`` as seen under ``hostfs`` (``/`` itself, or a captured tree)."""
    return os.path.join(hostfs, path.lstrip("/"))


@dataclass(frozen=True, slots=True)
class Mount:
    root: str
    mount_point: str
    fstype: str
    super_options: frozenset[str]


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts in ``/proc/<pid>/mountinfo`` text, in order."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 4 or fields[sep + 1] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            Mount(
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fstype=fields[sep + 1],
                super_options=frozenset(fields[sep + 3].split(",")),
            )
        )
    return mounts


def parse_proc_cgroup(text: str) -> tuple[str | None, str | None]:
    """(unified v2 path, v1 memory controller path) from ``/proc/<pid>/cgroup`` text."""
    v2: str | None = None
    v1: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _relative(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` when it lies inside it and never climbs out."""
    path_parts = [p for p in path.split("/") if p]
    root_parts = [p for p in root.split("/") if p]
    # A ".." anywhere means the path is outside our cgroup namespace (a process
    # moved after the namespace was made): joining it to any mount point would
    # name a directory that is not ours, so it never resolves (the JDK's rule).
    if ".." in path_parts or "." in path_parts:
        return None
    if path_parts[: len(root_parts)] != root_parts:
        return None
    return "/".join(path_parts[len(root_parts) :])


@dataclass(frozen=True, slots=True)
class CgroupLocation:
    """Where the reader looks: directories per cgroup version, and how they were found."""

    v2: tuple[str, str] | None  # (cgroup directory, mount point)
    v1: tuple[str, str] | None
    #: ``"explicit"`` (root given), ``"discovered"`` or ``"fallback"``.
    how: Literal["explicit", "discovered", "fallback"]
    warnings: tuple[str, ...] = ()
    #: The v1 mount shows the whole hierarchy (its root is ``/``) and our directory
    #: lies inside it, so every ancestor's limit file is visible.
    v1_whole_chain: bool = False


def _resolve(
    path: str, mounts: list[Mount], hostfs: str
) -> tuple[tuple[str, str] | None, str | None, bool]:
    """((directory, mount point), a warning, whether the mount shows the whole hierarchy)."""
    for mount in mounts:
        rel = _relative(path, mount.root)
        if rel is not None:
            mount_point = on_host(hostfs, mount.mount_point)
            directory = os.path.join(mount_point, rel) if rel else mount_point
            if os.path.isdir(directory):
                return (os.path.normpath(directory), mount_point), None, mount.root == "/"
    for mount in mounts:
        mount_point = on_host(hostfs, mount.mount_point)
        if os.path.isdir(mount_point):
            return (
                (os.path.normpath(mount_point), mount_point),
                f"cgroup path {path!r} does not resolve inside its mount "
                f"(root {mount.root!r} at {mount.mount_point!r}); reading the mount point "
                f"{mount_point!r} instead",
                False,
            )
    return None, None, False


#: The inode of the initial cgroup namespace (the kernel's PROC_CGROUP_INIT_INO). In any
#: other namespace a mount root of "/" is the namespace's root, with ancestors hidden.
INITIAL_CGROUP_NAMESPACE_INODE: Final = 0xEFFFFFFB


def in_initial_cgroup_namespace(path: str = "/proc/self/ns/cgroup") -> bool:
    """Whether this process sees the whole cgroup hierarchy (no cgroup namespace)."""
    try:
        return os.stat(path).st_ino == INITIAL_CGROUP_NAMESPACE_INODE
    except OSError:
        return False


def whole_hierarchy_mount(directory: str, mounts: list[Mount], hostfs: str = "/") -> str | None:
    """The mount point of the cgroup v1 memory mount that shows its whole hierarchy and
    holds ``directory``, if there is one: then every ancestor's limit file is visible."""
    directory = os.path.normpath(directory)
    for mount in mounts:
        if mount.fstype != "cgroup" or "memory" not in mount.super_options or mount.root != "/":
            continue
        mount_point = os.path.normpath(on_host(hostfs, mount.mount_point))
        if directory == mount_point or directory.startswith(mount_point + os.sep):
            return mount_point
    return None


def discover_cgroup(
    *,
    proc_self_cgroup: str = "/proc/self/cgroup",
    mountinfo: str = "/proc/self/mountinfo",
    hostfs: str = "/",
    cgroup_namespace: str = "/proc/self/ns/cgroup",
) -> CgroupLocation:
    """Find this process's own memory cgroup, v2 and v1, from ``/proc``.

    ``hostfs`` prefixes every mount point (for a tree captured from another
    machine, or a host filesystem mounted elsewhere). Falls back to
    ``/sys/fs/cgroup`` (under ``hostfs``) when the files cannot be read or
    name no usable mount.
    """
    try:
        with open(proc_self_cgroup, encoding="utf-8", errors="replace") as f:
            v2_path, v1_path = parse_proc_cgroup(f.read())
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        v2_path = v1_path = None
        mounts = []
    warnings: list[str] = []
    v2 = v1 = None
    v1_whole_chain = False
    if v2_path is not None:
        v2, warning, _ = _resolve(v2_path, [m for m in mounts if m.fstype == "cgroup2"], hostfs)
        if warning:
            warnings.append(warning)
    if v1_path is not None:
        v1_mounts = [m for m in mounts if m.fstype == "cgroup" and "memory" in m.super_options]
        v1, warning, v1_whole_chain = _resolve(v1_path, v1_mounts, hostfs)
        v1_whole_chain = v1_whole_chain and in_initial_cgroup_namespace(cgroup_namespace)
        if warning:
            warnings.append(warning)
    if v2 is None and v1 is None:
        fallback = on_host(hostfs, DEFAULT_CGROUP_MOUNT)
        return CgroupLocation(
            v2=None,
            v1=None,
            how="fallback",
            warnings=(f"could not find this process's cgroup; reading {fallback!r}",),
        )
    return CgroupLocation(
        v2=v2,
        v1=v1,
        how="discovered",
        warnings=tuple(warnings),
        v1_whole_chain=v1_whole_chain,
    )


def whole_chain_tops(
    root: str, mountinfo: str, hostfs: str, cgroup_namespace: str
) -> dict[str, str]:
    """For the v1 places under an explicit root, the mount point above which nothing is
    hidden, where the mount shows the whole hierarchy; empty where unknown."""
    if not in_initial_cgroup_namespace(cgroup_namespace):
        return {}
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        return {}
    tops: dict[str, str] = {}
    for directory in (os.path.join(root, "memory"), root):
        top = whole_hierarchy_mount(directory, mounts, hostfs)
        if top is not None:
            tops[directory] = top
    return tops
