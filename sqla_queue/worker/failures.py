"""What a database error means to a worker: try again, isolate an outcome, or stop.

Most errors pass (a dropped connection, a restart, a cancelled statement): the worker
backs off and tries again. Some never pass, and retrying them would only log the same
warning forever while the worker holds its jobs:

* a missing privilege (SQLSTATE 42501) or a missing table, column, function or schema
  (42P01, 42703, 42883, 3F000): the worker stops with a :class:`WorkerStoppedError` that
  names the object and the fix;
* a data error or a constraint violation (classes 22 and 23, except a lost uniqueness
  race on the queue's own guard indexes): in a completion, the worker writes the outcomes
  one by one to find the one at fault and fails that job alone; anywhere else it stops;
* a prepared statement the server does not know, or knows already (26000, 42P05): the
  driver prepared it on one server connection and a pooler in transaction mode (PgBouncer
  before 1.21, or without ``max_prepared_statements``) sent the next run to another. The
  worker stops with a :class:`WorkerStoppedError` that says how to turn the driver's
  prepared statements off.

The SQLSTATE is read through :mod:`sqla_queue._sqlstate`, driver-neutral. Nothing here
does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Collection

from sqla_queue._sqlstate import is_unique_violation_of, sqlstate_of
from sqla_queue.models.tables import QueueTables

__all__ = ["Fault", "classify", "database_message", "explain"]

#: SQLSTATEs of a missing object: undefined table, column, function; invalid schema name.
MISSING_OBJECT = frozenset({"42P01", "42703", "42883", "3F000"})
INSUFFICIENT_PRIVILEGE = "42501"
#: SQLSTATEs of a driver's prepared statement lost or duplicated by a transaction pooler:
#: invalid SQL statement name ("prepared statement ... does not exist"), duplicate
#: prepared statement. The worker prepares nothing by name itself.
PREPARED_STATEMENT_LOST = frozenset({"26000", "42P05"})


class Fault(enum.Enum):
    """How a worker treats a failed statement."""

    #: Worth another try after a pause: connections, restarts, timeouts, serialization.
    TRANSIENT = "transient"
    #: A claim lost a uniqueness race on one of the queue's guard indexes: retry at once.
    RACE = "race"
    #: Data error or constraint violation: the same statement fails the same way again.
    DATA = "data"
    #: The worker's role lacks a privilege.
    PRIVILEGE = "privilege"
    #: A table, column, function or schema the worker needs does not exist.
    MISSING = "missing"
    #: The driver's prepared statements do not survive the connection pooler in between.
    POOLER = "pooler"


def classify(exc: BaseException, race_indexes: Collection[str]) -> Fault:
    """The :class:`Fault` of ``exc``, a failed statement of the worker."""
    code = sqlstate_of(exc)
    if code is None:
        return Fault.TRANSIENT
    if is_unique_violation_of(exc, race_indexes):
        return Fault.RACE
    if code == INSUFFICIENT_PRIVILEGE:
        return Fault.PRIVILEGE
    if code in MISSING_OBJECT:
        return Fault.MISSING
    if code in PREPARED_STATEMENT_LOST:
        return Fault.POOLER
    if code.startswith(("22", "23")):
        return Fault.DATA
    return Fault.TRANSIENT


def database_message(exc: BaseException) -> str:
    """The first line of the database's own message for ``exc``, with its SQLSTATE."""
    orig = getattr(exc, "orig", None) or exc
    try:
        text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    except Exception:  # a driver error that cannot print itself
        text = type(orig).__name__
    code = sqlstate_of(exc)
    return f"{text} (SQLSTATE {code})" if code else text


def explain(fault: Fault, exc: BaseException, tables: QueueTables, doing: str) -> str:
    """Why a worker stops on ``exc`` (raised while ``doing``), and what fixes it."""
    reason = database_message(exc)
    names = ", ".join(_where_rows_are(tables, table.name) for table in tables.all)
    if fault is Fault.PRIVILEGE:
        schema = tables.effective_schema or "public"
        return (
            f"the worker stopped: its database role lacks a privilege it needs ({doing}: "
            f"{reason}). Grant it what the deployment guide's least-privilege role has "
            f"(docs/guides/deployment.md): USAGE on schema {schema}; SELECT, INSERT, UPDATE, "
            f"DELETE on {names}; USAGE on their sequences. Then start the worker again."
        )
    if fault is Fault.MISSING:
        return (
            f"the worker stopped: a database object it needs is missing ({doing}: {reason}). "
            f"Create or upgrade the queue's tables ({names}) with `alembic upgrade head` "
            "(or Queue.create_all), then start the worker again."
        )
    if fault is Fault.POOLER:
        return (
            f"the worker stopped: a prepared statement of the driver was lost ({doing}: "
            f"{reason}). The engine goes through a connection pooler in transaction mode "
            "(PgBouncer) that does not keep prepared statements: turn them off in the "
            'driver (psycopg: create_engine(url, connect_args={"prepare_threshold": None})) '
            "or let the pooler keep them (PgBouncer 1.21 or later: max_prepared_statements). "
            "See docs/guides/pgbouncer.md."
        )
    return (
        f"the worker stopped: {doing} failed with an error that retrying cannot fix "
        f"({reason}). Its running jobs were finished or handed back; fix the row or the "
        "statement named above, then start the worker again."
    )


def _where_rows_are(tables: QueueTables, name: str) -> str:
    """``name`` qualified by the schema the worker's statements touch: a tenant's, when a
    ``schema_translate_map`` moved the queue (a GRANT on the placeholder would fix nothing)."""
    schema = tables.effective_schema
    return f"{schema}.{name}" if schema else name
