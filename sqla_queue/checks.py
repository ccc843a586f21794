"""The generic checks of values the library is given: whole numbers within bounds, and
numbers of seconds.

Every setting, option and argument that is a count, a limit, an id or a duration is checked
here, where it enters, so that a bad value fails at the call with an error naming it and
the rule, before anything is written: it never reaches PostgreSQL as a ``DataError`` that
aborts the caller's transaction. The bounds are those of PostgreSQL's integer columns.

This module sits at the bottom of the package: it imports nothing of it.
"""

from __future__ import annotations

import datetime as dt
import math
import numbers
from typing import TypeGuard

__all__ = [
    "INT4_MAX",
    "INT4_MIN",
    "INT8_MAX",
    "INT8_MIN",
    "check_in_range",
    "check_row_limit",
    "check_seconds",
    "check_whole_number",
    "described",
    "is_number",
    "is_whole_number",
]

#: The range of a PostgreSQL ``integer`` column (priority, max_attempts, limits, ...).
INT4_MIN = -(2**31)
INT4_MAX = 2**31 - 1
#: The range of a PostgreSQL ``bigint`` (job ids, and the ``LIMIT`` of a statement).
INT8_MIN = -(2**63)
INT8_MAX = 2**63 - 1

# Why a bound is what it is, for the messages of check_whole_number.
_STORED_AS = {
    INT4_MAX: " (it is stored as a PostgreSQL integer)",
    INT8_MAX: " (it is a PostgreSQL bigint)",
}


def described(value: object) -> str:
    """``value`` for an error message: its repr and its type, ``'7' (str)``."""
    return f"{value!r} ({type(value).__name__})"


def is_whole_number(value: object) -> TypeGuard[numbers.Integral]:
    """Whether ``value`` is an integer: any ``numbers.Integral`` but a ``bool`` (``2.0``
    and ``Decimal(2)`` are not)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is a real number: any ``numbers.Real`` but a ``bool``.

    A plain ``bool``, not a ``TypeGuard``: narrowing to ``numbers.Real``, which declares no
    ``>`` or ``>=``, would hide the caller's ``float`` from the type checker.
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_whole_number(option: str, value: object, low: int, high: int | None = INT4_MAX) -> int:
    """``value`` as an ``int`` if it is a whole number from ``low`` to ``high``, else raise.

    ``TypeError`` for anything but an integer (``True``, ``2.0`` and ``Decimal("2.9")``
    included); ``ValueError`` outside the range (``high=None``: no upper bound, for a
    number that never reaches SQL). Both messages name ``option`` and the rule.
    """
    if not is_whole_number(value):
        raise TypeError(f"{option} must be a whole number (int), got {described(value)}")
    number = int(value)
    if number < low and high in (INT4_MAX, None):
        raise ValueError(f"{option} must be at least {low}, got {number}")
    if high is not None and not low <= number <= high:
        why = _STORED_AS.get(high, "")
        raise ValueError(f"{option} must be from {low} to {high}{why}, got {number}")
    return number


def check_in_range(option: str, value: object, low: int, high: int) -> int:
    """``value`` as an ``int`` if it is a whole number from ``low`` to ``high``, else raise.

    Unlike :func:`check_whole_number`, every bad value, of a wrong type or out of range,
    raises the same :class:`ValueError`, naming ``option`` and the range.
    """
    if not is_whole_number(value) or not low <= int(value) <= high:
        raise ValueError(f"{option} must be a whole number from {low} to {high}, got {value!r}")
    return int(value)


def check_row_limit(option: str, value: object) -> int:
    """``value`` as the ``LIMIT`` of a listing: a whole number of at least 1, else raise.

    Every bad value raises the same :class:`ValueError` naming ``option``. A number beyond
    a ``bigint`` is lowered to :data:`INT8_MAX`: no table holds that many rows, so it
    lists what the larger number would.
    """
    if not is_whole_number(value) or int(value) < 1:
        raise ValueError(f"{option} must be at least 1, got {value!r}")
    return min(int(value), INT8_MAX)


def check_seconds(
    option: str,
    value: object,
    *,
    maximum: float,
    positive: bool = False,
    timedelta: bool = False,
) -> float:
    """``value`` as seconds (a ``float``) if it is a finite number within bounds, else raise.

    Accepted: an ``int`` or ``float`` (not a ``bool``), and with ``timedelta=True`` a
    ``timedelta``. The number must be ``>= 0`` (``> 0`` with ``positive=True``) and at
    most ``maximum``. ``TypeError`` for a wrong type, ``ValueError`` for a bad number; both
    name ``option`` and the rule.
    """
    if timedelta and isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    else:
        kinds = "a number of seconds (int or float)" + (" or a timedelta" if timedelta else "")
        raise TypeError(f"{option} must be {kinds}, got {described(value)}")
    if not math.isfinite(seconds):
        raise ValueError(f"{option} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (positive and seconds == 0):
        rule = "positive" if positive else "non-negative (cannot be negative)"
        raise ValueError(f"{option} must be {rule}, got {value!r}")
    if seconds > maximum:
        raise ValueError(
            f"{option} must be at most {maximum:.0f} seconds "
            f"({dt.timedelta(seconds=maximum)}), got {value!r}"
        )
    return seconds
