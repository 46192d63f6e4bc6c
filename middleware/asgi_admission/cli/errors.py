"""The command's errors: their exit statuses, and the error a subcommand raises for bad usage."""

from __future__ import annotations

from typing import Final

#: A bad option or argument (sysexits.h ``EX_USAGE``): distinct from every probe verdict.
EX_USAGE: Final = 64
#: Anything else that went wrong (sysexits.h ``EX_SOFTWARE``).
EX_SOFTWARE: Final = 70


class UsageError(ValueError):
    """An argument a subcommand cannot use; exits with ``EX_USAGE`` and one line."""
