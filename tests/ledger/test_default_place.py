"""The place the workers of one memory group share by default: found, private, per group,
and refused (for the next) where something else holds its name."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ledgerkit import SPAWN, hold_sessions, write_v2_tree
from test_ledger_faults import ok_app, post

from asgi_admission import (
    AdmissionConfig,
    AdmissionMiddleware,
    AdmissionTicket,
    HostMemoryReader,
    MemoryReading,
    _factory,
)
from asgi_admission._admission.ledger import shared_place
from asgi_admission._admission.ledger.ledger import InProcessLedger
from asgi_admission._admission.ledger.shared_ledger import FILE_NAME, SharedLedger, read_entries
from asgi_admission._admission.ledger.shared_place import AloneCheck, MemoryGroup
from asgi_admission._admission.reservations import shared_files
from asgi_admission._admission.reservations.learning import empty_observations
from asgi_admission._admission.reservations.settling import QueueRecord
from asgi_admission._admission.reservations.tickets import reservation_of
from asgi_admission._factory import build_sharing
from asgi_admission._memory.reading import CgroupMemoryReader
from asgi_admission.cli.probe import learned, probing, service_directory

#: Internal on purpose: the bases the default place is made under are injected (the
#: suite never uses the machine's /dev/shm), and so is the /proc the search reads.
INTERNAL = "the default shared place's bases, its name and the search for other workers"


@pytest.fixture
def bases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Two bases for default places, in order, standing for /dev/shm and the next."""
    made = [tmp_path / "shm", tmp_path / "run"]
    for base in made:
        base.mkdir()
        base.chmod(0o1777)  # like /dev/shm: everyone may write, sticky
    monkeypatch.setattr(shared_place, "default_bases", lambda: tuple(map(str, made)))
    return made


def tree(tmp_path: Path, name: str) -> Path:
    return write_v2_tree(tmp_path / name, used_mb=100, limit_mb=4096)


def guard(cgroup: Path, *, max_sessions: int = 10, **settings: Any) -> AdmissionMiddleware:
    """A guard of the memory group ``cgroup`` with nothing said about sharing."""
    # The fixture's memory never moves: a timeout of ~0 settles each session at its response,
    # and a probe would learn nothing from it (these tests are about where counts live).
    settings.setdefault("pending_timeout_s", 1e-9)
    settings.setdefault("probe_sessions", 0)
    config = AdmissionConfig(cgroup_root=str(cgroup), max_sessions=max_sessions, **settings)
    return AdmissionMiddleware(ok_app, session_routes=["POST /s"], config=config, registry=None)


def hold_sessions_open(*guards: AdmissionMiddleware) -> asyncio.Event:
    """Each guard's app keeps its session requests open until the event is set."""
    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await release.wait()
        await ok_app(scope, receive, send)

    for middleware in guards:
        middleware.app = app
    return release


def test_guards_of_one_memory_group_share_a_private_place_by_default(
    tmp_path: Path, bases: list[Path]
) -> None:
    """Two guards reading the same memory group, with no shared directory set, count
    each other's sessions in one directory under the first base: this user's, mode 0700,
    named after the group."""
    group = tree(tmp_path, "app-container")
    first, second = guard(group, max_sessions=2), guard(group, max_sessions=2)
    assert first.shared_dir is not None
    assert first.shared_dir == second.shared_dir
    place = Path(first.shared_dir)
    assert place.parent == bases[0]
    assert place.name.startswith(f"asgi-admission-{os.geteuid()}-app-container-")
    info = place.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o700)
    release = hold_sessions_open(first, second)

    async def scenario() -> list[int]:
        opened = [asyncio.ensure_future(post(g)) for g in (first, second)]
        await asyncio.sleep(0.05)
        refused = (await post(first))[0]  # 2 of 2 are open, one through each guard
        release.set()
        return [refused, *[status for status, _, _ in await asyncio.gather(*opened)]]

    assert asyncio.run(scenario()) == [503, 200, 200]
    assert first.session_counts() == second.session_counts() == (0, 0)


