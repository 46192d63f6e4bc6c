"""The files the workers share: opened safely, rebuilt when malformed, merged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from reskit import MIB

from asgi_admission._admission.settling import QueueRecord
from asgi_admission._admission.shared_files import (
    LEARNED_FILE,
    SETTLING_FILE,
    LearnedStore,
    SharedSettleQueue,
    open_private,
    read_learned,
)

#: Internal on purpose: the files the workers share for settling and learning.
INTERNAL = "the files the workers share for settling and learning"


def test_a_new_file_is_private(tmp_path: Path) -> None:
    """Files are created 0600."""
    fd = open_private(str(tmp_path / "f"))
    os.close(fd)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o600


def test_a_symlink_is_refused(tmp_path: Path) -> None:
    """A symlink planted in the shared directory is not followed."""
    (tmp_path / "target").write_text("")
    (tmp_path / "f").symlink_to(tmp_path / "target")
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR.*symbolic link"):
        open_private(str(tmp_path / "f"))


def test_a_file_others_may_read_is_refused(tmp_path: Path) -> None:
    """A file open to other users is refused, naming the setting."""
    path = tmp_path / "f"
    path.write_text("")
    path.chmod(0o644)
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR.*lets other users in"):
        open_private(str(path))


def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    """A file owned by another user is refused."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("changing a file's owner needs root")
        pytest.skip("changing a file's owner needs root")
    path = tmp_path / "f"
    path.write_text("")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(ValueError, match="owned by uid 65534"):
        open_private(str(path))


def test_a_directory_in_its_place_is_refused(tmp_path: Path) -> None:
    """Something that is not a regular file cannot be opened as one."""
    (tmp_path / "f").mkdir(mode=0o700)
    with pytest.raises(ValueError, match="ADMISSION_SHARED_DIR"):
        open_private(str(tmp_path / "f"))


def test_the_settling_queue_round_trips(tmp_path: Path) -> None:
    """Records and the floor stored by one queue are what another opening loads."""
    first = SharedSettleQueue(str(tmp_path))
    assert first.load() == (None, [])
    records = [QueueRecord(os.getpid(), 1, 2.5, 100 * MIB, 50 * MIB, False)]
    records.append(QueueRecord(os.getpid(), 2, 3.5, 110 * MIB, 50 * MIB, True))
    first.store(90 * MIB, records)
    second = SharedSettleQueue(str(tmp_path))
    assert second.load() == (90 * MIB, records)
    first.store(None, [])
    assert second.load() == (None, [])
    first.close()
    second.close()


def test_a_malformed_settling_file_is_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A settling file with no header is started afresh, with a warning."""
    path = tmp_path / SETTLING_FILE
    path.write_bytes(b"not a queue at all, not at all")
    path.chmod(0o600)
    queue = SharedSettleQueue(str(tmp_path))
    assert queue.load() == (None, [])
    assert "starting it afresh" in caplog.text
    path.write_bytes(b"x")
    assert queue.load() == (None, [])
    queue.close()


def test_a_dead_owner_is_noticed(tmp_path: Path) -> None:
    """owner_alive tells a live pid from one that no longer exists."""
    queue = SharedSettleQueue(str(tmp_path))
    assert queue.owner_alive(os.getpid())
    assert queue.owner_alive(1)
    assert not queue.owner_alive(2**22 + 1)
    queue.close()


def test_learned_observations_are_merged_and_survive(tmp_path: Path) -> None:
    """Two stores append to one file; a new store reads everything back, windowed."""
    first = LearnedStore(str(tmp_path), window=3)
    second = LearnedStore(str(tmp_path), window=3)
    first.add([("POST /s", 10 * MIB, 1.0)])
    merged = second.add([("POST /s", 20 * MIB, None), ("WS /t", 5 * MIB, 0.5)])
    assert merged["POST /s"]["footprints"] == [10.0 * MIB, 20.0 * MIB]
    assert merged["POST /s"]["ramps"] == [1.0]
    for i in range(5):
        first.add([("POST /s", i, float(i))])
    again = LearnedStore(str(tmp_path), window=3).load()
    assert again["POST /s"]["footprints"] == [2.0, 3.0, 4.0]
    assert read_learned(str(tmp_path), window=3) == again


def test_a_malformed_learned_file_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Unreadable JSON counts as nothing learned, with a warning, and is rewritten."""
    path = tmp_path / LEARNED_FILE
    path.write_text("{nope")
    path.chmod(0o600)
    store = LearnedStore(str(tmp_path), window=4)
    assert store.load() == {}
    assert "not a learned-sessions file" in caplog.text
    store.add([("POST /s", 1, None)])
    assert json.loads(path.read_text())["routes"]["POST /s"]["footprints"] == [1.0]


def test_no_learned_file_reads_as_none(tmp_path: Path) -> None:
    """probe's reader says there is no evidence where no file exists."""
    assert read_learned(str(tmp_path), window=4) is None


def test_a_shared_dir_that_cannot_be_created_names_the_setting(tmp_path: Path) -> None:
    """A shared directory under a regular file is an error naming ADMISSION_SHARED_DIR."""
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR=.*cannot be created"):
        SharedSettleQueue(str(tmp_path / "file" / "shared"))
