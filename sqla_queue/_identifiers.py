"""Validation of the names that end up in DDL or in rows.

SQLAlchemy quotes identifiers, so validation is not about injection: it keeps names portable
(no quoting surprises in psql) and turns a typo into a clear error at import time instead of a
confusing one at migration time.
"""

from __future__ import annotations

import re

from sqla_queue.errors import InvalidIdentifierError

# PostgreSQL truncates identifiers at 63 bytes; the prefix must leave room for our suffixes.
_MAX_IDENTIFIER = 63
LONGEST_SUFFIX = len("job_executions_queue_running_uq")
_SQL_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_TASK_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]*$")
MAX_TASK_NAME = 200


def validate_schema(schema: str | None) -> str | None:
    """Return ``schema`` unchanged if it is a plain lower-case SQL name, else raise."""
    if schema is None:
        return None
    if not _SQL_NAME.match(schema) or len(schema) > _MAX_IDENTIFIER:
        raise InvalidIdentifierError(
            f"invalid schema name {schema!r}: use lower-case letters, digits and underscores, "
            f"starting with a letter or underscore, at most {_MAX_IDENTIFIER} characters"
        )
    return schema


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` unchanged if table and index names built from it stay valid."""
    if prefix and not _SQL_NAME.match(prefix):
        raise InvalidIdentifierError(
            f"invalid table prefix {prefix!r}: use lower-case letters, digits and underscores, "
            "starting with a letter or underscore"
        )
    if len(prefix) + LONGEST_SUFFIX > _MAX_IDENTIFIER:
        raise InvalidIdentifierError(
            f"table prefix {prefix!r} is too long: at most "
            f"{_MAX_IDENTIFIER - LONGEST_SUFFIX} characters, so that index names fit in "
            f"PostgreSQL's {_MAX_IDENTIFIER}"
        )
    return prefix


def validate_task_name(name: str) -> str:
    """Return ``name`` unchanged if it is an acceptable task name, else raise."""
    if not isinstance(name, str) or not name:
        raise InvalidIdentifierError(f"task name must be a non-empty string, got {name!r}")
    if len(name) > MAX_TASK_NAME or not _TASK_NAME.match(name):
        raise InvalidIdentifierError(
            f"invalid task name {name!r}: start with a letter or underscore, then letters, "
            f"digits, '_', '.', ':' or '-', at most {MAX_TASK_NAME} characters"
        )
    return name
