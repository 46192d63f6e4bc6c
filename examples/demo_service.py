"""The demo session service, as ``asgi-admission demo`` serves it.

Run it with ``uvicorn examples.demo_service:app`` from the repository root;
settings come from the ``ADMISSION_*`` environment (docs/configuration.md) and
``DEMO_SESSION_MB`` (the memory each session holds, default 64).
"""

from asgi_admission import AdmissionConfig
from asgi_admission.demo import create_app

app = create_app(
    config=AdmissionConfig.from_env(),
    readiness_path="/admission/ready",
)
