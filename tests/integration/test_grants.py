"""The deployment guide's grants: what verify() requires, what the test roles get, and that
a worker does everything with them, stored limits included.

Issue 12, item 2: the guide's grants left out the limits table. A worker with a declared
limit then claimed nothing, forever; one without ignored stored limits (a stored limit of
1, and 8 ran at once); and a role without any grant passed verify(), then warned forever.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, MetaData, create_engine, make_url, select, text
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import Queue, SqlaQueueError
from sqla_queue.worker.sync import Worker
from tests.conftest import _grant_dml
from tests.support.app import noop, queue, sleepy
from tests.support.grants import (
    GUIDE_ADMIN_ROLE,
    GUIDE_APP_ROLE,
    GUIDE_PREFIX,
    GUIDE_SCHEMA,
    GrantedPrivilege,
    GuideRoles,
    effective_privileges,
    guide_statements,
    held_privileges,
    parse_grants,
)
from tests.support.limited import limited1

pytestmark = pytest.mark.integration

SCHEMA = str(queue.tables.schema)
_names = itertools.count(1)


@dataclass(frozen=True)
class RoleEngines:
    """Engines logging in as the guide's application and operator roles."""

    roles: GuideRoles
    app: Engine
    admin: Engine


def _role_name(kind: str) -> str:
    return f"sqlaq_g{os.getpid()}_{next(_names)}_{kind}"


