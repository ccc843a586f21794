"""The list of database objects that the current schema version needs.

It is derived from the table definitions, so a new index or column is in the manifest the
moment it is in the model, and verification can never lag behind the claim that uses it.

Besides names, the manifest records what matters about an object's shape and is cheap to
compare in the same catalog query: a column's type and nullability, an index's uniqueness,
columns and partial predicate, a constraint's kind. An index with the right name and the
wrong predicate would otherwise pass, and a claim relying on it could quietly misbehave.

It also lists the privileges the connected role needs at run time (:func:`required_privileges`):
the grants of the deployment guide's application role, which verification checks in the same
catalog query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlalchemy import CheckConstraint, ForeignKeyConstraint, Index, PrimaryKeyConstraint, Table
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.schema import CreateIndex

from sqla_queue.models.tables import HistoryLayout, QueueTables

__all__ = [
    "ADMIN_LIMIT_PRIVILEGES",
    "DATA_PRIVILEGES",
    "RequiredObject",
    "RequiredPrivilege",
    "constraint_kind",
    "index_shape",
    "normalize_type",
    "required_objects",
    "required_privileges",
]

_DIALECT = PGDialect()  # type: ignore[no-untyped-call]
# Casts that pg_get_indexdef adds to literals, e.g. 'x'::text, 'y'::character varying(20).
_CAST = re.compile(
    r"::(?:character varying|double precision|time(?:stamp)? with(?:out)? time zone"
    r"|[a-z_][a-z0-9_.]*)(?:\(\d+(?:,\s*\d+)?\))?(?:\[\])?"
)
_SPACES = re.compile(r"\s+")
# SQLAlchemy's spelling on the left, PostgreSQL's format_type() spelling on the right.
_TYPE_ALIASES = {
    "varchar": "character varying",
    "timestamp": "timestamp without time zone",
    "time": "time without time zone",
    "float": "double precision",
    "bool": "boolean",
    "int": "integer",
}
_CONSTRAINT_KINDS = {"p": "primary key", "f": "foreign key", "c": "check", "u": "unique"}


def normalize_type(spelling: str) -> str:
    """A column type as PostgreSQL's ``format_type`` would print it (lower case)."""
    text = _SPACES.sub(" ", spelling.strip().lower())
    base, paren, rest = text.partition("(")
    base = _TYPE_ALIASES.get(base.strip(), base.strip())
    return f"{base}({rest}" if paren else base


def index_shape(definition: str) -> str:
    """The comparable part of a ``CREATE [UNIQUE] INDEX`` statement.

    Both SQLAlchemy's DDL and ``pg_get_indexdef`` reduce to the same string: uniqueness, key
    columns with their order, and the partial predicate, without the index and table names,
    the access method, casts such as ``::text`` or parentheses.
    """
    unique = definition.lstrip().upper().startswith("CREATE UNIQUE INDEX")
    _, _, tail = definition.partition(" ON ")
    opening = tail.find("(")
    body = tail[opening:] if opening >= 0 else tail
    body = _CAST.sub("", body).replace("(", " ").replace(")", " ")
    body = _SPACES.sub(" ", body).strip().lower()
    return f"{'unique ' if unique else ''}{body}"


@dataclass(frozen=True, order=True)
class RequiredObject:
    """One object the library needs: its kind, the table it belongs to and its name.

    ``shape`` is what the object must look like (see the module docstring); an empty shape
    means only existence is checked.
    """

    kind: str  # "table" | "column" | "index" | "constraint"
    table: str
    name: str
    shape: str = field(default="", compare=False)

    def describe(self, schema: str | None) -> str:
        """A human name such as ``index app.sqla_queue_job_executions_claim_ix``."""
        where = f"{schema}." if schema else ""
        if self.kind == "table":
            return f"table {where}{self.table}"
        if self.kind == "column":
            return f"column {where}{self.table}.{self.name}"
        return f"{self.kind} {where}{self.name} (on {self.table})"


def _column_shape(table: Table, name: str) -> str:
    column = table.c[name]
    spelled = normalize_type(column.type.compile(dialect=_DIALECT))
    return f"{spelled} {'null' if column.nullable else 'not null'}"


def _index(table: Table, index: Index) -> RequiredObject:
    ddl = str(CreateIndex(index).compile(dialect=_DIALECT))
    return RequiredObject("index", table.name, str(index.name), index_shape(ddl))


