"""The statements of the partitioned history's maintenance and pruning (:mod:`sqla_queue.history`).

The partitions come and go, and their names carry dates, so these statements are SQL text
built from the layout's names (:class:`~sqla_queue.models.partitioning.HistoryNames`, in
the schema as the connection sees it), never from ``Table`` objects. Each name is quoted
by :meth:`~sqla_queue.models.partitioning.HistoryNames.qualified`; the values a caller
passes are bound, except a partition's bounds, which PostgreSQL's ``ATTACH PARTITION``
only takes as literals (they are ISO timestamps that this library computed).

The DDL that ``create_all`` runs for the layout is part of the table definitions:
:func:`~sqla_queue.models.partitioning.structure_statements`.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import DateTime, Double, Table, bindparam, text
from sqlalchemy.sql.elements import TextClause

from sqla_queue.models.partitioning import HistoryNames
from sqla_queue.models.tables import QueueTables

__all__ = [
    "attach_partition_statement",
    "count_partition_statement",
    "create_partition_statement",
    "detach_partition_statement",
    "drop_partition_statement",
    "free_partition_keys_statement",
    "history_lock_statement",
    "lock_default_statement",
    "lock_timeout_statement",
    "move_rows_statement",
    "now_statement",
    "oldest_finished_statement",
    "partitions_catalog_statement",
    "prune_cutoff_statement",
    "prune_default_statement",
]

# Every partition of the two range branches, with its bounds as text and its parent's
# comment (which records the interval); the default partitions have bound 'DEFAULT'.
_CATALOG = text(
    """
    SELECT parent.relname AS branch, child.relname AS name,
           pg_catalog.pg_get_expr(child.relpartbound, child.oid) AS bound,
           pg_catalog.obj_description(parent.oid, 'pg_class') AS comment
    FROM pg_catalog.pg_inherits i
    JOIN pg_catalog.pg_class parent ON parent.oid = i.inhparent
    JOIN pg_catalog.pg_class child ON child.oid = i.inhrelid
    WHERE i.inhparent IN (to_regclass(:done), to_regclass(:failed))
    ORDER BY 1, 2
    """
)


def partitions_catalog_statement() -> TextClause:
    """Every partition of the two range branches: ``branch``, ``name``, ``bound`` (as
    ``pg_get_expr`` spells it, ``DEFAULT`` for a default partition) and the branch's
    ``comment``. Binds ``done`` and ``failed``: the branches' qualified names."""
    return _CATALOG


def history_lock_statement(*, wait: bool) -> TextClause:
    """Take the transaction's advisory lock on the key bound as ``key``.

    With ``wait`` it waits for the lock; without, it returns at once with one column
    ``got``, true when it took the lock.
    """
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    return text(f"SELECT {function}(hashtext(:key))" + ("" if wait else " AS got"))


def lock_timeout_statement(seconds: float) -> TextClause:
    """Make every later statement of the transaction wait at most ``seconds`` for a lock."""
    return text(f"SET LOCAL lock_timeout = '{int(seconds * 1000)}ms'")


def now_statement() -> TextClause:
    """The transaction's start time, by the database clock."""
    return text("SELECT now()")


def oldest_finished_statement(names: HistoryNames, branch: str) -> TextClause:
    """When the oldest job in ``branch``'s default partition finished (NULL when empty)."""
    return text(f"SELECT min(finished_at) FROM {names.qualified(names.default_of(branch))}")


def lock_default_statement(names: HistoryNames, branch: str) -> TextClause:
    """Lock ``branch``'s default partition against every other access until commit."""
    return text(f"LOCK TABLE {names.qualified(names.default_of(branch))} IN ACCESS EXCLUSIVE MODE")


