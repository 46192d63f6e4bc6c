"""The files the workers share: opened safely, rebuilt when malformed, merged."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from asgi_admission._admission.reservations import shared_files
from asgi_admission._admission.reservations.learning import Observations, Overlap, Window
from asgi_admission._admission.reservations.probing import Probe, ProbeTrial
from asgi_admission._admission.reservations.settling import QueueRecord
from asgi_admission._admission.reservations.shared_files import (
    LEARNED_FILE,
    PROBING_FILE,
    SETTLING_FILE,
    LearnedStore,
    SharedProbeStore,
    SharedSettleQueue,
    read_learned,
    read_probing,
)
from kits.suitekit import MIB

#: Internal on purpose: the files the workers share for settling and learning.
INTERNAL = "the files the workers share for settling and learning"


@pytest.mark.parametrize("name", [SETTLING_FILE, LEARNED_FILE])
def test_new_files_are_private(tmp_path: Path, name: str) -> None:
    """The directory is made 0700 and each file 0600."""
    shared = tmp_path / "shared"
    opened = open_both(shared)
    assert shared.stat().st_mode & 0o777 == 0o700
    assert (shared / name).stat().st_mode & 0o777 == 0o600
    opened.close()


@pytest.mark.parametrize("name", [SETTLING_FILE, LEARNED_FILE])
def test_a_symlink_is_refused(tmp_path: Path, name: str) -> None:
    """A symlink planted in the shared directory is not followed: its target is untouched."""
    (tmp_path / "target").write_text("precious")
    (tmp_path / name).symlink_to(tmp_path / "target")
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR=.*is a symlink"):
        open_both(tmp_path)
    assert (tmp_path / "target").read_text() == "precious"


@pytest.mark.parametrize("name", [SETTLING_FILE, LEARNED_FILE])
def test_a_file_others_may_write_is_refused(tmp_path: Path, name: str) -> None:
    """A file other users may write to is refused, naming the setting."""
    path = tmp_path / name
    path.write_text("")
    path.chmod(0o666)
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR=.*other users may write"):
        open_both(tmp_path)


@pytest.mark.parametrize("name", [SETTLING_FILE, LEARNED_FILE])
def test_a_file_of_another_user_is_refused(tmp_path: Path, name: str) -> None:
    """A file owned by another user is refused."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("changing a file's owner needs root")
        pytest.skip("changing a file's owner needs root")
    path = tmp_path / name
    path.write_text("")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(ValueError, match="owned by uid 65534"):
        open_both(tmp_path)


@pytest.mark.parametrize("name", [SETTLING_FILE, LEARNED_FILE])
def test_a_directory_in_its_place_is_refused(tmp_path: Path, name: str) -> None:
    """Something that is not a regular file cannot be opened as one."""
    (tmp_path / name).mkdir(mode=0o700)
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR=.*Is a directory"):
        open_both(tmp_path)


class Opened:
    def __init__(self, queue: SharedSettleQueue, store: LearnedStore) -> None:
        self.queue, self.store = queue, store

    def close(self) -> None:
        self.queue.close()


def open_both(directory: Path) -> Opened:
    """Both shared files of ``directory``, as a worker opens them."""
    queue = SharedSettleQueue(str(directory))
    try:
        return Opened(queue, LearnedStore(str(directory), keep=4))
    except BaseException:
        queue.close()
        raise


def test_the_settling_queue_round_trips(tmp_path: Path) -> None:
    """Records and what is accounted for, stored by one queue, are what another opening loads."""
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


def test_the_settling_queue_shows_when_other_workers_sessions_were_admitted(
    tmp_path: Path,
) -> None:
    """At each load the queue says when the other workers' sessions on it were admitted
    (what the learner must not take for this worker's own), and only theirs."""
    queue = SharedSettleQueue(str(tmp_path))
    other = os.getpid() + 1
    records = [
        QueueRecord(os.getpid(), 1, 2.5, 100 * MIB, 50 * MIB),
        QueueRecord(other, 7, 3.5, 100 * MIB, 50 * MIB),
    ]
    seen: list[tuple[float, ...]] = []
    for stored in (records, records[:1]):
        queue.store(None, stored)
        queue.load()
        seen.append(queue.others)
    assert seen == [(3.5,), ()]
    queue.close()


