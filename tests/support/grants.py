"""The deployment guide's least-privilege grants, read from the page and applied to test roles.

``docs/guides/deployment.md`` shows the grants of the application role (producers and
workers) and of the operator role (who changes stored limits) in ``sql`` blocks marked
``<!-- grants: app-role -->`` and ``<!-- grants: admin-role -->``. The least-privilege test
run gives its roles exactly that SQL, with the guide's names (schema ``jobs``, role ``app``,
role ``queue_admin``) replaced by the test's. So the page cannot drift from what is tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, create_engine, make_url, text

__all__ = [
    "GUIDE",
    "GrantedPrivilege",
    "GuideRoles",
    "effective_privileges",
    "grant_test_roles",
    "guide_block",
    "guide_statements",
    "held_privileges",
    "parse_grants",
]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "deployment.md"
# The names the guide uses, replaced by the test's own.
GUIDE_SCHEMA = "jobs"
GUIDE_PREFIX = "sqla_queue_"
GUIDE_APP_ROLE = "app"
GUIDE_ADMIN_ROLE = "queue_admin"

_SECTION = "## Least-privilege roles"
_FENCE = re.compile(r"^```sql\s*$")
_MARKER = re.compile(r"^<!--\s*grants:\s*(?P<name>[a-z-]+)\s*-->$")
_GRANT_ON = re.compile(
    r"^GRANT\s+(?P<privs>[A-Z, ]+?)\s+ON\s+(?P<schema>SCHEMA\s+)?(?P<objects>.+?)\s+TO\s+"
    r"(?P<grantee>\S+)$",
    re.IGNORECASE,
)
_GRANT_ROLE = re.compile(r"^GRANT\s+(?P<role>\S+)\s+TO\s+(?P<grantee>\S+)$", re.IGNORECASE)


@dataclass(frozen=True)
class GuideRoles:
    """The login roles of a least-privilege run: the guide's application and operator roles."""

    app: str
    admin: str
    #: The one the test engines log in as (``app`` or ``admin``).
    login: str


@dataclass(frozen=True, order=True)
class GrantedPrivilege:
    """A privilege of a role on a schema or a table (``name`` unqualified)."""

    role: str
    kind: str  # "schema" | "table" | "sequence" | "member of"
    name: str
    privilege: str


def _blocks(markdown: str) -> list[tuple[str | None, str]]:
    """The ``sql`` blocks of the Least-privilege section, each with its marker's name."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == _SECTION)
    found: list[tuple[str | None, str]] = []
    marker: str | None = None
    i = start + 1
    while i < len(lines) and not lines[i].startswith("## "):
        stripped = lines[i].strip()
        matched = _MARKER.match(stripped)
        if matched:
            marker = matched["name"]
        elif _FENCE.match(stripped):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            found.append((marker, "\n".join(lines[i + 1 : end])))
            marker = None
            i = end
        elif stripped:
            marker = None  # a marker applies to the block right after it only
        i += 1
    return found


def guide_block(name: str, guide: Path = GUIDE) -> str:
    """The SQL of the block marked ``<!-- grants: name -->``.

    A page without markers (the guide before they were added) has one unmarked block: it is
    the application role's.
    """
    blocks = _blocks(guide.read_text(encoding="utf-8"))
    for marker, sql in blocks:
        if marker == name:
            return sql
    if name == "app-role" and blocks and all(marker is None for marker, _ in blocks):
        return blocks[0][1]
    raise LookupError(f"{guide.name} has no sql block marked <!-- grants: {name} -->")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def guide_statements(
    name: str, *, schema: str, prefix: str, app_role: str, admin_role: str
) -> list[str]:
    """The guide's block ``name`` as statements, with the guide's names replaced by these.

    Only ``GRANT`` statements are accepted: the page must not be able to make a test run
    anything else.
    """
    sql = "\n".join(line.split("--", 1)[0] for line in guide_block(name).splitlines())
    # Roles first, while the text has only the guide's names in it.
    sql = re.sub(rf"\b{GUIDE_ADMIN_ROLE}\b", _quote(admin_role), sql)
    sql = re.sub(rf"\b{GUIDE_APP_ROLE}\b", _quote(app_role), sql)
    sql = re.sub(
        rf"\b{GUIDE_SCHEMA}\.{GUIDE_PREFIX}(\w+)",
        lambda m: f"{_quote(schema)}.{_quote(prefix + m[1])}",
        sql,
    )
    sql = re.sub(rf"\bSCHEMA\s+{GUIDE_SCHEMA}\b", f"SCHEMA {_quote(schema)}", sql)
    statements = [" ".join(part.split()) for part in sql.split(";")]
    statements = [s for s in statements if s]
    for statement in statements:
        if not statement.upper().startswith("GRANT "):
            raise ValueError(f"the guide's grants must be GRANT statements only: {statement!r}")
        if re.search(rf"\b{GUIDE_SCHEMA}\b", statement.replace(_quote(schema), "")):
            raise ValueError(f"a name of the guide was left in: {statement!r}")
    return statements


def _unquote(name: str) -> str:
    name = name.strip()
    return name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()


def parse_grants(statements: list[str]) -> set[GrantedPrivilege]:
    """What ``statements`` grant, directly: one entry per role, object and privilege."""
    granted: set[GrantedPrivilege] = set()
    for statement in statements:
        on = _GRANT_ON.match(statement)
        if on:
            grantee = _unquote(on["grantee"])
            privileges = [p.strip().upper() for p in on["privs"].split(",")]
            kind = "schema" if on["schema"] else "table"
            for obj in on["objects"].split(","):
                obj_name = _unquote(obj.strip().rsplit(".", 1)[-1])
                granted |= {GrantedPrivilege(grantee, kind, obj_name, p) for p in privileges}
            continue
        member = _GRANT_ROLE.match(statement)
        if not member:
            raise ValueError(f"cannot read the grant {statement!r}")
        granted.add(
            GrantedPrivilege(_unquote(member["grantee"]), "member of", _unquote(member["role"]), "")
        )
    return granted


def effective_privileges(granted: set[GrantedPrivilege], role: str) -> set[GrantedPrivilege]:
    """What ``role`` holds given ``granted``: its own grants and its roles' (inherited)."""
    roles = {role}
    while True:
        more = {g.name for g in granted if g.kind == "member of" and g.role in roles} - roles
        if not more:
            break
        roles |= more
    return {
        GrantedPrivilege(role, g.kind, g.name, g.privilege)
        for g in granted
        if g.role in roles and g.kind != "member of"
    }


