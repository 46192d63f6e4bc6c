"""Real memory groups, cgroup v1 and v2, for the tests and benches that need the kernel's
own counters: make one (v1 under /sys/fs/cgroup/memory on this machine, v2 in the VM of
scripts/cgroup-v2), run a command in it or in a container's view of it, read its working
set, peak and OOM kills, and always remove it; and what the session-group tests of both
(tests/watchdog/test_session_groups_real.py, tests/v2/test_v2_session_groups.py) do in
one: a demo server started in a group, a session that holds some MiB in a group of its
own, an offender killed inside its group.

Every reader takes the group's directory and finds out which version it is (a v2 group
has ``cgroup.controllers``, a v1 memory group ``memory.limit_in_bytes``); where the two
keep a figure in different files, the version's file is read, and a file that cannot be
read or parsed fails the test naming that file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import httpx
from prometheus_client import CollectorRegistry

from asgi_admission import (
    AdmissionConfig,
    CgroupMemoryReader,
    MemoryReading,
    SessionPeak,
    SessionWatchdog,
)
from asgi_admission._admission.ledger import shared_place
from asgi_admission._watchdog.groups import GroupsPlace, SessionGroups
from kits.pollkit import wait_for
from kits.processkit import free_port, stop_process_group
from kits.requirekit import require_marker
from kits.suitekit import MIB, V1_MEMORY, V2_ROOT

#: Internal on purpose: where the servers it starts put their default shared place, and
#: a SessionGroups placed in a test's own group.
INTERNAL = "the default shared place's bases and directory name, and a test's SessionGroups"

Version = Literal["v1", "v2"]

#: The files that keep the same figure under another name in each version.
FILES: dict[str, dict[Version, str]] = {
    "limit": {"v1": "memory.limit_in_bytes", "v2": "memory.max"},
    "usage": {"v1": "memory.usage_in_bytes", "v2": "memory.current"},
    "peak": {"v1": "memory.max_usage_in_bytes", "v2": "memory.peak"},
    "swap": {"v1": "memory.memsw.limit_in_bytes", "v2": "memory.swap.max"},
    "oom": {"v1": "memory.oom_control", "v2": "memory.events"},
}
#: The keys of ``memory.stat`` for the file LRUs (v1's ``total_*`` count the groups below).
FILE_LRUS: dict[Version, tuple[str, str]] = {
    "v1": ("total_inactive_file", "total_active_file"),
    "v2": ("inactive_file", "active_file"),
}

# Bound at import: the suite's conftest replaces shared_place.default_bases for the
# guards it builds, but the servers it starts use the machine's own.
_machine_bases = shared_place.default_bases


# -- reading a group's files --------------------------------------------------------------


def version(group: Path) -> Version:
    """Which cgroup version ``group`` is a memory group of."""
    if (group / "cgroup.controllers").exists():
        return "v2"
    if (group / FILES["limit"]["v1"]).exists():
        return "v1"
    raise AssertionError(
        f"{group} is no memory group: neither {group / 'cgroup.controllers'} (cgroup v2) "
        f"nor {group / FILES['limit']['v1']} (cgroup v1) is there"
    )


def file_of(group: Path, figure: str) -> Path:
    """The file that keeps ``figure`` (a key of :data:`FILES`) in ``group``'s version."""
    return group / FILES[figure][version(group)]


def read(path: Path) -> str:
    """The text of one of a group's files; failing, the error names the file."""
    try:
        return path.read_text()
    except OSError as error:
        raise AssertionError(f"cannot read {path}: {error.strerror or error}") from error


def number(path: Path) -> int:
    """A file that holds one number (``max``, v2's "no limit", is refused, naming it)."""
    text = read(path).strip()
    try:
        return int(text)
    except ValueError:
        raise AssertionError(f"{path} holds {text!r}, not a number") from None


def keyed(path: Path) -> dict[str, int]:
    """A file of ``key value`` lines (``memory.stat``, ``memory.events``,
    ``memory.oom_control``) as numbers."""
    found: dict[str, int] = {}
    for line in read(path).splitlines():
        key, _, value = line.partition(" ")
        try:
            found[key] = int(value)
        except ValueError:
            raise AssertionError(f"{path}: the line {line!r} is not a key and a number") from None
    return found