def test_the_other_workers_admissions_are_those_the_last_load_read(tmp_path: Path) -> None:
    """What the queue says of the other workers' admissions is what its last load read,
    whatever the caller has done since to the records that load handed it."""
    queue = SharedSettleQueue(str(tmp_path))
    other = os.getpid() + 1
    queue.store(None, [QueueRecord(other, 7, 3.5, 100 * MIB, 50 * MIB)])
    _accounted, records = queue.load()
    records[0] = QueueRecord(other, 8, 9.5, 100 * MIB, 50 * MIB)
    records.append(QueueRecord(other, 9, 4.5, 100 * MIB, 50 * MIB))
    assert queue.others == (3.5,)
    assert queue.others == (3.5,)  # asked again: the same
    queue.close()


def test_a_load_makes_records_again_only_when_the_rows_changed(tmp_path: Path) -> None:
    """Loaded again with nothing changed, the queue hands back the same records; changed
    by another worker, or by the caller without storing them, it makes them again from
    the file."""
    queue = SharedSettleQueue(str(tmp_path))
    other = SharedSettleQueue(str(tmp_path))
    stored = [QueueRecord(os.getpid(), 1, 2.5, 100 * MIB, 50 * MIB)]
    queue.store(90 * MIB, stored)
    accounted, records = queue.load()
    assert (accounted, records) == (90 * MIB, stored)
    assert queue.load()[1] is records
    records[0].base_bytes = 0
    records.append(QueueRecord(os.getpid(), 2, 3.5, 110 * MIB, 50 * MIB))
    fresh = queue.load()[1]
    assert fresh == [QueueRecord(os.getpid(), 1, 2.5, 100 * MIB, 50 * MIB)]
    moved = [QueueRecord(os.getpid() + 1, 7, 3.5, 120 * MIB, 40 * MIB, True)]
    other.store(None, moved)
    assert queue.load() == (None, moved)
    queue.close()
    other.close()


def probe_trial(route: str = "POST /s", *, pid: int | None = None) -> ProbeTrial:
    """An open trial of one probe of this process (or of ``pid``)."""
    return ProbeTrial(
        route=route,
        started_at=1.5,
        base_bytes=100 * MIB,
        guess_bytes=16 * MIB,
        peak_bytes=120 * MIB,
        last_peak_at=2.0,
        last_event_at=2.0,
        probes=[Probe(os.getpid() if pid is None else pid, 3)],
        admitted=1,
        peaks=[(1.5, 100 * MIB), (2.0, 120 * MIB)],
        waiting={os.getpid(): 2},
    )


def test_the_probing_file_loads_the_trials_stored_and_what_others_stored(
    tmp_path: Path,
) -> None:
    """Trials stored by one worker are what another loads; unchanged, a load hands back
    the same trials, and trials changed without being stored are read from the file."""
    first = SharedProbeStore(str(tmp_path))
    second = SharedProbeStore(str(tmp_path))
    assert first.load() == {}
    first.store({"POST /s": probe_trial()})
    loaded = second.load()
    assert loaded == {"POST /s": probe_trial()}
    assert second.load() is loaded
    assert loaded is not None
    loaded["POST /s"].peak_bytes = 0
    assert second.load() == {"POST /s": probe_trial()}
    second.store({})
    assert first.load() == {}
    first.close()
    second.close()


def test_the_probing_file_deleted_is_made_again(tmp_path: Path) -> None:
    """The store keeps its file open; deleted with its directory, the next store makes
    both again, where another worker and ``probe`` find it."""
    shared = tmp_path / "shared"
    store = SharedProbeStore(str(shared))
    store.store({"POST /s": probe_trial()})
    shutil.rmtree(shared)
    assert store.load() == {}
    store.store({"POST /s": probe_trial(pid=os.getpid() + 1)})
    assert (shared / PROBING_FILE).stat().st_mode & 0o777 == 0o600
    assert read_probing(str(shared)) == {"POST /s": probe_trial(pid=os.getpid() + 1)}
    store.close()


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


def observed(
    route: str,
    *,
    footprints: Sequence[float] = (),
    ramps: Sequence[float] = (),
    ends: Sequence[float] = (),
    exact: Sequence[float] = (),
    windows: Sequence[Window] = (),
    probed: Sequence[float] = (),
) -> Observations:
    """What one route's observations look like in the file."""
    return {
        route: {
            "footprints": [float(v) for v in footprints],
            "ramps": [float(v) for v in ramps],
            "ends": [float(v) for v in ends],
            "exact": [float(v) for v in exact],
            "windows": list(windows),
            "probed": [float(v) for v in probed],
        }
    }


