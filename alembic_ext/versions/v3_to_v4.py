"""The step from schema version 3 to 4, frozen: unique jobs, cancellation, awaited results, links.

Version 4 adds to ``jobs`` a job's unique key (``unique_key``), the application row it is
about (``about_table`` and ``about_key``) and whether a caller awaits its result
(``awaited``, false by default); to ``job_executions`` a request to cancel a running
execution (``cancel_requested``, false by default); two partial indexes on ``jobs``, over the
jobs linked to a row and the jobs with a unique key; and the ``unique_keys`` table, where a
key is held by one job for as long as its scope lasts.

On a live install: the step runs in the migration's transaction, and each ``ALTER TABLE``
takes an exclusive lock on its table that is held until the migration commits. Adding a
nullable column, or one whose default is a constant, changes only the catalog on PostgreSQL
11 and later: no row is rewritten, whatever the table's size. A lock waits for the
transactions already using its table and holds up those that come after, so a long
transaction open on the queue's tables (an application session that enqueued and has not
committed, say) delays the step and everything queued behind it; a ``lock_timeout`` for the
migration makes it give up instead, to be run again. The two new indexes hold no entry when
they are built (no job uses the new options yet), so there is nothing to sort or write, but
each build reads the whole ``jobs`` table once, while ``jobs`` is locked (enqueues, claims
and completions wait): measured, 0.35 s per index for 2 million jobs (515 MB) in memory,
longer when the table must come from disk. Prune old finished jobs first if the history is
large. The executions table is altered last, so that heartbeats go on during the builds.
Later, each index covers only the jobs that use its option. The new table starts empty.

Version-3 workers and producers keep running on version 4: their statements name none of
the new columns, which take their defaults in the rows they write. They know nothing of the
new options, though: unique keys need nothing of them (a key is released by its holder's
own state, read when someone else wants the key), but a version-3 worker never sees a
cancel request for a job it runs, and its completions send no notification to a caller
awaiting the result (who then reads the job at the next poll, within 5 seconds). Cancel
running jobs once every worker runs version 4.

The downgrade drops what the step added, with what it held: every unique key (jobs enqueued
afterwards may duplicate a job that held one), every job's link to its row, the awaited
marks, and the cancel requests of running executions, which then run to their end.
"""

from __future__ import annotations

from alembic_ext.versions._names import Names

__all__ = ["FROM_VERSION", "TO_VERSION", "downgrade_statements", "upgrade_statements"]

FROM_VERSION = 3
TO_VERSION = 4

_TABLES = frozenset({"jobs", "job_executions", "unique_keys"})

_UPGRADE = (
    "ALTER TABLE {jobs} ADD COLUMN unique_key TEXT, ADD COLUMN about_table TEXT, "
    "ADD COLUMN about_key TEXT, ADD COLUMN awaited BOOLEAN DEFAULT false NOT NULL",
    "CREATE INDEX {jobs_about_ix} ON {jobs} (about_table, about_key) WHERE about_key IS NOT NULL",
    "CREATE INDEX {jobs_unique_key_ix} ON {jobs} (task, unique_key) WHERE unique_key IS NOT NULL",
    """CREATE TABLE {unique_keys} (
    task TEXT NOT NULL,
    key TEXT NOT NULL,
    job_id BIGINT,
    scope TEXT NOT NULL,
    hold_seconds DOUBLE PRECISION,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT {unique_keys_pkey} PRIMARY KEY (task, key),
    CONSTRAINT {unique_keys_scope_ck} CHECK (scope IN ('queued', 'active', 'finished'))
)""",
    "COMMENT ON TABLE {unique_keys} IS "
    "'sqla_queue: unique job keys, each held by one job while its scope lasts'",
    # Last: from here to the commit, the executions table is locked too.
    "ALTER TABLE {job_executions} ADD COLUMN cancel_requested BOOLEAN DEFAULT false NOT NULL",
    "COMMENT ON TABLE {job_executions} IS 'sqla_queue schema version 4'",
)

# Dropping a column drops the indexes built on it or filtered by it.
_DOWNGRADE = (
    "DROP TABLE {unique_keys}",
    "ALTER TABLE {job_executions} DROP COLUMN cancel_requested",
    "ALTER TABLE {jobs} DROP COLUMN awaited, DROP COLUMN about_key, DROP COLUMN about_table, "
    "DROP COLUMN unique_key",
    "COMMENT ON TABLE {job_executions} IS 'sqla_queue schema version 3'",
)


def upgrade_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that take an install from version 3 to version 4."""
    names = Names(schema, prefix, _TABLES)
    return [names.render(sql) for sql in _UPGRADE]


def downgrade_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that take an install from version 4 back to version 3."""
    names = Names(schema, prefix, _TABLES)
    return [names.render(sql) for sql in _DOWNGRADE]
