"""Signals, and what operators do with durable jobs: list the suspended ones, read a job's
steps, list and migrate stored step versions, fire timers. Each is a flow, run by
:class:`~sqla_queue.queue_durable.DurableMethods` in the caller's transaction."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqla_queue.conversation import Flow, Step
from sqla_queue.durable.statements import DurableStatements
from sqla_queue.errors import JobNotFoundError
from sqla_queue.logic.payload import dump_json
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements import durable_admin
from sqla_queue.statements.durable import deadline_of

__all__ = [
    "AdminStatements",
    "Signalled",
    "StepRecord",
    "StepVersion",
    "SuspendedJob",
    "encode_signal_payload",
    "fire_flow",
    "job_steps_flow",
    "migrate_steps_flow",
    "signal_flow",
    "step_versions_flow",
    "suspended_flow",
]


@dataclass(frozen=True)
class AdminStatements:
    """The operators' statements, with the durable ones, for one set of tables."""

    durable: DurableStatements
    suspended: Any
    job_steps: Any
    step_versions: Any
    migrate_steps: Any
    wake_jobs: Any
    fire: Any

    @classmethod
    @functools.cache
    def of(cls, tables: QueueTables) -> AdminStatements:
        """Build them for ``tables`` (cached: one set per queue and tenant)."""
        durable = DurableStatements.of(tables)
        return cls(
            durable=durable,
            suspended=durable_admin.suspended_statement(tables),
            job_steps=durable_admin.job_steps_statement(tables),
            step_versions=durable_admin.step_versions_statement(tables),
            migrate_steps=durable_admin.migrate_steps_statement(tables),
            wake_jobs=durable_admin.wake_jobs_statement(tables),
            fire=durable_admin.fire_statement(tables),
        )


@dataclass(frozen=True)
class Signalled:
    """What :meth:`Queue.signal <sqla_queue.Queue.signal>` did."""

    job_id: int
    name: str
    #: False: a signal of this name had been sent to the job before; the first one stands.
    stored: bool
    #: The job was suspended waiting for this signal, and now runs again.
    woke: bool
    #: The job's status when the signal was sent (a finished job never reads it).
    status: str


@dataclass(frozen=True)
class SuspendedJob:
    """A suspended durable job: what it waits for, and until when."""

    id: int
    task: str
    queue_id: str | None
    #: ``sleep``, ``signal:<name>``, ``row:<condition>:<key>`` or ``version:<step>``.
    waits_for: str
    #: The deadline (``None``: none: it waits for its signal, row or operator only).
    until: dt.datetime | None


@dataclass(frozen=True)
class StepRecord:
    """One committed checkpoint of a job, as an operator sees it."""

    name: str
    kind: str
    version: int
    attempt: int
    result: Any
    has_compensation: bool
    compensated_by: int | None
    committed_at: dt.datetime


@dataclass(frozen=True)
class StepVersion:
    """How many queued jobs of ``task`` hold step ``step`` at ``version``."""

    task: str
    step: str
    version: int
    jobs: int


def encode_signal_payload(name: str, payload: Any) -> str:
    """``payload`` as JSON text, or a :class:`~sqla_queue.errors.PayloadNotSerializableError`
    (a ``TypeError``) naming what cannot be stored, before anything is sent."""
    return dump_json(payload, task="", what="its payload", doing=f"send signal {name!r}")


def signal_flow(statements: DurableStatements, job_id: int, name: str, payload: str) -> Flow[Any]:
    """Send signal ``name`` to job ``job_id`` (see :mod:`sqla_queue.statements.signals`)."""
    yield Step(statements.lock_for_signal, {"job": job_id})
    rows = yield Step(
        statements.signal,
        {"job": job_id, "signal": name, "payload": payload, "waits_for": f"signal:{name}"},
    )
    row = rows[0]
    if row.status is None:
        raise JobNotFoundError(f"no job {job_id} to signal", job_id=job_id)
    return Signalled(job_id, name, bool(row.stored), bool(row.woken), row.status)


def _until(value: dt.datetime) -> dt.datetime | None:
    return deadline_of(value)


def suspended_flow(
    statements: AdminStatements, *, task: str | None, limit: int
) -> Flow[list[SuspendedJob]]:
    """The suspended jobs (of ``task``), soonest due first, at most ``limit``."""
    rows: Sequence[Any] = yield Step(statements.suspended, {"task": task, "limit": limit})
    return [
        SuspendedJob(r.id, r.task, r.queue_id, r.wait or "", _until(r.execute_at)) for r in rows
    ]


def job_steps_flow(statements: AdminStatements, job_id: int) -> Flow[list[StepRecord]]:
    """Job ``job_id``'s committed checkpoints, in commit order."""
    rows: Sequence[Any] = yield Step(statements.job_steps, {"job": job_id})
    return [
        StepRecord(
            r.name,
            r.kind,
            r.version,
            r.attempt,
            r.result,
            bool(r.has_compensation),
            r.compensated_by,
            r.committed_at,
        )
        for r in rows
    ]


def step_versions_flow(statements: AdminStatements) -> Flow[list[StepVersion]]:
    """The stored step versions of the queued durable jobs."""
    rows: Sequence[Any] = yield Step(statements.step_versions, {})
    return [StepVersion(r.task, r.name, r.version, r.jobs) for r in rows]


def migrate_steps_flow(
    statements: AdminStatements, *, task: str, step: str, from_version: int, to_version: int
) -> Flow[list[int]]:
    """Declare ``task``'s stored ``step`` at ``from_version`` valid for ``to_version``,
    and wake the jobs that waited for that; the migrated jobs' ids."""
    for value in (from_version, to_version):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"a step's version is a whole number from 1, got {value!r}")
    rows: Sequence[Any] = yield Step(
        statements.migrate_steps,
        {"task": task, "step": step, "from_version": from_version, "to_version": to_version},
    )
    ids = sorted(r.job_id for r in rows)
    if ids:
        yield Step(statements.wake_jobs, {"ids": ids, "waits_for": f"version:{step}"})
    return ids


def fire_flow(statements: AdminStatements, job_ids: Sequence[int] | None) -> Flow[list[int]]:
    """End the sleeps and wait deadlines of suspended jobs (``None``: all) now, and wake
    them: for tests, which cannot wait for a timer. Returns the woken ids."""
    ids = None if job_ids is None else list(job_ids)
    fired: Sequence[Any] = yield Step(statements.fire, {"ids": ids})
    woken = [r.id for r in fired]
    if woken:
        yield Step(statements.wake_jobs, {"ids": woken, "waits_for": None})
    return sorted(woken)
