"""The queue's tables, built into the host application's own MetaData.

A queue has fourteen tables, each with a role: the fields of :class:`QueueTables` that hold a
``Table`` name them (:data:`TABLE_ROLES`, in creation order). Each table has its builder in
:mod:`sqla_queue.models.builders`; :func:`build_tables` composes them, tags each table with
its role for the tooling, and registers the queue in the metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, get_type_hints

from sqlalchemy import MetaData, Table

from sqla_queue._identifiers import validate_prefix
from sqla_queue.models.builders import (
    controls_table,
    daemons_table,
    executions_table,
    jobs_table,
    limits_table,
    rate_starts_table,
    schedules_table,
    unique_keys_table,
    workers_table,
    workflow_edges_table,
    workflow_nodes_table,
    workflows_table,
)
from sqla_queue.models.durable import job_signals_table, job_steps_table
from sqla_queue.models.partitioning import attach_partition_ddl
from sqla_queue.models.placement import resolve_schema, translated_schema
from sqla_queue.models.vocabulary import (
    DEFAULT_PREFIX,
    SCHEMA_VERSION,
    ExecutionState,
    HistoryLayout,
    JobStatus,
    NodeState,
    ParentFailure,
    ParentPolicy,
    StepKind,
    UniqueScope,
    check_history,
    parse_schema_version_comment,
    schema_version_comment,
)

__all__ = [
    "DEFAULT_PREFIX",
    "SCHEMA_VERSION",
    "TABLE_ROLES",
    "ExecutionState",
    "HistoryLayout",
    "JobStatus",
    "NodeState",
    "ParentFailure",
    "ParentPolicy",
    "QueueTables",
    "StepKind",
    "UniqueScope",
    "build_tables",
    "check_history",
    "parse_schema_version_comment",
    "resolve_schema",
    "schema_version_comment",
    "translated_schema",
]


@dataclass(frozen=True)
class QueueTables:
    """The Core tables of one queue, plus the names derived from its prefix.

    ``schema`` is the queue's effective schema (see :func:`resolve_schema`): the one its
    tables carry, ``None`` for the search path.
    """

    # The table roles, in creation order (each one's referents first).
    jobs: Table
    executions: Table
    limits: Table
    unique_keys: Table
    controls: Table
    rate_starts: Table
    schedules: Table
    daemons: Table
    workers: Table
    workflows: Table
    workflow_nodes: Table
    workflow_edges: Table
    job_steps: Table
    job_signals: Table
    schema: str | None
    prefix: str
    #: The :class:`HistoryLayout` of the jobs table.
    history: str = HistoryLayout.PLAIN
    #: Where a connection's ``schema_translate_map`` puts the tables (one name), or empty
    #: when no map moves them: see :meth:`translated`.
    moved_to: tuple[str | None, ...] = ()

    @classmethod
    def from_roles(
        cls,
        roles: Mapping[str, Table],
        *,
        schema: str | None,
        prefix: str,
        history: str = HistoryLayout.PLAIN,
    ) -> QueueTables:
        """The queue whose table of each role in :data:`TABLE_ROLES` is ``roles[role]``.

        Raises :class:`KeyError` for a role that ``roles`` lacks; other keys are ignored.
        """
        tables: dict[str, Any] = {role: roles[role] for role in TABLE_ROLES}
        return cls(**tables, schema=schema, prefix=prefix, history=history)

    @property
    def all(self) -> tuple[Table, ...]:
        """Every table of the queue, in creation order (each one's referents first)."""
        return tuple(getattr(self, role) for role in TABLE_ROLES)

    @property
    def effective_schema(self) -> str | None:
        """The schema the rows are in for the connections these tables serve: ``schema``,
        or the one a ``schema_translate_map`` moved it to (see :meth:`translated`)."""
        return self.moved_to[0] if self.moved_to else self.schema

    def translated(self, translate_map: Mapping[Any, Any] | None) -> QueueTables:
        """These tables as a connection with the ``schema_translate_map`` option sees them.

        SQLAlchemy moves the tables' statements to the translated schema; every name that
        the library derives from the schema itself (the NOTIFY channels, the advisory lock
        keys) must move with them, or two tenants of one queue would wake, wait for and
        answer each other. The copy names the translated schema in
        :attr:`effective_schema`; ``schema`` stays the declared one, which is what the
        map translates. Without a map that moves the schema, ``self`` is returned.
        """
        target = translated_schema(self.schema, translate_map)
        moved_to = () if target == self.schema else (target,)
        return self if moved_to == self.moved_to else replace(self, moved_to=moved_to)

    @property
    def notify_channel(self) -> str:
        """The LISTEN/NOTIFY channel on which enqueues wake idle workers."""
        return f"{self.effective_schema or 'public'}.{self.prefix}wakeup"

    @property
    def finished_channel(self) -> str:
        """The channel on which the completion of an awaited job sends the job's id."""
        return f"{self.effective_schema or 'public'}.{self.prefix}finished"


def _roles() -> tuple[str, ...]:
    hints = get_type_hints(QueueTables)
    return tuple(f.name for f in fields(QueueTables) if hints[f.name] is Table)


#: The role of each of a queue's tables, in creation order: the fields of
#: :class:`QueueTables` that hold a ``Table``. :func:`build_tables` tags each table's
#: ``info["sqla_queue"]["role"]`` with it, which is how tooling finds a queue's tables.
TABLE_ROLES: tuple[str, ...] = _roles()


def build_tables(
    metadata: MetaData,
    *,
    schema: str | None = None,
    prefix: str = DEFAULT_PREFIX,
    history: str = HistoryLayout.PLAIN,
) -> QueueTables:
    """Create the queue's tables in ``metadata`` and return them.

    The tables go to ``schema``, else to the metadata's own schema (``MetaData(schema=...)``),
    else to the search path; :func:`resolve_schema` decides, and ``QueueTables.schema``
    records the result. Every constraint and index name goes through ``conv()`` so that the
    host's naming convention cannot rename objects that migrations and verification refer to.

    With ``history="partitioned"`` the jobs table is created partitioned by status, its
    partitions with it (:mod:`sqla_queue.models.partitioning`); the Core table is the same.
    """
    schema = resolve_schema(metadata, schema)
    prefix = validate_prefix(prefix)
    history = check_history(history)
    partitioned = history == HistoryLayout.PARTITIONED
    tables = QueueTables(
        jobs=jobs_table(metadata, schema, prefix, partitioned=partitioned),
        executions=executions_table(metadata, schema, prefix),
        limits=limits_table(metadata, schema, prefix),
        unique_keys=unique_keys_table(metadata, schema, prefix),
        controls=controls_table(metadata, schema, prefix),
        rate_starts=rate_starts_table(metadata, schema, prefix),
        schedules=schedules_table(metadata, schema, prefix),
        daemons=daemons_table(metadata, schema, prefix),
        workers=workers_table(metadata, schema, prefix),
        workflows=workflows_table(metadata, schema, prefix),
        workflow_nodes=workflow_nodes_table(metadata, schema, prefix),
        workflow_edges=workflow_edges_table(metadata, schema, prefix),
        job_steps=job_steps_table(metadata, schema, prefix),
        job_signals=job_signals_table(metadata, schema, prefix),
        schema=schema,
        prefix=prefix,
        history=history,
    )
    if partitioned:
        attach_partition_ddl(tables.jobs, schema)
    # Tooling (alembic_ext's comparator, verification) finds the queue's tables here
    # without importing the host's Queue object.
    info = {
        "schema_version": SCHEMA_VERSION,
        "prefix": prefix,
        "schema": schema,
        "history": history,
    }
    for role, table in zip(TABLE_ROLES, tables.all, strict=True):
        table.info["sqla_queue"] = {**info, "role": role}
    metadata.info.setdefault("sqla_queue", []).append(tables)
    return tables
