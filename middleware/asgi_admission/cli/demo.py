"""``asgi-admission demo``: serve :mod:`asgi_admission.demo` with uvicorn."""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any

from asgi_admission.cli.errors import UsageError

#: How long an idle connection stays open, in seconds (uvicorn's default is 5). A proxy
#: keeps its connections to a pod open longer (ingress-nginx 60 s), and a request it
#: sends on one just as the server closes it is reset: the proxy answers 502
#: (docs/containers.md, "Replicas behind a proxy").
KEEP_ALIVE_S = 75


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (8000)")
    parser.add_argument(
        "--session-mb",
        type=int,
        default=None,
        help="memory each session holds, in MiB (DEMO_SESSION_MB, else 64)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help=(
            "uvicorn worker processes (1); they count sessions together by default "
            "(ADMISSION_SHARED_DIR=auto; 'off': each counts alone)"
        ),
    )
    parser.add_argument("--log-level", default="info", help="uvicorn log level (info)")


def run(args: argparse.Namespace) -> int:
    if args.session_mb is not None and args.session_mb < 0:
        raise UsageError(f"--session-mb must be 0 or more; got {args.session_mb}.")
    if args.workers < 1:
        raise UsageError(f"--workers must be 1 or more; got {args.workers}.")
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise RuntimeError(
            "the demo needs the 'demo' extra: pip install 'asgi-admission[demo]'"
        ) from exc
    if args.session_mb is not None:
        # Workers are separate processes: the factory reads the size from the environment.
        os.environ["DEMO_SESSION_MB"] = str(args.session_mb)
    uvicorn.run(
        "asgi_admission.demo:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        timeout_keep_alive=KEEP_ALIVE_S,
        log_config=log_config(uvicorn.config.LOGGING_CONFIG),
    )
    return 0


def log_config(base: dict[str, Any]) -> dict[str, Any]:
    """uvicorn's logging, plus the guard's own messages (latch set and cleared) at INFO."""
    config = copy.deepcopy(base)
    config["loggers"]["asgi_admission"] = {
        "handlers": ["default"],
        "level": "INFO",
        "propagate": False,
    }
    return config
