"""Compensations: what a step stores to undo itself, and the sweep that enqueues them.

A step committed with a compensation stores its enqueue row (the same JSON row that an
enqueue writes), under the ``queue_id`` of its job's compensations: the compensations of
one job then run one at a time, in the order they were enqueued, by the queue's own
per-key serialization. The sweep enqueues a failed or cancelled job's compensations in
reverse commit order and marks each step in the same transaction, so each is enqueued
exactly once; each runs as an ordinary job, fenced and retried like any other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from sqla_queue.conversation import Flow, Step
from sqla_queue.durable.statements import DurableStatements
from sqla_queue.enqueue import TaskDefaults, job_row
from sqla_queue.logic.payload import dump_json
from sqla_queue.models.tables import QueueTables
from sqla_queue.spec import JobSpec
from sqla_queue.statements.compensations import (
    ReopenParams,
    reopen_compensated_statement,
)

__all__ = [
    "COMPENSATIONS_PER_SWEEP",
    "compensation_key",
    "compensation_spec",
    "compensations_flow",
    "encode_compensation",
    "reopen_compensated_flow",
]

#: Jobs whose compensations one sweep enqueues, at most.
COMPENSATIONS_PER_SWEEP = 100


def compensation_key(job_id: int) -> str:
    """The ``queue_id`` under which job ``job_id``'s compensations run, one at a time."""
    return f"sqla_queue.compensate:{job_id}"


def compensation_spec(compensate: Any, result: Any) -> JobSpec | None:
    """The call that undoes a step: ``compensate`` itself if it is a
    :class:`~sqla_queue.spec.JobSpec` (``refund.call(charge_id)``), else a task handle
    called with the step's ``result`` as its one argument (``compensate=refund``)."""
    if compensate is None:
        return None
    if isinstance(compensate, JobSpec):
        return compensate
    call = getattr(compensate, "call", None)
    if callable(call):
        spec = call(result)
        if isinstance(spec, JobSpec):
            return spec
    raise TypeError(
        "compensate= takes a task (called with the step's result) or a call "
        f"(task.call(...)), got {compensate!r}"
    )


def encode_compensation(spec: JobSpec, job_id: int, defaults: Callable[[str], TaskDefaults]) -> str:
    """The enqueue row of ``spec`` as job ``job_id``'s compensation, as JSON text.

    Checked now (its task known, its arguments storable), so that a bad compensation
    fails the step that declares it, not the sweep that enqueues it much later.
    """
    row: dict[str, Any] = dict(job_row(spec, defaults(spec.task), 0))
    row["queue_id"] = compensation_key(job_id)
    # Every payload rule of an enqueue (no NaN, no NUL, JSON types only), refused here
    # with the task's name, where json.dumps let the database refuse it, aborting the step.
    return dump_json(
        row,
        task=spec.task,
        what="its arguments",
        doing=f"declare {spec.task!r} as a compensation of job {job_id}",
    )


def compensations_flow(
    statements: DurableStatements, enqueue_keyed: Any, *, limit: int = COMPENSATIONS_PER_SWEEP
) -> Flow[list[int]]:
    """Enqueue the compensations of up to ``limit`` failed or cancelled jobs; their ids.

    ``enqueue_keyed`` is the queue's enqueue statement for keyed rows. Runs in the
    caller's transaction: the steps stay locked until it commits.
    """
    rows: Sequence[Any] = yield Step(statements.compensations_due, {"limit": limit})
    if not rows:
        return []
    chunk = []
    for seq, row in enumerate(rows):
        enqueue_row = dict(row.compensate)
        enqueue_row["seq"] = seq
        chunk.append(enqueue_row)
    written = yield Step(enqueue_keyed, {"rows": json.dumps(chunk)})
    # The identity follows the rows' seq, so the ids in order pair with the rows.
    ids = sorted(int(r[0]) for r in written)
    yield Step(
        statements.mark_compensated,
        {"jobs": [r.job_id for r in rows], "names": [r.name for r in rows], "ids": ids},
    )
    return ids


def reopen_compensated_flow(
    tables: QueueTables, requeued: list[int]
) -> Flow[list[tuple[int, str]]]:
    """After a requeue put jobs ``requeued`` back: the steps whose compensation was
    enqueued start again, so the job's next run does their work again rather than
    replaying results that were undone. Returns the reopened ``(job id, step name)``.

    In the requeue's transaction, after its update, which waited for a compensation
    sweep that held one of the jobs: a step is either compensated before the requeue (and
    reopened here) or never (it stays done). See
    :func:`~sqla_queue.statements.compensations.reopen_compensated_statement`.
    """
    if not requeued:
        return []
    params: ReopenParams = {"ids": sorted(requeued)}
    rows: Sequence[Any] = yield Step(reopen_compensated_statement(tables), params)
    return sorted((int(r.job_id), str(r.name)) for r in rows)
