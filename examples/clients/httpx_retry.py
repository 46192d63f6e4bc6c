"""Opening a session with ``httpx``: a short retry loop that honours ``Retry-After``.

httpx does not retry on a status by itself, so the loop is yours: on ``503`` wait
the ``Retry-After`` seconds (the guard always sends whole seconds; the body's
``retry_after_s`` says the same) and send the request again. With
``httpx.AsyncClient`` it is the same loop with ``await client.post(...)`` and
``await asyncio.sleep(...)``.
"""

from __future__ import annotations

import time
from typing import Any

import httpx


def retry_after_s(response: httpx.Response, default: float = 5.0) -> float:
    """The seconds a 503 asks to wait: ``Retry-After`` when it is a number, else ``default``."""
    value = response.headers.get("Retry-After", "")
    return float(value) if value.isdigit() else default


def post_with_retry(
    client: httpx.Client, url: str, *, attempts: int = 5, max_wait_s: float = 60.0, **kwargs: Any
) -> httpx.Response:
    """POST ``url``, waiting out up to ``attempts - 1`` refusals; the last response."""
    for _ in range(attempts - 1):
        response = client.post(url, **kwargs)
        if response.status_code != 503:
            return response
        time.sleep(min(retry_after_s(response), max_wait_s))
    return client.post(url, **kwargs)


if __name__ == "__main__":
    with httpx.Client(timeout=30) as client:
        response = post_with_retry(client, "http://127.0.0.1:8000/sessions")
        print(response.status_code, response.text)