_HELD = text(
    """
    SELECT 'schema' AS kind, n.nspname AS name, p.priv AS privilege
    FROM pg_catalog.pg_namespace n
    CROSS JOIN (VALUES ('USAGE'), ('CREATE')) AS p(priv)
    WHERE n.nspname = :schema AND pg_catalog.has_schema_privilege(:role, n.oid, p.priv)
    UNION ALL
    SELECT 'table', c.relname, p.priv
    FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    CROSS JOIN (
        VALUES ('SELECT'), ('INSERT'), ('UPDATE'), ('DELETE'), ('TRUNCATE'), ('REFERENCES'),
               ('TRIGGER')
    ) AS p(priv)
    WHERE n.nspname = :schema AND c.relkind IN ('r', 'p')
      AND pg_catalog.has_table_privilege(:role, c.oid, p.priv)
    UNION ALL
    SELECT 'sequence', c.relname, p.priv
    FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    CROSS JOIN (VALUES ('USAGE'), ('SELECT'), ('UPDATE')) AS p(priv)
    WHERE n.nspname = :schema AND c.relkind = 'S'
      AND pg_catalog.has_sequence_privilege(:role, c.oid, p.priv)
    """
)


def held_privileges(connection: Connection, role: str, schema: str) -> set[GrantedPrivilege]:
    """What ``role`` may do in ``schema`` as the catalog says, inherited grants included."""
    rows = connection.execute(_HELD, {"role": role, "schema": schema}).all()
    return {GrantedPrivilege(role, kind, name, priv) for kind, name, priv in rows}


def grant_test_roles(
    db_url: str, roles: GuideRoles, *, schema: str, prefix: str, app_schema: str = "public"
) -> str:
    """Give ``roles`` the guide's grants on the queue; return a URL logging in as ``login``.

    On the queue's schema the roles get exactly the guide's SQL, nothing more. The test
    application's own tables (in ``app_schema``) get plain data rights, as any host grants
    its own tables; those are not the queue's business.
    """
    blocks = ["app-role", "admin-role"]
    if all(marker is None for marker, _ in _blocks(GUIDE.read_text(encoding="utf-8"))):
        blocks = ["app-role"]  # the guide before its blocks were marked had one role
    owner = create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with owner.connect() as connection:
            for block in blocks:
                for statement in guide_statements(
                    block,
                    schema=schema,
                    prefix=prefix,
                    app_role=roles.app,
                    admin_role=roles.admin,
                ):
                    connection.exec_driver_sql(statement)
            for role in (roles.app, roles.admin):
                quoted = _quote(role)
                connection.exec_driver_sql(
                    f"GRANT USAGE ON SCHEMA {_quote(app_schema)} TO {quoted}"
                )
                connection.exec_driver_sql(
                    f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
                    f"{_quote(app_schema)} TO {quoted}"
                )
                connection.exec_driver_sql(
                    f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {_quote(app_schema)} TO {quoted}"
                )
            # No role may create anything: no DDL at runtime.
            connection.exec_driver_sql(
                f"REVOKE CREATE ON SCHEMA {_quote(app_schema)} "
                f"FROM PUBLIC, {_quote(roles.app)}, {_quote(roles.admin)}"
            )
    finally:
        owner.dispose()
    return make_url(db_url).set(username=roles.login).render_as_string(hide_password=False)
