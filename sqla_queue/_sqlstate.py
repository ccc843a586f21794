"""Reading SQLSTATE codes off driver exceptions without importing any driver's classes.

psycopg and asyncpg (as wrapped by SQLAlchemy) both expose the code as ``sqlstate`` on the
original exception; psycopg names the violated constraint on ``diag.constraint_name``,
asyncpg on ``constraint_name``. Reading attributes keeps the library driver-neutral.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = [
    "INSUFFICIENT_PRIVILEGE",
    "LOCK_NOT_AVAILABLE",
    "SERIALIZATION_FAILURE",
    "UNIQUE_VIOLATION",
    "constraint_of",
    "is_unique_violation_of",
    "sqlstate_of",
]

UNIQUE_VIOLATION = "23505"
#: ``permission denied`` for a table, schema or other object.
INSUFFICIENT_PRIVILEGE = "42501"
#: ``lock_timeout`` ran out (or ``NOWAIT`` found the row locked).
LOCK_NOT_AVAILABLE = "55P03"
#: A row the statement waited for moved to another partition (or a serializable conflict).
SERIALIZATION_FAILURE = "40001"


def _chain(exc: BaseException) -> list[object]:
    seen: list[object] = []
    current: object | None = exc
    while current is not None and current not in seen and len(seen) < 8:
        seen.append(current)
        current = getattr(current, "orig", None) or getattr(current, "__cause__", None)
    return seen


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE carried by ``exc`` or the driver error it wraps, if any."""
    for item in _chain(exc):
        code = getattr(item, "sqlstate", None) or getattr(item, "pgcode", None)
        if isinstance(code, str):
            return code
    return None


def constraint_of(exc: BaseException) -> str | None:
    """The name of the constraint or unique index that ``exc`` reports as violated."""
    for item in _chain(exc):
        diag = getattr(item, "diag", None)
        name = getattr(diag, "constraint_name", None) or getattr(item, "constraint_name", None)
        if isinstance(name, str):
            return name
    return None


def is_unique_violation_of(exc: BaseException, names: Collection[str]) -> bool:
    """True when ``exc`` is a unique violation of one of the indexes ``names``."""
    return sqlstate_of(exc) == UNIQUE_VIOLATION and constraint_of(exc) in names