def key_in(found: Mapping[str, int], path: Path, key: str) -> int:
    """One ``key``'s number in ``found``, the :func:`keyed` lines of ``path``; a key it
    has not fails naming the file."""
    if key not in found:
        raise AssertionError(f"{path} has no {key} line: {sorted(found)}")
    return found[key]


def key_of(path: Path, key: str) -> int:
    """One ``key``'s number in a file of :func:`keyed` lines."""
    return key_in(keyed(path), path, key)


def working_set_bytes(group: Path) -> int:
    """The group's usage (v1 ``memory.usage_in_bytes``, v2 ``memory.current``) less both
    file LRUs of ``memory.stat``, as the guard computes it."""
    stat = group / "memory.stat"
    found = keyed(stat)
    usage = number(file_of(group, "usage"))
    inactive, active = FILE_LRUS[version(group)]
    return max(0, usage - key_in(found, stat, inactive) - key_in(found, stat, active))


def peak_bytes(group: Path) -> int:
    """The group's highest usage since it was made (v1 ``memory.max_usage_in_bytes``,
    v2 ``memory.peak``)."""
    return number(file_of(group, "peak"))


def _events_file(group: Path, local: bool) -> Path:
    """v2's ``memory.events`` or ``memory.events.local`` of ``group``; a v1 group fails."""
    name = "memory.events.local" if local else "memory.events"
    if version(group) == "v1":
        raise AssertionError(
            f"{group / name}: a cgroup v1 memory group has no such file "
            f"(its OOM kills are in {group / FILES['oom']['v1']}: oom_kills())"
        )
    return group / name


def events(group: Path, *, local: bool = False) -> dict[str, int]:
    """v2's ``memory.events`` (counting the groups below too) or ``memory.events.local``."""
    return keyed(_events_file(group, local))


def event(group: Path, key: str, *, local: bool = False) -> int:
    """One ``key`` of :func:`events` (``oom``, ``oom_kill``, ``oom_group_kill``...); a key
    the file has not fails naming the file."""
    return key_of(_events_file(group, local), key)


def oom_kills(group: Path, *, local: bool = False) -> int:
    """How many processes the kernel's OOM killer has killed in ``group``: v2's
    ``memory.events`` (counting the groups below it too) or ``memory.events.local``
    (``local``: the group's own); v1's ``memory.oom_control``, which counts the group's
    own kills alone (the kernel adds none of the groups below it), whatever ``local``."""
    if version(group) == "v2":
        return event(group, "oom_kill", local=local)
    return key_of(group / FILES["oom"]["v1"], "oom_kill")


def procs(group: Path) -> list[int]:
    """The processes in ``group`` now (``cgroup.procs``, the same file in both versions)."""
    return [int(pid) for pid in read(group / "cgroup.procs").split()]


# -- making and removing groups -----------------------------------------------------------


@contextlib.contextmanager
def _fresh_group(
    parent: Path,
    name: str,
    limit_mb: int | None,
    swap: str | None,
    before_removal: Callable[[Path], object] = lambda _: None,
) -> Iterator[Path]:
    """``parent/asgi_admission_<name>_<pid>_<ns>`` with its limit at ``limit_mb`` (the
    version's file; ``None``: none) and its swap file at ``swap`` where the kernel has
    one; on exit ``before_removal`` sees it, then its tasks and those of the groups below
    it are killed and all of them removed, even after a failure."""
    group = parent / f"asgi_admission_{name}_{os.getpid()}_{time.monotonic_ns()}"
    group.mkdir()
    try:
        if limit_mb is not None:
            file_of(group, "limit").write_text(str(limit_mb * MIB))
        swap_file = file_of(group, "swap")
        if swap is not None and swap_file.exists():
            swap_file.write_text(swap)
        yield group
    finally:
        try:
            before_removal(group)
        finally:
            remove_group_tree(group)


@contextlib.contextmanager
def memory_group(limit_mb: int, name: str, *, swap_too: bool = True) -> Iterator[Path]:
    """A fresh cgroup v1 memory group ``asgi_admission_<name>_<pid>_<ns>`` limited to
    ``limit_mb`` (and its swap too, where the kernel counts swap, unless ``swap_too``
    is false); on exit its tasks are killed and it is removed, even after a failure, and
    so are the default shared places the servers in it made."""
    require_marker("real_cgroup", "makes a real memory group")
    swap = str(limit_mb * MIB) if swap_too else None
    places: list[Path] = []
    try:
        with _fresh_group(
            V1_MEMORY, name, limit_mb, swap, lambda group: places.extend(default_places(group))
        ) as group:
            yield group
    finally:
        for place in places:
            shutil.rmtree(place, ignore_errors=True)


