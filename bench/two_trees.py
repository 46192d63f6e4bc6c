"""The session path of two checkouts in one process, their rounds interleaved.

    sudo .venv/bin/python bench/two_trees.py OTHER_CHECKOUT [--rounds 20] [--clock cpu]

``middleware_bench.py`` (a) runs one tree at a time, and on a shared machine its
ratios moved by 0.1 between runs of the same code (bench/README.md, the fourteenth
session): more than most changes to the session path. Here the other checkout's
package and this one's are both imported (each under module objects of its own, the
``asgi_admission`` entries of ``sys.modules`` swapped between the two imports), and
their guards are timed in the same rounds as one bare app and starlette-exporter, so
both trees see the same moments of the machine (the harness, ``middleware_bench``'s
apps, is this checkout's for both). Each tree's two guards (without and
with metrics) share one ledger file, as in ``middleware_bench.py`` (a), over a memory
group of their own (a real cgroup v1 group where root may make one, else a cgroup v2
tree of regular files). ``--clock cpu`` (the default) times with the thread's CPU
clock, which leaves out the time another process ran; ``wall`` with
``time.perf_counter``. Prints each guard's added µs over bare and its added cost as a
share of the exporter's, medians of per-round figures.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from benchkit import MIB, V1_MEMORY, write_v2_tree

HERE = Path(__file__).resolve().parent.parent


def load(tree: Path) -> tuple[ModuleType, dict[str, ModuleType]]:
    """This checkout's ``middleware_bench`` over ``tree``'s package, and that package's
    modules."""
    ours = [
        name
        for name in sys.modules
        if name in ("asgi_admission", "middleware_bench") or name.startswith("asgi_admission.")
    ]
    for name in ours:
        del sys.modules[name]
    sys.path.insert(0, str(tree / "middleware"))
    try:
        bench = importlib.import_module("middleware_bench")
        package = importlib.import_module("asgi_admission")
    finally:
        sys.path.remove(str(tree / "middleware"))
    if not str(package.__file__).startswith(str(tree)):
        raise RuntimeError(
            f"{package.__file__} is not {tree}'s package; is it installed elsewhere?"
        )
    modules = {
        name: module
        for name, module in sys.modules.items()
        if name == "asgi_admission" or name.startswith("asgi_admission.")
    }
    return bench, modules


@contextmanager
def memory_group(tmp: str, name: str) -> Iterator[str]:
    """A memory group of its own (8 GiB limit): a real v1 group as root, else a v2 tree."""
    group = V1_MEMORY / f"asgi_admission_two_trees_{name}_{os.getpid()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(8 * 1024 * MIB))
    except OSError:
        yield str(write_v2_tree(Path(tmp) / name, used_mb=200, limit_mb=64 * 1024))
        return
    try:
        yield str(group)
    finally:
        group.rmdir()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (its middleware/ is used)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    clock: Callable[[], float] = time.thread_time if args.clock == "cpu" else time.perf_counter
    trees = {"other": args.other.resolve(), "this": HERE}
    apps: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        memory_group(tmp, "other") as other_root,
        memory_group(tmp, "this") as this_root,
    ):
        roots = {"other": other_root, "this": this_root}
        bench: ModuleType | None = None
        for label, tree in trees.items():
            bench, modules = load(tree)
            sys.modules.update(modules)
            if not apps:
                apps["bare"] = bench.base_app()
                apps["exporter"] = bench.exporter(bench.base_app())
            root = roots[label]
            apps[f"{label}: guard"] = bench.guarded(bench.base_app(), root)
            registry = bench.CollectorRegistry()
            apps[f"{label}: guard+metrics"] = bench.guarded(bench.base_app(), root, registry)
            apps[f"{label}: guard(fixed)"] = bench.guarded(bench.base_app(), None)
        assert bench is not None
        scope = bench.scope_for("POST", "/sessions")
        samples = asyncio.run(timed(apps, scope, args.rounds, args.calls, clock))
    bare, exporter = samples["bare"], samples["exporter"]
    print(
        f"{args.rounds} rounds of {args.calls} calls, {args.clock} clock; other: {trees['other']}, "
        f"this: {trees['this']}"
    )
    exporter_added = statistics.median(e - b for e, b in zip(exporter, bare, strict=True))
    print(
        f"  bare {statistics.median(bare) * 1e6:.2f} µs, exporter added {exporter_added * 1e6:.2f}"
    )
    for name, values in samples.items():
        if name in ("bare", "exporter"):
            continue
        added = statistics.median(v - b for v, b in zip(values, bare, strict=True))
        share = statistics.median(
            (v - b) / (e - b) for v, b, e in zip(values, bare, exporter, strict=True)
        )
        print(f"  {name:22} added {added * 1e6:6.2f} µs = {share:.3f} of the exporter's")
    return 0


async def timed(
    apps: dict[str, Any],
    scope: dict[str, Any],
    rounds: int,
    calls: int,
    clock: Callable[[], float],
) -> dict[str, list[float]]:
    request = {"type": "http.request", "body": b"", "more_body": False}

    async def receive() -> dict[str, Any]:
        return request

    async def send(message: dict[str, Any]) -> None:
        return None

    async def per_call(app: Any, count: int) -> float:
        start = clock()
        for _ in range(count):
            await app(dict(scope), receive, send)
        return (clock() - start) / count

    for app in apps.values():  # warm up
        await per_call(app, calls // 4)
    samples: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(rounds):
        for name, app in apps.items():
            samples[name].append(await per_call(app, calls))
    return samples


if __name__ == "__main__":
    sys.exit(main())
