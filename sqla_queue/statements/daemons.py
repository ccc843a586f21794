"""Daemon instances: who runs each one, under a lease the database enforces.

A row of ``daemons`` per (name, instance). A worker runs an instance only while the row
names it with an unexpired ``lease_until``; it renews the lease at a quarter of its length,
and a renewal that comes back without a row tells it the instance was taken over. Each
builder has a ``TypedDict`` next to it naming its parameters (a unit test checks them
against the compiled statement's bound names).
"""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

from sqlalchemy import (
    Double,
    Integer,
    Select,
    Text,
    Uuid,
    and_,
    bindparam,
    func,
    null,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, Insert, insert
from sqlalchemy.sql.dml import ReturningUpdate

from sqla_queue.models.tables import QueueTables
from sqla_queue.statements._common import ONE, seconds

__all__ = [
    "AcquireDaemonsParams",
    "DaemonCrashParams",
    "EnsureDaemonsParams",
    "ReleaseDaemonsParams",
    "RenewDaemonsParams",
    "acquire_daemons_statement",
    "daemon_crash_statement",
    "daemon_status_statement",
    "ensure_daemons_statement",
    "release_daemons_statement",
    "renew_daemons_statement",
]


class EnsureDaemonsParams(TypedDict):
    """Parameters of :func:`ensure_daemons_statement`: (name, instance) pairs, two arrays."""

    names: list[str]
    instances: list[int]


class AcquireDaemonsParams(TypedDict):
    """Parameters of :func:`acquire_daemons_statement`."""

    worker: uuid.UUID
    #: The daemons this worker supervises, with, pairwise, their instance count and lease.
    names: list[str]
    counts: list[int]
    leases: list[float]
    #: (name, instance) pairs whose previous run still has a thread here: never taken.
    busy_names: list[str]
    busy_instances: list[int]


class RenewDaemonsParams(TypedDict):
    """Parameters of :func:`renew_daemons_statement`: the instances held, and their leases."""

    worker: uuid.UUID
    names: list[str]
    instances: list[int]
    leases: list[float]


class ReleaseDaemonsParams(TypedDict):
    """Parameters of :func:`release_daemons_statement`: the instances to hand back."""

    worker: uuid.UUID
    names: list[str]
    instances: list[int]


class DaemonCrashParams(TypedDict):
    """Parameters of :func:`daemon_crash_statement`."""

    worker: uuid.UUID
    #: The daemon's name and the instance's number (not ``name``/``instance``: an
    #: UPDATE's bound names cannot be the names of its table's columns).
    daemon: str
    number: int
    error: str


def _pairs(first: str, second: str, first_type: Any, second_type: Any) -> Select[Any]:
    """``SELECT unnest(:first), unnest(:second)``: two arrays zipped into rows."""
    return select(
        func.unnest(bindparam(first, type_=ARRAY(first_type))),
        func.unnest(bindparam(second, type_=ARRAY(second_type))),
    )


def ensure_daemons_statement(tables: QueueTables) -> Insert:
    """Create the rows of the given instances, leaving existing ones as they are.

    Parameters: :class:`EnsureDaemonsParams`. Each worker sends every instance of every
    daemon it supervises (0 to N - 1) before its first acquire; a row is never deleted by a
    worker, so lowering ``instances`` only leaves rows that nobody acquires any more.
    """
    daemons = tables.daemons
    rows = _pairs("names", "instances", Text, Integer).subquery("wanted")
    name, instance = rows.c
    return (
        insert(daemons)
        .from_select(["name", "instance"], select(name, instance))
        .on_conflict_do_nothing(index_elements=[daemons.c.name, daemons.c.instance])
    )


def acquire_daemons_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Take every free instance of the given daemons for ``worker``, each with its lease.

    Parameters: :class:`AcquireDaemonsParams`. An instance is free when nobody holds it
    (``worker_id IS NULL``: released on a graceful stop) or its holder's lease has run out
    (the holder died, or lost the database for a whole lease; a row without a lease counts
    as run out). Instances numbered past a
    daemon's current count, and those still running here (``busy``), are left alone. Rows
    are locked with SKIP LOCKED, so two workers acquiring at once never wait for each other
    and never both take one instance. Returns ``(name, instance, restarts)`` of the taken.
    """
    d = tables.daemons
    wanted = select(
        func.unnest(bindparam("names", type_=ARRAY(Text))).label("name"),
        func.unnest(bindparam("counts", type_=ARRAY(Integer))).label("count"),
        func.unnest(bindparam("leases", type_=ARRAY(Double))).label("lease"),
    ).subquery("wanted")
    busy = _pairs("busy_names", "busy_instances", Text, Integer)
    free = (
        select(d.c.name, d.c.instance, wanted.c.lease)
        .join(wanted, d.c.name == wanted.c.name)
        .where(
            d.c.instance < wanted.c.count,
            or_(d.c.worker_id.is_(None), d.c.lease_until.is_(None), d.c.lease_until < func.now()),
            tuple_(d.c.name, d.c.instance).not_in(busy),
        )
        .order_by(d.c.name, d.c.instance)
        .with_for_update(of=d, skip_locked=True)
        .cte("free")
    )
    return (
        update(d)
        .where(d.c.name == free.c.name, d.c.instance == free.c.instance)
        .values(
            worker_id=bindparam("worker", type_=Uuid),
            lease_until=func.now() + seconds(free.c.lease),
            started_at=func.now(),
            updated_at=func.now(),
        )
        .returning(d.c.name, d.c.instance, d.c.restarts)
    )


def renew_daemons_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Extend the leases of the instances ``worker`` holds and runs.

    Parameters: :class:`RenewDaemonsParams`. Only a row that still names this worker under
    an unexpired lease is renewed: one that another worker took (after this one's lease
    ran out) is not. Returns ``(name, instance)`` of the renewed; an instance missing from
    the result is no longer this worker's, and its local run must stop at once (fencing).
    """
    d = tables.daemons
    held = select(
        func.unnest(bindparam("names", type_=ARRAY(Text))).label("name"),
        func.unnest(bindparam("instances", type_=ARRAY(Integer))).label("instance"),
        func.unnest(bindparam("leases", type_=ARRAY(Double))).label("lease"),
    ).subquery("held")
    return (
        update(d)
        .where(
            d.c.name == held.c.name,
            d.c.instance == held.c.instance,
            d.c.worker_id == bindparam("worker", type_=Uuid),
            d.c.lease_until >= func.now(),
        )
        .values(lease_until=func.now() + seconds(held.c.lease), updated_at=func.now())
        .returning(d.c.name, d.c.instance)
    )


def release_daemons_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Hand back instances whose run ended here, so another worker takes them at once.

    Parameters: :class:`ReleaseDaemonsParams`. Fenced by ``worker``: an instance another
    worker holds by now is left alone. Returns ``(name, instance)`` of the released.
    """
    d = tables.daemons
    pairs = _pairs("names", "instances", Text, Integer)
    return (
        update(d)
        .where(
            d.c.worker_id == bindparam("worker", type_=Uuid),
            tuple_(d.c.name, d.c.instance).in_(pairs),
        )
        .values(worker_id=null(), lease_until=null(), updated_at=func.now())
        .returning(d.c.name, d.c.instance)
    )


def daemon_crash_statement(tables: QueueTables) -> ReturningUpdate[Any]:
    """Count a crash of one instance and keep its error, if ``worker`` still holds it.

    Parameters: :class:`DaemonCrashParams`. Returns the new ``restarts`` (no row: the
    instance is no longer this worker's).
    """
    d = tables.daemons
    return (
        update(d)
        .where(
            d.c.name == bindparam("daemon", type_=Text),
            d.c.instance == bindparam("number", type_=Integer),
            d.c.worker_id == bindparam("worker", type_=Uuid),
        )
        .values(
            restarts=d.c.restarts + ONE,
            last_error=bindparam("error", type_=Text),
            updated_at=func.now(),
        )
        .returning(d.c.restarts)
    )


def daemon_status_statement(tables: QueueTables) -> Select[Any]:
    """Every daemon instance row, with whether its lease is live now. No parameters.

    Rows ``(name, instance, worker_id, lease_until, started_at, restarts, last_error,
    running)`` in (name, instance) order.
    """
    d = tables.daemons
    running = and_(d.c.worker_id.is_not(None), d.c.lease_until >= func.now())
    return select(
        d.c.name,
        d.c.instance,
        d.c.worker_id,
        d.c.lease_until,
        d.c.started_at,
        d.c.restarts,
        d.c.last_error,
        running.label("running"),
    ).order_by(d.c.name, d.c.instance)
