"""The in-process session ledger: reserve, activate and release exactly once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from asgi_admission import AdmissionConfig
from asgi_admission._admission.ledger import InProcessLedger
from asgi_admission._admission.shared_ledger import FILE_NAME, SharedLedger
from asgi_admission._factory import build_ledger

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
    """Asking for a shared directory builds the cross-process ledger there."""
    ledger = build_ledger(AdmissionConfig(shared_dir=str(tmp_path / "ledger")))
    assert isinstance(ledger, SharedLedger)
    ledger.close()
    assert (tmp_path / "ledger" / FILE_NAME).is_file()


def test_plain_config_builds_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """Without a shared directory the in-process ledger is built without a warning."""
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert isinstance(build_ledger(AdmissionConfig()), InProcessLedger)
    assert caplog.records == []
