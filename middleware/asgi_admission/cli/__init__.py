"""The ``asgi-admission`` command: ``probe`` and ``demo``.

Each subcommand lives in its own module with ``add_arguments(parser)`` and
``run(args) -> int``; errors are one clear line on stderr, never a traceback.
Usage errors exit 64 (``EX_USAGE``) and anything else that fails 70
(``EX_SOFTWARE``), so neither is mistaken for one of ``probe``'s verdicts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from asgi_admission import __version__
from asgi_admission.cli.errors import EX_SOFTWARE, EX_USAGE, UsageError


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors exit ``EX_USAGE`` (its subparsers too)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
        return EX_USAGE if isinstance(exc, UsageError) else EX_SOFTWARE
    return code
