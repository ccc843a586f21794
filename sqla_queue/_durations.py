"""Durations as a person writes them: ``7 d``, ``1 h 30 min``, ``10 s``, ``0.4 s``.

One formatter for every place that shows a duration to a person (the command line, a
schedule's description), so that none of them prints Python's ``7 days, 0:00:00``.
"""

from __future__ import annotations

import datetime as dt
import math

__all__ = ["format_duration"]

_UNITS = (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1))


def format_duration(value: float | dt.timedelta, *, parts: int | None = None) -> str:
    """``value`` (seconds, or a timedelta) as ``7 d``, ``1 h 30 min`` or ``0.4 s``.

    Below 10 seconds, fractions show (``0.4 s``, ``2.5 s``, ``0.05 s``); from 10 seconds
    on, whole units from days down to seconds, the zero ones left out. ``parts`` keeps only
    that many units, the largest (``parts=2``: ``3 d 4 h`` for 3 days 4 hours 5 minutes;
    the rest is cut, not rounded). A negative value reads as its size with a minus sign;
    ``nan`` and infinities read as themselves.
    """
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds < 0:
        return "-" + format_duration(-seconds, parts=parts)
    if seconds < 10:
        # Two significant digits below a second (0.05 s), tenths up to ten (2.5 s).
        shown = round(seconds, 2 if seconds < 1 else 1)
        return f"{shown:g} s"
    # A timedelta's whole seconds exactly: a float loses them beyond some 285 years.
    whole = value // dt.timedelta(seconds=1) if isinstance(value, dt.timedelta) else int(seconds)
    words = []
    for unit, size in _UNITS:
        count, whole = divmod(whole, size)
        if count:
            words.append(f"{count} {unit}")
    return " ".join(words[:parts] if parts is not None else words)