@contextlib.contextmanager
def v2_group(limit_mb: int | None, name: str, *, parent: Path = V2_ROOT) -> Iterator[Path]:
    """A fresh cgroup v2 group ``asgi_admission_<name>_<pid>_<ns>`` under ``parent`` with
    ``memory.max`` at ``limit_mb`` (``None``: no limit) and no swap; on exit its tasks
    and those of the groups below it are killed and all of them removed."""
    require_marker("cgroup_v2", "makes a real cgroup v2 memory group")
    with _fresh_group(parent, name, limit_mb, "0") as group:
        yield group


def remove_group_tree(group: Path, *, attempts: int = 200) -> None:
    """Kill every task in ``group`` and the groups below it (the session groups a guard
    made there), then remove them all, deepest first; gives up after ``attempts`` tries."""
    for _ in range(attempts):
        tree = sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for member in [*tree, group]:
            with contextlib.suppress(OSError):
                for pid in (member / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        try:
            for member in [*tree, group]:
                member.rmdir()
            return
        except FileNotFoundError:
            if not group.exists():
                return
        except OSError:
            time.sleep(0.05)


def give_memory(group: Path) -> None:
    """Give the memory controller to a v2 ``group``'s children (it must have no process);
    a v1 group's children have it already."""
    control = group / "cgroup.subtree_control"
    if version(group) == "v1":
        raise AssertionError(f"{control}: a cgroup v1 group has no such file")
    control.write_text("+memory")


def joining(group: Path) -> list[str]:
    """The argv prefix of a command run inside ``group``: a shell moves itself into the
    group, then execs the rest, so the command and all it allocates are charged there."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group)]


def container(group: Path) -> list[str]:
    """The argv prefix of a command run as in a container whose cgroup is the v2
    ``group``: it joins the group, then unshares a cgroup namespace (whose root is the
    group) and a mount namespace in which cgroup2 is mounted again at /sys/fs/cgroup, so
    that it sees the group as the top of the hierarchy, as a pod's container does."""
    if version(group) == "v1":
        raise AssertionError(f"{group}: a container's view mounts cgroup2, not this v1 group")
    remount = 'umount -l /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$@"'
    return [
        *joining(group),
        "unshare",
        "--cgroup",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        remount,
        "container",
    ]


def default_place_paths(group: Path) -> list[Path]:
    """Where guarded servers in ``group`` with no ``ADMISSION_SHARED_DIR`` set look for
    the directory they share, in order (under the machine's bases, as they find them)."""
    found = shared_place.group_of(CgroupMemoryReader(group))
    if found is None:
        return []
    name = shared_place.directory_name(found)
    return [Path(base, name) for base in _machine_bases() if Path(base).is_dir()]


def default_places(group: Path) -> list[Path]:
    """The directories of :func:`default_place_paths` that exist (made by the servers)."""
    return [path for path in default_place_paths(group) if path.is_dir()]


# -- waiting, and a server started in a group ---------------------------------------------


def metric(client: httpx.Client, name: str) -> float | None:
    """The value of the sample ``name`` (with its labels, as exposed) at ``/metrics``."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


#: The command :class:`Demo` serves unless told otherwise.
DEMO = [sys.executable, "-m", "asgi_admission.cli", "demo"]
#: Seconds a server has to answer ``/health``: in the VM of scripts/cgroup-v2, under
#: emulation (no KVM), Python runs about 20 times slower and importing the demo takes
#: 20 to 30 s.
SERVER_START_S = 240.0


#: How long the tests' clients keep an idle connection to a server: below uvicorn's
#: default keep-alive timeout (5 s; the demo keeps 75 s, a plain uvicorn app such as
#: tests/v2/test_v2_pressure.py's leak app the default), so that no server closes one as
#: it is reused.
CLIENT_IDLE_S = 2.0


class Demo:
    """``asgi-admission demo`` (or ``command``, which takes ``--port``) started with
    ``prefix`` (a group to join, a container's view) and only the ``ADMISSION_*``
    settings given, as in a pod."""

    def __init__(
        self,
        prefix: list[str],
        log: Path,
        *,
        command: list[str] = DEMO,
        env: Mapping[str, str] | None = None,
        **settings: str,
    ) -> None:
        require_marker("real_server", "starts a server process")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("ADMISSION_", "CODA_"))}
        given = {"DEMO_SESSION_MB": "0", "ADMISSION_SHARED_DIR": "off", **(env or {}), **settings}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*prefix, *command, "--port", str(self.port)],
                env={**clean, **given},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, f"the demo exited:\n{self.log()}"
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(self.base_url + "/health", timeout=5).status_code == 200
            return False

        wait_for(ready, SERVER_START_S, step=0.5)

    def log(self) -> str:
        return self.log_path.read_text()

    def client(self, timeout: float) -> httpx.Client:
        """A client of the server that drops a connection idle ``CLIENT_IDLE_S``: httpx
        keeps one 5 s by default, as long as uvicorn's default keep-alive timeout, and a
        request sent on a connection as the server closes it is reset (``ECONNRESET``)."""
        limits = httpx.Limits(keepalive_expiry=CLIENT_IDLE_S)
        return httpx.Client(base_url=self.base_url, timeout=timeout, limits=limits)

    def kill(self) -> None:
        """SIGKILL the server alone (its children and groups stay, as after a crash)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        stop_process_group(self.proc, timeout=30)


@contextlib.contextmanager
def demo(
    prefix: list[str],
    log: Path,
    *,
    command: list[str] = DEMO,
    env: Mapping[str, str] | None = None,
    **settings: str,
) -> Iterator[Demo]:
    """A :class:`Demo`, ready, stopped at the end (even after a failure, when the end of
    its log is printed for the report)."""
    server = Demo(prefix, log, command=command, env=env, **settings)
    try:
        server.wait_ready()
        yield server
    except Exception:
        state = "running" if server.proc.poll() is None else f"exit {server.proc.returncode}"
        print(f"--- the demo ({state}), the end of its log ---\n{server.log()[-6000:]}")
        raise
    finally:
        server.stop()


# -- session groups (docs/session-groups.md) ----------------------------------------------

#: The folder a server makes its session groups in, beside its own group.
SESSION_GROUPS = "asgi-admission"
#: The budget of the tests' process sessions.
BUDGET_MB = 64
HALTS = 'asgi_admission_sessions_halted_total{reason="memory_limit"}'


def session_groups_in(base: Path) -> list[str]:
    """The names of the session groups in ``base`` (none if it is not there)."""
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def holding(mib: int, seconds: float = 1.0) -> list[str]:
    """The argv of a Python process that builds ``mib`` MiB, touches every page of it,
    holds it ``seconds`` and exits 0."""
    code = (
        f"import time; b = bytearray({mib} << 20); b[::4096] = b'1' * ({mib} << 8); "
        f"time.sleep({seconds})"
    )
    return [sys.executable, "-c", code]


def offender_run(
    server: Demo, base: Path, *, burst: bool = False, halted_by_guard: bool = True
) -> dict[str, Any]:
    """Three process sessions of ``server`` with 64 MiB budgets, one of which (``burst``:
    in one block) then asks for 1 GiB at once: what became of each, of the server and of
    the session groups in ``base``, and the OOM kills of the group above them (its own).

    ``halted_by_guard``: the offender must end with a halt (its group's limit or the
    watchdog), waited for up to 120 s. Otherwise (session groups off) the kernel's OOM
    killer may end it before the watchdog samples it, with no halt, or neither within
    20 s: its state after at most 20 s is taken as it is, for the record."""
    with server.client(timeout=300) as client:
        opened = []
        for last in (False, False, True):
            params = {"hold_mb": 16, "budget_mb": BUDGET_MB, "burst": int(burst and last)}
            response = client.post("/processes", params=params)
            assert response.status_code == 201, response.text
            opened.append(response.json())
        while_open = session_groups_in(base)
        offender = opened[2]["id"]
        grown = client.post(f"/processes/{offender}/grow", params={"mb": 1024})

        def halted() -> dict[str, Any] | None:
            state: dict[str, Any] = client.get(f"/processes/{offender}").json()
            return state if state["halt"] is not None and not state["running"] else None

        def stopped() -> dict[str, Any] | None:
            state: dict[str, Any] = client.get(f"/processes/{offender}").json()
            return None if state["running"] else state

        if halted_by_guard:
            ended = wait_for(halted, timeout=120, step=0.2)
        else:
            with contextlib.suppress(AssertionError):  # still running at 20 s: for the record
                wait_for(stopped, timeout=20, step=0.2)
            ended = client.get(f"/processes/{offender}").json()
        time.sleep(3)  # several watchdog ticks: an ended session's group is gone by then
        others = [client.get(f"/processes/{s['id']}").json() for s in opened[:2]]
        return {
            "grow_status": grown.status_code,
            "offender": ended,
            "others": [(s["running"], s["halt"]) for s in others],
            "alive": server.proc.poll() is None and client.get("/health").status_code == 200,
            "halts": metric(client, HALTS),
            "enabled": metric(client, "asgi_admission_session_groups_enabled"),
            "while_open": while_open,
            "after": session_groups_in(base),
            "oom_kills_local": oom_kills(base.parent, local=True),
        }


def assert_only_the_offender_was_killed(run: dict[str, Any]) -> None:
    """Of an :func:`offender_run` with session groups on: the kernel killed the offender
    inside its own group (memory_limit), its group is gone, the others and the server
    live on, and the group above the session groups counted no OOM kill of its own."""
    assert run["enabled"] == 1.0, run
    assert len(run["while_open"]) == 3, run
    assert run["grow_status"] in (409, 410), run
    assert run["offender"]["halt"]["reason"] == "memory_limit", run
    assert run["others"] == [(True, None), (True, None)], run
    assert run["alive"], run
    assert run["halts"] == 1.0, run
    offender = run["offender"]["id"]
    assert [g for g in run["after"] if g.endswith(f"-{offender}")] == [], run
    assert len(run["after"]) == 2, run
    assert run["oom_kills_local"] == 0, run


def assert_a_grouped_sessions_peak_is_reported(container: Path) -> None:
    """One session started by a watchdog in a real group of its own below ``container``,
    holding 40 MiB and ending on its own, is reported once with its group's own peak
    (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``; source memory_group) to
    on_session_peak and the histogram, learned as exact, and its group is removed."""
    registry = CollectorRegistry()
    place = GroupsPlace(version(container), str(container), "a test's group")
    watchdog = SessionWatchdog(
        config=AdmissionConfig(session_groups="off"),
        memory_reader=lambda: MemoryReading(
            used_bytes=100 * MIB, limit_bytes=1024 * MIB, available=True
        ),
        registry=registry,
        session_groups=SessionGroups(place, mode="require"),
    )
    peaks: list[SessionPeak] = []
    learned: list[tuple[str, int, bool]] = []
    watchdog.on_session_peak = peaks.append
    watchdog.learn_peaks_with(lambda route, peak, exact=False: learned.append((route, peak, exact)))
    group = watchdog.session_group(session_id="p1", budget_bytes=BUDGET_MB * MIB)
    assert group is not None
    path = Path(group.path)
    child = subprocess.Popen(group.command(holding(40)))
    try:
        watchdog.register(child.pid, session_id="p1", route="POST /processes", group=group)
        wait_for(lambda: child.pid in procs(path), timeout=60, step=0.2)
        assert child.wait(timeout=120) == 0
        kernel_peak = peak_bytes(path)
    finally:
        child.kill()
        child.wait()
    watchdog.sample_once()  # sees the process gone: the session ends
    assert not path.exists(), f"{path} is still there after its session ended"
    (peak,) = peaks
    assert (peak.source, peak.route, peak.halted) == ("memory_group", "POST /processes", None)
    assert peak.peak_bytes == kernel_peak, (peak, kernel_peak)
    assert 40 * MIB <= peak.peak_bytes <= BUDGET_MB * MIB, peak
    assert learned == [("POST /processes", peak.peak_bytes, True)]
    histogram_sum = registry.get_sample_value("asgi_admission_session_memory_bytes_sum")
    assert histogram_sum == peak.peak_bytes, (histogram_sum, peak)
