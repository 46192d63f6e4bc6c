"""The watchdog's settings: the critical watermark and the sampling interval, their
defaults, the check a constructor makes of them, and reading them from the environment,
which never fails (``docs/configuration.md``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Final

from asgi_admission import _env

logger = logging.getLogger("asgi_admission")

DEFAULT_CRITICAL_WATERMARK_PERCENT: Final = 90.0
DEFAULT_INTERVAL_S: Final = 0.5
ENV_CRITICAL_WATERMARK: Final = ("ADMISSION_CRITICAL_WATERMARK_PERCENT", None)
ENV_INTERVAL: Final = ("ADMISSION_WATCHDOG_INTERVAL_SECONDS", None)


def check_settings(*, critical_watermark_percent: float, interval_s: float, high: float) -> None:
    """Raise ``ValueError`` unless the critical watermark lies above the high one ``high``
    and at most 100, and the interval is a number of seconds above 0."""
    if not (math.isfinite(critical_watermark_percent) and high < critical_watermark_percent <= 100):
        raise ValueError(
            "critical_watermark_percent must lie above the high watermark and at most 100 "
            f"(high < critical <= 100); got critical={critical_watermark_percent!r}, "
            f"high={high!r}."
        )
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(f"interval_s must be a number of seconds above 0; got {interval_s!r}.")


def settings_from_env(env: Mapping[str, str], *, high: float) -> tuple[float, float]:
    """The critical watermark and the interval from ``env``, given the high watermark
    ``high``; a bad value falls back with one warning naming the variable (see
    ``SessionWatchdog.from_env``)."""
    critical = _env.number(env, ENV_CRITICAL_WATERMARK, DEFAULT_CRITICAL_WATERMARK_PERCENT, float)
    if not (math.isfinite(critical) and high < critical <= 100):
        fallback = (
            DEFAULT_CRITICAL_WATERMARK_PERCENT
            if high < DEFAULT_CRITICAL_WATERMARK_PERCENT
            else (high + 100) / 2
        )
        logger.warning(
            "%s=%s must lie above the high watermark %s and at most 100; using %s.",
            ENV_CRITICAL_WATERMARK[0],
            critical,
            high,
            fallback,
        )
        critical = fallback
    interval = _env.number(env, ENV_INTERVAL, DEFAULT_INTERVAL_S, float)
    if not (math.isfinite(interval) and interval > 0):
        logger.warning(
            "%s=%s must be above 0; using the default %s.",
            ENV_INTERVAL[0],
            interval,
            DEFAULT_INTERVAL_S,
        )
        interval = DEFAULT_INTERVAL_S
    return critical, interval
