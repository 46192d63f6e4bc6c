"""The session service of ``session_counts_app`` for the blind tests, its default shared
place made under the base the test names (``BLIND_TEST_BASE``), never the machine's."""

from __future__ import annotations

import os
from typing import Any

from session_counts_app import create as create_counted

from asgi_admission._admission.ledger import shared_place

#: Internal on purpose: the base of the default shared place is the test's.
INTERNAL = "the default shared place's bases"


def create() -> Any:
    base = os.environ["BLIND_TEST_BASE"]
    shared_place.default_bases = lambda: (base,)
    return create_counted()
