"""The sampler against real processes: RSS as the kernel reports it, CPU share, descendants."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from watchdogkit import Spawn, vm_rss_bytes

from asgi_admission._watchdog.sampler import ProcessTreeSampler, read_children_map
from kits.suitekit import MIB

#: Internal on purpose: the process-tree sampler.
INTERNAL = "the process-tree sampler"

TOLERANCE = 4 * MIB


def test_rss_matches_vmrss(spawn: Spawn) -> None:
    """A child holding 64 MiB is measured within a few MiB of its /proc VmRSS."""
    child = spawn(64)
    sampler = ProcessTreeSampler(child.pid, logical_cpus=1)
    sample = sampler.sample(None, at=1.0)
    expected = vm_rss_bytes(child.pid)
    assert sample is not None
    assert abs(sample.rss_bytes - expected) < TOLERANCE
    assert sample.rss_bytes > 64 * MIB
    assert (sample.processes, sample.at) == (1, 1.0)


def test_rss_follows_growth(spawn: Spawn) -> None:
    """After the child allocates 96 MiB more, the next sample is about 96 MiB higher."""
    child = spawn(16)
    sampler = ProcessTreeSampler(child.pid, logical_cpus=1)
    before = sampler.sample(None, 0.0)
    child.grow(96)
    after = sampler.sample(None, 0.5)
    assert before is not None
    assert after is not None
    assert abs((after.rss_bytes - before.rss_bytes) - 96 * MIB) < TOLERANCE
    assert abs(after.rss_bytes - vm_rss_bytes(child.pid)) < TOLERANCE


def test_unique_memory_is_what_the_process_added(spawn: Spawn) -> None:
    """Asked for, a child's unique memory grows by what it allocates and leaves out the
    interpreter's pages mapped from files, which the container held already; not asked
    for, it is not measured."""
    child = spawn(16)
    sampler = ProcessTreeSampler(child.pid, logical_cpus=1)
    before = sampler.sample(None, 0.0, unique=True)
    child.grow(64)
    after = sampler.sample(None, 0.5, unique=True)
    plain = sampler.sample(None, 1.0)
    assert before is not None
    assert after is not None
    assert plain is not None
    assert before.unique_bytes is not None
    assert after.unique_bytes is not None
    assert abs((after.unique_bytes - before.unique_bytes) - 64 * MIB) < TOLERANCE
    assert 80 * MIB <= after.unique_bytes < after.rss_bytes
    assert plain.unique_bytes is None


def test_a_file_only_it_maps_is_not_counted_as_memory_it_made(tmp_path: Path) -> None:
    """A process that maps a 64 MiB file already in the page cache and reads every page
    holds them in its RSS (and its USS: no other process maps them), but made none of
    them: the container held them before it."""
    data = tmp_path / "data"
    data.write_bytes(b"x" * (64 * MIB))
    script = (
        "import mmap, sys, time\n"
        "f = open(sys.argv[1], 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        "sum(m[i] for i in range(0, len(m), 4096))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, str(data)], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "ready"
            sample = ProcessTreeSampler(child.pid, logical_cpus=1).sample(None, 0.0, unique=True)
        finally:
            child.kill()
    assert sample is not None
    assert sample.unique_bytes is not None
    assert sample.rss_bytes > 64 * MIB
    assert sample.unique_bytes < 16 * MIB


def test_a_forked_process_is_not_counted_its_parents_memory(tmp_path: Path) -> None:
    """A process forked without exec maps its parent's 64 MiB until it writes them: all of
    it in its RSS, none of it in its unique memory (it adds nothing to the container)."""
    script = (
        "import os, sys, time\n"
        "held = b'x' * (64 * 1048576)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(30)\n"
        "    os._exit(0)\n"
        "print(pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        forked = int(parent.stdout.readline())
        try:
            sample = ProcessTreeSampler(forked, logical_cpus=1).sample(None, 0.0, unique=True)
        finally:
            parent.kill()
            with contextlib.suppress(ProcessLookupError):
                os.kill(forked, signal.SIGKILL)
    assert sample is not None
    assert sample.unique_bytes is not None
    assert sample.rss_bytes > 64 * MIB
    assert sample.unique_bytes < 16 * MIB


def test_children_are_summed(spawn: Spawn) -> None:
    """With the children map, two grandchildren of 48 MiB each are added to the parent."""
    child = spawn(16, children=2, child_mib=48)
    sampler = ProcessTreeSampler(child.pid, logical_cpus=1)
    kids = psutil.Process(child.pid).children(recursive=True)
    expected = vm_rss_bytes(child.pid) + sum(vm_rss_bytes(k.pid) for k in kids)
    sample = sampler.sample(read_children_map(), 0.0)
    alone = sampler.sample(None, 0.0)
    assert sample is not None
    assert alone is not None
    assert sample.processes == 3
    assert sorted(sampler.descendant_pids) == sorted(k.pid for k in kids)
    assert abs(sample.rss_bytes - expected) < 2 * TOLERANCE
    assert sample.rss_bytes - alone.rss_bytes > 2 * 48 * MIB


def test_cpu_is_a_share_of_all_logical_cpus(spawn: Spawn) -> None:
    """A child spinning one core reads as its share of the whole machine: a quarter of
    what the same interval reads as on one CPU (compared with a second sampler over the
    same interval, so a busy machine that gives the child less than a core does not
    matter), and never more than one core's share."""
    child = spawn(0)
    cpus = 4
    sampler = ProcessTreeSampler(child.pid, logical_cpus=cpus)
    one_cpu = ProcessTreeSampler(child.pid, logical_cpus=1)
    child.spin()
    sample = sampler.sample(None, 0.0)
    whole = one_cpu.sample(None, 0.0)
    assert sample is not None
    assert whole is not None
    assert whole.cpu_percent > 10
    assert sample.cpu_percent == pytest.approx(whole.cpu_percent / cpus, rel=0.1)
    assert sample.cpu_percent <= 100 / cpus * 1.1