def _create_roles(admin_url: str, *names: str) -> None:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        for name in names:
            connection.execute(text(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB'))
    admin.dispose()


def _drop_roles(admin_url: str, db_url: str, *names: str) -> None:
    owner = create_engine(db_url, isolation_level="AUTOCOMMIT")
    with owner.connect() as connection:
        for name in names:
            # Their privileges in this database, so the roles can go.
            connection.execute(text(f'DROP OWNED BY "{name}"'))
    owner.dispose()
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        for name in names:
            connection.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
    admin.dispose()


def _as(db_url: str, role: str) -> Engine:
    return create_engine(make_url(db_url).set(username=role), pool_size=12)


@pytest.fixture
def guide_roles(db_url: str, admin_url: str) -> Iterator[RoleEngines]:
    """The guide's two roles, granted exactly as the least-privilege run grants them."""
    roles = GuideRoles(app=_role_name("app"), admin=_role_name("admin"), login="")
    _create_roles(admin_url, roles.app, roles.admin)
    _grant_dml(db_url, roles)  # the conftest's own function: the test roles' grants
    app, admin = _as(db_url, roles.app), _as(db_url, roles.admin)
    yield RoleEngines(roles, app, admin)
    app.dispose()
    admin.dispose()
    _drop_roles(admin_url, db_url, roles.admin, roles.app)


@pytest.fixture
def bare_role(db_url: str, admin_url: str) -> Iterator[Engine]:
    """A login role with no grant at all."""
    name = _role_name("bare")
    _create_roles(admin_url, name)
    engine = _as(db_url, name)
    yield engine
    engine.dispose()
    _drop_roles(admin_url, db_url, name)


def _guide(block: str) -> set[GrantedPrivilege]:
    """What block ``block`` grants, with the guide's own names."""
    return parse_grants(
        guide_statements(
            block,
            schema=GUIDE_SCHEMA,
            prefix=GUIDE_PREFIX,
            app_role=GUIDE_APP_ROLE,
            admin_role=GUIDE_ADMIN_ROLE,
        )
    )


def _run_briefly(worker: Worker, seconds: float) -> tuple[bool, list[BaseException]]:
    """Run ``worker`` in burst mode; stop it after ``seconds``. (finished, errors)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(burst=True)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    finished = not thread.is_alive()
    if not finished:
        worker.stop()
        thread.join(60)
    return finished, errors


def _worker(engine: Engine, **settings: object) -> Worker:
    return queue.worker(
        sessionmaker(engine), install_signal_handlers=False, poll_interval=0.05, **settings
    )


# -- the guide, the test roles and verify() agree ---------------------------------------------


def test_verify_requires_exactly_the_guides_application_role_grants() -> None:
    from sqla_queue.schema.manifest import required_privileges

    guide_queue = Queue(metadata=MetaData(), schema=GUIDE_SCHEMA, prefix=GUIDE_PREFIX)
    required = {
        GrantedPrivilege(GUIDE_APP_ROLE, need.kind, need.name, need.privilege)
        for need in required_privileges(guide_queue.tables, GUIDE_SCHEMA)
    }
    assert _guide("app-role") == required


ALL_DATA = {"SELECT", "INSERT", "UPDATE", "DELETE"}


def test_the_guide_grants_every_queue_table_and_the_operator_writes_limits() -> None:
    app = _guide("app-role")
    tables = {g.name for g in app if g.kind == "table"}
    assert tables == {
        f"{GUIDE_PREFIX}jobs",
        f"{GUIDE_PREFIX}job_executions",
        f"{GUIDE_PREFIX}task_limits",
        f"{GUIDE_PREFIX}unique_keys",
        f"{GUIDE_PREFIX}task_controls",
        f"{GUIDE_PREFIX}rate_starts",
        f"{GUIDE_PREFIX}schedules",
        f"{GUIDE_PREFIX}daemons",
        f"{GUIDE_PREFIX}workers",
        f"{GUIDE_PREFIX}workflows",
        f"{GUIDE_PREFIX}workflow_nodes",
        f"{GUIDE_PREFIX}workflow_edges",
        f"{GUIDE_PREFIX}job_steps",
        f"{GUIDE_PREFIX}job_signals",
    }
    # The application role reads and locks the controls; only operators write them.
    controls = {g.privilege for g in app if g.name == f"{GUIDE_PREFIX}task_controls"}
    assert controls == {"SELECT", "UPDATE"}
    written = ("rate_starts", "schedules", "daemons", "workers")
    durable = ("job_steps", "job_signals")
    for name in (*written, "workflows", "workflow_nodes", "workflow_edges", *durable):
        assert {g.privilege for g in app if g.name == f"{GUIDE_PREFIX}{name}"} == ALL_DATA, name
    admin = effective_privileges(app | _guide("admin-role"), GUIDE_ADMIN_ROLE)
    for name in ("task_limits", "unique_keys", "task_controls"):
        assert {g.privilege for g in admin if g.name == f"{GUIDE_PREFIX}{name}"} == ALL_DATA, name


def test_the_test_roles_hold_exactly_the_guides_grants(
    guide_roles: RoleEngines, owner_engine: Engine
) -> None:
    """Fails if the least-privilege run's grants and the guide's grants differ."""
    roles = guide_roles.roles
    granted: set[GrantedPrivilege] = set()
    for block in ("app-role", "admin-role"):
        granted |= parse_grants(
            guide_statements(
                block,
                schema=SCHEMA,
                prefix=queue.tables.prefix,
                app_role=roles.app,
                admin_role=roles.admin,
            )
        )
    with owner_engine.connect() as connection:
        for role in (roles.app, roles.admin):
            assert held_privileges(connection, role, SCHEMA) == effective_privileges(
                granted, role
            ), role


# -- verify() checks privileges ----------------------------------------------------------------


def test_a_role_without_grants_fails_verify_and_the_worker_at_once(
    bare_role: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job_id = noop.enqueue(session)
    with bare_role.connect() as connection, pytest.raises(SqlaQueueError) as refused:
        queue.verify(connection)
    from sqla_queue import InsufficientPrivilegeError

    assert isinstance(refused.value, InsufficientPrivilegeError)
    message = str(refused.value)
    assert len(refused.value.missing) == 52
    assert f"USAGE on schema {SCHEMA}" in refused.value.missing
    assert f"SELECT on table {SCHEMA}.sqla_queue_task_limits" in refused.value.missing
    assert f"GRANT USAGE ON SCHEMA {SCHEMA} TO " in message
    assert f"GRANT SELECT, INSERT, UPDATE, DELETE ON {SCHEMA}.sqla_queue_jobs TO " in message
    assert f"GRANT SELECT ON {SCHEMA}.sqla_queue_task_limits TO " in message
    assert f"GRANT SELECT, INSERT, UPDATE, DELETE ON {SCHEMA}.sqla_queue_unique_keys TO " in (
        message
    )
    assert f"GRANT SELECT, INSERT, UPDATE, DELETE ON {SCHEMA}.sqla_queue_daemons TO " in message
    assert f"GRANT SELECT, UPDATE ON {SCHEMA}.sqla_queue_task_controls TO " in message

    finished, errors = _run_briefly(_worker(bare_role), 10)
    assert finished, "the worker did not stop: it should refuse to start"
    assert [type(e).__name__ for e in errors] == ["InsufficientPrivilegeError"]
    executions = queue.tables.executions
    with SessionLocal() as session:
        state = session.scalar(select(executions.c.state).where(executions.c.id == job_id))
    assert state == "pending"


REQUIRED = [
    ("USAGE", f"SCHEMA {SCHEMA}"),
    *[(p, f"{SCHEMA}.sqla_queue_jobs") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_job_executions") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_unique_keys") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_rate_starts") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_schedules") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_daemons") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_workers") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_workflows") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_workflow_nodes") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_workflow_edges") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_job_steps") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    *[(p, f"{SCHEMA}.sqla_queue_job_signals") for p in ("SELECT", "INSERT", "UPDATE", "DELETE")],
    ("SELECT", f"{SCHEMA}.sqla_queue_task_limits"),
    ("SELECT", f"{SCHEMA}.sqla_queue_task_controls"),
    ("UPDATE", f"{SCHEMA}.sqla_queue_task_controls"),
]


@pytest.mark.parametrize(("privilege", "on"), REQUIRED, ids=[f"{p} {o}" for p, o in REQUIRED])
def test_each_missing_privilege_is_named_with_the_grant_that_fixes_it(
    guide_roles: RoleEngines, owner_engine: Engine, privilege: str, on: str
) -> None:
    role = guide_roles.roles.app
    with owner_engine.begin() as connection:
        connection.execute(text(f'REVOKE {privilege} ON {on} FROM "{role}"'))
    with guide_roles.app.connect() as connection, pytest.raises(SqlaQueueError) as refused:
        queue.verify(connection)
    target = on.removeprefix("SCHEMA ")
    kind = "schema" if on.startswith("SCHEMA") else "table"
    assert refused.value.missing == [f"{privilege} on {kind} {target}"]  # type: ignore[attr-defined]
    grant = f"GRANT {privilege} ON {on} TO {role};"
    assert grant in str(refused.value)
    with owner_engine.begin() as connection:
        connection.execute(text(grant))
    with guide_roles.app.connect() as connection:
        queue.verify(connection)


# -- a worker does everything with the guide's grants ----------------------------------------


def _most_at_once(engine: Engine) -> int:
    """The most executions that ran at once, from the execution log's start and end times."""
    with engine.connect() as connection:
        return int(
            connection.scalar(
                text(
                    "SELECT max((SELECT count(*) FROM execution_log o "
                    "WHERE o.started_at <= e.started_at AND o.finished_at > e.started_at)) "
                    "FROM execution_log e"
                )
            )
            or 0
        )


def _statuses(engine: Engine, ids: list[int]) -> list[str]:
    jobs = queue.tables.jobs
    with engine.connect() as connection:
        return sorted(connection.execute(select(jobs.c.status).where(jobs.c.id.in_(ids))).scalars())


def test_a_stored_limit_holds_for_a_worker_of_the_guides_role(
    guide_roles: RoleEngines, owner_engine: Engine
) -> None:
    """With a stored limit of 1 and no declared one, 8 ran at once under the old grants."""
    with Session(owner_engine) as session, session.begin():
        queue.set_limit(session, "sleepy", 1)
        ids = [sleepy.enqueue(session, seconds=0.2) for _ in range(6)]
    worker = _worker(guide_roles.app, tasks=["sleepy"], concurrency=6)
    finished, errors = _run_briefly(worker, 60)
    assert finished and not errors, errors
    assert _statuses(owner_engine, ids) == ["succeeded"] * 6
    assert _most_at_once(owner_engine) == 1


def test_a_task_with_a_declared_limit_runs_for_a_worker_of_the_guides_role(
    guide_roles: RoleEngines, owner_engine: Engine
) -> None:
    """Under the old grants, such a worker claimed nothing, forever."""
    with Session(guide_roles.app) as session, session.begin():
        ids = [limited1.enqueue(session) for _ in range(3)]
    worker = _worker(guide_roles.app, tasks=["limited1"], concurrency=3)
    finished, errors = _run_briefly(worker, 30)
    assert finished and not errors, errors
    assert _statuses(owner_engine, ids) == ["succeeded"] * 3


def test_changing_limits_takes_the_operator_role(guide_roles: RoleEngines) -> None:
    from sqla_queue import InsufficientPrivilegeError

    with Session(guide_roles.app) as session, pytest.raises(InsufficientPrivilegeError) as refused:
        queue.set_limit(session, "noop", 2)
    assert "GRANT INSERT, UPDATE, DELETE ON" in str(refused.value)
    assert "sqla_queue_task_limits" in str(refused.value)
    with Session(guide_roles.admin) as session, session.begin():
        queue.set_limit(session, "noop", 2)
    with Session(guide_roles.app) as session:
        assert queue.limits(session)["noop"].stored == 2
