"""The statements one worker runs, built once from its queue's tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import CompoundSelect, Delete, Select, TextClause
from sqlalchemy.sql.dml import ReturningDelete, ReturningUpdate

from sqla_queue import statements
from sqla_queue.durable.statements import DurableStatements
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.controls import (
    controlled_tasks_statement,
    rate_backlog_statement,
    rate_lock_statement,
)
from sqla_queue.statements.registry import unregister_worker_statement

__all__ = ["WorkerStatements"]


@dataclass(frozen=True)
class WorkerStatements:
    """Every statement of a worker's run loop and heartbeat, built when the worker starts.

    Built once so that SQLAlchemy's compiled cache (and the raw path's own, see
    :mod:`sqla_queue.worker.raw`) sees the same objects on every unit.
    """

    claim_plain: Select[*tuple[Any, ...]]
    claim_limited: Select[*tuple[Any, ...]]
    claim_rated: Select[*tuple[Any, ...]]
    claim_rated_limited: Select[*tuple[Any, ...]]
    rate_lock: Select[Any]
    rate_backlog: Select[Any]
    controls: Select[Any]
    limits: Select[str]
    complete: CompoundSelect[int]
    heartbeat: Select[Any]
    #: Deletes the worker's row, when its last beat is over.
    unregister: Delete
    reclaim: CompoundSelect[Any]
    promote: ReturningUpdate[tuple[int]]
    cleanup: ReturningDelete[tuple[str]]
    clear_done: Select[tuple[str]]
    orphan_sweep: Select[tuple[Any, Any]]
    #: Durable jobs: the wake sweep and the compensations' sweep (schema version 7).
    durable: DurableStatements
    enqueue_keyed: Select[Any]
    #: The ``SET LOCAL`` settings every unit of the worker opens with.
    guard: TextClause

    @classmethod
    def build(cls, tables: QueueTables, *, generic_plans: bool) -> WorkerStatements:
        """The statements for ``tables``; ``generic_plans`` as in ``WorkerSettings``."""
        return cls(
            claim_plain=statements.claim_statement(tables),
            claim_limited=statements.claim_statement(tables, limited=True),
            claim_rated=statements.claim_statement(tables, rated=True),
            claim_rated_limited=statements.claim_statement(tables, limited=True, rated=True),
            rate_lock=rate_lock_statement(tables),
            rate_backlog=rate_backlog_statement(tables),
            controls=controlled_tasks_statement(tables),
            limits=statements.limited_tasks_statement(tables),
            complete=statements.complete_statement(tables),
            heartbeat=statements.heartbeat_statement(tables),
            unregister=unregister_worker_statement(tables),
            reclaim=statements.reclaim_statement(tables),
            promote=statements.promote_statement(tables),
            cleanup=statements.cleanup_statement(tables),
            clear_done=statements.clear_done_statement(tables),
            orphan_sweep=statements.orphan_sweep_statement(tables),
            durable=DurableStatements.of(tables),
            enqueue_keyed=statements.enqueue_statement(tables, keyed=True, notify=True),
            guard=statements.planner_guard(generic_plans=generic_plans),
        )

    def claim(self, *, limited: bool) -> Select[*tuple[Any, ...]]:
        """The plain claim: slot-aware only while one of the worker's tasks is limited."""
        return self.claim_limited if limited else self.claim_plain

    def rated_claim(self, *, limited: bool) -> Select[*tuple[Any, ...]]:
        """The claim of one rate-limited task, slot-aware when that task is limited."""
        return self.claim_rated_limited if limited else self.claim_rated