def test_gone_process_is_none_not_an_error(spawn: Spawn) -> None:
    """Once the child has exited and been reaped, sampling reports None."""
    child = spawn(0)
    sampler = ProcessTreeSampler(child.pid, logical_cpus=1)
    assert child.finish() == 0
    assert sampler.sample(read_children_map(), 0.0) is None
    assert not sampler.alive()


def test_zombie_counts_as_gone(spawn: Spawn) -> None:
    """A child that exited but is not reaped yet (a zombie) is not alive."""
    child = spawn(0)
    sampler = ProcessTreeSampler(child.pid, logical_cpus=1)
    assert child.popen.stdin is not None
    child.popen.stdin.close()
    # Wait for the exit without reaping: the zombie stays until popen.wait().
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    assert sampler.sample(None, 0.0) is None


def test_already_gone_raises_at_construction(spawn: Spawn) -> None:
    """Constructing a sampler for a reaped pid raises psutil's NoSuchProcess."""
    child = spawn(0)
    child.finish()
    with pytest.raises(psutil.NoSuchProcess):
        ProcessTreeSampler(child.pid, logical_cpus=1)


def _stat(root: Path, pid: int, comm: str, ppid: str) -> None:
    (root / str(pid)).mkdir()
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1\n")


def test_children_map_from_a_fake_proc(tmp_path: Path) -> None:
    """The map parses names holding spaces and parentheses and skips junk entries."""
    _stat(tmp_path, 10, "init", "0")
    _stat(tmp_path, 11, "a) (b c", "10")
    _stat(tmp_path, 12, "x", "11")
    _stat(tmp_path, 13, "bad", "zz")
    (tmp_path / "14").mkdir()  # exited while scanned: no stat file
    (tmp_path / "15" / "stat").mkdir(parents=True)  # opens, but reading fails
    (tmp_path / "self").mkdir()
    assert read_children_map(str(tmp_path)) == {0: [10], 10: [11], 11: [12]}


def test_children_map_of_a_missing_proc(tmp_path: Path) -> None:
    """An unreadable proc directory gives an empty map rather than an error."""
    assert read_children_map(str(tmp_path / "absent")) == {}


def test_descendant_loops_are_broken(spawn: Spawn) -> None:
    """A children map with a cycle (pids reused mid-scan) still terminates."""
    child = spawn(0)
    sampler = ProcessTreeSampler(child.pid, logical_cpus=1)
    sample = sampler.sample({child.pid: [child.pid, 2**22 + 1], 2**22 + 1: [child.pid]}, 0.0)
    assert sample is not None
    assert sample.processes == 1


def test_unreadable_status_means_not_alive(spawn: Spawn, monkeypatch: pytest.MonkeyPatch) -> None:
    """When psutil may no longer read the process, it counts as gone rather than raising."""
    child = spawn(0)
    sampler = ProcessTreeSampler(child.pid, logical_cpus=1)
    assert sampler.alive()

    def denied(self: psutil.Process) -> str:
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "status", denied)
    assert not sampler.alive()
