"""Opening a session with ``requests``, letting urllib3 wait out the guard's refusals.

A refused session request gets ``503`` with ``Retry-After``; urllib3's ``Retry``
sleeps that long and sends the request again. ``allowed_methods=None`` retries
``POST`` too: a request the guard refused never reached the app, so sending it
again opens at most one session. (If your app itself answers 503 after doing part
of the work, narrow ``status_forcelist`` or the methods.)
"""

from __future__ import annotations

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


def session_with_retry(*, attempts: int = 5) -> requests.Session:
    """A ``requests.Session`` that retries a 503 up to ``attempts - 1`` times."""
    retry = Retry(
        total=attempts - 1,
        status_forcelist=[503],
        allowed_methods=None,
        respect_retry_after_header=True,
        # After the last attempt, hand back the 503 instead of raising RetryError.
        raise_on_status=False,
    )
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


if __name__ == "__main__":
    with session_with_retry() as http:
        response = http.post("http://127.0.0.1:8000/sessions", timeout=30)
        print(response.status_code, response.text)
