"""The list of database objects that the current schema version needs.

It is derived from the table definitions, so a new index or column is in the manifest the
moment it is in the model, and verification can never lag behind the claim that uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import CheckConstraint, ForeignKeyConstraint, Table

from sqla_queue.models.tables import QueueTables

__all__ = ["RequiredObject", "required_objects"]


@dataclass(frozen=True, order=True)
class RequiredObject:
    """One object the library needs: its kind, the table it belongs to and its name."""

    kind: str  # "table" | "column" | "index" | "constraint"
    table: str
    name: str

    def describe(self, schema: str | None) -> str:
        """A human name such as ``index app.sqla_queue_job_executions_claim_ix``."""
        where = f"{schema}." if schema else ""
        if self.kind == "table":
            return f"table {where}{self.table}"
        if self.kind == "column":
            return f"column {where}{self.table}.{self.name}"
        return f"{self.kind} {where}{self.name} (on {self.table})"


def _objects_of(table: Table) -> list[RequiredObject]:
    found = [RequiredObject("table", table.name, table.name)]
    found += [RequiredObject("column", table.name, c.name) for c in table.columns]
    found += [RequiredObject("index", table.name, str(ix.name)) for ix in table.indexes]
    for constraint in table.constraints:
        if isinstance(constraint, CheckConstraint | ForeignKeyConstraint) and constraint.name:
            found.append(RequiredObject("constraint", table.name, str(constraint.name)))
    return found


def required_objects(tables: QueueTables) -> list[RequiredObject]:
    """Every table, column, index and named constraint the queue needs, sorted."""
    return sorted(_objects_of(tables.jobs) + _objects_of(tables.executions))
