"""The checks of what durable jobs are given, run before anything is sent: names (of
steps, cursors, waits, signals, conditions), durations, job ids and limits.

A bad value raises :class:`TypeError` or :class:`ValueError` naming it and the rule, so
that nothing is written and the caller's transaction is not aborted by a server error.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from typing import Any

from sqla_queue.checks import INT4_MAX, INT8_MAX, INT8_MIN, check_row_limit, check_whole_number

__all__ = [
    "MAX_NAME_LENGTH",
    "MAX_WAIT_SECONDS",
    "check_durable_name",
    "check_job_id",
    "check_job_id_list",
    "check_listing_limit",
    "check_seconds",
    "check_step_version",
]

#: The longest name of a step, cursor, wait or signal.
MAX_NAME_LENGTH = 200
#: The longest sleep or wait timeout: 100 years. Its end must be a date every driver can
#: read, and stay before the year that means "no deadline" (a wait without a timeout).
MAX_WAIT_SECONDS = 100 * 365.25 * 86400


def check_durable_name(name: object, what: str) -> str:
    """``name`` as the name of a ``what`` (step, cursor, sleep, wait, signal, condition):
    a string of 1 to :data:`MAX_NAME_LENGTH` characters that PostgreSQL can store (no NUL
    character, no lone surrogate)."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"a {what} needs a name of 1 to {MAX_NAME_LENGTH} characters, got {name!r}"
        )
    if "\x00" in name:
        raise ValueError(f"a {what}'s name cannot hold a NUL character (\\x00), got {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"a {what}'s name must be valid Unicode text (it holds a lone surrogate), got {name!r}"
        ) from None
    return name


def check_seconds(value: object, what: str) -> float | None:
    """``value`` (seconds, or a ``timedelta``; ``None`` passes) as seconds: a finite
    number from 0 to :data:`MAX_WAIT_SECONDS`."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or math.isnan(seconds):
        raise TypeError(f"{what} must be seconds or a timedelta, got {value!r}")
    if seconds < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    if not seconds <= MAX_WAIT_SECONDS:
        raise ValueError(
            f"{what} must be at most 100 years ({MAX_WAIT_SECONDS:.0f} s), got {value!r}; "
            "to wait with no deadline, give no timeout"
        )
    return float(seconds)


def check_job_id(job_id: object) -> int:
    """``job_id`` as a job's id: an ``int`` (not a ``bool``, a ``float`` or a
    ``Decimal``: ``1.5`` must not become job 1 or 2) that a ``bigint`` holds."""
    return check_whole_number("a job id", job_id, INT8_MIN, INT8_MAX)


def check_job_id_list(job_ids: Iterable[Any] | None) -> list[int] | None:
    """``job_ids`` (``None`` passes: all) as a list of checked job ids."""
    if job_ids is None:
        return None
    if isinstance(job_ids, str | bytes) or not isinstance(job_ids, Iterable):
        raise TypeError(f"job_ids must be an iterable of job ids, got {job_ids!r}")
    return [check_job_id(job_id) for job_id in job_ids]


def check_listing_limit(limit: object, what: str) -> int:
    """``limit`` as the most rows of a listing of ``what``: a whole number from 1 (one
    beyond an ``integer`` lists what that many would: everything)."""
    return min(check_row_limit(f"the number of {what} to list", limit), INT4_MAX)


def check_step_version(version: object) -> int:
    """``version`` as a step's version: a whole number from 1 that an ``integer`` holds."""
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= INT4_MAX:
        raise ValueError(
            f"a step's version is a whole number from 1 to {INT4_MAX}, got {version!r}"
        )
    return version
