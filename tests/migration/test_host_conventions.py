"""The host's own conventions, each on a small host app driven through its own Alembic.

Every case writes a host project into a temporary directory from the templates below (a
models module, its Alembic options, ``env.py``, ``alembic.ini``) and runs it in one
subprocess (:mod:`tests.migration.conventions_driver`): autogenerate, offline ``--sql``,
upgrade, ``verify``, ``alembic check``, a burst worker on two jobs per queue, downgrade. The
test then holds the driver's report to what the case expects:

* the revision creates each queue with exactly one ``op.create_queue`` in the right schema,
  and nothing else touches the queue's tables;
* the offline script creates the queue's tables in the same place;
* after the upgrade the database holds exactly the expected tables (no queue twice);
* ``verify`` and ``alembic check`` pass; every job succeeded;
* the downgrade leaves no queue table behind.

The cases: ``MetaData(schema=...)``, ``Queue(schema=...)``, both and conflicting, a naming
convention, ``include_name``/``include_object`` filters, several MetaData targets,
``include_schemas`` off, two queues on one Base, the async ``env.py`` template, and tenant
schemas through ``schema_translate_map``.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import make_url

from alembic_ext.versions import LATEST_VERSION
from sqla_queue.testing.databases import DatabaseFactory
from tests.migration.conftest import HOSTAPP_MIGRATIONS, REPO_ROOT, run_cli

pytestmark = pytest.mark.migration

#: Cases whose drivers run side by side.
PARALLEL_CASES = 3
#: How long a test waits for its case's driver (run_cli stops a driver after 120 s).
CASE_TIMEOUT = 300

QUEUE_TABLES = (
    "jobs",
    "job_executions",
    "task_limits",
    "unique_keys",
    "task_controls",
    "rate_starts",
    "schedules",
    "daemons",
    "workers",
    "workflows",
    "workflow_nodes",
    "workflow_edges",
    "job_steps",
    "job_signals",
)
SUCCEEDED = [["succeeded", 2], ["succeeded", 4]]

MODELS_HEADER = '''\
"""The host app of one host-conventions case."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Column, ForeignKey, Integer, MetaData, String, Table
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqla_queue import Queue

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def with_tasks(queue: Queue) -> Queue:
    """The host's task, on ``queue``."""

    @queue.task(name="double")
    def double(n: int) -> int:
        return 2 * n

    return queue


'''

CUSTOMER = """

class Customer(Base):
    __tablename__ = "customers"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)
"""

OPTIONS_HEADER = '''\
"""The host's Alembic options: env.py passes them to context.configure()."""

from __future__ import annotations

from typing import Any

'''

SCHEMA_FILTER = '''
MANAGED_SCHEMAS = {managed!r}


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Compare only the schemas this host manages."""
    return type_ != "schema" or name in MANAGED_SCHEMAS


OPTIONS: dict[str, Any] = {{"include_schemas": True, "include_name": include_name}}
'''

ENV = '''\
"""The host's Alembic environment: its own options, and the one line sqla_queue asks for."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

import alembic_ext  # noqa: F401
from myapp.alembic_options import OPTIONS
from myapp.models import TARGET_METADATA

config = context.config


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=TARGET_METADATA,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **OPTIONS,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=TARGET_METADATA, **OPTIONS)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
'''

# One schema per tenant, all described by the placeholder schema "tenant" of the models.
# `alembic -x tenant=NAME upgrade head` migrates one tenant; without -x, the placeholder
# schema itself, which is where autogenerate and `alembic check` look.
TENANT_ENV = '''\
"""A multi-tenant host: its models name the schema "tenant", translated per connection."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import engine_from_config, pool, text

import alembic_ext  # noqa: F401
from myapp.models import PLACEHOLDER, TARGET_METADATA

config = context.config
TENANT = context.get_x_argument(as_dictionary=True).get("tenant")
SCHEMA = TENANT or PLACEHOLDER


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Compare the default schema and this run's schema, not the other tenants'."""
    return type_ != "schema" or name in (None, SCHEMA)


