"""Properties of the shared ledger: a model in one process, real concurrent processes."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from ledgerkit import SPAWN, random_worker

from asgi_admission._admission.ledger.ledger import CountedSession, InProcessLedger
from asgi_admission._admission.ledger.shared_ledger import SharedLedger, read_entries

#: Internal on purpose: the shared ledger's file format and recovery, below the middleware.
INTERNAL = "the shared ledger's file format and recovery, below the middleware"

# (ledger index, operation, which held reservation); indexes are taken modulo what exists.
OPERATIONS = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.sampled_from(["reserve", "activate", "release"]),
        st.integers(0, 50),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(OPERATIONS)
def test_shared_counts_follow_the_in_process_model(
    operations: list[tuple[int, str, int]],
) -> None:
    """Any sequence over three ledgers on one file counts as one in-process ledger does."""
    model = InProcessLedger()
    with tempfile.TemporaryDirectory() as directory:
        ledgers = [SharedLedger(directory) for _ in range(3)]
        held: list[tuple[CountedSession, CountedSession]] = []
        try:
            for index, operation, which in operations:
                ledger = ledgers[index]
                if operation == "reserve" or not held:
                    with ledger.locked(), model.locked():
                        held.append((ledger.reserve(), model.reserve()))
                else:
                    shared, modelled = held[which % len(held)]
                    getattr(shared, operation)()
                    getattr(modelled, operation)()
                with ledger.locked():
                    observed = ledger.counts()
                assert observed == model.counts()
                assert min(observed) >= 0
        finally:
            for ledger in ledgers:
                ledger.close()


def test_concurrent_processes_keep_exact_totals(tmp_path: Path) -> None:
    """Four processes reserving, activating and releasing at once never see a wrong total."""
    directory = str(tmp_path)
    start = SPAWN.Barrier(4)
    finish = SPAWN.Event()
    results = SPAWN.Queue()
    workers = [
        SPAWN.Process(target=random_worker, args=(directory, seed, 3000, start, finish, results))
        for seed in range(4)
    ]
    for worker in workers:
        worker.start()
    try:
        held = [results.get(timeout=60) for _ in workers]
        ledger = SharedLedger(directory)
        with ledger.locked():
            totals = ledger.counts()
        assert [violations for *_, violations in held] == [0, 0, 0, 0]
        assert totals == (sum(h[1] for h in held), sum(h[2] for h in held))
        assert totals != (0, 0)
        assert all(e.pending >= 0 and e.active >= 0 for e in read_entries(directory))
        finish.set()
        assert [results.get(timeout=60) for _ in workers] == [("released",)] * 4
        with ledger.locked():
            assert ledger.counts() == (0, 0)
        ledger.close()
    finally:
        finish.set()
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():  # pragma: no cover - only when the test has failed
                worker.kill()
        results.close()
    assert [worker.exitcode for worker in workers] == [0, 0, 0, 0]
