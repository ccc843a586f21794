"""Autogenerate: the queue's tables belong to the queue operations, not to ``create_table``.

The queue's tables sit in the host's metadata like any other, so left alone Alembic would
propose ``create_table``/``add_column``/``create_index``... for them. Two hooks prevent that.
:func:`hide_queue_tables` runs before Alembic's own comparison (Alembic 1.18+) and keeps the
queue's tables out of it. :func:`compare_queues` runs after it, removes any proposal for a
queue table that still got through (on older Alembic, all of them), and puts one queue
operation in their place, chosen from the database's recorded schema version:

* no queue tables: ``op.create_queue(..., version=<model version>)``;
* an older version: ``op.upgrade_queue(from_version=<db>, to_version=<model>)``;
* the same version: nothing, so a second autogenerate is empty and ``alembic check`` passes;
* queue tables in the database but no Queue in the metadata: ``op.drop_queue(...)``.

The host's ``include_name``/``include_object`` decide for the queue's tables as for any other
table. The queue operation touches all of a queue's tables, so a queue with any table
excluded gets no operation at all, and Alembic proposes nothing for its other tables either.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from alembic.autogenerate.api import AutogenContext
from alembic.operations import MigrateOperation
from alembic.operations.ops import DropTableOp, UpgradeOps
from sqlalchemy import MetaData, Table

from alembic_ext import versions
from alembic_ext.ops import CreateQueueOp, DropQueueOp, QueueOp, UpgradeQueueOp
from sqla_queue.errors import InvalidIdentifierError
from sqla_queue.models.tables import (
    TABLE_ROLES,
    HistoryLayout,
    QueueTables,
    parse_schema_version_comment,
    translated_schema,
)
from sqla_queue.schema.verify import inspect_schema

__all__ = [
    "QueueSchemaWarning",
    "QueueTarget",
    "compare_queues",
    "find_queues",
    "hide_queue_tables",
    "plan_queue_op",
    "rewrite_upgrade_ops",
]

_EXECUTIONS_SUFFIX = "job_executions"
# Set on the UpgradeOps once handled, so that the hook registered twice (a reloaded module, a
# hand-written plugin calling it too) still produces one queue operation.
_DONE = "alembic_ext.queues_compared"
# The queues taking part in this run, settled before Alembic's own comparison.
_TARGETS = "alembic_ext.queue_targets"

TableKey = tuple[str | None, str]

log = logging.getLogger(__name__)


class QueueSchemaWarning(UserWarning):
    """Autogenerate found queue tables it will not touch, and says why."""


@dataclass(frozen=True)
class QueueTarget:
    """One queue declared in the target metadata: its tables and the version it wants."""

    tables: QueueTables
    version: int

    @property
    def schema(self) -> str | None:
        """The schema the model declares for the queue (``None``: the search path)."""
        return self.tables.schema

    @property
    def prefix(self) -> str:
        """The prefix of the queue's table names."""
        return self.tables.prefix

    @property
    def history(self) -> str:
        """The history layout the model declares (``Queue(history=...)``)."""
        return self.tables.history


def _metadatas(metadata: MetaData | Sequence[MetaData] | None) -> list[MetaData]:
    if metadata is None:
        return []
    if isinstance(metadata, MetaData):
        return [metadata]
    return list(metadata)


def _target(tables: QueueTables) -> QueueTarget:
    info = tables.executions.info.get("sqla_queue", {})
    return QueueTarget(tables, int(info.get("schema_version", versions.LATEST_VERSION)))


