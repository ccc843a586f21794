"""DDL for the queue's tables outside Alembic (tests, scripts, ``queue.create_all``)."""

from __future__ import annotations

from sqlalchemy import Connection
from sqlalchemy.schema import CreateSchema

from sqla_queue.models.tables import QueueTables, translated_schema

__all__ = ["create_queue_schema", "drop_queue_schema"]


def create_queue_schema(connection: Connection, tables: QueueTables) -> None:
    """Create the schema (if named and absent) and the queue's tables and indexes.

    The schema is the one the tables go to: on a connection with a
    ``schema_translate_map`` (a tenant's), the translated one.
    """
    translate = connection.get_execution_options().get("schema_translate_map")
    schema = translated_schema(tables.schema, translate)
    if schema is not None:
        connection.execute(CreateSchema(schema, if_not_exists=True))
    tables.jobs.metadata.create_all(connection, tables=list(tables.all))


def drop_queue_schema(connection: Connection, tables: QueueTables) -> None:
    """Drop the queue's tables; the schema itself is left, it may hold the host's tables."""
    tables.jobs.metadata.drop_all(connection, tables=list(reversed(tables.all)))
