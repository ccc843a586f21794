"""How a log line quotes a database error: its message in full, its statement cut short.

SQLAlchemy's error text ends with the whole statement and its parameters. A completion of
5,000 jobs quotes some 30 KB of SQL and ids in every warning it logs, which buries the
message and floods the log. :func:`short_error` keeps the message and cuts the rest.
"""

from __future__ import annotations

__all__ = ["MAX_QUOTED", "short_error"]

#: The most characters of an error's text that a log line quotes.
MAX_QUOTED = 500


def short_error(exc: BaseException, limit: int = MAX_QUOTED) -> str:
    """``exc`` as text of at most ``limit`` characters (plus a note of how much was cut).

    The driver's message comes first in SQLAlchemy's text, so the cut keeps it and drops
    the tail: the statement and its parameters. ``limit`` must be positive.
    """
    if limit <= 0:
        raise ValueError(f"limit must be a positive number of characters, not {limit!r}")
    text = str(exc)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"
