"""The public surface: exactly these names, each importable, and the version from metadata."""

from __future__ import annotations

import importlib.metadata

import asgi_admission

EXPORTED = [
    "AdmissionCollector",
    "AdmissionConfig",
    "AdmissionController",
    "AdmissionMiddleware",
    "AdmissionTicket",
    "CapacityDecision",
    "CgroupMemoryReader",
    "DecisionMetrics",
    "HostMemoryReader",
    "MemoryReading",
    "ProcessGroupHalt",
    "ProcessSample",
    "RetryAfterPolicy",
    "SessionHalt",
    "SessionWatchdog",
    "WatchedSession",
    "__version__",
    "admission_ticket",
    "metrics_app",
    "metrics_route",
    "parse_cgroup_memory_value",
    "read_cgroup_memory",
    "serving_metrics",
    "session_watchdog",
    "start_metrics_server",
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
        if name != "__version__":
            assert getattr(member, "__module__", "").startswith("asgi_admission")


def test_version_comes_from_package_metadata() -> None:
    """__version__ is the installed distribution's version."""
    assert asgi_admission.__version__ == importlib.metadata.version("asgi-admission")
