"""Creating time partitions ahead, and pruning history by dropping them.

Each operation is a :data:`~sqla_queue.conversation.Flow`: it yields its statements and reads
their rows, so one body serves sync and async callers (:func:`~sqla_queue.conversation.run_flow`)
and joins the caller's transaction. Its DDL waits at most :data:`LOCK_TIMEOUT` for a lock
(``SET LOCAL lock_timeout``): a partition's DDL locks the branch it changes, and must never
queue the workers' completions behind an analytics query that holds it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.sql import Executable

from sqla_queue.admin import Pruned, add_counts, prune_leftovers_flow
from sqla_queue.conversation import Flow
from sqla_queue.history.layout import floor_to_interval, next_boundary, partition_name
from sqla_queue.logic.times import EARLIEST_DUE
from sqla_queue.models.partitioning import HistoryNames, parse_interval_comment
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.history import (
    attach_partition_statement,
    count_partition_statement,
    create_partition_statement,
    detach_partition_statement,
    drop_partition_statement,
    free_partition_keys_statement,
    history_lock_statement,
    lock_default_statement,
    lock_timeout_statement,
    move_rows_statement,
    now_statement,
    oldest_finished_statement,
    partitions_catalog_statement,
    prune_cutoff_statement,
    prune_default_statement,
)

__all__ = [
    "LOCK_TIMEOUT",
    "HistoryPartition",
    "MaintainReport",
    "PruneReport",
    "ensure_flow",
    "list_flow",
    "prune_flow",
]

#: Longest wait, in seconds, of one partition statement for its lock.
LOCK_TIMEOUT = 5.0
#: At most this many partitions are created per branch in one call (a backfill of years of
#: hourly history goes in several runs, each one short).
MAX_CREATED = 400

_BOUND = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")


@dataclass(frozen=True)
class HistoryPartition:
    """One partition of finished jobs: its branch (``..._done`` or ``..._failed``), its
    name and its range; ``lower`` and ``upper`` are ``None`` for a default partition."""

    branch: str
    name: str
    lower: dt.datetime | None
    upper: dt.datetime | None

    @property
    def is_default(self) -> bool:
        """Whether this is the branch's default partition (finished jobs out of range)."""
        return self.lower is None


@dataclass(frozen=True)
class MaintainReport:
    """What :func:`ensure_flow` did: the partitions it created and the rows it moved into
    them from the default partitions."""

    created: tuple[str, ...]
    moved: int


@dataclass(frozen=True)
class PruneReport:
    """What :func:`prune_flow` did: the partitions dropped or detached, the jobs gone
    with them (those of the default partitions included), and the rows removed from each
    table, by role (see :class:`~sqla_queue.admin.Pruned`; ``jobs`` counts the jobs of
    detached partitions too, which left the queue)."""

    partitions: tuple[str, ...]
    jobs: int
    detached: bool
    removed: Mapping[str, int] = field(default_factory=dict)

    @property
    def pruned(self) -> Pruned:
        """The same report as :meth:`Queue.prune <sqla_queue.Queue.prune>` gives it."""
        return Pruned(self.removed, self.partitions)


# A bound as pg_get_expr writes it: the local time, then the offset of the session's
# TimeZone: "-05", "+05:30", "+00:44:30", up to "+167:59".
_SPELLED_BOUND = re.compile(
    r"(\d{4,}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)([+-])(\d+)(?::(\d\d))?(?::(\d\d))?"
)


def _timestamp(spelling: str) -> dt.datetime:
    """A partition bound, in UTC, whatever the session's TimeZone.

    The offset is applied here: Python's ``fromisoformat`` takes offsets below 24 hours
    only, and PostgreSQL accepts a session offset of up to 167:59 (which its own
    timestamp input then refuses).
    """
    match = _SPELLED_BOUND.fullmatch(spelling)
    if match is None:
        raise ValueError(f"cannot read the partition bound {spelling!r}")
    local, sign, hours, minutes, seconds = match.groups()
    offset = dt.timedelta(hours=int(hours), minutes=int(minutes or 0), seconds=int(seconds or 0))
    utc = dt.datetime.fromisoformat(local) - (offset if sign == "+" else -offset)
    return utc.replace(tzinfo=dt.UTC)