def test_two_memory_groups_never_share_a_place(tmp_path: Path, bases: list[Path]) -> None:
    """Guards of two memory groups get two places, under the same base, and one's
    sessions never count against the other's."""
    one, other = guard(tree(tmp_path, "one"), max_sessions=1), guard(tree(tmp_path, "other"))
    assert one.shared_dir is not None
    assert other.shared_dir is not None
    assert one.shared_dir != other.shared_dir
    assert Path(one.shared_dir).parent == Path(other.shared_dir).parent == bases[0]
    release = hold_sessions_open(one)

    async def scenario() -> tuple[int, tuple[int, int]]:
        opened = asyncio.ensure_future(post(one))
        await asyncio.sleep(0.05)
        status, counts = (await post(other))[0], other.session_counts()
        release.set()
        await opened
        return status, counts

    assert asyncio.run(scenario()) == (200, (0, 0))


def test_groups_seen_at_the_same_path_are_told_apart(tmp_path: Path) -> None:
    """Two containers each seeing their group at /sys/fs/cgroup (a cgroup namespace of
    their own) get different names: the name carries the group directory's identity
    (device and inode), not only its path; the same group always gets the same one."""
    path = tmp_path / "cgroup"
    tree(tmp_path, "cgroup")
    first = shared_place.group_of(CgroupMemoryReader(path))
    (tmp_path / "kept").mkdir()
    path.rename(tmp_path / "kept" / "old")  # the old group lives on; a new one at its path
    tree(tmp_path, "cgroup")
    second = shared_place.group_of(CgroupMemoryReader(path))
    again = shared_place.group_of(CgroupMemoryReader(path))
    assert first is not None
    assert second is not None
    assert first.label == second.label
    assert shared_place.directory_name(first) != shared_place.directory_name(second)
    assert again == second
    assert shared_place.directory_name(again) == shared_place.directory_name(second)
    same_label = [MemoryGroup("/sys/fs/cgroup", f"cgroup 26:{ino} boot b", None) for ino in (1, 2)]
    names = {shared_place.directory_name(group, uid=0) for group in same_label}
    assert len(names) == 2
    assert all(name.startswith("asgi-admission-0-cgroup-") for name in names)


