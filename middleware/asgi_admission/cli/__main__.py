"""``python -m asgi_admission.cli``: the same as the ``asgi-admission`` command."""

import sys

from asgi_admission.cli import main

sys.exit(main())