def a_window(growth_mb: float, *, overlaps: tuple[Overlap, ...] = ()) -> Window:
    return Window(growth_mb * MIB, 3.5, 1.8, overlaps, True)


def test_learned_observations_are_merged_and_survive(tmp_path: Path) -> None:
    """Two stores append to one file; a new store reads everything back, windowed."""
    first = LearnedStore(str(tmp_path), keep=3)
    second = LearnedStore(str(tmp_path), keep=3)
    first.add(observed("POST /s", footprints=[10 * MIB], ramps=[1.0]))
    merged = second.add(
        {
            **observed("POST /s", footprints=[20 * MIB]),
            **observed("WS /t", footprints=[5 * MIB], ramps=[0.5]),
        }
    )
    assert merged is not None
    assert merged["POST /s"]["footprints"] == [10.0 * MIB, 20.0 * MIB]
    assert merged["POST /s"]["ramps"] == [1.0]
    for i in range(5):
        first.add(observed("POST /s", footprints=[i], ramps=[float(i)]))
    again = LearnedStore(str(tmp_path), keep=3).load()
    assert again["POST /s"]["footprints"] == [2.0, 3.0, 4.0]
    assert read_learned(str(tmp_path), keep=3) == again


def test_windows_and_ends_are_shared_and_read_back(tmp_path: Path) -> None:
    """Windows (with their overlaps), the memory freed at ends and the exact peaks of
    sessions in groups of their own go through the file as they were made, windowed like
    the rest; the file says it is version 2."""
    store = LearnedStore(str(tmp_path), keep=2)
    overlap = (Overlap("WS /t", 0.75, 0.5, 48 * MIB, 0.5),)
    store.add(observed("POST /s", ends=[48 * MIB], exact=[41 * MIB], windows=[a_window(48)]))
    store.add(observed("POST /s", windows=[a_window(100, overlaps=overlap), a_window(50)]))
    again = LearnedStore(str(tmp_path), keep=2).load()
    assert again["POST /s"]["windows"] == [a_window(100, overlaps=overlap), a_window(50)]
    assert again["POST /s"]["ends"] == [48.0 * MIB]
    assert again["POST /s"]["exact"] == [41.0 * MIB]
    assert json.loads((tmp_path / LEARNED_FILE).read_text())["version"] == 2


def test_probes_figures_are_shared_and_a_file_without_them_still_reads(tmp_path: Path) -> None:
    """A concluded probe's growth per session goes through the file with the rest; a file
    written before it was kept (no ``probed``) reads as having none."""
    store = LearnedStore(str(tmp_path), keep=2)
    store.add(observed("POST /s", probed=[48 * MIB, 50 * MIB, 52 * MIB]))
    again = LearnedStore(str(tmp_path), keep=2).load()
    assert again["POST /s"]["probed"] == [50.0 * MIB, 52.0 * MIB]
    document = json.loads((tmp_path / LEARNED_FILE).read_text())
    del document["routes"]["POST /s"]["probed"]
    (tmp_path / LEARNED_FILE).write_text(json.dumps(document))
    assert LearnedStore(str(tmp_path), keep=2).load()["POST /s"]["probed"] == []


def test_a_version_1_file_is_read_as_per_session_values(tmp_path: Path) -> None:
    """A file of the first release (footprints and ramps alone) keeps what it held: its
    values count as per-session footprints until newer observations replace them."""
    path = tmp_path / LEARNED_FILE
    document = {
        "version": 1,
        "id": "abc",
        "routes": {"POST /s": {"footprints": [96.0 * MIB], "ramps": [2.0]}},
    }
    path.write_text(json.dumps(document))
    path.chmod(0o600)
    loaded = LearnedStore(str(tmp_path), keep=4).load()
    assert loaded == observed("POST /s", footprints=[96 * MIB], ramps=[2.0])