def create_partition_statement(names: HistoryNames, partition: str) -> TextClause:
    """Create ``partition`` as a table shaped like the jobs table (attached later)."""
    q = names.qualified
    return text(
        f"CREATE TABLE {q(partition)} "
        f"(LIKE {q(names.jobs)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    )


def _columns(jobs: Table) -> str:
    return ", ".join(f'"{c.name}"' for c in jobs.columns)


def move_rows_statement(
    names: HistoryNames, branch: str, partition: str, tables: QueueTables
) -> TextClause:
    """Move the jobs of ``branch``'s default partition that finished in [``lower``,
    ``upper``) (bound) into ``partition``; one row per job moved."""
    default = names.qualified(names.default_of(branch))
    columns = _columns(tables.jobs)
    return text(
        f"WITH moved AS (DELETE FROM {default} WHERE finished_at >= :lower "
        f"AND finished_at < :upper RETURNING {columns}) "
        f"INSERT INTO {names.qualified(partition)} ({columns}) "
        f"SELECT {columns} FROM moved RETURNING 1"
    )


def attach_partition_statement(
    names: HistoryNames, branch: str, partition: str, lower: dt.datetime, upper: dt.datetime
) -> TextClause:
    """Attach ``partition`` to ``branch`` for the finished times in [``lower``, ``upper``)."""
    q = names.qualified
    return text(
        f"ALTER TABLE {q(branch)} ATTACH PARTITION {q(partition)} "
        f"FOR VALUES FROM ('{lower.isoformat()}') TO ('{upper.isoformat()}')"
    )


def prune_cutoff_statement() -> TextClause:
    """``age`` seconds (bound) before now, but never before ``earliest`` (bound)."""
    return text("SELECT greatest(now() - make_interval(secs => :age), :earliest)").bindparams(
        bindparam("age", type_=Double), bindparam("earliest", type_=DateTime(timezone=True))
    )


def count_partition_statement(names: HistoryNames, partition: str) -> TextClause:
    """How many jobs ``partition`` holds."""
    return text(f"SELECT count(*) FROM {names.qualified(partition)}")


def free_partition_keys_statement(
    names: HistoryNames, partition: str, tables: QueueTables
) -> TextClause:
    """Delete the unique keys that the jobs of ``partition`` hold, and the committed steps
    and signals of its durable jobs (schema version 7); one row, a count per table role
    (``unique_keys``, ``job_steps``, ``job_signals``)."""
    q = names.qualified
    return text(
        f"WITH keys AS (DELETE FROM {q(tables.unique_keys.name)} k USING {q(partition)} j "
        "WHERE j.unique_key IS NOT NULL AND k.job_id = j.id RETURNING 1), "
        f"steps AS (DELETE FROM {q(tables.job_steps.name)} s USING {q(partition)} j "
        "WHERE s.job_id = j.id RETURNING 1), "
        f"signals AS (DELETE FROM {q(tables.job_signals.name)} g USING {q(partition)} j "
        "WHERE g.job_id = j.id RETURNING 1) "
        f"{_COUNTS}"
    )


# The counts of the three CTEs that every prune of a partition's jobs deletes with them.
_COUNTS = (
    "SELECT (SELECT count(*) FROM keys) AS unique_keys, "
    "(SELECT count(*) FROM steps) AS job_steps, "
    "(SELECT count(*) FROM signals) AS job_signals"
)


def prune_default_statement(names: HistoryNames, branch: str, tables: QueueTables) -> TextClause:
    """Delete the jobs of ``branch``'s default partition that finished before ``cutoff``
    (bound), the unique keys they hold and their durable steps and signals; one row, a
    count per table role (``jobs``, ``unique_keys``, ``job_steps``, ``job_signals``)."""
    q = names.qualified
    return text(
        f"WITH gone AS (DELETE FROM {q(names.default_of(branch))} WHERE finished_at < :cutoff "
        "RETURNING id, unique_key), "
        f"keys AS (DELETE FROM {q(tables.unique_keys.name)} k USING gone "
        "WHERE gone.unique_key IS NOT NULL AND k.job_id = gone.id RETURNING 1), "
        f"steps AS (DELETE FROM {q(tables.job_steps.name)} s USING gone "
        "WHERE s.job_id = gone.id RETURNING 1), "
        f"signals AS (DELETE FROM {q(tables.job_signals.name)} g USING gone "
        "WHERE g.job_id = gone.id RETURNING 1) "
        f"{_COUNTS}, (SELECT count(*) FROM gone) AS jobs"
    )


def detach_partition_statement(names: HistoryNames, branch: str, partition: str) -> TextClause:
    """Detach ``partition`` from ``branch``: it stays a table of its own."""
    return text(
        f"ALTER TABLE {names.qualified(branch)} DETACH PARTITION {names.qualified(partition)}"
    )


def drop_partition_statement(names: HistoryNames, partition: str) -> TextClause:
    """Drop ``partition`` and the jobs it holds."""
    return text(f"DROP TABLE {names.qualified(partition)}")
