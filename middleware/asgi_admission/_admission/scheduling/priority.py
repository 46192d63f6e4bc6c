"""Priority classes: their names and ceilings, as configured (``ADMISSION_PRIORITY_CLASSES``).

A class is a name and its own high watermark (``latch.ClassCeilings`` decides with it);
the first class is served first (docs/configuration.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

#: The one class there is when none are configured; its ceiling is the high watermark.
DEFAULT_CLASS: Final = "default"

# Names become the value of a metric label and appear in problem bodies: a short word.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_SETTING: Final = "priority_classes (ADMISSION_PRIORITY_CLASSES)"


@dataclass(frozen=True, slots=True, kw_only=True)
class PriorityClass:
    """One priority class: its name and the high watermark percent its requests fit under."""

    name: str
    high_watermark_percent: float


def check_priority_classes(
    classes: object, *, high_watermark_percent: float, resume_threshold_percent: float
) -> None:
    """Raise ``ValueError`` naming the setting unless ``classes`` is usable."""
    if not isinstance(classes, tuple):
        raise ValueError(
            f"{_SETTING} must be a tuple of PriorityClass (an empty one for the single "
            f"default class); got {classes!r}."
        )
    gap = high_watermark_percent - resume_threshold_percent
    seen: set[str] = set()
    above: PriorityClass | None = None
    for entry in classes:
        if not isinstance(entry, PriorityClass):
            raise ValueError(f"{_SETTING} must hold PriorityClass entries; got {entry!r}.")
        name, ceiling = entry.name, entry.high_watermark_percent
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"{_SETTING}: a class name must be a word of letters, digits, '_', '.' or "
                f"'-' (at most 32, not empty); got {name!r}."
            )
        if name in seen:
            raise ValueError(f"{_SETTING} names the class {name!r} twice; each name once.")
        seen.add(name)
        if (
            isinstance(ceiling, bool)
            or not isinstance(ceiling, (int, float))
            or not math.isfinite(ceiling)
            or not gap < ceiling <= 100
        ):
            raise ValueError(
                f"{_SETTING}: the class {name!r} has the ceiling {ceiling!r}; a ceiling must "
                f"be a percentage of the memory limit above {gap:g} (the gap between "
                "the high watermark and the resume threshold, where its latch clears) and "
                "at most 100."
            )
        if above is not None and ceiling > above.high_watermark_percent:
            raise ValueError(
                f"{_SETTING}: the class {name!r} ({ceiling:g}) comes after {above.name!r} "
                f"({above.high_watermark_percent:g}) but has a higher ceiling; classes are "
                "served in the order given, so list them from the highest ceiling down."
            )
        above = entry


def parse_priority_classes(text: str) -> tuple[PriorityClass, ...]:
    """``"critical=90,standard=80,batch=65"`` as classes, in that order."""
    classes: list[PriorityClass] = []
    for entry in text.split(","):
        name, equals, percent = entry.partition("=")
        try:
            ceiling = float(percent.strip()) if equals else math.nan
        except ValueError:
            ceiling = math.nan
        if math.isnan(ceiling):
            raise ValueError(
                f"{_SETTING}: {entry.strip()!r} is not name=percent, as in "
                "'critical=90,standard=80,batch=65'."
            )
        classes.append(PriorityClass(name=name.strip(), high_watermark_percent=ceiling))
    return tuple(classes)


def classes_in_force(
    classes: tuple[PriorityClass, ...], *, high_watermark_percent: float
) -> tuple[PriorityClass, ...]:
    """The classes configured; none: one ``DEFAULT_CLASS`` at the high watermark."""
    if classes:
        return classes
    return (PriorityClass(name=DEFAULT_CLASS, high_watermark_percent=high_watermark_percent),)