def find_queues(metadata: MetaData | Sequence[MetaData] | None) -> list[QueueTarget]:
    """Every queue in the target metadata.

    Queues register themselves in ``metadata.info["sqla_queue"]``; tables tagged with
    ``table.info["sqla_queue"]`` (for instance copied with ``Table.to_metadata``) are found
    too. Each (schema, prefix) is reported once.
    """
    found: dict[tuple[str | None, str], QueueTarget] = {}
    for md in _metadatas(metadata):
        for tables in md.info.get("sqla_queue", []):
            if isinstance(tables, QueueTables):
                found.setdefault((tables.schema, tables.prefix), _target(tables))
        tagged: dict[tuple[str | None, str], dict[str, Table]] = {}
        for table in md.tables.values():
            info = table.info.get("sqla_queue")
            if isinstance(info, dict) and "role" in info:
                key = (info.get("schema"), str(info.get("prefix")))
                tagged.setdefault(key, {})[str(info["role"])] = table
        for (schema, prefix), roles in tagged.items():
            # A queue is found by its tags only when every role is there.
            if (schema, prefix) in found or not roles.keys() >= set(TABLE_ROLES):
                continue
            found[(schema, prefix)] = _target(
                QueueTables.from_roles(
                    roles,
                    schema=schema,
                    prefix=prefix,
                    history=str(roles["jobs"].info["sqla_queue"].get("history", "plain")),
                )
            )
    return list(found.values())


def plan_queue_op(
    target: QueueTarget, db_version: int | None, *, existing_tables: Sequence[str] = ()
) -> QueueOp | None:
    """The one operation that takes the database's queue to the model's version, if any.

    ``db_version`` is the version recorded on the executions table, ``None`` when that table
    does not exist and ``0`` when it exists without a recognisable version.
    ``existing_tables`` names the queue's other tables found in the database; with no
    executions table, any of them means a half-installed queue, which is left alone.
    """
    where = f"{target.schema + '.' if target.schema else ''}{target.prefix}*"
    if db_version is None:
        if existing_tables:
            warnings.warn(
                f"sqla_queue tables {where}: {', '.join(existing_tables)} found but "
                f"{target.tables.executions.name} not; autogenerate leaves this half-installed "
                "queue alone. Drop the leftover tables or finish the install by hand.",
                QueueSchemaWarning,
                stacklevel=2,
            )
            return None
        return CreateQueueOp(
            target.schema, target.prefix, version=target.version, history=target.history
        )
    if db_version == 0:
        warnings.warn(
            f"sqla_queue tables {where} exist but carry no schema version comment; "
            "autogenerate leaves them alone. Were they created by hand?",
            QueueSchemaWarning,
            stacklevel=2,
        )
        return None
    if db_version < target.version:
        return UpgradeQueueOp(db_version, target.version, target.schema, target.prefix)
    if db_version > target.version:
        warnings.warn(
            f"sqla_queue tables {where} are at schema version {db_version}, newer than this "
            f"library's {target.version}; autogenerate will not downgrade them. Upgrade "
            "sqla_queue, or write op.upgrade_queue(...) down by hand if you really mean it.",
            QueueSchemaWarning,
            stacklevel=2,
        )
    return None


def _included(autogen_context: AutogenContext, target: QueueTarget) -> bool:
    default_schema = autogen_context.dialect.default_schema_name
    # The name filters see the schema as reflection does: after a schema_translate_map.
    in_database = translated_schema(target.schema, _translate_map(autogen_context))
    # Alembic names the default schema None when it asks the filters; so do we.
    schema_name = None if in_database == default_schema else in_database
    if (
        schema_name is not None
        and autogen_context.opts.get("include_schemas", False)
        and not autogen_context.run_name_filters(schema_name, "schema", {})
    ):
        return False
    # The queue operation touches every table of the queue, so one excluded table is enough
    # to leave the whole queue alone (a filter written for version 1 names only two).
    for table in target.tables.all:
        if not autogen_context.run_name_filters(table.name, "table", {"schema_name": schema_name}):
            return False
        if not autogen_context.run_object_filters(table, table.name, "table", False, None):
            return False
    return True


def _op_key(op: MigrateOperation, default_schema: str | None) -> TableKey | None:
    table_name = getattr(op, "table_name", None)
    if not isinstance(table_name, str):
        return None
    schema = getattr(op, "schema", None)
    return (None if schema == default_schema else schema, table_name)


