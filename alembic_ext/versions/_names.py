"""Quoted identifiers for the frozen DDL templates.

The templates name every object through a placeholder, so that the SQL text itself never
changes while the schema and prefix can. Quoting goes through PostgreSQL's own identifier
preparer: a schema called ``user`` or ``order`` comes out as ``"user"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from sqlalchemy.dialects.postgresql.base import PGDialect

from sqla_queue._identifiers import validate_prefix, validate_schema

__all__ = ["Names"]

_PREPARER = PGDialect().identifier_preparer  # type: ignore[no-untyped-call]


class Names(Mapping[str, str]):
    """Placeholder values for ``str.format_map`` over a frozen template.

    ``{schema}`` is the quoted schema, ``{schema_dot}`` the quoted schema and a dot (empty
    without a schema); a key listed in ``tables`` is the prefixed table name,
    schema-qualified; any other key is the prefixed name of an index or constraint, quoted but
    not qualified (PostgreSQL puts those in their table's schema).
    """

    def __init__(self, schema: str | None, prefix: str, tables: frozenset[str]) -> None:
        self.schema = validate_schema(schema)
        self.prefix = validate_prefix(prefix)
        self._tables = tables

    def __getitem__(self, key: str) -> str:
        if key == "schema_dot":
            # Qualifies an index name where PostgreSQL needs it (DROP INDEX).
            return "" if self.schema is None else f"{_PREPARER.quote_schema(self.schema)}."
        if key == "schema":
            if self.schema is None:
                raise KeyError("this template needs a schema, and none was given")
            return _PREPARER.quote_schema(self.schema)
        name = _PREPARER.quote(self.prefix + key)
        if key in self._tables and self.schema is not None:
            return f"{_PREPARER.quote_schema(self.schema)}.{name}"
        return name

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def render(self, template: str) -> str:
        """The template with every placeholder replaced."""
        return template.format_map(self)
