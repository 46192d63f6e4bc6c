"""The public surface: exactly these names, each importable, nothing else leaked."""

from __future__ import annotations

import re
import types

import asgi_admission
from kits.suitekit import ROOT

#: Subpackages with a public name of their own, not part of the API: the command line
#: (``asgi-admission``) and the demo service. They show as attributes once imported.
SUBPACKAGES = {"cli", "demo"}

EXPORTED = [
    "AdmissionConfig",
    "AdmissionController",
    "AdmissionMiddleware",
    "AdmissionTicket",
    "CapacityDecision",
    "CgroupMemoryReader",
    "DecisionObserver",
    "HaltAction",
    "HostMemoryReader",
    "MemoryReader",
    "MemoryReading",
    "PriorityClass",
    "ProcessGroupHalt",
    "ProcessSample",
    "RetryAfterPolicy",
    "SessionGroup",
    "SessionHalt",
    "SessionPeak",
    "SessionWatchdog",
    "WatchedSession",
    "__version__",
    "admission_ticket",
    "metrics_app",
    "metrics_route",
    "serving_metrics",
    "session_watchdog",
]


def test_all_is_exactly_the_public_names_sorted() -> None:
    """__all__ lists exactly the intended names, in sorted order; changing it is deliberate."""
    assert asgi_admission.__all__ == EXPORTED
    assert sorted(asgi_admission.__all__) == asgi_admission.__all__


def test_every_exported_name_imports() -> None:
    """Each name in __all__ is an attribute of the package (so `from ... import *` works)."""
    namespace: dict[str, object] = {}
    exec("from asgi_admission import *", namespace)
    assert sorted(name for name in namespace if name != "__builtins__") == EXPORTED
    for name in EXPORTED:
        member = getattr(asgi_admission, name)
        if name not in {"__version__", "HaltAction"}:  # a string; a typing alias
            assert getattr(member, "__module__", "").startswith("asgi_admission")


def test_no_other_public_attribute_leaks() -> None:
    """Every attribute of the package without a leading underscore is in __all__
    (as httpx checks its own): a helper imported into __init__ would show here."""
    public = {name for name in vars(asgi_admission) if not name.startswith("_")}
    for name in public & SUBPACKAGES:
        assert isinstance(getattr(asgi_admission, name), types.ModuleType)
    assert public - set(EXPORTED) - SUBPACKAGES == set()


def test_version_is_the_one_pyproject_toml_declares() -> None:
    """__version__ is the version pyproject.toml declares: not the 0.0.0 of a package
    without metadata, nor the version of an install older than the checkout."""
    declared = re.findall(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared != ["0.0.0"]
    assert [asgi_admission.__version__] == declared