OPTIONS: dict[str, Any] = {"include_schemas": True, "include_name": include_name}


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=TARGET_METADATA,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        version_table_schema=SCHEMA,
        **OPTIONS,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"'))
        connection.commit()
        if TENANT:
            connection = connection.execution_options(
                schema_translate_map={PLACEHOLDER: TENANT}
            )
        context.configure(
            connection=connection,
            target_metadata=TARGET_METADATA,
            version_table_schema=SCHEMA,
            **OPTIONS,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
'''


def _schema_filter(*managed: str | None) -> str:
    return SCHEMA_FILTER.format(managed=set(managed))


@dataclass(frozen=True)
class Case:
    """One host convention: the host app's code and what its migrations must produce."""

    id: str
    #: The models module after the common header: defines TARGET_METADATA and QUEUES.
    models: str
    #: The body of ``myapp/alembic_options.py``: defines OPTIONS.
    options: str = "OPTIONS: dict[str, Any] = {}\n"
    #: Where each queue lives: (schema or None, prefix), in the order of the revision.
    queues: tuple[tuple[str | None, str], ...] = ((None, "sqla_queue_"),)
    #: The host's own tables after the upgrade, as (schema, table).
    host_tables: frozenset[tuple[str, str]] = frozenset({("public", "customers")})
    #: Tables that exist before and after, owned by someone else.
    foreign_tables: frozenset[tuple[str, str]] = frozenset()
    setup_sql: tuple[str, ...] = ()
    env: str = "sync"  # "sync", "async" (alembic init -t async) or "tenants"
    tenants: tuple[str, ...] = ()
    #: A queue table the host's include_object additionally excludes in a second comparison.
    excluded_queue_table: str | None = None
    #: Constraint and index names that must exist after the upgrade, as (schema, table, name).
    names: frozenset[tuple[str, str, str]] = frozenset()
    #: Text that the revision must not contain.
    absent: tuple[str, ...] = ()
    #: An error expected at autogenerate (the app's import), as (type name, message parts).
    error: tuple[str, tuple[str, ...]] | None = None
    #: WorkerSettings for the case's workers, over a burst worker's defaults.
    worker_settings: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case(
        "metadata_schema",
        """
class Base(DeclarativeBase):
    metadata = MetaData(schema="app", naming_convention=NAMING_CONVENTION)
"""
        + CUSTOMER
        + """

queue = with_tasks(Queue(Base))
TARGET_METADATA = Base.metadata
QUEUES = {"queue": queue}
""",
        options=_schema_filter(None, "app"),
        queues=(("app", "sqla_queue_"),),
        host_tables=frozenset({("app", "customers")}),
        # The host made its schema before (Alembic never creates one for create_table).
        setup_sql=("CREATE SCHEMA app",),
        names=frozenset(
            {
                ("app", "customers", "pk_customers"),
                ("app", "sqla_queue_jobs", "sqla_queue_jobs_pkey"),
            }
        ),
    ),
    Case(
        "queue_schema",
        """
class Base(DeclarativeBase):
    metadata = MetaData()
"""
        + CUSTOMER
        + """

queue = with_tasks(Queue(Base, schema="jobs"))
TARGET_METADATA = Base.metadata
QUEUES = {"queue": queue}
""",
        options=_schema_filter(None, "jobs"),
        queues=(("jobs", "sqla_queue_"),),
    ),
    Case(
        "conflicting_schemas",
        """
class Base(DeclarativeBase):
    metadata = MetaData(schema="app")
"""
        + CUSTOMER
        + """

queue = with_tasks(Queue(Base, schema="jobs"))
TARGET_METADATA = Base.metadata
QUEUES = {"queue": queue}
""",
        options=_schema_filter(None, "app", "jobs"),
        error=("InvalidIdentifierError", ("Queue(schema='jobs')", "MetaData(schema='app')")),
    ),
    Case(
        "naming_convention",
        """
class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
"""
        + CUSTOMER
        + """

queue = with_tasks(Queue(Base))


class Invoice(Base):
    __tablename__ = "invoices"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer_id: Mapped[int] = mapped_column(ForeignKey("customers.id"), index=True)
    mail_job_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey(queue.tables.jobs.c.id, ondelete="SET NULL")
    )


TARGET_METADATA = Base.metadata
QUEUES = {"queue": queue}
""",
        host_tables=frozenset({("public", "customers"), ("public", "invoices")}),
        names=frozenset(
            {
                ("public", "customers", "pk_customers"),
                ("public", "customers", "uq_customers_email"),
                ("public", "invoices", "ix_invoices_customer_id"),
                ("public", "invoices", "fk_invoices_mail_job_id_sqla_queue_jobs"),
                ("public", "sqla_queue_jobs", "sqla_queue_jobs_pkey"),
                ("public", "sqla_queue_jobs", "sqla_queue_jobs_status_ck"),
                ("public", "sqla_queue_job_executions", "sqla_queue_job_executions_pkey"),
            }
        ),
    ),
    Case(
        "include_filters",
        """
class Base(DeclarativeBase):
    metadata = MetaData()
"""
        + CUSTOMER
        + """

class AuditLog(Base):
    \"\"\"Mapped here, but its table is managed by another tool.\"\"\"

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(primary_key=True)


queue = with_tasks(Queue(Base, schema="jobs"))
TARGET_METADATA = Base.metadata
QUEUES = {"queue": queue}
""",
        options='''
MANAGED_SCHEMAS = {None, "jobs"}
UNMANAGED_TABLES = {"legacy_reports"}
OTHER_TOOLS_MODELS = {"audit_log"}


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Only this host's schemas; never the table another tool keeps in the database."""
    if type_ == "schema":
        return name in MANAGED_SCHEMAS
    return not (type_ == "table" and name in UNMANAGED_TABLES)


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, other: Any) -> bool:
    """Leave out the models whose tables another tool manages."""
    return not (type_ == "table" and name in OTHER_TOOLS_MODELS)


