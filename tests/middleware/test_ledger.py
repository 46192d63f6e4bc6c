"""The in-process session ledger: reserve, activate and release exactly once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from asgi_admission import AdmissionConfig
from asgi_admission._admission.ledger.ledger import InProcessLedger
from asgi_admission._admission.ledger.shared_ledger import FILE_NAME, SharedLedger
from asgi_admission._factory import build_sharing

#: Internal on purpose: the ledger the factory builds for a configuration.
INTERNAL = "the ledger the factory builds for a configuration"


def test_reserve_activate_release_counts() -> None:
    """A reservation is pending, then active, then gone; repeated calls change nothing."""
    ledger = InProcessLedger()
    with ledger.locked():
        first = ledger.reserve()
        second = ledger.reserve()
    assert ledger.counts() == (0, 2)
    first.activate()
    first.activate()
    assert ledger.counts() == (1, 1)
    first.release()
    first.release()
    first.activate()
    assert ledger.counts() == (0, 1)
    second.release()
    second.activate()
    assert ledger.counts() == (0, 0)


def test_shared_dir_builds_the_shared_ledger(tmp_path: Path) -> None:
    """Naming a shared directory builds the cross-process ledger there."""
    sharing = build_sharing(AdmissionConfig(shared_dir=str(tmp_path / "ledger")), None)
    assert isinstance(sharing.ledger, SharedLedger)
    assert sharing.directory == str(tmp_path / "ledger")
    sharing.ledger.close()
    assert (tmp_path / "ledger" / FILE_NAME).is_file()


def test_off_builds_the_in_process_ledger_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """With the shared directory off, the in-process ledger is built without a warning."""
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        sharing = build_sharing(AdmissionConfig(shared_dir="off"), None)
    assert isinstance(sharing.ledger, InProcessLedger)
    assert (sharing.directory, sharing.alone) == (None, None)
    assert caplog.records == []
