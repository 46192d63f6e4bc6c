"""Real servers with several workers and nothing said about sharing: the workers of one
memory group share one ledger, and two memory groups never share one."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import httpx
import pytest
from ledgerkit import Workers, burst

from kits.cgroupkit import default_place_paths, memory_group
from kits.pollkit import wait_for
from kits.processkit import open_files

pytestmark = [pytest.mark.real_cgroup, pytest.mark.real_server, pytest.mark.slow]

LEDGER = "asgi-admission.ledger"


def test_two_memory_groups_never_share_a_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `uvicorn --workers 2` servers, each in a memory group of its own, with no
    ADMISSION_SHARED_DIR nor cgroup root: each server's workers have one ledger file
    open, in a private directory named after their group, the two servers' files differ,
    and a burst that fills one server's session limit leaves the other admitting."""
    monkeypatch.delenv("ADMISSION_SHARED_DIR", raising=False)  # the suite's "off"
    monkeypatch.delenv("ADMISSION_CGROUP_ROOT", raising=False)
    env = {"ADMISSION_MAX_SESSIONS": "2", "DEMO_SESSION_MB": "1"}
    with memory_group(1024, "place_one") as one, memory_group(1024, "place_two") as two:
        servers = [Workers(2, env, tmp_path / f"{g.name}.log", cgroup=g) for g in (one, two)]
        try:
            for server in servers:
                server.wait_ready()
            ledgers = []
            for group, server in zip((one, two), servers, strict=True):
                workers = server.worker_pids()
                assert len(workers) == 2
                files = {pid: open_files(pid, LEDGER) for pid in workers}
                assert all(len(paths) == 1 for paths in files.values()), files
                paths = set().union(*files.values())
                assert len(paths) == 1, files  # the workers of one group: one ledger
                place = Path(paths.pop()).parent
                assert place.name.startswith(f"asgi-admission-{os.geteuid()}-{group.name[:40]}")
                info = place.stat()
                assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o700)
                ledgers.append(place)
            assert ledgers[0] != ledgers[1]

            async def fill_one_then_open_on_two() -> tuple[list[int | str], int]:
                filling = asyncio.ensure_future(burst(servers[0].base_url, 6, 2.0))
                await asyncio.sleep(1.0)  # the burst's sessions hold the first server
                async with httpx.AsyncClient(base_url=servers[1].base_url, timeout=30) as c:
                    other = (await c.post("/sessions")).status_code
                return await filling, other

            statuses, other = asyncio.run(fill_one_then_open_on_two())
        finally:
            for server in servers:
                server.stop()
    # Its two workers admitted 2 between them, the limit of the whole server.
    assert (statuses.count(201), statuses.count(503)) == (2, 4), statuses
    assert other == 201


def test_workers_that_cannot_share_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`uvicorn --workers 2` in a memory group whose default place is taken under every
    base (another user's directory at each name): each worker warns naming the path,
    counts alone, and says once that other workers of its server share its group."""
    monkeypatch.delenv("ADMISSION_SHARED_DIR", raising=False)  # the suite's "off"
    monkeypatch.delenv("ADMISSION_CGROUP_ROOT", raising=False)
    with memory_group(1024, "place_taken") as group:
        taken = default_place_paths(group)
        assert taken
        for path in taken:
            path.mkdir(mode=0o700)
            os.chown(path, 65534, 65534)
        log = tmp_path / "server.log"
        server = Workers(2, {"DEMO_SESSION_MB": "1"}, log, cgroup=group)
        try:
            server.wait_ready()
            workers = server.worker_pids()
            assert all(open_files(pid, LEDGER) == set() for pid in workers)
            wait_for(
                lambda: log.read_text().count("more workers of this server") >= 2,
                10,
                "the warning from both workers",
            )
        finally:
            server.stop()
        assert all(not (path / LEDGER).exists() for path in taken)
    text = log.read_text()
    for path in taken:
        assert text.count(f"{path} cannot hold the shared session ledger") == 2, text
    alone = "runs more workers of this server (1 besides this one)"
    assert text.count(alone) == 2, text  # one worker, not uvicorn's resource tracker too
    assert text.count("this guard counts its sessions alone: no private directory") == 2, text
