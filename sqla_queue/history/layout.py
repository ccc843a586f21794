"""Where the partitioned history's tables are, and the time ranges of its partitions.

The layout itself (its tables, the DDL that ``create_all`` runs for it, the intervals a
partition may cover) is part of the table definitions: see
:mod:`sqla_queue.models.partitioning`. This module adds what maintenance and pruning
need on top: the layout's names as a connection sees them, and the date arithmetic of
the partitions' ranges. Everything here is pure: names and dates, no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqla_queue.models.partitioning import HistoryNames, check_interval
from sqla_queue.models.tables import QueueTables, translated_schema

__all__ = [
    "floor_to_interval",
    "history_names",
    "next_boundary",
    "partition_name",
]


def history_names(
    tables: QueueTables, translate_map: Mapping[Any, Any] | None = None
) -> HistoryNames:
    """The layout's names for ``tables``, in their schema as ``translate_map`` (a
    connection's ``schema_translate_map``) moves it."""
    return HistoryNames.for_jobs(tables.jobs.name, translated_schema(tables.schema, translate_map))


def floor_to_interval(moment: dt.datetime, interval: str) -> dt.datetime:
    """The start (UTC) of the ``interval`` that holds ``moment``; weeks start on Monday."""
    utc = moment.astimezone(dt.UTC)
    if interval == "hour":
        return utc.replace(minute=0, second=0, microsecond=0)
    day = utc.replace(hour=0, minute=0, second=0, microsecond=0)
    if interval == "day":
        return day
    if interval == "week":
        return day - dt.timedelta(days=day.weekday())
    if interval == "month":
        return day.replace(day=1)
    raise ValueError(check_interval(interval))


def next_boundary(start: dt.datetime, interval: str) -> dt.datetime:
    """The start of the interval after the one that begins at ``start``."""
    if interval == "hour":
        return start + dt.timedelta(hours=1)
    if interval == "day":
        return start + dt.timedelta(days=1)
    if interval == "week":
        return start + dt.timedelta(weeks=1)
    if interval == "month":
        year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
        return start.replace(year=year, month=month)
    raise ValueError(check_interval(interval))


def partition_name(branch: str, start: dt.datetime) -> str:
    """The name of ``branch``'s partition that begins at ``start``: ``<branch>_pYYYYMMDDHH``."""
    return f"{branch}_p{start.astimezone(dt.UTC):%Y%m%d%H}"