def _without(
    ops: Iterable[MigrateOperation], keys: set[TableKey], default_schema: str | None
) -> list[MigrateOperation]:
    return [op for op in ops if _op_key(op, default_schema) not in keys]


def _dropped_queues(
    ops: list[MigrateOperation], default_schema: str | None
) -> tuple[list[DropQueueOp], set[TableKey]]:
    """Queues whose tables Alembic wants to drop because no Queue declares them any more."""
    dropped = {
        key: op
        for op in ops
        if isinstance(op, DropTableOp) and (key := _op_key(op, default_schema)) is not None
    }
    queue_ops: list[DropQueueOp] = []
    owned: set[TableKey] = set()
    for (schema, name), op in dropped.items():
        comment = getattr(op, "comment", None) or op.table_kw.get("comment")
        version = parse_schema_version_comment(comment)
        if not name.endswith(_EXECUTIONS_SUFFIX) or version is None:
            continue
        prefix = name[: -len(_EXECUTIONS_SUFFIX)]
        try:
            keys = {(schema, prefix + suffix) for suffix in versions.table_suffixes(version)}
            drop = DropQueueOp(schema, prefix, version=version)
        except (InvalidIdentifierError, TypeError, versions.UnknownSchemaVersionError):
            continue
        # drop_queue drops every table of its version: only when Alembic drops all of them
        # (none kept by a filter) may one drop_queue stand in for them.
        if not keys <= dropped.keys():
            continue
        queue_ops.append(drop)
        owned |= keys
    return queue_ops, owned


def rewrite_upgrade_ops(
    upgrade_ops: UpgradeOps,
    queue_ops: Sequence[MigrateOperation],
    owned: set[TableKey],
    default_schema: str | None,
) -> None:
    """Put ``queue_ops`` in place of whatever Alembic proposed for the ``owned`` tables.

    Also turns Alembic's ``drop_table`` of all of a queue's tables (recognised by the version
    comment on the executions table, which says which tables that version has) into one
    ``drop_queue``. ``owned`` holds ``(schema, table)`` pairs with the default schema
    spelled ``None``, as Alembic does.
    """
    rest = _without(upgrade_ops.ops, owned, default_schema)
    drops, dropped_tables = _dropped_queues(rest, default_schema)
    rest = _without(rest, dropped_tables, default_schema)
    # Queue tables first and last: a host table may reference the jobs table, never the
    # other way round, and the downgrade (the reverse list) then drops the queue last.
    upgrade_ops.ops[:] = [*queue_ops, *rest, *drops]


def _targets(autogen_context: AutogenContext) -> list[QueueTarget]:
    return [t for t in find_queues(autogen_context.metadata) if _included(autogen_context, t)]


def _translate_map(autogen_context: AutogenContext) -> Mapping[Any, Any] | None:
    """The migration connection's ``schema_translate_map``, if it has one."""
    connection = autogen_context.connection
    if connection is None:
        return None
    found = connection.get_execution_options().get("schema_translate_map")
    return found if isinstance(found, Mapping) else None


class OwnedTables(set[TableKey]):
    """The ``(schema, table)`` keys of the queues' tables, plus the partitions of a
    partitioned history: any table of the queue's schema named ``<jobs table>_...``
    (their names carry dates, so they are matched by prefix)."""

    def __init__(self) -> None:
        super().__init__()
        self.partition_prefixes: set[TableKey] = set()

    def __contains__(self, key: object) -> bool:
        if super().__contains__(key):
            return True
        if not isinstance(key, tuple) or len(key) != 2 or not isinstance(key[1], str):
            return False
        return any(
            key[0] == schema and key[1].startswith(prefix)
            for schema, prefix in self.partition_prefixes
        )


