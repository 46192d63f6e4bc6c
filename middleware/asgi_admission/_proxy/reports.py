"""The guard's reports to the proxy in front of it: the agent check and the load report.

``ProxyReports`` is what ``AdmissionMiddleware`` holds of them (``docs/containers.md``):
the capacity it checks, the agent-check listener (run with the lifespan) where a port is
set, and the view session responses are reported from where the header is on.
"""

from __future__ import annotations

from asgi_admission._admission.service import AdmissionService
from asgi_admission._proxy.agent import AgentListener
from asgi_admission._proxy.capacity import CapacityView


class ProxyReports:
    """The capacity ``service``'s guard reports, and where it reports it."""

    def __init__(self, service: AdmissionService) -> None:
        self.view = CapacityView(service)
        config = service.config
        port = config.agent_port
        self.agent = None if port is None else AgentListener(self.view, port=port)
        #: The view session responses report from; ``None``: no header.
        self.load_report = self.view if config.load_metrics_header else None