def _objects_of(table: Table) -> list[RequiredObject]:
    found = [RequiredObject("table", table.name, table.name)]
    found += [
        RequiredObject("column", table.name, c.name, _column_shape(table, c.name))
        for c in table.columns
    ]
    found += [_index(table, ix) for ix in table.indexes]
    for constraint in table.constraints:
        if isinstance(constraint, PrimaryKeyConstraint):
            # Unnamed, PostgreSQL calls it <table>_pkey; a host naming convention names it.
            name = str(constraint.name) if constraint.name else f"{table.name}_pkey"
            found.append(RequiredObject("constraint", table.name, name, "primary key"))
        elif isinstance(constraint, CheckConstraint | ForeignKeyConstraint) and constraint.name:
            kind = "check" if isinstance(constraint, CheckConstraint) else "foreign key"
            found.append(RequiredObject("constraint", table.name, str(constraint.name), kind))
    return found


def constraint_kind(contype: str) -> str:
    """The manifest's word for a ``pg_constraint.contype`` letter."""
    return _CONSTRAINT_KINDS.get(contype, contype)


def _history_objects(tables: QueueTables) -> list[RequiredObject]:
    """The partitioned history's own tables, in place of the jobs table's primary key.

    A partitioned table has no primary key of its own (see ``build_tables``): the live
    partition carries it. The time partitions come and go, and are not listed.
    """
    jobs = tables.jobs.name
    live = f"{jobs}_live"
    return [
        RequiredObject("table", live, live),
        RequiredObject("constraint", live, f"{live}_pkey", "primary key"),
        RequiredObject("table", f"{jobs}_done", f"{jobs}_done"),
        RequiredObject("table", f"{jobs}_failed", f"{jobs}_failed"),
    ]


def required_objects(tables: QueueTables) -> list[RequiredObject]:
    """Every table, column, index and named constraint the queue needs, sorted."""
    found: list[RequiredObject] = []
    for table in tables.all:
        found += _objects_of(table)
    if tables.history == HistoryLayout.PARTITIONED:
        jobs_key = next(
            o for o in found if o.table == tables.jobs.name and o.shape == "primary key"
        )
        found.remove(jobs_key)
        found += _history_objects(tables)
    return sorted(found)


#: The table privileges a producer and a worker need on the jobs, executions and unique
#: keys tables.
DATA_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
#: What changing a stored limit needs on the limits table, beyond ``SELECT`` (set_limit).
ADMIN_LIMIT_PRIVILEGES = ("INSERT", "UPDATE", "DELETE")


@dataclass(frozen=True, order=True)
class RequiredPrivilege:
    """One privilege the connected role needs: ``USAGE`` on a schema, or one on a table.

    ``kind`` is ``"schema"`` (``name`` is the schema) or ``"table"`` (``name`` is the
    table, in the queue's schema).
    """

    kind: str  # "schema" | "table"
    name: str
    privilege: str

    def describe(self, schema: str) -> str:
        """A human name such as ``SELECT on table app.sqla_queue_task_limits``."""
        if self.kind == "schema":
            return f"{self.privilege} on schema {self.name}"
        return f"{self.privilege} on table {schema}.{self.name}"


def required_privileges(tables: QueueTables, schema: str) -> list[RequiredPrivilege]:
    """What a worker and a producer need, ``schema`` being the queue's resolved schema.

    ``USAGE`` on the schema; ``SELECT``, ``INSERT``, ``UPDATE`` and ``DELETE`` on the jobs,
    executions and unique keys tables (an enqueue with a unique key takes or updates its
    row there, and the key is released and pruned later) and on the tables the worker's
    own bookkeeping writes (the starts of rate-limited tasks, the periodic schedules' last
    ticks, the daemons' owners, the live workers) and on the workflow tables (a producer
    enqueues a workflow's nodes and dependencies, and a worker's completion of a node
    releases its dependents); ``SELECT`` on the limits table, which every claim reads;
    ``SELECT`` and ``UPDATE`` on the task controls, which the maintenance reads and a claim
    of a rate-limited task locks (``FOR UPDATE``). Writing the limits and the controls is
    for the operators who change them (:data:`ADMIN_LIMIT_PRIVILEGES`), not required here.
    These are exactly the deployment guide's application-role grants.
    """
    needed = [RequiredPrivilege("schema", schema, "USAGE")]
    written = (
        tables.jobs,
        tables.executions,
        tables.unique_keys,
        tables.rate_starts,
        tables.schedules,
        tables.daemons,
        tables.workers,
        tables.workflows,
        tables.workflow_nodes,
        tables.workflow_edges,
        tables.job_steps,
        tables.job_signals,
    )
    for table in written:
        needed += [RequiredPrivilege("table", table.name, p) for p in DATA_PRIVILEGES]
    needed.append(RequiredPrivilege("table", tables.limits.name, "SELECT"))
    needed += [RequiredPrivilege("table", tables.controls.name, p) for p in ("SELECT", "UPDATE")]
    return needed