def _owned_keys(
    targets: Sequence[QueueTarget],
    default_schema: str | None,
    translate_map: Mapping[Any, Any] | None = None,
) -> OwnedTables:
    """The ``(schema, table)`` keys of the queues' tables, as Alembic spells them.

    Under a ``schema_translate_map`` the metadata names a table by its schema as declared,
    and reflection by the schema it was translated to; both spellings belong to the queue.
    """
    owned = OwnedTables()
    for target in targets:
        for where in {target.schema, translated_schema(target.schema, translate_map)}:
            schema = None if where == default_schema else where
            owned |= {(schema, t.name) for t in target.tables.all}
            if target.history == HistoryLayout.PARTITIONED:
                owned.partition_prefixes.add((schema, f"{target.tables.jobs.name}_"))
    return owned


def hide_queue_tables(autogen_context: AutogenContext, upgrade_ops: UpgradeOps) -> None:
    """Before Alembic's own comparison: settle which queues take part, then hide their tables.

    The host's filters decide first. Then two filters of our own keep Alembic from reflecting
    and comparing the queue's tables at all, so it neither logs "Detected added table" for
    them nor spends reflection queries on them. The filter lists are not public API; without
    them, :func:`compare_queues` still removes Alembic's proposals afterwards.
    """
    if _TARGETS in upgrade_ops.info:
        return
    targets = _targets(autogen_context)
    upgrade_ops.info[_TARGETS] = targets
    default_schema = autogen_context.dialect.default_schema_name
    # Also the tables of a queue the host's filters left out: a filter that names only some
    # of them must not turn the others into create_table or drop_table.
    hidden = _owned_keys(
        find_queues(autogen_context.metadata), default_schema, _translate_map(autogen_context)
    )
    if not hidden:
        return

    def key(schema: str | None, name: str | None) -> TableKey:
        return (None if schema == default_schema else schema, str(name))

    def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
        return type_ != "table" or key(parent_names.get("schema_name"), name) not in hidden

    def include_object(
        obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
    ) -> bool:
        return type_ != "table" or key(getattr(obj, "schema", None), name) not in hidden

    name_filters = getattr(autogen_context, "_name_filters", None)
    object_filters = getattr(autogen_context, "_object_filters", None)
    if isinstance(name_filters, list) and isinstance(object_filters, list):
        name_filters.append(include_name)
        object_filters.append(include_object)


def compare_queues(autogen_context: AutogenContext, upgrade_ops: UpgradeOps) -> None:
    """Replace Alembic's proposals for queue tables with queue operations (see module doc)."""
    if upgrade_ops.info.get(_DONE):
        return
    upgrade_ops.info[_DONE] = True
    connection = autogen_context.connection
    if connection is None:
        return
    default_schema = autogen_context.dialect.default_schema_name
    targets: list[QueueTarget] = upgrade_ops.info.get(_TARGETS) or _targets(autogen_context)

    translate_map = _translate_map(autogen_context)
    queue_ops: list[MigrateOperation] = []
    for target in targets:
        # The database is read where the connection puts the tables; the operation keeps
        # the declared schema, which the same translation moves when it runs.
        in_database = replace(target.tables, schema=translated_schema(target.schema, translate_map))
        report = inspect_schema(connection, in_database)
        absent = {m.table for m in report.missing if m.kind == "table"}
        others = [t for t in target.tables.all if t is not target.tables.executions]
        existing = [t.name for t in others if t.name not in absent]
        op = plan_queue_op(target, report.version, existing_tables=existing)
        if op is not None:
            log.info("Detected sqla_queue change: %r", op)
            queue_ops.append(op)
        elif report.version == target.version and not report.ok:
            listing = "; ".join(report.problems(in_database.schema))
            warnings.warn(
                f"sqla_queue tables are at schema version {report.version} but differ from "
                f"it: {listing}. Autogenerate does not repair hand-made changes; "
                "`sqla-queue verify` shows the same list.",
                QueueSchemaWarning,
                stacklevel=2,
            )
    owned = _owned_keys(find_queues(autogen_context.metadata), default_schema, translate_map)
    rewrite_upgrade_ops(upgrade_ops, queue_ops, owned, default_schema)
