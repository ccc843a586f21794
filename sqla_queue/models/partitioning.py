"""The partitioned history layout: its tables' names, their DDL and its intervals.

With ``Queue(history="partitioned")`` the jobs table is partitioned by status::

    jobs (PARTITION BY LIST (status))
    |-- jobs_live      'queued'                  the live jobs, with their primary key
    |-- jobs_done      'succeeded', 'cancelled'  PARTITION BY RANGE (finished_at)
    |   |-- jobs_done_p2026120300 ...            one partition per interval
    |   `-- jobs_done_default                    finished jobs no partition covers yet
    `-- jobs_failed    'failed'                  PARTITION BY RANGE (finished_at), the same

A job moves from ``jobs_live`` to a time partition in the completion that finishes it
(an UPDATE that changes the partition key is a move), and back with a requeue. The
statements on the hot path name ``status = 'queued'`` so that PostgreSQL plans them on
``jobs_live`` alone, whatever the history holds. Pruning drops (or detaches) whole time
partitions; a partition is created ahead of time by the workers' maintenance or by
``sqla-queue maintain`` (:mod:`sqla_queue.history`).

This module is the part of the layout that the table definitions need: the partitions
that ``create_all`` creates under a partitioned jobs table, and the comment that records
their interval. Everything but :func:`attach_partition_ddl` is pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Table, event
from sqlalchemy.dialects.postgresql.base import PGDialect

from sqla_queue.models.placement import translated_schema
from sqla_queue.models.vocabulary import JobStatus

__all__ = [
    "DEFAULT_INTERVAL",
    "DONE_STATUSES",
    "FAILED_STATUSES",
    "INTERVALS",
    "HistoryNames",
    "attach_partition_ddl",
    "check_interval",
    "interval_comment",
    "parse_interval_comment",
    "structure_statements",
]

#: The lengths a time partition may cover; ``day`` unless chosen otherwise.
INTERVALS = ("hour", "day", "week", "month")
DEFAULT_INTERVAL = "day"

#: The statuses of each range-partitioned branch of the jobs table.
DONE_STATUSES = (JobStatus.SUCCEEDED, JobStatus.CANCELLED)
FAILED_STATUSES = (JobStatus.FAILED,)

_QUOTE = PGDialect().identifier_preparer.quote  # type: ignore[no-untyped-call]
_COMMENT = "sqla_queue: finished jobs, one partition per {}"


def check_interval(interval: object) -> str:
    """``interval`` if it is one of :data:`INTERVALS`, else a ``ValueError`` naming them."""
    if interval not in INTERVALS:
        raise ValueError(
            f"the history interval must be one of {', '.join(INTERVALS)}, got {interval!r}"
        )
    return str(interval)


def interval_comment(interval: str) -> str:
    """The comment on a range-partitioned branch that records its partitions' interval."""
    return _COMMENT.format(check_interval(interval))


def parse_interval_comment(comment: str | None) -> str:
    """The interval a branch's comment records (the default for a missing one)."""
    for interval in INTERVALS:
        if comment == _COMMENT.format(interval):
            return interval
    return DEFAULT_INTERVAL


@dataclass(frozen=True)
class HistoryNames:
    """The unqualified names of the layout's tables, and the queue's (effective) schema."""

    schema: str | None
    jobs: str
    live: str
    done: str
    failed: str

    @classmethod
    def for_jobs(cls, jobs: str, schema: str | None) -> HistoryNames:
        """The layout's names under the jobs table named ``jobs``, in ``schema``."""
        return cls(
            schema=schema,
            jobs=jobs,
            live=f"{jobs}_live",
            done=f"{jobs}_done",
            failed=f"{jobs}_failed",
        )

    def qualified(self, name: str) -> str:
        """``name`` quoted and prefixed by the schema, for SQL text."""
        return f"{_QUOTE(self.schema)}.{_QUOTE(name)}" if self.schema else _QUOTE(name)

    def default_of(self, branch: str) -> str:
        """The default partition of ``branch`` (``done`` or ``failed``)."""
        return f"{branch}_default"

    @property
    def branches(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Each range-partitioned branch with the statuses it holds."""
        return ((self.done, DONE_STATUSES), (self.failed, FAILED_STATUSES))


def _literals(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def structure_statements(names: HistoryNames, interval: str = DEFAULT_INTERVAL) -> list[str]:
    """The partitions under a freshly created partitioned jobs table, and their comments.

    The range branches get an index on ``id`` (the live partition has its primary key):
    lookups of one finished job by id probe each time partition's index.
    """
    q = names.qualified
    statements = [
        f"CREATE TABLE {q(names.live)} PARTITION OF {q(names.jobs)} "
        f"(CONSTRAINT {_QUOTE(names.live + '_pkey')} PRIMARY KEY (id)) "
        f"FOR VALUES IN ('{JobStatus.QUEUED}')",
        f"COMMENT ON TABLE {q(names.live)} IS 'sqla_queue: the queued and running jobs'",
    ]
    for branch, statuses in names.branches:
        statements += [
            f"CREATE TABLE {q(branch)} PARTITION OF {q(names.jobs)} "
            f"FOR VALUES IN ({_literals(statuses)}) PARTITION BY RANGE (finished_at)",
            f"COMMENT ON TABLE {q(branch)} IS '{interval_comment(interval)}'",
            f"CREATE TABLE {q(names.default_of(branch))} PARTITION OF {q(branch)} DEFAULT",
            f"CREATE INDEX {_QUOTE(branch + '_id_ix')} ON {q(branch)} (id)",
        ]
    return statements


def attach_partition_ddl(jobs: Table, schema: str | None) -> None:
    """Have ``create_all`` create the partitions right after the partitioned ``jobs`` table.

    ``schema`` is the queue's declared schema; the partitions go where the connection's
    ``schema_translate_map`` (a tenant's) moves it, beside the jobs table.
    """

    def create_partitions(target: Table, connection: Connection, **_: object) -> None:
        translate = connection.get_execution_options().get("schema_translate_map")
        names = HistoryNames.for_jobs(jobs.name, translated_schema(schema, translate))
        for statement in structure_statements(names):
            connection.exec_driver_sql(statement)

    event.listen(jobs, "after_create", create_partitions)