def test_off_and_a_named_directory_are_still_obeyed(
    tmp_path: Path, bases: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``off`` (in code or ADMISSION_SHARED_DIR, in any case) counts in the process;
    a directory named is used as it is; an empty value is refused, naming the setting."""
    group = tree(tmp_path, "app")
    assert guard(group, shared_dir="off").shared_dir is None
    assert isinstance(guard(group, shared_dir="off").service.ledger, InProcessLedger)
    monkeypatch.setenv("ADMISSION_SHARED_DIR", " OFF ")
    assert AdmissionConfig.from_env().shared_dir == "off"
    monkeypatch.setenv("ADMISSION_SHARED_DIR", "")
    assert AdmissionConfig.from_env().shared_dir == "auto"
    named = tmp_path / "named"
    assert guard(group, shared_dir=str(named)).shared_dir == str(named)
    assert list(bases[0].iterdir()) == []  # nothing made in the default place
    with pytest.raises(ValueError, match=r"shared_dir \(ADMISSION_SHARED_DIR\) must be 'auto'"):
        AdmissionConfig(shared_dir="  ")


@pytest.mark.parametrize(
    "squat", ["another user's", "writable by others", "a symlink", "a file", "a file inside"]
)
def test_a_name_taken_by_something_else_is_refused_for_the_next_base(
    tmp_path: Path, bases: list[Path], caplog: pytest.LogCaptureFixture, squat: str
) -> None:
    """Where the group's name under the first base is not this user's private directory,
    the guard says so at WARNING, naming the path, and uses the next base."""
    group = tree(tmp_path, "app")
    found = shared_place.group_of(CgroupMemoryReader(group))
    assert found is not None
    taken = bases[0] / shared_place.directory_name(found)
    if squat == "a symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        taken.symlink_to(tmp_path / "elsewhere")
    elif squat == "a file":
        taken.write_text("not a directory")
    elif squat == "a file inside":
        taken.mkdir(mode=0o700)
        (taken / shared_files.LEARNED_FILE).write_text("{}")
        os.chown(taken / shared_files.LEARNED_FILE, 65534, 65534)
    else:
        taken.mkdir(mode=0o700 if squat == "another user's" else 0o777)
        taken.chmod(0o700 if squat == "another user's" else 0o777)
        if squat == "another user's":
            os.chown(taken, 65534, 65534)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        middleware = guard(group)
    assert middleware.shared_dir == str(bases[1] / taken.name)
    assert f"{taken} cannot hold the shared session ledger" in caplog.text
    assert not (tmp_path / "elsewhere" / FILE_NAME).exists()


def test_a_missing_base_is_passed_over_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A base that does not exist (a container without /dev/shm) is passed over without
    a warning; with no base at all the guard counts alone, and with no other worker
    around it says nothing."""
    present = tmp_path / "tmp"
    present.mkdir()
    monkeypatch.setattr(
        shared_place, "default_bases", lambda: (str(tmp_path / "no-shm"), str(present))
    )
    group = tree(tmp_path, "app")
    with caplog.at_level(logging.INFO, logger="asgi_admission"):
        middleware = guard(group)
    assert middleware.shared_dir is not None
    assert Path(middleware.shared_dir).parent == present
    assert [r.levelname for r in caplog.records] == ["INFO"]  # which place: said at INFO
    monkeypatch.setattr(shared_place, "default_bases", lambda: ())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        alone = guard(group)
        assert alone.service.alone is not None
        assert alone.service.alone.search() == []
    assert alone.shared_dir is None
    assert caplog.records == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_a_read_only_base_is_passed_over(tmp_path: Path) -> None:
    """A base that is read-only (its own mount, in a mount namespace of the child's) is
    passed over for the next; the reason goes with the search's warning, not a warning
    of its own."""
    read_only, writable = tmp_path / "ro", tmp_path / "rw"
    read_only.mkdir()
    writable.mkdir()
    group = tree(tmp_path, "app")
    script = (
        "import sys\n"
        "from asgi_admission._admission.ledger import shared_place\n"
        "from asgi_admission._memory.reading import CgroupMemoryReader\n"
        "group = shared_place.group_of(CgroupMemoryReader(sys.argv[1]))\n"
        "place = shared_place.choose_place(group, bases=sys.argv[2:])\n"
        "print(place.directory)\n"
        "print(place.passed_over)\n"
    )
    shell = f'mount -t tmpfs -o ro tmpfs "{read_only}" && exec "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell, "sh"]
    try:
        done = subprocess.run(
            [*unshare, sys.executable, "-c", script, str(group), str(read_only), str(writable)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except FileNotFoundError:
        pytest.skip("needs unshare(1)")
    assert done.returncode == 0, done.stderr
    chosen, passed_over = done.stdout.splitlines()
    assert Path(chosen).parent == writable
    assert "Read-only file system" in passed_over


def test_a_place_left_by_dead_workers_is_used_afresh(tmp_path: Path, bases: list[Path]) -> None:
    """The group's directory left behind with a killed worker's sessions in its ledger
    and its rows in the settling queue: a new guard recovers them and admits up to
    max_sessions, counting none of the dead worker's."""
    group = tree(tmp_path, "app")
    found = shared_place.group_of(CgroupMemoryReader(group))
    assert found is not None
    place = shared_place.choose_place(found).directory
    assert place is not None
    ready = SPAWN.Event()
    worker = SPAWN.Process(target=hold_sessions, args=(place, 3, 1, ready))
    worker.start()
    assert ready.wait(30)
    dead = worker.pid
    assert dead is not None
    queue = shared_files.SharedSettleQueue(place)
    queue.store(None, [QueueRecord(dead, 1, 0.0, 50 * 2**20, 2**30)])
    queue.close()
    os.kill(dead, signal.SIGKILL)
    worker.join()
    middleware = guard(group, max_sessions=2)
    assert middleware.shared_dir == place

    async def scenario() -> list[int]:
        return [(await post(middleware))[0] for _ in range(2)]

    assert asyncio.run(scenario()) == [200, 200]
    assert middleware.session_counts() == (0, 0)
    assert all(entry.pid != dead for entry in read_entries(place) if entry.pending)


def test_two_guards_of_one_process_never_take_each_others_settling_rows(
    tmp_path: Path, bases: list[Path]
) -> None:
    """Two guards built in one process share the default place (one memory group): each
    queues its sessions under its own numbers, so releasing one guard's session leaves
    the other's row and count alone."""
    group = tree(tmp_path, "app")
    first = guard(group, pending_timeout_s=60.0)
    second = guard(group, pending_timeout_s=60.0)
    assert first.shared_dir == second.shared_dir
    assert first.shared_dir is not None
    entries = []
    for middleware in (first, second):
        outcome = middleware.service.admit("http")
        assert isinstance(outcome, AdmissionTicket)
        entries.append(outcome)
    # A slot each in the ledger: each guard is a worker of its own there.
    busy = [(e.pid, e.pending) for e in read_entries(first.shared_dir) if e.pending]
    assert busy == [(os.getpid(), 1), (os.getpid(), 1)]
    queue = shared_files.SharedSettleQueue(first.shared_dir)
    try:
        rows = queue.load()[1]
        assert len({(row.pid, row.seq) for row in rows}) == 2
        entries[0].release()
        assert [(row.pid, row.seq) for row in queue.load()[1]] == [
            (os.getpid(), reservation_of(entries[1]).seq)
        ]
    finally:
        queue.close()
    assert second.session_counts() == (0, 1)
    entries[1].release()
    assert first.session_counts() == (0, 0)


WORKER = "python3\0-c\0from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle={})\0"


def proc_tree(root: Path, processes: dict[int, tuple[int, str, str]], me: int) -> Path:
    """A fixture /proc: each pid's stat (with its parent), cmdline and exe; ``self`` is
    ``me``."""
    for pid, (parent, program, command) in processes.items():
        directory = root / str(pid)
        directory.mkdir(parents=True)
        (directory / "stat").write_text(f"{pid} (python3 x) S {parent} 1 1 0 -1\n")
        (directory / "cmdline").write_text(command.format(pid))
        binary = root.parent / "bin" / program
        binary.parent.mkdir(exist_ok=True)
        binary.touch()
        (directory / "exe").symlink_to(binary)
    (root / "self").symlink_to(str(me))
    return root


def test_a_guard_that_counts_alone_warns_once_of_sibling_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where no place can be made, a guard whose memory group holds other processes of
    its program and command line started by the same parent (the other workers) says
    so, once, at WARNING; processes of another program, command or parent (a resource
    tracker the server also started) do not count."""
    tracker = "python3\0-c\0from multiprocessing.resource_tracker import main;main(5)\0"
    proc = proc_tree(
        tmp_path / "proc",
        {
            100: (1, "python3", WORKER),
            101: (1, "python3", WORKER),
            102: (1, "bash", WORKER),
            103: (7, "python3", WORKER),
            104: (1, "python3", tracker),
        },
        me=100,
    )
    group = tree(tmp_path, "app")
    (group / "cgroup.procs").write_text("100\n101\n102\n103\n104\n")
    monkeypatch.setattr(shared_place, "default_bases", lambda: ())
    monkeypatch.setattr(shared_place, "PROC", str(proc))
    middleware = guard(group)
    check = middleware.service.alone
    assert isinstance(check, AloneCheck)
    assert middleware.shared_dir is None
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert check.search() == [101]
    assert caplog.text.count("runs more workers of this server (1 besides this one)") == 1
    assert str(group) in caplog.text
    assert "no private directory could be made" in caplog.text
    check.start()
    check.start()  # once per process: a second start starts nothing
    assert check._pid == os.getpid()


def test_host_mode_and_custom_readers(tmp_path: Path, bases: list[Path]) -> None:
    """With memory_source="host" the group is the whole machine (every guarded service
    of this user on it shares one place); a reader the guard does not know has no group
    it can tell, so its guard counts alone, searching its own cgroup for workers."""
    host = shared_place.group_of(HostMemoryReader())
    assert host is not None
    assert (host.label, host.procs) == ("host", None)
    sharing = build_sharing(AdmissionConfig(memory_source="host"), HostMemoryReader())
    assert isinstance(sharing.ledger, SharedLedger)
    assert sharing.directory is not None
    assert Path(sharing.directory).name.startswith(f"asgi-admission-{os.geteuid()}-host-")
    sharing.ledger.close()

    def custom() -> MemoryReading:
        return MemoryReading(used_bytes=1, limit_bytes=10, available=True)

    assert shared_place.group_of(custom) is None
    alone = build_sharing(AdmissionConfig(), custom)
    assert (alone.directory, type(alone.ledger)) == (None, InProcessLedger)
    assert alone.alone is not None
    assert "memory reader is not one whose memory group" in alone.alone.reason


def test_host_mode_searches_every_process_and_unreadable_lists_find_none(tmp_path: Path) -> None:
    """With the host as the memory group the search reads every process in /proc; a
    group whose process list cannot be read, or a /proc without this process, finds no
    other worker (and raises nothing)."""
    proc = proc_tree(
        tmp_path / "proc", {10: (1, "python3", WORKER), 11: (1, "python3", WORKER)}, me=10
    )
    assert shared_place.other_workers(None, proc=str(proc)) == [11]
    assert (
        shared_place.other_workers((str(tmp_path / "gone" / "cgroup.procs"),), proc=str(proc)) == []
    )
    assert shared_place.other_workers(None, proc=str(tmp_path / "no-proc")) == []


def test_a_search_that_fails_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The search is a diagnostic: an error inside it is logged and it finds no worker."""

    def broken(procs: object, *, proc: str) -> list[int]:
        raise RuntimeError("an unexpected /proc")

    monkeypatch.setattr(shared_place, "other_workers", broken)
    check = AloneCheck(reason="testing", label="group", procs=())
    with caplog.at_level(logging.ERROR, logger="asgi_admission"):
        assert check.search() == []
    assert "looking for other workers failed" in caplog.text


def test_a_default_place_whose_ledger_fails_counts_alone(
    tmp_path: Path,
    bases: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Should the ledger still fail in the place chosen, the guard starts all the same,
    counting alone, with a warning naming the directory."""

    def failing(directory: str) -> SharedLedger:
        raise ValueError(f"{directory} went away")

    monkeypatch.setattr(_factory, "SharedLedger", failing)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        middleware = guard(tree(tmp_path, "app"))
    assert middleware.shared_dir is None
    assert middleware.service.alone is not None
    assert "cannot be used" in caplog.text


def test_probe_finds_the_place_the_workers_made(tmp_path: Path, bases: list[Path]) -> None:
    """`probe` reads what the service learned from the place its workers made for the
    memory group it reads, without making one where there is none."""
    group = shared_place.group_of(CgroupMemoryReader(tree(tmp_path, "app")))
    assert group is not None
    config = AdmissionConfig()
    report = learned(config, 64 * 2**20, *service_directory(config, group))
    assert "no directory shared" in report["note"]
    assert shared_place.find_place(group) is None
    assert list(bases[0].iterdir()) == []
    place = shared_place.choose_place(group).directory
    assert place is not None
    assert shared_place.find_place(group) == place
    observed = empty_observations()
    observed["footprints"], observed["ramps"] = [100.0 * 2**20], [2.0]
    shared_files.LearnedStore(place, keep=20).add({"POST /s": observed})
    report = learned(config, 64 * 2**20, *service_directory(config, group))
    assert report["evidence"] is True
    assert report["reserve_bytes"] == 100 * 2**20
    # With ADMISSION_SHARED_DIR unset, the notes name the place found, not the setting.
    assert report["note"] == f"learned by the service's workers, from {place}"
    assert probing(config, *service_directory(config, group))["note"] == (
        f"no evidence: nothing probed yet in {place}"
    )


def test_a_reader_whose_group_is_gone_has_none(tmp_path: Path) -> None:
    """A cgroup reader none of whose places exists names no group (and so no place)."""
    assert shared_place.group_of(CgroupMemoryReader(tmp_path / "gone")) is None
