"""Opening the files this package keeps in a shared directory, without being tricked.

Every check, the hazard it answers and the refusal's words: docs/trust.md, "The shared
directory and its files". Each check is made on the descriptor that is then used, so
whoever renames the directory or a file away and puts their own in its place fails it;
a guard that cannot trust its file must not start (``ValueError``).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Final

#: The setting that names the shared directory, which a refusal to use one of its files
#: names (whoever opens a file there, the ledger's, the waiting order's or the stuck watch's).
SHARED_DIR_SETTING: Final = "ADMISSION_SHARED_DIR"
#: Mode bits that let someone other than the owner change a file or a directory's entries.
_OTHERS_WRITE: Final = stat.S_IWGRP | stat.S_IWOTH


class UnsafeFileError(ValueError):
    """A directory or file in the shared directory cannot be trusted or used."""


def _refuse(setting: str, directory: str, path: str, problem: str) -> UnsafeFileError:
    return UnsafeFileError(
        f"{setting}={directory!r} cannot be used: {path} {problem}. Point {setting} at a "
        "directory that only this user owns and writes to (it is created with mode 0700 "
        "when missing), such as /dev/shm/asgi-admission."
    )


def _check_owned(setting: str, directory: str, path: str, info: os.stat_result, what: str) -> None:
    uid = os.geteuid()
    if info.st_uid != uid:
        raise _refuse(
            setting,
            directory,
            path,
            f"is a {what} owned by uid {info.st_uid}, not by this user (uid {uid})",
        )
    if info.st_mode & _OTHERS_WRITE:
        raise _refuse(
            setting,
            directory,
            path,
            f"is a {what} that other users may write to (mode {stat.S_IMODE(info.st_mode):04o})",
        )


def open_private_dir(directory: str, *, setting: str = SHARED_DIR_SETTING) -> int:
    """Create ``directory`` (mode 0700) if missing and return a checked descriptor of it,
    for the caller to close; :class:`UnsafeFileError` naming ``setting`` otherwise (the
    sticky bit does not help: others could still add files to it)."""
    directory = os.path.abspath(directory)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except FileExistsError:
        pass  # something that is not a directory: the open below says what
    except OSError as exc:
        raise _refuse(
            setting, directory, directory, f"cannot be created ({exc.strerror or exc})"
        ) from exc
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refuse(setting, directory, directory, "is a symlink or not a directory") from exc
        raise _refuse(
            setting, directory, directory, f"cannot be opened ({exc.strerror or exc})"
        ) from exc
    try:
        _check_owned(setting, directory, directory, os.fstat(fd), "directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private_file(directory: str, name: str, *, setting: str = SHARED_DIR_SETTING) -> int:
    """Open ``directory/name`` read-write (close-on-exec), creating it (mode 0600) only
    if it is missing; :class:`UnsafeFileError` naming ``setting`` where it is unsafe
    (a symlink, not a regular file, another user's, writable by others)."""
    directory = os.path.abspath(directory)
    path = os.path.join(directory, name)
    dir_fd = open_private_dir(directory, setting=setting)
    try:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        fd = -1
        # Two tries: another worker may create the file between our open and our create.
        for _ in range(2):
            try:
                fd = os.open(name, flags, dir_fd=dir_fd)
                break
            except FileNotFoundError:
                pass
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
                break
            except FileExistsError:
                continue
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(setting, directory, path, "is a symlink") from exc
        raise _refuse(
            setting, directory, path, f"cannot be opened ({exc.strerror or exc})"
        ) from exc
    finally:
        os.close(dir_fd)
    if fd < 0:
        raise _refuse(setting, directory, path, "keeps appearing and disappearing")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(setting, directory, path, "is not a regular file")
        _check_owned(setting, directory, path, info, "file")
        # O_NONBLOCK only kept the open from hanging on a planted FIFO.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def process_alive(pid: int) -> bool:
    """Whether the worker ``pid`` that wrote a row of a shared file still runs (this
    process always; one of another user's that cannot be signalled counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
