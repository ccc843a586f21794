"""Statement builders: pure functions from the queue's tables to SQLAlchemy Core statements.

Each builder takes a :class:`~sqla_queue.models.QueueTables` and returns a statement with
bound parameters only, so a test can compile it with the PostgreSQL dialect without a
database, and SQLAlchemy's compiled cache serves every later execution.
"""

from sqla_queue.statements.admin import (
    failed_jobs_statement,
    prune_statement,
    requeue_keys_statement,
    requeue_statement,
)
from sqla_queue.statements.bounded import bound_lock_statement, pending_count_statement
from sqla_queue.statements.claim import claim_statement
from sqla_queue.statements.complete import complete_statement
from sqla_queue.statements.daemons import (
    acquire_daemons_statement,
    release_daemons_statement,
    renew_daemons_statement,
)
from sqla_queue.statements.enqueue import ENQUEUE_ROW_FIELDS, enqueue_statement
from sqla_queue.statements.keys import (
    cleanup_statement,
    clear_done_statement,
    orphan_sweep_statement,
    promote_statement,
)
from sqla_queue.statements.limits import (
    delete_limit_statement,
    limited_tasks_statement,
    set_limit_statement,
)
from sqla_queue.statements.liveness import heartbeat_statement, reclaim_statement
from sqla_queue.statements.periodic import advance_schedule_statement, create_schedule_statement
from sqla_queue.statements.planner import planner_guard

__all__ = [
    "ENQUEUE_ROW_FIELDS",
    "acquire_daemons_statement",
    "advance_schedule_statement",
    "bound_lock_statement",
    "claim_statement",
    "cleanup_statement",
    "clear_done_statement",
    "complete_statement",
    "create_schedule_statement",
    "delete_limit_statement",
    "enqueue_statement",
    "failed_jobs_statement",
    "heartbeat_statement",
    "limited_tasks_statement",
    "orphan_sweep_statement",
    "pending_count_statement",
    "planner_guard",
    "promote_statement",
    "prune_statement",
    "reclaim_statement",
    "release_daemons_statement",
    "renew_daemons_statement",
    "requeue_keys_statement",
    "requeue_statement",
    "set_limit_statement",
]
