"""The step from schema version 4 to 5, frozen: pause, rate limits, periodic jobs, daemons.

Version 5 adds five tables and one index. ``task_controls`` holds, per task, a paused flag
and a rate limit (at most ``rate_max`` starts in any window of ``rate_seconds``), both
stored at run time like the concurrency limits; ``rate_starts`` records each start of a
rate-limited task by the database clock, for as long as a window needs it; ``schedules``
holds each periodic schedule's last enqueued tick, the row whose compare-and-set lets one
worker enqueue each tick; ``daemons`` holds each daemon instance's owner and lease;
``workers`` lists the live workers (host, pid, tasks, last beat) for ``sqla-queue status``
and the dashboard. The
index ``job_executions_task_waiting_ix`` covers the executions waiting behind a
``queue_id``, by task: an enqueue of a bounded task (``max_pending``) counts them there.

On a live install: the new tables start empty and are created in the migration's
transaction, touching no existing row. The index is built over ``job_executions``, which it
locks against writes (enqueues, claims and completions wait) until the migration commits;
it holds only the waiting executions, and the build reads the whole table once (the
executions table is the small, live one: it holds no history). It is the last statement,
so the lock is held for as short a time as possible.

Version-4 workers and producers keep running on version 5: they name none of the new
tables, and a waiting execution they insert gets its entry in the new index like any
other. They know nothing of the new features, though: a version-4 worker claims a paused
task and ignores a rate limit, and does not fire periodic schedules or run daemons. Pause
tasks and store rate limits once every worker runs version 5.

The downgrade drops what the step added, with what it held: pauses and rate limits (the
tasks run unthrottled), the record of recent starts, every schedule's last tick (a
version-5 worker started again fires each schedule from its next tick on), the daemons'
owners (each daemon is started afresh) and the list of live workers.
"""

from __future__ import annotations

from alembic_ext.versions._names import Names

__all__ = ["FROM_VERSION", "TO_VERSION", "downgrade_statements", "upgrade_statements"]

FROM_VERSION = 4
TO_VERSION = 5

_TABLES = frozenset(
    {"job_executions", "task_controls", "rate_starts", "schedules", "daemons", "workers"}
)

_UPGRADE = (
    """CREATE TABLE {task_controls} (
    task TEXT NOT NULL,
    paused BOOLEAN DEFAULT false NOT NULL,
    rate_max INTEGER,
    rate_seconds DOUBLE PRECISION,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT {task_controls_pkey} PRIMARY KEY (task),
    CONSTRAINT {task_controls_rate_ck} CHECK ((rate_max IS NULL) = (rate_seconds IS NULL) """
    """AND rate_max >= 1 AND rate_seconds > 0)
)""",
    "COMMENT ON TABLE {task_controls} IS "
    "'sqla_queue: pause and rate limit per task, shared by every worker'",
    """CREATE TABLE {rate_starts} (
    task TEXT NOT NULL,
    started_at TIMESTAMP WITH TIME ZONE NOT NULL,
    job_id BIGINT NOT NULL,
    CONSTRAINT {rate_starts_pkey} PRIMARY KEY (task, started_at, job_id)
)""",
    "COMMENT ON TABLE {rate_starts} IS 'sqla_queue: recent starts of rate-limited tasks'",
    """CREATE TABLE {schedules} (
    name TEXT NOT NULL,
    task TEXT NOT NULL,
    last_tick TIMESTAMP WITH TIME ZONE NOT NULL,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT {schedules_pkey} PRIMARY KEY (name)
)""",
    "COMMENT ON TABLE {schedules} IS "
    "'sqla_queue: periodic schedules, each with its last enqueued tick'",
    """CREATE TABLE {daemons} (
    name TEXT NOT NULL,
    instance INTEGER NOT NULL,
    worker_id UUID,
    lease_until TIMESTAMP WITH TIME ZONE,
    started_at TIMESTAMP WITH TIME ZONE,
    restarts INTEGER DEFAULT 0 NOT NULL,
    last_error TEXT,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT {daemons_pkey} PRIMARY KEY (name, instance)
)""",
    "COMMENT ON TABLE {daemons} IS 'sqla_queue: daemon instances and the worker that runs each'",
    """CREATE TABLE {workers} (
    worker_id UUID NOT NULL,
    hostname TEXT NOT NULL,
    pid INTEGER NOT NULL,
    tasks TEXT[] NOT NULL,
    concurrency INTEGER NOT NULL,
    running INTEGER DEFAULT 0 NOT NULL,
    finished BIGINT DEFAULT 0 NOT NULL,
    started_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    seen_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT {workers_pkey} PRIMARY KEY (worker_id)
)""",
    "COMMENT ON TABLE {workers} IS 'sqla_queue: live workers, each refreshed by its own beats'",
    # Last: from here to the commit, the executions table is locked against writes.
    "CREATE INDEX {job_executions_task_waiting_ix} ON {job_executions} (task) "
    "WHERE state = 'waiting'",
    "COMMENT ON TABLE {job_executions} IS 'sqla_queue schema version 5'",
)

_DOWNGRADE = (
    "DROP INDEX {schema_dot}{job_executions_task_waiting_ix}",
    "DROP TABLE {workers}",
    "DROP TABLE {daemons}",
    "DROP TABLE {schedules}",
    "DROP TABLE {rate_starts}",
    "DROP TABLE {task_controls}",
    "COMMENT ON TABLE {job_executions} IS 'sqla_queue schema version 4'",
)


def upgrade_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that take an install from version 4 to version 5."""
    names = Names(schema, prefix, _TABLES)
    return [names.render(sql) for sql in _UPGRADE]


def downgrade_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that take an install from version 5 back to version 4."""
    names = Names(schema, prefix, _TABLES)
    return [names.render(sql) for sql in _DOWNGRADE]
