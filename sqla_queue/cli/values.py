"""The values that ``sqla-queue`` options take, as argparse types: durations, bounded whole
numbers, seconds, job states, rows, log levels.

Each turns the text typed into the value a command needs, or raises
``argparse.ArgumentTypeError`` with one line naming the option and the rule (the parser
prints it as a usage error, status 2). The rules themselves are those of the library
(:mod:`sqla_queue.checks`), so that the command line refuses what the API refuses.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
from collections.abc import Callable

from sqla_queue.checks import check_seconds, check_whole_number
from sqla_queue.lifecycle import check_timeout
from sqla_queue.statements.listing import JOB_STATES

__all__ = [
    "DURATION_UNITS",
    "about_row",
    "job_states",
    "log_level",
    "non_empty",
    "parse_duration",
    "seconds",
    "timeout",
    "whole_number",
]

#: The units a duration may end with, in seconds, smallest first.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> dt.timedelta:
    """``7d``, ``12h``, ``30m``, ``90s`` or plain seconds, as a timedelta."""
    unit = text[-1:].lower()
    number = text[:-1] if unit in DURATION_UNITS else text
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number with s, m, h or d (7d, 12h)"
        ) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: it must be finite")
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: it cannot be negative")
    try:
        return dt.timedelta(seconds=value * DURATION_UNITS.get(unit, 1))
    except OverflowError:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: at most {dt.timedelta.max.days} days"
        ) from None


def whole_number(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            return check_whole_number(what, int(text), low, high)
        except ValueError:  # not a whole number, or out of range
            raise argparse.ArgumentTypeError(
                f"{what} must be a whole number from {low} to {high}, got {text!r}"
            ) from None

    return parse


def seconds(*, allow_zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, positive (or, with ``allow_zero``, >= 0)."""
    rule = "zero or more" if allow_zero else "more than zero"

    def parse(text: str) -> float:
        try:
            return check_seconds("seconds", float(text), maximum=math.inf, positive=not allow_zero)
        except ValueError:  # not a number, or not a finite one in range
            raise argparse.ArgumentTypeError(
                f"expected a finite number of seconds, {rule}, got {text!r}"
            ) from None

    return parse


def timeout(text: str) -> float | None:
    """An argparse type: a duration (``30``, ``90s``, ``5m``, ``0``) or ``none`` (no limit)."""
    if text.strip().lower() in ("none", "forever"):
        return None
    try:
        return check_timeout(parse_duration(text).total_seconds())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: {exc}") from None


def job_states(text: str) -> list[str]:
    """An argparse type: job states, comma-separated (``failed,cancelled``)."""
    words = [word.strip().lower() for word in text.split(",") if word.strip()]
    if not words:
        raise argparse.ArgumentTypeError(f"expected a job state, got {text!r}")
    for word in words:
        if word not in JOB_STATES:
            raise argparse.ArgumentTypeError(
                f"unknown job state {word!r}; use one of {', '.join(JOB_STATES)}"
            )
    return words


def about_row(text: str) -> tuple[str, str | None]:
    """An argparse type: ``TABLE`` or ``TABLE:KEY`` (``orders:42``, ``shop.orders:42``)."""
    table, sep, key = text.partition(":")
    if not table or (sep and not key):
        raise argparse.ArgumentTypeError(
            f"expected TABLE or TABLE:KEY such as orders:42, got {text!r}"
        )
    return table, key if sep else None


def non_empty(what: str) -> Callable[[str], str]:
    """An argparse type: any text but the empty one."""

    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"{what} must not be empty")
        return text

    return parse


def log_level(text: str) -> str:
    """An argparse type: a logging level name (DEBUG, INFO, WARNING, ERROR, CRITICAL)."""
    names = [name for name in logging.getLevelNamesMapping() if name not in ("NOTSET", "WARN")]
    if text.upper() not in logging.getLevelNamesMapping():
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r}; use one of {', '.join(sorted(names))}"
        )
    return text.upper()
