"""The step from schema version 1 to 2, frozen: capacity slots and stored limits.

Version 2 adds the ``slot`` column and its partial unique index on ``(task, slot)``, two
per-task indexes over pending rows for the slot-aware claim, and the ``task_limits`` table
that every worker reads at claim time. Executions already running when
the step runs keep ``slot`` NULL; the claim's count gate still covers them until they drain.

On a live install: the new column is nullable without a default (a catalog change only), and
the slot index covers no row yet. The two per-task indexes cover every pending row, so
building them holds a lock that blocks writes to the executions table (enqueue, claims,
acks) for as long as it takes to index the pending backlog: about a second per few hundred
thousand pending rows on modest hardware. Run the migration when the backlog is small.
"""

from __future__ import annotations

from alembic_ext.versions._names import Names

__all__ = ["FROM_VERSION", "TO_VERSION", "downgrade_statements", "upgrade_statements"]

FROM_VERSION = 1
TO_VERSION = 2

_TABLES = frozenset({"job_executions", "task_limits"})

_UPGRADE = (
    "ALTER TABLE {job_executions} ADD COLUMN slot INTEGER",
    "CREATE UNIQUE INDEX {job_executions_slot_uq} ON {job_executions} "
    "(task, slot) WHERE slot IS NOT NULL",
    "CREATE INDEX {job_executions_task_claim_ix} ON {job_executions} "
    "(task, priority DESC, execute_at, id) WHERE state = 'pending' AND slot IS NULL",
    "CREATE INDEX {job_executions_seated_ix} ON {job_executions} "
    "(task, priority DESC, execute_at, id) WHERE state = 'pending' AND slot IS NOT NULL",
    """CREATE TABLE {task_limits} (
    task TEXT NOT NULL,
    concurrency_limit INTEGER NOT NULL,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT {task_limits_pkey} PRIMARY KEY (task),
    CONSTRAINT {task_limits_limit_ck} CHECK (concurrency_limit >= 1)
)""",
    "COMMENT ON TABLE {task_limits} IS "
    "'sqla_queue: concurrency limit per task, shared by every worker'",
    "COMMENT ON TABLE {job_executions} IS 'sqla_queue schema version 2'",
)

# Dropping the column drops the indexes built on it or filtered by it.
_DOWNGRADE = (
    "DROP TABLE {task_limits}",
    "ALTER TABLE {job_executions} DROP COLUMN slot",
    "COMMENT ON TABLE {job_executions} IS 'sqla_queue schema version 1'",
)


def upgrade_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that take an install from version 1 to version 2."""
    names = Names(schema, prefix, _TABLES)
    return [names.render(sql) for sql in _UPGRADE]


def downgrade_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that take an install from version 2 back to version 1."""
    names = Names(schema, prefix, _TABLES)
    return [names.render(sql) for sql in _DOWNGRADE]
