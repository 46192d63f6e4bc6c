"""The ``asgi-admission`` command: ``probe`` and ``demo``.

Each subcommand lives in its own module with ``add_arguments(parser)`` and
``run(args) -> int``; errors are one clear line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asgi-admission",
        description="Memory admission control for ASGI session services.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from . import _probe

    probe = sub.add_parser("probe", help="show what the guard sees and would decide now")
    _probe.add_arguments(probe)
    probe.set_defaults(run=_probe.run)

    demo = sub.add_parser("demo", help="serve the demo session service with uvicorn")
    demo.set_defaults(run=_run_demo)
    _add_demo_arguments(demo)
    return parser


def _add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    from . import _demo_cli

    _demo_cli.add_arguments(parser)


def _run_demo(args: argparse.Namespace) -> int:
    from . import _demo_cli

    return _demo_cli.run(args)


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
