"""The one reader of the dashboard's request parameters: query strings, path parts, forms.

Every value a request carries reaches a view through these functions and nothing else,
so a value the database cannot take (a NUL, a number beyond its column, digits Python
reads but PostgreSQL does not) is refused here, by name, before any statement runs: the
view answers 400 (bad input) or 404 (no such thing) and writes nothing, instead of a 500
and a traceback in the host's log.

Numbers are ASCII digits only (``int()`` also reads ``"١٢"`` and refuses ``"²"``, which
``str.isdigit`` accepts), checked for length before conversion (Python refuses to read
more than 4,300 digits) and bounded by the column they are compared with. Text has no
NUL or lone surrogate (PostgreSQL stores neither) and a bounded length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqla_queue.checks import INT8_MAX as BIGINT_MAX
from sqla_queue.logic.payload import text_problem

__all__ = [
    "RequestRefused",
    "choice",
    "job_id",
    "optional_text",
    "optional_whole_number",
    "shown",
    "text",
    "whole_number",
    "workflow_id",
]

# The digits of the largest bound any caller passes (bigint: 19); a longer run of digits
# is out of range without being converted.
_MAX_DIGITS = 19
_SHOWN = 40


class RequestRefused(Exception):
    """A request the dashboard refuses before anything runs: the HTTP status and the
    reason shown to the operator."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def shown(value: str) -> str:
    """``value`` quoted for a message: ``repr`` (a NUL shows as ``\\x00``), cut short."""
    if len(value) <= _SHOWN:
        return repr(value)
    return f"{value[:_SHOWN]!r}... ({len(value):,} characters)"


def whole_number(name: str, value: str, *, low: int, high: int) -> int:
    """``value`` (ASCII digits, surrounding spaces allowed) as an int from ``low`` to
    ``high``; else :class:`RequestRefused` (400) naming ``name`` and the rule."""
    digits = value.strip()
    if not digits or not digits.isascii() or not digits.isdigit():
        raise RequestRefused(
            400, f"{name} must be a whole number (digits 0-9), not {shown(value)}."
        )
    if len(digits.lstrip("0")) > _MAX_DIGITS or not low <= int(digits) <= high:
        raise RequestRefused(400, f"{name} must be from {low} to {high:,}, not {shown(digits)}.")
    return int(digits)


def optional_whole_number(
    params: Mapping[str, str], name: str, *, low: int, high: int
) -> int | None:
    """``params[name]`` read by :func:`whole_number`; ``None`` when absent or blank."""
    value = params.get(name, "")
    return whole_number(name, value, low=low, high=high) if value.strip() else None


def job_id(value: str) -> int:
    """A job id from a URL's path: a whole number from 1 to ``BIGINT_MAX``; anything else
    names no job, so :class:`RequestRefused` is a 404."""
    try:
        return whole_number("a job id", value, low=1, high=BIGINT_MAX)
    except RequestRefused as refused:
        raise RequestRefused(404, f"There is no job {shown(value)}: {refused.reason}") from None


def workflow_id(value: str) -> int:
    """A workflow id from a URL's path, read as :func:`job_id` reads a job's: anything
    but a whole number from 1 to ``BIGINT_MAX`` names no workflow (404)."""
    try:
        return whole_number("a workflow id", value, low=1, high=BIGINT_MAX)
    except RequestRefused as refused:
        raise RequestRefused(
            404, f"There is no workflow {shown(value)}: {refused.reason}"
        ) from None


def text(name: str, value: str, *, max_length: int) -> str:
    """``value`` if PostgreSQL can compare it (no NUL, no lone surrogate) and it has at most
    ``max_length`` characters; else :class:`RequestRefused` (400) naming ``name``."""
    if len(value) > max_length:
        raise RequestRefused(
            400, f"{name} must be at most {max_length} characters, not {len(value):,}."
        )
    problem = text_problem(value)
    if problem is not None:
        raise RequestRefused(400, f"{name} {shown(value)} {problem}.")
    return value


def optional_text(
    params: Mapping[str, str], name: str, *, max_length: int, strip: bool = True
) -> str | None:
    """``params[name]`` read by :func:`text` (stripped of surrounding spaces unless
    ``strip`` is false); ``None`` when absent or blank."""
    value = params.get(name, "")
    if strip:
        value = value.strip()
    return text(name, value, max_length=max_length) if value else None


def choice(name: str, value: str, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed``; else :class:`RequestRefused` (400) listing them."""
    if value not in allowed:
        raise RequestRefused(
            400, f"Unknown {name} {shown(value)}: use one of {', '.join(allowed)}."
        )
    return value