def _parse(rows: Iterable[Any]) -> tuple[dict[str, str], list[HistoryPartition]]:
    intervals: dict[str, str] = {}
    found: list[HistoryPartition] = []
    for row in rows:
        branch, name, bound, comment = (str(row[0]), str(row[1]), row[2], row[3])
        intervals[branch] = parse_interval_comment(comment)
        match = _BOUND.search(bound or "")
        if match:
            lower, upper = _timestamp(match.group(1)), _timestamp(match.group(2))
            found.append(HistoryPartition(branch, name, lower, upper))
        else:
            found.append(HistoryPartition(branch, name, None, None))
    return intervals, found


def _catalog(names: HistoryNames) -> tuple[Executable, dict[str, object]]:
    return partitions_catalog_statement(), {
        "done": names.qualified(names.done),
        "failed": names.qualified(names.failed),
    }


def list_flow(names: HistoryNames) -> Flow[list[HistoryPartition]]:
    """Every partition of the history, oldest first within each branch."""
    _, found = _parse((yield _catalog(names)))
    earliest = dt.datetime.min.replace(tzinfo=dt.UTC)
    return sorted(found, key=lambda p: (p.branch, p.lower is not None, p.lower or earliest))


def _serialize(names: HistoryNames, *, wait: bool) -> tuple[Executable, dict[str, object]]:
    """The transaction lock that keeps two maintenances or prunes of one queue apart.

    Without it, two workers creating the same partition collide on its name, and a prune
    dropping partitions (which locks the branch) beside a maintenance moving rows out of
    the default partition (which locks that partition first) wait for each other.
    """
    return (
        history_lock_statement(wait=wait),
        {"key": f"sqla_queue history {names.qualified(names.jobs)}"},
    )


def _lock_timeout() -> tuple[Executable, dict[str, object]]:
    return lock_timeout_statement(LOCK_TIMEOUT), {}


def ensure_flow(
    tables: QueueTables,
    names: HistoryNames,
    *,
    ahead: int,
    backfill: bool = False,
    now: dt.datetime | None = None,
) -> Flow[MaintainReport]:
    """Create each branch's partitions from the current interval to ``ahead`` more.

    Finished jobs that a new partition's range covers and that wait in the branch's default
    partition (completed while no partition covered them) move into it first: PostgreSQL
    refuses to attach a range that rows of the default partition fall into. With
    ``backfill``, the partitions also reach back to the oldest job of the default
    partition, so that history written before the layout existed can be dropped by
    partition too. While another transaction maintains the same queue's partitions, this
    one does nothing and reports so (nothing created, nothing moved).
    """
    yield _lock_timeout()
    ((got,),) = yield _serialize(names, wait=False)
    if not got:
        # Another worker maintains the partitions right now: nothing is left to do here.
        return MaintainReport((), 0)
    if now is None:
        ((now,),) = yield now_statement(), {}
    assert now is not None
    intervals, existing = _parse((yield _catalog(names)))
    created: list[str] = []
    moved = 0
    for branch, _statuses in names.branches:
        interval = intervals.get(branch)
        if interval is None:
            raise LookupError(
                f"{names.qualified(branch)} is not a partitioned history table: is the "
                "queue's history partitioned (op.create_queue(..., history='partitioned'))?"
            )
        covered = {p.lower for p in existing if p.branch == branch and p.lower is not None}
        start = floor_to_interval(now, interval)
        if backfill:
            (oldest,) = yield oldest_finished_statement(names, branch), {}
            if oldest[0] is not None:
                start = min(start, floor_to_interval(oldest[0], interval))
        stop = floor_to_interval(now, interval)
        for _ in range(ahead):
            stop = next_boundary(stop, interval)
        lower = start
        made = 0
        while lower <= stop and made < MAX_CREATED:
            upper = next_boundary(lower, interval)
            if lower not in covered:
                name = partition_name(branch, lower)
                moved += yield from _create_partition(tables, names, branch, name, lower, upper)
                created.append(name)
                made += 1
            lower = upper
    return MaintainReport(tuple(created), moved)


