"""``op.create_queue``, ``op.drop_queue`` and ``op.upgrade_queue``.

Each operation runs the frozen SQL of the schema version it names and nothing else: no
reflection, no ``get_bind()``. So ``alembic upgrade --sql`` prints the complete script, and a
migration written today means the same thing after the library's models have moved on.
"""

from __future__ import annotations

from typing import Any

from alembic.operations import MigrateOperation, Operations

from alembic_ext import versions
from alembic_ext.versions.history import INTERVALS as HISTORY_INTERVALS
from alembic_ext.versions.history import partition_statements, unpartition_statements
from sqla_queue._identifiers import validate_prefix, validate_schema
from sqla_queue.models.tables import (
    DEFAULT_PREFIX,
    HistoryLayout,
    check_history,
    translated_schema,
)

__all__ = [
    "CreateQueueOp",
    "DropQueueOp",
    "PartitionHistoryOp",
    "QueueOp",
    "UnpartitionHistoryOp",
    "UpgradeQueueOp",
    "run_create_queue",
    "run_drop_queue",
    "run_partition_history",
    "run_unpartition_history",
    "run_upgrade_queue",
    "target_schema",
]


def _check_version(version: object, argument: str) -> int:
    # bool is an int; a stray True must not silently mean version 1.
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TypeError(f"{argument} must be a positive int schema version, got {version!r}")
    return version


class QueueOp(MigrateOperation):
    """What the three queue operations share: where the queue lives."""

    _fields: tuple[str, ...] = ("schema", "prefix")

    def __init__(self, schema: str | None, prefix: str) -> None:
        self.schema = validate_schema(schema)
        self.prefix = validate_prefix(prefix)

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash((type(self), self._key()))

    def __repr__(self) -> str:
        shown = [n for n in self._fields if not (n == "history" and getattr(self, n) == "plain")]
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{type(self).__name__}({fields})"


class _AtVersionOp(QueueOp):
    """An operation on the queue's tables as they are at one frozen schema version."""

    _fields: tuple[str, ...] = ("schema", "prefix", "version")

    def __init__(
        self, schema: str | None = None, prefix: str = DEFAULT_PREFIX, *, version: int
    ) -> None:
        super().__init__(schema, prefix)
        self.version = _check_version(version, "version")


class _WholeQueueOp(_AtVersionOp):
    """Creating or dropping a whole queue: at one version, in one history layout."""

    _fields = ("schema", "prefix", "version", "history")

    def __init__(
        self,
        schema: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        *,
        version: int,
        history: str = "plain",
    ) -> None:
        super().__init__(schema, prefix, version=version)
        self.history = check_history(history)


class CreateQueueOp(_WholeQueueOp):
    """Create the queue's tables at one frozen schema version."""

    @classmethod
    def create_queue(
        cls,
        operations: Operations,
        schema: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        *,
        version: int,
        history: str = "plain",
    ) -> None:
        """Create the sqla_queue tables, indexes and constraints of schema ``version``.

        ``version`` is required and frozen into the migration: the same migration creates the
        same schema with every later release of the library. A named ``schema`` is created
        if it does not exist. ``history="partitioned"`` creates the jobs table partitioned
        by status and finish time (``Queue(history="partitioned")``, see
        :mod:`sqla_queue.history`), with daily partitions.
        """
        operations.invoke(cls(schema, prefix, version=version, history=history))

    def reverse(self) -> DropQueueOp:
        """Dropping the queue at the same version."""
        return DropQueueOp(self.schema, self.prefix, version=self.version, history=self.history)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        """``("create_queue", schema, prefix, version)``, as ``compare_metadata`` lists it
        (``history`` appended when partitioned)."""
        base = ("create_queue", self.schema, self.prefix, self.version)
        return base if self.history == "plain" else (*base, self.history)


class DropQueueOp(_WholeQueueOp):
    """Drop the queue's tables, as they are at one schema version."""

    @classmethod
    def drop_queue(
        cls,
        operations: Operations,
        schema: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        *,
        version: int,
        history: str = "plain",
    ) -> None:
        """Drop the sqla_queue tables of schema ``version``, with every job in them.

        The schema itself is kept: it may hold other tables. A partitioned jobs table goes
        with its partitions; ``history`` only says what the downgrade creates again.
        """
        operations.invoke(cls(schema, prefix, version=version, history=history))

    def reverse(self) -> CreateQueueOp:
        """Creating the queue again at the same version (empty)."""
        return CreateQueueOp(self.schema, self.prefix, version=self.version, history=self.history)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        """``("drop_queue", schema, prefix, version)``."""
        return ("drop_queue", self.schema, self.prefix, self.version)


