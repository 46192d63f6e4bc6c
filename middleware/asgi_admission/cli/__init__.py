"""The ``asgi-admission`` command: ``probe`` and ``demo``.

Each subcommand lives in its own module with ``add_arguments(parser)`` and
``run(args) -> int``; errors are one clear line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from asgi_admission import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asgi-admission",
        description="Memory admission control for ASGI session services.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from asgi_admission.cli import demo as demo_command
    from asgi_admission.cli import probe as probe_command

    probe = sub.add_parser("probe", help="show what the guard sees and would decide now")
    probe_command.add_arguments(probe)
    probe.set_defaults(run=probe_command.run)

    demo = sub.add_parser("demo", help="serve the demo session service with uvicorn")
    demo_command.add_arguments(demo)
    demo.set_defaults(run=demo_command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one clear line, never a traceback
        print(f"asgi-admission {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return code
