"""The shared directory and its files are never reached through a link or another
user's hands: ``ADMISSION_SHARED_DIR`` refused with a sentence saying what is wrong."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from asgi_admission import AdmissionConfig, AdmissionMiddleware
from asgi_admission._admission.ledger.safe_files import (
    UnsafeFileError,
    open_private_dir,
    open_private_file,
)
from asgi_admission._admission.ledger.shared_ledger import FILE_NAME, SharedLedger
from kits.requirekit import require_root

#: Internal on purpose: the safe opener for files in the shared directory.
INTERNAL = "the safe opener for files in the shared directory"

NOBODY = 65534


def build(shared_dir: Path) -> AdmissionMiddleware:
    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("not called")

    return AdmissionMiddleware(
        app,
        session_routes=["POST /s"],
        config=AdmissionConfig(shared_dir=str(shared_dir)),
        registry=None,
    )


def test_a_symlink_at_the_ledgers_name_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    """A symlink planted at the ledger's name is not followed: the guard refuses to
    start, naming the setting, and the file it points at keeps its contents."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (shared / FILE_NAME).symlink_to(victim)
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR=.*is a symlink"):
        build(shared)
    assert victim.read_bytes() == b"precious"


def test_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    """The shared directory itself may not be a symlink (to somewhere someone chose)."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR=.*symlink or not a directory"):
        SharedLedger(tmp_path / "link")
    assert not (real / FILE_NAME).exists()


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_directory_others_may_write_to_is_refused(tmp_path: Path, mode: int) -> None:
    """The ledger's own directory must not be writable by others, sticky bit or not."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(ValueError, match=f"other users may write to \\(mode {mode:04o}\\)"):
        SharedLedger(shared)
    assert not (shared / FILE_NAME).exists()


def test_a_file_others_may_write_to_is_refused(tmp_path: Path) -> None:
    """An existing ledger file writable by others is refused, not trusted."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    (shared / FILE_NAME).write_bytes(b"")
    (shared / FILE_NAME).chmod(0o666)
    with pytest.raises(ValueError, match="is a file that other users may write to"):
        SharedLedger(shared)


def test_something_other_than_a_file_is_refused(tmp_path: Path) -> None:
    """A FIFO at the ledger's name is refused without hanging the open."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    os.mkfifo(shared / FILE_NAME)
    with pytest.raises(ValueError, match="is not a regular file"):
        SharedLedger(shared)


def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    """A directory someone else made first (say under /dev/shm) is not used, even by root."""
    require_root("chown to another user")
    shared = tmp_path / "planted"
    shared.mkdir(mode=0o755)
    os.chown(shared, NOBODY, NOBODY)
    with pytest.raises(ValueError, match=f"owned by uid {NOBODY}, not by this user"):
        build(shared)


def test_another_users_file_is_refused(tmp_path: Path) -> None:
    """A ledger file someone else owns is not written."""
    require_root("chown to another user")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    (shared / FILE_NAME).write_bytes(b"theirs")
    os.chown(shared / FILE_NAME, NOBODY, NOBODY)
    with pytest.raises(ValueError, match=f"is a file owned by uid {NOBODY}"):
        SharedLedger(shared)
    assert (shared / FILE_NAME).read_bytes() == b"theirs"


def test_a_sticky_shared_parent_is_fine_and_new_files_are_private(tmp_path: Path) -> None:
    """Under a world-writable sticky parent (like /dev/shm) the directory is made 0700 and
    the ledger file 0600, both owned by this user."""
    parent = tmp_path / "shm"
    parent.mkdir()
    parent.chmod(0o1777)
    ledger = SharedLedger(parent / "asgi-admission")
    try:
        directory = os.stat(parent / "asgi-admission")
        file = os.stat(parent / "asgi-admission" / FILE_NAME)
        assert stat.S_IMODE(directory.st_mode) == 0o700
        assert stat.S_IMODE(file.st_mode) == 0o600
        assert directory.st_uid == file.st_uid == os.geteuid()
    finally:
        ledger.close()


def test_open_private_file_creates_once_and_reopens(tmp_path: Path) -> None:
    """The reusable opener creates a missing file and opens the same one later."""
    first = open_private_file(str(tmp_path / "d"), "figures", setting="SOME_SETTING")
    try:
        os.write(first, b"42")
    finally:
        os.close(first)
    second = open_private_file(str(tmp_path / "d"), "figures", setting="SOME_SETTING")
    try:
        assert os.pread(second, 10, 0) == b"42"
    finally:
        os.close(second)


def test_errors_name_the_callers_setting(tmp_path: Path) -> None:
    """The error names whichever setting the caller passes, and is a ValueError."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(
        UnsafeFileError, match=r"^SOME_SETTING=.* cannot be used: .*cannot be created"
    ):
        open_private_dir(str(tmp_path / "file" / "d"), setting="SOME_SETTING")
    with pytest.raises(UnsafeFileError, match="is a symlink or not a directory"):
        open_private_dir(str(tmp_path / "file"), setting="SOME_SETTING")
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / "sub").mkdir()
    with pytest.raises(UnsafeFileError, match="cannot be opened"):
        open_private_file(str(tmp_path / "d"), "sub", setting="SOME_SETTING")


def test_a_directory_that_cannot_be_opened_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open refused by the kernel (say EACCES for another user) says so, naming it."""
    real_open = os.open

    def refusing(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if flags & os.O_DIRECTORY:
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(UnsafeFileError, match=r"cannot be opened \(Permission denied\)"):
        open_private_dir(str(tmp_path / "d"), setting="SOME_SETTING")


def test_a_file_that_keeps_vanishing_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that is missing when opened and present when created, twice over (a
    race with someone deleting and recreating it), is refused rather than retried
    forever."""
    real_open = os.open

    def racing(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if path == "figures" and flags & os.O_CREAT:
            raise FileExistsError(17, "File exists")
        if path == "figures":
            raise FileNotFoundError(2, "No such file or directory")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", racing)
    with pytest.raises(UnsafeFileError, match="keeps appearing and disappearing"):
        open_private_file(str(tmp_path / "d"), "figures", setting="SOME_SETTING")