class UpgradeQueueOp(QueueOp):
    """Move the queue's tables from one schema version to another, keeping their rows."""

    _fields = ("from_version", "to_version", "schema", "prefix")

    def __init__(
        self,
        from_version: int,
        to_version: int,
        schema: str | None = None,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        super().__init__(schema, prefix)
        self.from_version = _check_version(from_version, "from_version")
        self.to_version = _check_version(to_version, "to_version")

    @classmethod
    def upgrade_queue(
        cls,
        operations: Operations,
        from_version: int,
        to_version: int,
        schema: str | None = None,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        """Run the frozen steps from ``from_version`` to ``to_version`` (either direction).

        Rows survive: every step alters the tables in place.
        """
        operations.invoke(cls(from_version, to_version, schema, prefix))

    def reverse(self) -> UpgradeQueueOp:
        """The same path walked backwards."""
        return UpgradeQueueOp(self.to_version, self.from_version, self.schema, self.prefix)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        """``("upgrade_queue", schema, prefix, from_version, to_version)``."""
        return ("upgrade_queue", self.schema, self.prefix, self.from_version, self.to_version)


class PartitionHistoryOp(_AtVersionOp):
    """Turn the queue's jobs table into the partitioned history layout, keeping its rows."""

    _fields = ("schema", "prefix", "version", "interval")

    def __init__(
        self,
        schema: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        *,
        version: int,
        interval: str = "day",
    ) -> None:
        super().__init__(schema, prefix, version=version)
        if interval not in HISTORY_INTERVALS:
            raise ValueError(
                f"interval must be one of {', '.join(HISTORY_INTERVALS)}, got {interval!r}"
            )
        self.interval = interval

    @classmethod
    def partition_history(
        cls,
        operations: Operations,
        schema: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        *,
        version: int,
        interval: str = "day",
    ) -> None:
        """Move the jobs of schema ``version`` into the partitioned history layout.

        Every job is copied into the new table (finished ones land in the default
        partitions; ``sqla-queue maintain --backfill`` moves them into time ranges), the job
        ids carry on, and the old table's grants are given again. ``interval`` is the length
        of a time partition: ``hour``, ``day``, ``week`` or ``month``.
        """
        operations.invoke(cls(schema, prefix, version=version, interval=interval))

    def reverse(self) -> UnpartitionHistoryOp:
        """Back to one plain jobs table."""
        return UnpartitionHistoryOp(self.schema, self.prefix, version=self.version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        """``("partition_history", schema, prefix, version, interval)``."""
        return ("partition_history", self.schema, self.prefix, self.version, self.interval)


class UnpartitionHistoryOp(_AtVersionOp):
    """Turn a partitioned jobs table back into one plain table, keeping its rows."""

    @classmethod
    def unpartition_history(
        cls,
        operations: Operations,
        schema: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        *,
        version: int,
    ) -> None:
        """Copy every job of the partitioned layout into one plain jobs table."""
        operations.invoke(cls(schema, prefix, version=version))

    def reverse(self) -> PartitionHistoryOp:
        """Partitioned again (daily)."""
        return PartitionHistoryOp(self.schema, self.prefix, version=self.version)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        """``("unpartition_history", schema, prefix, version)``."""
        return ("unpartition_history", self.schema, self.prefix, self.version)


def _execute_all(operations: Operations, statements: list[str]) -> None:
    for statement in statements:
        operations.execute(statement)


def target_schema(operations: Operations, schema: str | None) -> str | None:
    """The schema an operation writes to: ``schema`` through the connection's translate map.

    Alembic's own operations compile tables on the migration connection, so a
    ``schema_translate_map`` execution option (one migration run per tenant schema) moves
    them; the frozen DDL names its schema in text, so the queue operations apply the map
    themselves. Offline (``--sql``) there is no connection, and ``schema`` is written as it
    is, like Alembic writes the schema of its own tables.
    """
    context = operations.migration_context
    connection = context.connection
    if context.as_sql or connection is None:
        return schema
    translate_map = connection.get_execution_options().get("schema_translate_map")
    return translated_schema(schema, translate_map)


def run_create_queue(operations: Operations, operation: CreateQueueOp) -> None:
    """Implementation of :class:`CreateQueueOp`: frozen DDL only, so ``--sql`` works."""
    schema = target_schema(operations, operation.schema)
    statements = versions.create_statements(operation.version, schema, operation.prefix)
    if operation.history == HistoryLayout.PARTITIONED:
        statements += partition_statements(operation.version, schema, operation.prefix)
    _execute_all(operations, statements)


def run_drop_queue(operations: Operations, operation: DropQueueOp) -> None:
    """Implementation of :class:`DropQueueOp`."""
    schema = target_schema(operations, operation.schema)
    statements = versions.drop_statements(operation.version, schema, operation.prefix)
    _execute_all(operations, statements)


def run_upgrade_queue(operations: Operations, operation: UpgradeQueueOp) -> None:
    """Implementation of :class:`UpgradeQueueOp`."""
    schema = target_schema(operations, operation.schema)
    statements = versions.migrate_statements(
        operation.from_version, operation.to_version, schema, operation.prefix
    )
    _execute_all(operations, statements)


def run_partition_history(operations: Operations, operation: PartitionHistoryOp) -> None:
    """Implementation of :class:`PartitionHistoryOp`: frozen DDL only."""
    schema = target_schema(operations, operation.schema)
    _execute_all(
        operations,
        partition_statements(operation.version, schema, operation.prefix, operation.interval),
    )


def run_unpartition_history(operations: Operations, operation: UnpartitionHistoryOp) -> None:
    """Implementation of :class:`UnpartitionHistoryOp`: frozen DDL only."""
    schema = target_schema(operations, operation.schema)
    _execute_all(operations, unpartition_statements(operation.version, schema, operation.prefix))
