"""DDL for the queue's tables outside Alembic (tests, scripts, ``queue.create_all``)."""

from __future__ import annotations

from sqlalchemy import Connection
from sqlalchemy.schema import CreateSchema

from sqla_queue.models.tables import QueueTables

__all__ = ["create_queue_schema", "drop_queue_schema"]


def create_queue_schema(connection: Connection, tables: QueueTables) -> None:
    """Create the schema (if named and absent) and the queue's tables and indexes."""
    if tables.schema is not None:
        connection.execute(CreateSchema(tables.schema, if_not_exists=True))
    tables.jobs.metadata.create_all(connection, tables=list(tables.all))


def drop_queue_schema(connection: Connection, tables: QueueTables) -> None:
    """Drop the queue's tables; the schema itself is left, it may hold the host's tables."""
    tables.jobs.metadata.drop_all(connection, tables=list(reversed(tables.all)))
