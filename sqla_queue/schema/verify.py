"""Startup verification: one catalog query, and a clear refusal when anything is missing."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql.base import PGDialect

from sqla_queue.errors import InsufficientPrivilegeError, SchemaMismatchError
from sqla_queue.models.tables import (
    SCHEMA_VERSION,
    QueueTables,
    parse_schema_version_comment,
    translated_schema,
)
from sqla_queue.schema.manifest import (
    DATA_PRIVILEGES,
    RequiredObject,
    RequiredPrivilege,
    constraint_kind,
    index_shape,
    normalize_type,
    required_objects,
    required_privileges,
)

__all__ = [
    "CATALOG_QUERY",
    "FIX_COMMAND",
    "GRANTS_GUIDE",
    "SchemaReport",
    "find_missing",
    "grant_statements",
    "inspect_schema",
    "verify_schema",
]

FIX_COMMAND = "alembic upgrade head"
#: Where the grants of each role are explained.
GRANTS_GUIDE = "the deployment guide, section Least-privilege roles"

_QUOTE = PGDialect().identifier_preparer.quote  # type: ignore[no-untyped-call]

# One round trip for everything: tables, columns with type and nullability, indexes with
# their definitions, constraints with their kind, and the version comment, restricted to the
# queue's own tables in its schema; then the current role's privileges on that schema and
# those tables (has_*_privilege counts grants to PUBLIC and to roles it inherits from), and
# the role's name for the GRANT that fixes a missing one.
CATALOG_QUERY = text(
    """
    WITH s AS (
        SELECT n.oid, n.nspname
        FROM pg_catalog.pg_namespace n
        WHERE n.nspname = coalesce(:schema, current_schema())
    ),
    t AS (
        SELECT c.oid, c.relname
        FROM pg_catalog.pg_class c
        JOIN s ON s.oid = c.relnamespace
        WHERE c.relkind IN ('r', 'p')
          AND c.relname = ANY(:tables)
    )
    SELECT 'table' AS kind, t.relname AS tbl, t.relname AS name, NULL::text AS detail FROM t
    UNION ALL
    SELECT 'column', t.relname, a.attname::text,
           pg_catalog.format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN '|not null' ELSE '|null' END
    FROM t JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid
    WHERE a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'index', t.relname, i.relname::text, pg_catalog.pg_get_indexdef(x.indexrelid)
    FROM t JOIN pg_catalog.pg_index x ON x.indrelid = t.oid
    JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
    UNION ALL
    SELECT 'constraint', t.relname, con.conname::text, con.contype::text
    FROM t JOIN pg_catalog.pg_constraint con ON con.conrelid = t.oid
    UNION ALL
    SELECT 'comment', t.relname, t.relname, obj_description(t.oid, 'pg_class') FROM t
    UNION ALL
    SELECT 'privilege', t.relname, p.privilege,
           CASE WHEN pg_catalog.has_table_privilege(t.oid, p.privilege) THEN 'granted' END
    FROM t CROSS JOIN (VALUES ('SELECT'), ('INSERT'), ('UPDATE'), ('DELETE')) AS p(privilege)
    UNION ALL
    SELECT 'schema privilege', s.nspname, 'USAGE',
           CASE WHEN pg_catalog.has_schema_privilege(s.oid, 'USAGE') THEN 'granted' END
    FROM s
    UNION ALL
    SELECT 'role', current_user, current_user, NULL
    """
).bindparams(
    bindparam("schema", type_=Text),
    bindparam("tables", type_=ARRAY(Text)),
)


@dataclass(frozen=True)
class SchemaReport:
    """What the catalog query found for one queue.

    ``missing`` lists required objects that do not exist; ``different`` pairs a required
    object with the shape found in the database where the two disagree; ``version`` is the
    schema version recorded on the executions table (``None``: no executions table; ``0``:
    the table carries no recognisable version).
    """

    missing: list[RequiredObject]
    different: list[tuple[RequiredObject, str]]
    version: int | None
    #: Privileges the connected role needs and lacks, on the schema and the tables found.
    missing_privileges: list[RequiredPrivilege] = field(default_factory=list)
    #: The connected role (``current_user``).
    role: str | None = None
    #: The queue's schema as resolved (the search path's first schema when it has none);
    #: ``None`` when that schema does not exist.
    schema: str | None = None

    @property
    def ok(self) -> bool:
        """Whether every required object exists with the expected shape."""
        return not self.missing and not self.different

    @property
    def privileges_ok(self) -> bool:
        """Whether the connected role holds every privilege a worker and a producer need."""
        return not self.missing_privileges

    def problems(self, schema: str | None) -> list[str]:
        """One line per missing or different object.

        A missing table is one line: listing each of its columns and indexes too would
        bury the point.
        """
        absent = {obj.table for obj in self.missing if obj.kind == "table"}
        lines = [
            f"{obj.describe(schema)} (with its columns, indexes and constraints)"
            for obj in self.missing
            if obj.kind == "table"
        ]
        lines += [
            obj.describe(schema)
            for obj in self.missing
            if obj.kind != "table" and obj.table not in absent
        ]
        lines += [
            f"{obj.describe(schema)}: expected {obj.shape!r}, found {found!r}"
            for obj, found in self.different
        ]
        return lines


def _found_shape(kind: str, detail: str | None) -> str:
    if detail is None:
        return ""
    if kind == "index":
        return index_shape(detail)
    if kind == "constraint":
        return constraint_kind(detail)
    if kind == "column":
        spelled, _, nullability = detail.rpartition("|")
        return f"{normalize_type(spelled)} {nullability}"
    return detail


def _table_names(required: list[RequiredObject]) -> list[str]:
    return sorted({obj.table for obj in required})


def inspect_schema(connection: Connection, tables: QueueTables) -> SchemaReport:
    """Run the catalog query and compare the result with the manifest.

    Privileges are compared for the schema and the tables that exist: a missing table is
    a schema problem first.
    """
    required = required_objects(tables)
    names = _table_names(required)
    # A connection with a schema_translate_map (a tenant's) reads the schema it maps to.
    translate = connection.get_execution_options().get("schema_translate_map")
    where = translated_schema(tables.schema, translate)
    rows = connection.execute(CATALOG_QUERY, {"schema": where, "tables": names}).all()
    found: dict[tuple[str, str, str], str] = {}
    version: int | None = None
    # (kind, object, privilege) -> held; only the privileges the query could check.
    checked: dict[tuple[str, str, str], bool] = {}
    role: str | None = None
    schema: str | None = None
    for kind, tbl, name, detail in rows:
        if kind == "comment":
            if tbl == tables.executions.name:
                recorded = parse_schema_version_comment(detail, anywhere=True)
                version = 0 if recorded is None else recorded
            continue
        if kind == "privilege":
            checked[("table", tbl, name)] = detail is not None
            continue
        if kind == "schema privilege":
            schema = tbl
            checked[("schema", tbl, name)] = detail is not None
            continue
        if kind == "role":
            role = tbl
            continue
        found[(kind, tbl, name)] = _found_shape(kind, detail)
    missing: list[RequiredObject] = []
    different: list[tuple[RequiredObject, str]] = []
    for obj in required:
        key = (obj.kind, obj.table, obj.name)
        if key not in found:
            missing.append(obj)
        elif obj.shape and found[key] != obj.shape:
            different.append((obj, found[key]))
    lacking = []
    if schema is not None:
        lacking = [
            need
            for need in required_privileges(tables, schema)
            if checked.get((need.kind, need.name, need.privilege)) is False
        ]
    return SchemaReport(
        missing=missing,
        different=different,
        version=version,
        missing_privileges=lacking,
        role=role,
        schema=schema,
    )


def grant_statements(privileges: list[RequiredPrivilege], schema: str, role: str) -> list[str]:
    """The ``GRANT`` statements that give ``role`` ``privileges``: one per schema or table.

    Identifiers are quoted where PostgreSQL needs it.
    """
    grantee = _QUOTE(role)
    statements: list[str] = []
    by_object: dict[tuple[str, str], list[str]] = {}
    for need in privileges:
        by_object.setdefault((need.kind, need.name), []).append(need.privilege)
    for (kind, name), privs in by_object.items():
        ordered = sorted(
            privs, key=lambda p: DATA_PRIVILEGES.index(p) if p in DATA_PRIVILEGES else 9
        )
        listed = ", ".join(ordered)
        if kind == "schema":
            statements.append(f"GRANT {listed} ON SCHEMA {_QUOTE(name)} TO {grantee};")
        else:
            statements.append(f"GRANT {listed} ON {_QUOTE(schema)}.{_QUOTE(name)} TO {grantee};")
    return statements


def _refuse_privileges(report: SchemaReport) -> None:
    schema = report.schema or ""
    role = report.role or "CURRENT_USER"
    lines = [need.describe(schema) for need in report.missing_privileges]
    listing = "\n".join(f"  - {line}" for line in lines)
    grants = "\n".join(
        f"  {grant}" for grant in grant_statements(report.missing_privileges, schema, role)
    )
    raise InsufficientPrivilegeError(
        f"sqla_queue cannot run: role {role!r} lacks {len(lines)} privilege(s) that workers "
        f"and producers need on the queue's schema and tables:\n{listing}\n"
        f"Fix: as the owner of the queue's tables (your migration role), run\n{grants}\n"
        f"(the application role's grants in {GRANTS_GUIDE}).",
        lines,
    )


def find_missing(
    connection: Connection, tables: QueueTables
) -> tuple[list[RequiredObject], int | None]:
    """The required objects absent from the database, and the database's schema version.

    The version is read from the comment on the executions table; ``None`` means no queue
    tables were found at all.
    """
    report = inspect_schema(connection, tables)
    return report.missing, report.version


def verify_schema(connection: Connection, tables: QueueTables) -> None:
    """Refuse a database this process cannot run on.

    Raises :class:`SchemaMismatchError` unless every required object exists as expected,
    then :class:`InsufficientPrivilegeError` unless the connected role holds every privilege
    a worker and a producer need (see :func:`~sqla_queue.schema.manifest.required_privileges`).
    Both come from the one catalog query.
    """
    report = inspect_schema(connection, tables)
    if report.ok:
        if not report.privileges_ok:
            _refuse_privileges(report)
        return
    version = report.version
    tables_missing = sum(obj.kind == "table" for obj in report.missing)
    if version is not None:
        found = f"schema version {version}"
    elif tables_missing == len(_table_names(required_objects(tables))):
        found = "no queue tables"
    else:
        found = "an incomplete queue (no executions table, so no recorded version)"
    # Named where they are missing: a tenant's schema, when the connection's map moves it.
    translate = connection.get_execution_options().get("schema_translate_map")
    problems = report.problems(translated_schema(tables.schema, translate))
    listing = "\n".join(f"  - {line}" for line in problems)
    if version is not None and 0 < version < SCHEMA_VERSION:
        # create_all skips tables that exist, so it cannot be the fix for an older install.
        fix = (
            f"Fix: run `{FIX_COMMAND}`. If no migration upgrades the queue yet, "
            "`alembic revision --autogenerate` writes one: "
            f"op.upgrade_queue(from_version={version}, to_version={SCHEMA_VERSION}, ...), "
            "which alters the tables in place and keeps every job."
        )
    else:
        fix = (
            f"Fix: run `{FIX_COMMAND}` (or queue.create_all(connection) on a database "
            "without Alembic)."
        )
    if version is not None and version > SCHEMA_VERSION:
        # A later release's migration ran (a rolling deploy, an old process restarted): the
        # objects it dropped or reshaped are not to be put back by hand.
        fix = (
            f"Fix: the database records schema version {version}, newer than this library's "
            f"{SCHEMA_VERSION}: a later release's migration changed what this release needs. "
            f"Run this process on a release of sqla_queue at schema version {version}; do "
            "not recreate these objects (docs: Versioning and upgrades)."
        )
    elif version == SCHEMA_VERSION:
        fix += (
            f"\nThe database already records version {version}, so if `{FIX_COMMAND}` has "
            "nothing to do, these objects were changed outside the migrations: recreate them "
            f"as `{FIX_COMMAND} --sql` prints them."
        )
    raise SchemaMismatchError(
        f"sqla_queue cannot run: the database has {found}, this library needs schema "
        f"version {SCHEMA_VERSION}. Missing or different ({len(problems)}):\n{listing}\n"
        f"{fix}",
        problems,
    )
