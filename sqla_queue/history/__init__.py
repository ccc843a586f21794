"""History by time partitions: keep finished jobs in partitions, prune by dropping them.

Opt in with ``Queue(history="partitioned")`` and create the queue with
``op.create_queue(..., history="partitioned")`` (or convert an existing one with
``op.partition_history(...)``). Then:

* :func:`maintain_history` creates each interval's partitions ahead of time. Every worker
  does it in the background (the ``history`` service), and so does ``sqla-queue maintain``;
  it needs to own the jobs table (the migration role) to do so.
* :func:`prune_history` drops (or detaches, for archiving) whole partitions of finished
  jobs older than an age: a catalog change, whatever the partition holds, instead of a
  DELETE of every row. ``queue.prune`` does this on a partitioned queue.
* :func:`history_partitions` lists them.

Each function joins the caller's transaction on a ``Session``, ``Connection`` or their
async twins (a coroutine is returned for the async ones); nothing here commits.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, overload

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from sqla_queue._binds import AnyBind, on_connection, options_of
from sqla_queue.admin import check_age
from sqla_queue.checks import check_in_range
from sqla_queue.conversation import Flow, run_flow
from sqla_queue.history.layout import history_names
from sqla_queue.history.partitions import (
    HistoryPartition,
    MaintainReport,
    PruneReport,
    ensure_flow,
    list_flow,
    prune_flow,
)
from sqla_queue.models.partitioning import DEFAULT_INTERVAL, INTERVALS, HistoryNames
from sqla_queue.models.tables import HistoryLayout, QueueTables

T = TypeVar("T")

__all__ = [
    "DEFAULT_AHEAD",
    "DEFAULT_INTERVAL",
    "INTERVALS",
    "HistoryPartition",
    "MaintainReport",
    "PruneReport",
    "history_partitions",
    "maintain_history",
    "prune_history",
]

#: How many intervals past the current one :func:`maintain_history` prepares by default.
DEFAULT_AHEAD = 3
#: Most intervals a call may prepare ahead.
MAX_AHEAD = 1000


def _require_partitioned(tables: QueueTables) -> None:
    if tables.history != HistoryLayout.PARTITIONED:
        raise ValueError(
            f"this queue has no history partitions (Queue(history={tables.history!r})). "
            "Declare Queue(..., history='partitioned') and migrate with "
            "op.partition_history() to use them; queue.prune deletes old rows meanwhile"
        )


@overload
def maintain_history(
    bind: Session | Connection, tables: QueueTables, *, ahead: int = ..., backfill: bool = ...
) -> MaintainReport: ...


@overload
def maintain_history(
    bind: AsyncSession | AsyncConnection,
    tables: QueueTables,
    *,
    ahead: int = ...,
    backfill: bool = ...,
) -> Coroutine[Any, Any, MaintainReport]: ...


def maintain_history(
    bind: AnyBind,
    tables: QueueTables,
    *,
    ahead: int = DEFAULT_AHEAD,
    backfill: bool = False,
) -> MaintainReport | Coroutine[Any, Any, MaintainReport]:
    """Create the history partitions of the current interval and of ``ahead`` more.

    Finished jobs waiting in a default partition for a range move into the partition
    created for it. ``backfill=True`` also creates the partitions of past intervals that the
    default partitions still hold jobs of (after a conversion of an existing history, say),
    at most 400 per branch per call. Runs in the caller's transaction: commit it.
    """
    _require_partitioned(tables)
    ahead = check_in_range("ahead", ahead, 0, MAX_AHEAD)
    return _run_on_names(
        bind, tables, lambda names: ensure_flow(tables, names, ahead=ahead, backfill=backfill)
    )


@overload
def prune_history(
    bind: Session | Connection,
    tables: QueueTables,
    *,
    older_than: dt.timedelta,
    include_failed: bool = ...,
    detach: bool = ...,
) -> PruneReport: ...


@overload
def prune_history(
    bind: AsyncSession | AsyncConnection,
    tables: QueueTables,
    *,
    older_than: dt.timedelta,
    include_failed: bool = ...,
    detach: bool = ...,
) -> Coroutine[Any, Any, PruneReport]: ...


def prune_history(
    bind: AnyBind,
    tables: QueueTables,
    *,
    older_than: dt.timedelta,
    include_failed: bool = False,
    detach: bool = False,
) -> PruneReport | Coroutine[Any, Any, PruneReport]:
    """Drop the partitions whose whole range finished at least ``older_than`` ago.

    Failed jobs' partitions go only with ``include_failed``. ``detach=True`` detaches them
    instead: each stays a table of its own, out of the queue, to archive and drop. A job
    may outlive ``older_than`` by up to one interval, since a partition goes whole; jobs
    in the default partitions are deleted row by row. A negative age raises
    :class:`ValueError`.
    """
    _require_partitioned(tables)
    age = check_age(older_than)
    return _run_on_names(
        bind,
        tables,
        lambda names: prune_flow(
            tables,
            names,
            older_than=age,
            include_failed=bool(include_failed),
            detach=bool(detach),
        ),
    )


@overload
def history_partitions(
    bind: Session | Connection, tables: QueueTables
) -> list[HistoryPartition]: ...


@overload
def history_partitions(
    bind: AsyncSession | AsyncConnection, tables: QueueTables
) -> Coroutine[Any, Any, list[HistoryPartition]]: ...


def history_partitions(
    bind: AnyBind, tables: QueueTables
) -> list[HistoryPartition] | Coroutine[Any, Any, list[HistoryPartition]]:
    """Every partition of finished jobs, oldest first within each branch."""
    _require_partitioned(tables)
    return _run_on_names(bind, tables, list_flow)


def _run_on_names(
    bind: AnyBind, tables: QueueTables, make_flow: Callable[[HistoryNames], Flow[T]]
) -> T | Coroutine[Any, Any, T]:
    """Run the flow ``make_flow`` builds for the history's names as ``bind``'s connection
    sees them: a tenant's ``schema_translate_map`` moves the partitions (and the lock that
    serializes their maintenance) to the tenant's schema."""

    def run(connection: Any) -> Any:
        translate = options_of(connection).get("schema_translate_map")
        return run_flow(connection, make_flow(history_names(tables, translate)))

    return on_connection(bind, run)