OPTIONS: dict[str, Any] = {
    "include_schemas": True,
    "include_name": include_name,
    "include_object": include_object,
}
''',
        queues=(("jobs", "sqla_queue_"),),
        foreign_tables=frozenset({("public", "legacy_reports")}),
        setup_sql=("CREATE TABLE legacy_reports (id integer PRIMARY KEY)",),
        excluded_queue_table="sqla_queue_task_limits",
        absent=("audit_log", "legacy_reports"),
    ),
    Case(
        "several_metadata",
        """
class Base(DeclarativeBase):
    metadata = MetaData()
"""
        + CUSTOMER
        + """

queue = with_tasks(Queue(Base))

# A second, Core-only MetaData with its own schema and a queue of its own.
reporting = MetaData(schema="reports")
daily_totals = Table("daily_totals", reporting, Column("day", Integer, primary_key=True))
report_queue = with_tasks(Queue(metadata=reporting, prefix="report_q_"))

TARGET_METADATA = [Base.metadata, reporting]
QUEUES = {"queue": queue, "report_queue": report_queue}
""",
        options=_schema_filter(None, "reports"),
        queues=((None, "sqla_queue_"), ("reports", "report_q_")),
        host_tables=frozenset({("public", "customers"), ("reports", "daily_totals")}),
    ),
    Case(
        "include_schemas_off",
        """
class Base(DeclarativeBase):
    metadata = MetaData()
"""
        + CUSTOMER
        + """

queue = with_tasks(Queue(Base, schema="jobs"))
TARGET_METADATA = Base.metadata
QUEUES = {"queue": queue}
""",
        queues=(("jobs", "sqla_queue_"),),
    ),
    Case(
        "two_queues_one_base",
        """
class Base(DeclarativeBase):
    metadata = MetaData()
"""
        + CUSTOMER
        + """

queue = with_tasks(Queue(Base))
mail_queue = with_tasks(Queue(Base, prefix="mail_q_"))
TARGET_METADATA = Base.metadata
QUEUES = {"queue": queue, "mail_queue": mail_queue}
""",
        queues=((None, "sqla_queue_"), (None, "mail_q_")),
    ),
    Case(
        "async_template",
        """
class Base(DeclarativeBase):
    metadata = MetaData()
"""
        + CUSTOMER
        + """

queue = with_tasks(Queue(Base, schema="jobs"))
TARGET_METADATA = Base.metadata
QUEUES = {"queue": queue}
""",
        queues=(("jobs", "sqla_queue_"),),
        env="async",
    ),
    Case(
        "schema_translate_map",
        """
PLACEHOLDER = "tenant"


class Base(DeclarativeBase):
    metadata = MetaData(schema=PLACEHOLDER)
"""
        + CUSTOMER
        + """

queue = with_tasks(Queue(Base))
TARGET_METADATA = Base.metadata
QUEUES = {"queue": queue}
""",
        queues=(("tenant", "sqla_queue_"),),
        host_tables=frozenset(
            {("tenant", "customers"), ("tenant_a", "customers"), ("tenant_b", "customers")}
        ),
        env="tenants",
        tenants=("tenant_a", "tenant_b"),
    ),
]


def _write_project(case: Case, root: Path, url: str) -> None:
    """The host project of ``case`` in ``root``, and the driver's ``case.json``."""
    app = root / "myapp"
    app.mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "models.py").write_text(MODELS_HEADER + case.models.lstrip("\n"))
    (app / "alembic_options.py").write_text(OPTIONS_HEADER + case.options.lstrip("\n"))
    migrations = root / "migrations"
    if case.env == "async":
        # Alembic's own async template, with the lines a host adds to it.
        quiet = Config(str(root / "alembic.ini"), stdout=io.StringIO())
        command.init(quiet, str(migrations), template="async")
        env_py = migrations / "env.py"
        env_py.write_text(
            env_py.read_text().replace(
                "target_metadata = None",
                "import alembic_ext  # noqa: F401\n"
                "from myapp.models import TARGET_METADATA\n\n"
                "target_metadata = TARGET_METADATA",
            )
        )
        # psycopg 3 runs on asyncio too: the async template needs no other driver.
        alembic_url = make_url(url).set(drivername="postgresql+psycopg")
        alembic_url_text = alembic_url.render_as_string(hide_password=False)
    else:
        (migrations / "versions").mkdir(parents=True)
        shutil.copy2(HOSTAPP_MIGRATIONS / "script.py.mako", migrations / "script.py.mako")
        (migrations / "env.py").write_text(TENANT_ENV if case.env == "tenants" else ENV)
        alembic_url_text = url
    ini = root / "alembic.ini"
    # '%' is configparser's interpolation character.
    url_line = f"sqlalchemy.url = {alembic_url_text.replace('%', '%%')}"
    if ini.exists():  # written by `alembic init`, with its logging sections
        ini.write_text(re.sub(r"(?m)^sqlalchemy\.url = .*$", lambda _: url_line, ini.read_text()))
    else:
        ini.write_text(
            "[alembic]\n"
            "script_location = %(here)s/migrations\n"
            "path_separator = os\n"
            "prepend_sys_path = .\n"
            f"{url_line}\n"
        )
    spec = {
        "url": url,
        "async": case.env == "async",
        "async_url": alembic_url_text,
        "tenants": list(case.tenants),
        "placeholder": case.queues[0][0] if case.tenants else None,
        "unmigrated_tenant": "tenant_c" if case.tenants else None,
        "setup_sql": list(case.setup_sql),
        "excluded_queue_table": case.excluded_queue_table,
        "worker_settings": case.worker_settings,
    }
    (root / "case.json").write_text(json.dumps(spec))


def _run(case: Case, root: Path, url: str) -> dict[str, Any]:
    _write_project(case, root, url)
    run_cli([sys.executable, "-m", "tests.migration.conventions_driver", str(root)], REPO_ROOT)
    report: dict[str, Any] = json.loads((root / "report.json").read_text())
    return report


def _body(source: str, name: str) -> list[str]:
    """The code lines of ``upgrade()`` or ``downgrade()`` in a revision."""
    match = re.search(rf"def {name}\(\) -> None:\n(.*?)(?=\ndef |\Z)", source, re.S)
    assert match, f"no {name}() in the revision:\n{source}"
    lines = [line.strip() for line in match.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith(('"""', "#"))]


def _queue_tables(case: Case, *, tenants: bool = True) -> set[tuple[str, str]]:
    schemas: list[tuple[str | None, str]] = list(case.queues)
    if tenants:
        schemas += [(tenant, prefix) for tenant in case.tenants for _, prefix in case.queues]
    return {
        (schema or "public", f"{prefix}{suffix}")
        for schema, prefix in schemas
        for suffix in QUEUE_TABLES
    }


def _failure(report: dict[str, Any]) -> str:
    error = report.get("error")
    return "" if error is None else f"step {error['step']!r} failed:\n{error['traceback']}"


@pytest.fixture(scope="module")
def reports(
    request: pytest.FixtureRequest,
    db_factory: DatabaseFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[dict[str, Any]]]]:
    """The selected cases, started at once on a few threads, each on its own database.

    The drivers spend much of their time starting Python and waiting for PostgreSQL, so
    running a few side by side keeps the matrix short.
    """
    selected: set[str] = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is sys.modules[__name__] and callspec is not None:
            selected.add(callspec.params["case"].id)
    urls: list[str] = []
    with ThreadPoolExecutor(max_workers=PARALLEL_CASES) as pool:
        futures: dict[str, Future[dict[str, Any]]] = {}
        for case in CASES:
            if case.id in selected:
                urls.append(db_factory.clone("template0"))
                root = tmp_path_factory.mktemp(case.id) / "project"
                futures[case.id] = pool.submit(_run, case, root, urls[-1])
        yield futures
    for url in urls:
        db_factory.drop(url)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_host_convention(case: Case, reports: dict[str, Future[dict[str, Any]]]) -> None:
    report = reports[case.id].result(timeout=CASE_TIMEOUT)

    if case.error is not None:
        kind, parts = case.error
        error = report.get("error")
        assert error is not None, "the host app was accepted"
        assert (error["step"], error["type"]) == ("autogenerate", kind), error["traceback"]
        for part in parts:
            assert part in error["message"]
        return
    assert "error" not in report, _failure(report)

    # One op.create_queue per queue, in its schema; no other op names a queue table.
    upgrade = _body(report["revision"], "upgrade")
    downgrade = _body(report["revision"], "downgrade")
    expected_ops = [
        f"op.create_queue(schema={schema!r}, prefix={prefix!r}, version={LATEST_VERSION})"
        for schema, prefix in case.queues
    ]
    assert [line for line in upgrade if "create_queue(" in line] == expected_ops
    assert [line for line in downgrade if "drop_queue(" in line] == [
        op.replace("create_queue", "drop_queue") for op in reversed(expected_ops)
    ]
    # (Lines inside an operation, such as a host table's foreign key to the jobs table, may
    # name a queue table; operations may not.)
    for line in upgrade + downgrade:
        if line.startswith("op.") and "_queue(" not in line:
            assert not any(f"'{prefix}" in line for _, prefix in case.queues), line
    for text in case.absent:
        assert text not in report["revision"]

    # The offline script creates the same tables in the same place.
    for schema, table in _queue_tables(case, tenants=False):
        qualified = table if schema == "public" else f"{schema}.{table}"
        assert re.search(rf"CREATE TABLE {re.escape(qualified)}\b", report["offline_sql"]), (
            qualified
        )

    # Exactly the expected tables: the queue's once each, where they belong.
    tables = {tuple(row) for row in report["after_upgrade"]["tables"]}
    assert tables == _queue_tables(case) | case.host_tables | case.foreign_tables
    names = {tuple(row) for row in report["after_upgrade"]["names"]}
    assert case.names <= names, sorted(case.names - names)

    assert set(report["verify"].values()) == {"ok"}, report["verify"]
    assert report["jobs"] == dict.fromkeys(report["jobs"], SUCCEEDED)
    assert len(report["jobs"]) == len(case.queues) * max(1, len(case.tenants))

    if case.tenants:
        # The comparator reads each tenant's own schema; an unmigrated one gets the create.
        diffs = report["tenant_diffs"]
        assert {t: diffs[t] for t in case.tenants} == {t: [] for t in case.tenants}
        [(schema, prefix)] = case.queues
        assert diffs["tenant_c"] == [repr(("create_queue", schema, prefix, LATEST_VERSION))]
    if case.excluded_queue_table is not None:
        # With one queue table excluded by the host, autogenerate leaves the whole queue alone.
        diffs = report["excluded_diffs"]
        assert diffs, "the comparison found nothing at all"
        assert not [d for d in diffs if "queue" in d], diffs

    # The downgrade takes every queue table away, and leaves other tools' tables.
    assert {tuple(row) for row in report["after_downgrade"]["tables"]} == set(case.foreign_tables)
