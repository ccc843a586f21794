"""The statements of durable jobs, built once per queue (and per tenant schema)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements import compensations, durable, signals

__all__ = ["DurableStatements"]


@dataclass(frozen=True)
class DurableStatements:
    """Every statement of :mod:`sqla_queue.durable`, for one set of tables.

    Built once (:meth:`of`), so that SQLAlchemy's compiled cache sees the same objects.
    """

    tables: QueueTables
    steps: Any
    checkpoint: Any
    advance_cursor: Any
    lock_execution: Any
    record_wait: Any
    restart_wait: Any
    record_met: Any
    suspend: Any
    execution_state: Any
    lock_for_signal: Any
    signal: Any
    signal_payload: Any
    wake_due: Any
    wake_waiting: Any
    compensations_due: Any
    mark_compensated: Any

    @classmethod
    @functools.cache
    def of(cls, tables: QueueTables) -> DurableStatements:
        """The statements of ``tables`` (cached: one set per queue and tenant)."""
        return cls(
            tables=tables,
            steps=durable.steps_statement(tables),
            checkpoint=durable.checkpoint_statement(tables),
            advance_cursor=durable.advance_cursor_statement(tables),
            lock_execution=durable.lock_execution_statement(tables),
            record_wait=durable.record_wait_statement(tables),
            restart_wait=durable.restart_wait_statement(tables),
            record_met=durable.record_met_statement(tables),
            suspend=durable.suspend_statement(tables),
            execution_state=durable.execution_state_statement(tables),
            lock_for_signal=signals.lock_for_signal_statement(tables),
            signal=signals.signal_statement(tables),
            signal_payload=signals.signal_payload_statement(tables),
            wake_due=signals.wake_due_statement(tables),
            wake_waiting=signals.wake_waiting_statement(tables),
            compensations_due=compensations.compensations_due_statement(tables),
            mark_compensated=compensations.mark_compensated_statement(tables),
        )
