"""Durable jobs: steps that commit with their writes, waits that hold no worker, and
compensations (see the "Durable jobs" guide).

A handler reaches them through its context (``ctx.step``, ``ctx.run_step``,
``ctx.cursor``, ``ctx.sleep``, ``ctx.wait_for_signal``, ``ctx.wait_until``); the queue
sends signals (``queue.signal``), declares conditions (``queue.condition``) and gives
operators their tools.
"""

from sqla_queue.durable.admin import Signalled, StepRecord, StepVersion, SuspendedJob
from sqla_queue.durable.api import Batch, Cursor, StepBlock
from sqla_queue.durable.conditions import RowCondition
from sqla_queue.durable.run import StoredStep

__all__ = [
    "Batch",
    "Cursor",
    "RowCondition",
    "Signalled",
    "StepBlock",
    "StepRecord",
    "StepVersion",
    "StoredStep",
    "SuspendedJob",
]
