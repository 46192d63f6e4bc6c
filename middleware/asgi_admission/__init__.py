"""Admission control for ASGI services that open memory-hungry sessions."""

from importlib.metadata import PackageNotFoundError, version

from ._cgroup import CgroupMemoryReader, parse_cgroup_memory_value, read_cgroup_memory
from ._config import AdmissionConfig
from ._host import HostMemoryReader
from ._latch import AdmissionController, CapacityDecision
from ._metrics import AdmissionCollector, DecisionMetrics
from ._metrics_app import metrics_app, metrics_route, serving_metrics, start_metrics_server
from ._middleware import AdmissionMiddleware
from ._reading import MemoryReading
from ._responses import RetryAfterPolicy

try:
    __version__ = version("asgi-admission")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = [
    "AdmissionCollector",
    "AdmissionConfig",
    "AdmissionController",
    "AdmissionMiddleware",
    "CapacityDecision",
    "CgroupMemoryReader",
    "DecisionMetrics",
    "HostMemoryReader",
    "MemoryReading",
    "RetryAfterPolicy",
    "__version__",
    "metrics_app",
    "metrics_route",
    "parse_cgroup_memory_value",
    "read_cgroup_memory",
    "serving_metrics",
    "start_metrics_server",
]
