"""Which schema a queue's tables live in: as declared, and as a connection sees it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import MetaData

from sqla_queue._identifiers import validate_schema
from sqla_queue.errors import InvalidIdentifierError

__all__ = ["resolve_schema", "translated_schema"]


def resolve_schema(metadata: MetaData, schema: str | None) -> str | None:
    """The schema the queue's tables live in: ``schema`` if given, else ``metadata.schema``.

    A table added to ``MetaData(schema="app")`` without a schema of its own goes to ``app``,
    so the queue must record ``app`` too: its migration operation, verification, NOTIFY
    channel and autogenerate comparison all name the schema it records. Giving both, with
    different names, raises :class:`~sqla_queue.errors.InvalidIdentifierError` naming both:
    the queue's tables would leave the metadata's schema, which is rarely what was meant.
    """
    declared = metadata.schema
    if declared is not None:
        try:
            declared = validate_schema(str(declared))
        except InvalidIdentifierError as exc:
            raise InvalidIdentifierError(f"the metadata's schema: {exc}") from None
    if schema is None:
        return declared
    schema = validate_schema(schema)
    if declared is not None and schema != declared:
        raise InvalidIdentifierError(
            f"conflicting schemas for the queue: Queue(schema={schema!r}), but its metadata "
            f"is MetaData(schema={declared!r}). Name the schema once: leave schema= out to "
            f"put the queue in {declared!r}, or pass the same name to both"
        )
    return schema


def translated_schema(schema: str | None, translate_map: Mapping[Any, Any] | None) -> str | None:
    """``schema`` as a connection with the ``schema_translate_map`` option names it.

    SQLAlchemy applies the map to the statements it compiles from the tables; SQL written
    by name (the frozen migration DDL, the catalog query) must apply it the same way. A
    schema absent from the map, or no map, is left as it is.
    """
    if not translate_map or schema not in translate_map:
        return schema
    translated = translate_map[schema]
    return None if translated is None else str(translated)
