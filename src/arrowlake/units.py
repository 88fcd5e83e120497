"""Quantities written for people: byte counts in binary units, and durations.

One duration syntax serves table properties, the command line and every ``older_than``-style
argument given as text: a number of seconds (``3600``), a number with a unit (``30 min``,
``7 d``, ``500 ms``, ``1w``), or several such parts (``1h30m``, ``1 d 12 h``). Units: ``ms``;
``s``, ``sec``, ``second(s)``; ``m``, ``min``, ``minute(s)``; ``h``, ``hr``, ``hour(s)``;
``d``, ``day(s)``; ``w``, ``week(s)``. Durations are never negative.
"""

from __future__ import annotations

import math
import re

_UNITS: dict[str, float] = {
    "ms": 0.001, "msec": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}
_PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)", re.IGNORECASE)

#: The syntax, as error messages describe it.
DURATION_HELP = ("a number of seconds, or numbers with units (ms, s, min, h, d, w), e.g. "
                 "'3600', '30 min', '7 d', '500 ms' or '1h30m'")


def parse_duration_seconds(text: str) -> float:
    """``text`` as a number of seconds; ValueError saying what is accepted otherwise.

    >>> parse_duration_seconds("1h30m"), parse_duration_seconds("7 d"), parse_duration_seconds("2")
    (5400.0, 604800.0, 2.0)
    """
    source = str(text).strip()
    if source.startswith("-"):
        raise ValueError(f"a duration cannot be negative: {text!r}")
    total, position, parts = 0.0, 0, 0
    while position < len(source):
        match = _PART.match(source, position)
        if match is None or match.end() == position:
            break
        number, unit = match.group(1), match.group(2).lower()
        if unit == "" and parts == 0 and match.end() == len(source.rstrip()):
            unit = "s"  # a bare number is seconds
        if unit not in _UNITS:
            break
        total += float(number) * _UNITS[unit]
        parts += 1
        position = match.end()
        while position < len(source) and source[position].isspace():
            position += 1
    if parts == 0 or position != len(source):
        raise ValueError(f"{text!r} is not a duration: give {DURATION_HELP}")
    if not math.isfinite(total):
        raise ValueError(f"{text!r} is too long a duration")
    return total


def human_size(n: float) -> str:
    """A byte count for people: ``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


__all__ = ["DURATION_HELP", "human_size", "parse_duration_seconds"]