def test_a_malformed_window_makes_the_file_unusable_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A window that is not ``[growth, seconds, ramp, overlaps, exact]`` is not half-read:
    the file counts as nothing learned, with the warning, as any malformed file."""
    path = tmp_path / LEARNED_FILE
    route: dict[str, list[object]] = {
        "footprints": [],
        "ramps": [],
        "ends": [],
        "windows": [[1.0, 2.0, None, [], "yes"]],
    }
    path.write_text(json.dumps({"version": 2, "id": "abc", "routes": {"POST /s": route}}))
    path.chmod(0o600)
    assert LearnedStore(str(tmp_path), keep=4).load() == {}
    assert "not a learned-sessions file" in caplog.text


def test_a_malformed_learned_file_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Unreadable JSON counts as nothing learned, with a warning, and is rewritten."""
    path = tmp_path / LEARNED_FILE
    path.write_text("{nope")
    path.chmod(0o600)
    store = LearnedStore(str(tmp_path), keep=4)
    assert store.load() == {}
    assert "not a learned-sessions file" in caplog.text
    store.add(observed("POST /s", footprints=[1]))
    assert json.loads(path.read_text())["routes"]["POST /s"]["footprints"] == [1.0]


def test_no_learned_file_reads_as_none(tmp_path: Path) -> None:
    """probe's reader says there is no evidence where no file exists."""
    assert read_learned(str(tmp_path), keep=4) is None


def test_a_shared_dir_that_cannot_be_created_names_the_setting(tmp_path: Path) -> None:
    """A shared directory under a regular file is an error naming ADMISSION_SHARED_DIR."""
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR=.*cannot be created"):
        SharedSettleQueue(str(tmp_path / "file" / "shared"))


def test_the_learned_file_survives_its_directory_being_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The directory deleted under a running service is made again and the file refilled
    from what the worker knows (which holds the new observation), without an error."""
    shared = tmp_path / "shared"
    store = LearnedStore(str(shared), keep=8)
    store.add(observed("POST /s", footprints=[10 * MIB], ramps=[1.0]))
    shutil.rmtree(shared)
    known = observed(
        "POST /s", footprints=[10 * MIB, 20 * MIB], ramps=[1.0], windows=[a_window(20)]
    )
    merged = store.add(
        observed("POST /s", footprints=[20 * MIB], windows=[a_window(20)]), known=known
    )
    assert merged == known
    assert LearnedStore(str(shared), keep=8).load() == known
    assert (shared / LEARNED_FILE).stat().st_mode & 0o777 == 0o600
    assert caplog.text == ""


def test_a_learned_file_that_cannot_be_used_is_logged_once_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With a regular file where the directory was, adding and refreshing answer None with
    one warning; once the directory is back, they work again and say so."""
    shared = tmp_path / "shared"
    store = LearnedStore(str(shared), keep=8)
    store.add(observed("POST /s", footprints=[10 * MIB], ramps=[1.0]))
    shutil.rmtree(shared)
    shared.write_text("in the way")
    assert store.add(observed("POST /s", footprints=[20 * MIB])) is None
    assert store.refresh() is None
    assert caplog.text.count("each worker keeps what it learns") == 1
    assert "ADMISSION_SHARED_DIR" in caplog.text
    shared.unlink()
    assert store.refresh() == {}
    assert "usable again" in caplog.text
    assert store.add(observed("POST /s", footprints=[30 * MIB])) == observed(
        "POST /s", footprints=[30 * MIB]
    )


def test_the_settling_queue_follows_its_file_deleted_with_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two workers' queues on a file deleted with its directory: the first to look makes
    it again and carries the rows over, the second adds none twice, and a worker that
    opens the path now sees them all."""
    monkeypatch.setattr(shared_files, "LINK_CHECK_INTERVAL_S", 0.0)
    shared = tmp_path / "shared"
    first = SharedSettleQueue(str(shared))
    second = SharedSettleQueue(str(shared))
    records = [
        QueueRecord(os.getpid(), 1, 2.5, 100 * MIB, 50 * MIB, False),
        QueueRecord(os.getpid(), 2, 3.5, 110 * MIB, 50 * MIB, True),
    ]
    first.store(90 * MIB, records)
    shutil.rmtree(shared)
    ordered = [records[1], records[0]]  # those left early first
    assert first.load() == (90 * MIB, ordered)
    assert second.load() == (90 * MIB, ordered)
    third = SharedSettleQueue(str(shared))
    assert third.load() == (90 * MIB, ordered)
    assert caplog.text.count("moved to the file now at that path") == 2
    for queue in (first, second, third):
        queue.close()


def test_the_settling_queue_keeps_working_when_its_directory_cannot_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A regular file where the directory was: a fork hook and later loads do not raise;
    the worker goes on with the file it has and says so once."""
    monkeypatch.setattr(shared_files, "LINK_CHECK_INTERVAL_S", 0.0)
    shared = tmp_path / "shared"
    queue = SharedSettleQueue(str(shared))
    records = [QueueRecord(os.getpid(), 1, 2.5, 100 * MIB, 50 * MIB, False)]
    queue.store(None, records)
    shutil.rmtree(shared)
    shared.write_text("in the way")
    queue.after_fork()
    assert queue.load() == (None, records)
    assert queue.load() == (None, records)
    assert caplog.text.count("cannot be made again") == 1
    queue.close()


