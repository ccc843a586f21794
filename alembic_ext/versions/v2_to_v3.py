"""The step from schema version 2 to 3, frozen: waiting and done executions for keyed jobs.

Version 3 lets a job with a ``queue_id`` wait outside the claim's indexes while an earlier
job of its key is queued or running (state ``waiting``), and lets a finished keyed execution
stay behind briefly (state ``done``) when an enqueue in flight holds it as the predecessor of
its new job. Three partial indexes serve them: the active rows of each key (the claim's head
probe), the waiting rows of each key in order (promotion), and the done rows (the sweep).
It drops the foreign key from executions to jobs: its check runs a plan cached per
connection, and one made while ``jobs`` looked empty scans the whole table for every row an
enqueue writes, until the next ANALYZE. It drops the two indexes over every task's pending
rows (``claim_ix``, ``due_ix``): the claim now walks each task's own slice of
``task_claim_ix``, and those two were the paths that stale statistics made look cheaper
while they passed over other tasks' backlogs.

On a live install: the state check is replaced by a wider one added ``NOT VALID`` and then
validated, which reads the table without blocking writes. The new indexes cover only keyed
rows (and none is waiting or done yet), so building them is quick unless many keyed jobs
are queued. Version-2 workers still running keep claiming correctly, but without the two
dropped indexes their claims sort the backlog: deploy the version-3 workers right after the
migration. They never see a waiting row, and their head check counts waiting rows as
predecessors, so no key runs out of turn; a waiting job whose predecessor a version-2
worker finished is promoted by the next version-3 worker's sweep.
"""

from __future__ import annotations

from alembic_ext.versions._names import Names

__all__ = ["FROM_VERSION", "TO_VERSION", "downgrade_statements", "upgrade_statements"]

FROM_VERSION = 2
TO_VERSION = 3

_TABLES = frozenset({"jobs", "job_executions"})

_UPGRADE = (
    "ALTER TABLE {job_executions} DROP CONSTRAINT {job_executions_job_fk}",
    "ALTER TABLE {job_executions} DROP CONSTRAINT {job_executions_state_ck}",
    "ALTER TABLE {job_executions} ADD CONSTRAINT {job_executions_state_ck} "
    "CHECK (state IN ('pending', 'running', 'waiting', 'done')) NOT VALID",
    "ALTER TABLE {job_executions} VALIDATE CONSTRAINT {job_executions_state_ck}",
    "CREATE INDEX {job_executions_queue_active_ix} ON {job_executions} "
    "(queue_id, execute_at, id) "
    "WHERE queue_id IS NOT NULL AND (state = 'pending' OR state = 'running')",
    "CREATE INDEX {job_executions_waiting_ix} ON {job_executions} "
    "(queue_id, execute_at, id) WHERE state = 'waiting'",
    "CREATE INDEX {job_executions_done_ix} ON {job_executions} (queue_id) WHERE state = 'done'",
    "DROP INDEX {schema_dot}{job_executions_claim_ix}",
    "DROP INDEX {schema_dot}{job_executions_due_ix}",
    "COMMENT ON TABLE {job_executions} IS 'sqla_queue schema version 3'",
)

# Going back to version 2 first makes every waiting or done row something version 2 knows:
# a waiting job becomes pending (version 2's claim serializes it by its head check), and a
# done execution is deleted (its job already holds the final status).
_DOWNGRADE = (
    "DELETE FROM {job_executions} WHERE state = 'done'",
    "UPDATE {job_executions} SET state = 'pending' WHERE state = 'waiting'",
    "CREATE INDEX {job_executions_claim_ix} ON {job_executions} "
    "(priority DESC, execute_at, id) WHERE state = 'pending'",
    "CREATE INDEX {job_executions_due_ix} ON {job_executions} (execute_at) WHERE state = 'pending'",
    "DROP INDEX {schema_dot}{job_executions_done_ix}",
    "DROP INDEX {schema_dot}{job_executions_waiting_ix}",
    "DROP INDEX {schema_dot}{job_executions_queue_active_ix}",
    "ALTER TABLE {job_executions} DROP CONSTRAINT {job_executions_state_ck}",
    "ALTER TABLE {job_executions} ADD CONSTRAINT {job_executions_state_ck} "
    "CHECK (state IN ('pending', 'running'))",
    # Executions whose job was deleted by hand cannot satisfy the key again.
    "DELETE FROM {job_executions} e WHERE NOT EXISTS (SELECT FROM {jobs} j WHERE j.id = e.id)",
    "ALTER TABLE {job_executions} ADD CONSTRAINT {job_executions_job_fk} "
    "FOREIGN KEY (id) REFERENCES {jobs} (id) ON DELETE CASCADE NOT VALID",
    "ALTER TABLE {job_executions} VALIDATE CONSTRAINT {job_executions_job_fk}",
    "COMMENT ON TABLE {job_executions} IS 'sqla_queue schema version 2'",
)


def upgrade_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that take an install from version 2 to version 3."""
    names = Names(schema, prefix, _TABLES)
    return [names.render(sql) for sql in _UPGRADE]


def downgrade_statements(schema: str | None, prefix: str) -> list[str]:
    """The statements that take an install from version 3 back to version 2."""
    names = Names(schema, prefix, _TABLES)
    return [names.render(sql) for sql in _DOWNGRADE]
