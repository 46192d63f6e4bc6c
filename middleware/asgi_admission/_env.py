"""Reading settings from the environment: current and legacy names, one warning per fallback.

Each setting is named by a pair ``(current name, legacy name or None)``; the
legacy names are those of the deployment this guard replaced (``CODA_*``).
Nothing here raises: a malformed value falls back to its default with one
warning naming the variable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

logger = logging.getLogger("asgi_admission")

#: A setting's variable names: (current name, legacy name or None).
EnvNames = tuple[str, "str | None"]

_N = TypeVar("_N", int, float)


def setting_name(env: Mapping[str, str], names: EnvNames) -> str:
    """The variable actually in effect: the current name, or the legacy one if only it is set."""
    current, legacy = names
    if current not in env and legacy is not None and legacy in env:
        return legacy
    return current


def raw_value(env: Mapping[str, str], names: EnvNames) -> str | None:
    """The variable's text (current name first), warning once where a legacy name is used."""
    current, legacy = names
    if current in env:
        if legacy is not None and legacy in env:
            logger.warning("%s is set, so the legacy %s is ignored.", current, legacy)
        return env[current]
    if legacy is not None and legacy in env:
        logger.warning("%s is a legacy name; set %s instead.", legacy, current)
        return env[legacy]
    return None


def number(
    env: Mapping[str, str],
    names: EnvNames,
    default: _N,
    kind: Callable[[str], _N],
    *,
    minimum: _N | None = None,
) -> _N:
    """A number from the environment; the default (with one warning) when malformed or low."""
    raw = raw_value(env, names)
    if raw is None or not raw.strip():
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        logger.warning(
            "%s=%r is not a valid number; using the default %s.",
            setting_name(env, names),
            raw,
            default,
        )
        return default
    if minimum is not None and value < minimum:
        logger.warning(
            "%s=%r is below the minimum %s; using the default %s.",
            setting_name(env, names),
            raw,
            minimum,
            default,
        )
        return default
    return value


def text(env: Mapping[str, str], names: EnvNames) -> str | None:
    """The variable's stripped text, ``None`` when unset or blank."""
    raw = raw_value(env, names)
    return raw.strip() or None if raw is not None else None


_S = TypeVar("_S", bound=str)


def choice(env: Mapping[str, str], names: EnvNames, choices: tuple[_S, ...], default: _S) -> _S:
    """One of ``choices`` (case-insensitive); the default, with one warning, for anything else."""
    raw = raw_value(env, names)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    for option in choices:
        if value == option:
            return option
    logger.warning(
        "%s=%r is not one of %s; using the default %r.",
        setting_name(env, names),
        raw,
        ", ".join(choices),
        default,
    )
    return default


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(env: Mapping[str, str], names: EnvNames, *, default: bool) -> bool:
    """A yes/no setting (``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off``);
    the default, with one warning, for anything else."""
    raw = raw_value(env, names)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    logger.warning(
        "%s=%r is neither true nor false; using the default %s.",
        setting_name(env, names),
        raw,
        "true" if default else "false",
    )
    return default