def _create_partition(
    tables: QueueTables,
    names: HistoryNames,
    branch: str,
    name: str,
    lower: dt.datetime,
    upper: dt.datetime,
) -> Flow[int]:
    # The default partition is locked first: a completion routed there between the move and
    # the ATTACH would make the ATTACH fail. Completions routed to other partitions do not
    # touch it, and the lock is held for this short transaction only.
    yield lock_default_statement(names, branch), {}
    yield create_partition_statement(names, name), {}
    rows = yield (
        move_rows_statement(names, branch, name, tables),
        {"lower": lower, "upper": upper},
    )
    yield attach_partition_statement(names, branch, name, lower, upper), {}
    return len(rows)


def prune_flow(
    tables: QueueTables,
    names: HistoryNames,
    *,
    older_than: float,
    include_failed: bool,
    detach: bool,
) -> Flow[PruneReport]:
    """Drop (or detach) every time partition whose whole range finished ``older_than``
    seconds ago or more, then delete the default partitions' jobs that old row by row.

    Failed jobs' partitions go only with ``include_failed``. A partition is pruned whole, so
    a job may outlive ``older_than`` by up to one interval. The unique keys that its jobs
    still hold are deleted first (a key whose job is gone is free, and would only take up
    room), and so are their durable steps and signals; last, what earlier prunes left
    behind (see :func:`~sqla_queue.admin.prune_leftovers_flow`). Returns the partitions,
    the count of jobs they held and the rows removed from each table.
    """
    yield _lock_timeout()
    yield _serialize(names, wait=True)
    _, existing = _parse((yield _catalog(names)))
    # The cutoff comes back to Python, whose datetime stops at the year 1: an age that
    # reaches further back (3,000 years is allowed) is cut at EARLIEST_DUE, which selects
    # what it would (nothing finished before then) and loads at any session time zone.
    ((cutoff,),) = yield (
        prune_cutoff_statement(),
        {"age": older_than, "earliest": EARLIEST_DUE},
    )
    branches = [names.done] + ([names.failed] if include_failed else [])
    pruned: list[str] = []
    removed: dict[str, int] = {}
    doomed = [
        p for p in existing if p.branch in branches and p.upper is not None and p.upper <= cutoff
    ]
    for partition in doomed:
        ((count,),) = yield count_partition_statement(names, partition.name), {}
        (freed,) = yield free_partition_keys_statement(names, partition.name, tables), {}
        add_counts(removed, freed)
        removed["jobs"] = removed.get("jobs", 0) + int(count)
    for branch in branches:
        (gone,) = yield prune_default_statement(names, branch, tables), {"cutoff": cutoff}
        add_counts(removed, gone)
    # The DDL comes last: dropping a partition locks its branch until the transaction
    # ends, and the workers' completions into that branch wait for it meanwhile.
    for partition in doomed:
        if detach:
            yield detach_partition_statement(names, partition.branch, partition.name), {}
        else:
            yield drop_partition_statement(names, partition.name), {}
        pruned.append(partition.name)
    # Last, what the pruned jobs (these and earlier ones) left behind: their workflows,
    # and the steps and signals of jobs that the completion deleted (history="none").
    yield from prune_leftovers_flow(tables, older_than, removed)
    return PruneReport(tuple(pruned), removed.get("jobs", 0), detach, dict(removed))