def test_only_this_workers_rows_move_to_the_new_settling_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that follows late carries over its own rows only: another worker's row,
    which that worker may have dropped in the new file since, does not come back."""
    monkeypatch.setattr(shared_files, "LINK_CHECK_INTERVAL_S", 0.0)
    shared = tmp_path / "shared"
    queue = SharedSettleQueue(str(shared))
    own = QueueRecord(os.getpid(), 1, 2.5, 100 * MIB, 50 * MIB, False)
    others = QueueRecord(os.getppid(), 7, 2.0, 100 * MIB, 50 * MIB, False)
    queue.store(None, [others, own])
    shutil.rmtree(shared)
    assert queue.load() == (None, [own])
    queue.close()


def test_the_settling_queue_waits_for_its_ledger_to_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue is used under the ledger's lock: while this worker's ledger is still
    the deleted file, the queue stays in its deleted file too (the workers already in
    the new ledger write the new queue under a lock this worker does not hold); once
    the ledger has moved, so does the queue, with its rows."""
    monkeypatch.setattr(shared_files, "LINK_CHECK_INTERVAL_S", 0.0)
    shared = tmp_path / "shared"
    ledger_moved = False
    queue = SharedSettleQueue(str(shared), may_follow=lambda: ledger_moved)
    own = QueueRecord(os.getpid(), 1, 2.5, 100 * MIB, 50 * MIB, False)
    queue.store(None, [own])
    shutil.rmtree(shared)
    newcomer = SharedSettleQueue(str(shared))
    assert queue.load() == (None, [own])  # still the old file
    assert newcomer.load() == (None, [])  # the new file: untouched
    ledger_moved = True
    assert queue.load() == (None, [own])
    assert newcomer.load() == (None, [own])
    queue.close()
    newcomer.close()


def test_every_worker_adds_what_it_knows_to_a_learned_file_made_again(tmp_path: Path) -> None:
    """The learned file deleted with its directory: the first worker to see it made
    again writes what it knows, and another worker, which had learned more since the
    first last looked, adds what the file lacks (its larger footprint is not lost);
    what both knew is not counted twice."""
    shared = tmp_path / "shared"
    first = LearnedStore(str(shared), keep=8)
    second = LearnedStore(str(shared), keep=8)
    first.add(observed("POST /s", footprints=[100 * MIB], windows=[a_window(100)]))
    second.add(observed("POST /s", footprints=[300 * MIB], windows=[a_window(300)]))
    stale = observed("POST /s", footprints=[100 * MIB], windows=[a_window(100)])
    current = observed(
        "POST /s", footprints=[100 * MIB, 300 * MIB], windows=[a_window(100), a_window(300)]
    )
    shutil.rmtree(shared)
    assert first.refresh() == {}
    assert first.moved
    assert first.add({}, known=stale) == stale
    assert second.refresh() == stale
    assert second.moved
    assert second.add({}, known=current) == current
    assert first.refresh() == current
    assert not first.moved  # the same file as its last write: nothing to add
    assert LearnedStore(str(shared), keep=8).load() == current


def test_a_new_settling_file_that_fails_under_a_worker_leaves_it_in_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing the new file fails (a full disk): the load still answers from the old
    file, raises nothing, and the worker moves once writing works again."""
    monkeypatch.setattr(shared_files, "LINK_CHECK_INTERVAL_S", 0.0)
    shared = tmp_path / "shared"
    queue = SharedSettleQueue(str(shared))
    own = QueueRecord(os.getpid(), 1, 2.5, 100 * MIB, 50 * MIB, False)
    queue.store(None, [own])
    shutil.rmtree(shared)
    pwrite = os.pwrite

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    assert queue.load() == (None, [own])
    monkeypatch.setattr(os, "pwrite", pwrite)
    assert queue.load() == (None, [own])
    newcomer = SharedSettleQueue(str(shared))
    assert newcomer.load() == (None, [own])
    queue.close()
    newcomer.close()
