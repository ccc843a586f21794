"""Drive one host-conventions case in one process: the host's Alembic commands, then workers.

``tests/migration/test_host_conventions.py`` writes a small host project into a directory
(``myapp/models.py``, ``migrations/env.py``, ``alembic.ini`` and ``case.json``) and runs
``python -m tests.migration.conventions_driver DIR`` once per case. Starting one process per
case, instead of one per ``alembic`` command, keeps the matrix fast; each case still gets a
fresh interpreter, so its Base, its Queue and Alembic's process-wide registries never meet
another case's. The driver asserts nothing: it records what it saw in ``DIR/report.json``
and the test compares that with what the case expects.

The steps, each through Alembic's command API with the project's own ``alembic.ini`` and
``env.py`` (what the ``alembic`` command line calls):

1. ``revision --autogenerate``, and the revision's source;
2. ``upgrade head --sql`` (offline), and the script it prints;
3. ``upgrade head``, and with tenants also ``-x tenant=NAME upgrade head`` per tenant;
4. the tables, constraint and index names in the database;
5. ``check``; with tenants, then ``downgrade base`` of the placeholder schema, and the queue
   comparison on each tenant's translated connection;
6. ``queue.verify`` per queue (and tenant);
7. per queue (and tenant): two jobs enqueued from the host's session, a burst worker, the
   jobs' outcomes;
8. ``downgrade base`` (per tenant), and the tables left;
9. with ``excluded_queue_table``: a comparison whose ``include_object`` also excludes it.

Any ``SAWarning`` is an error here, as it is in the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import io
import json
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, create_engine, select, text
from sqlalchemy.exc import SAWarning
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

USER_SCHEMAS = "n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"

RELATIONS = text(
    f"""
    SELECT n.nspname, c.relname FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p') AND {USER_SCHEMAS} AND c.relname <> 'alembic_version'
    ORDER BY 1, 2
    """
)

OBJECT_NAMES = text(
    f"""
    SELECT n.nspname, c.relname, con.conname::text FROM pg_constraint con
    JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE {USER_SCHEMAS}
    UNION
    SELECT n.nspname, t.relname, i.relname::text FROM pg_index x
    JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
    JOIN pg_namespace n ON n.oid = t.relnamespace
    WHERE {USER_SCHEMAS}
    ORDER BY 1, 2, 3
    """
)


class Driver:
    """One case: its directory, its settings (``case.json``) and what it has seen so far."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.spec: dict[str, Any] = json.loads((root / "case.json").read_text())
        self.url: str = self.spec["url"]
        self.report: dict[str, Any] = {"steps": [], "seconds": {}}

    # -- alembic ---------------------------------------------------------------------------

    def config(self, *, tenant: str | None = None, buffer: io.StringIO | None = None) -> Config:
        """The project's Alembic config, as ``alembic [-x tenant=NAME]`` would build it."""
        options = argparse.Namespace(x=[f"tenant={tenant}"] if tenant else [])
        if buffer is None:
            return Config(str(self.root / "alembic.ini"), cmd_opts=options)
        return Config(
            str(self.root / "alembic.ini"), cmd_opts=options, stdout=buffer, output_buffer=buffer
        )

    def step(self, name: str, action: Callable[[], Any]) -> Any:
        """Run one step; on failure record its error and stop the case."""
        self.report["steps"].append(name)
        started = time.perf_counter()
        try:
            return action()
        except Exception as exc:
            self.report["error"] = {
                "step": name,
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(),
            }
            raise _Stop from exc
        finally:
            self.report["seconds"][name] = round(time.perf_counter() - started, 3)

    def tenants(self) -> list[str | None]:
        """Where each migration runs: the untranslated schemas, then each tenant."""
        return [None, *self.spec.get("tenants", [])]

    # -- database --------------------------------------------------------------------------

    def engine(self, tenant: str | None = None) -> Engine:
        """A pool-less sync engine, translated to ``tenant``'s schema when one is given."""
        engine = create_engine(self.url, poolclass=NullPool)
        if tenant is None:
            return engine
        return engine.execution_options(schema_translate_map={self.spec["placeholder"]: tenant})

    def catalog(self) -> dict[str, Any]:
        """Every user table, and every constraint and index name, in the database."""
        engine = self.engine()
        try:
            with engine.connect() as connection:
                return {
                    "tables": [list(row) for row in connection.execute(RELATIONS)],
                    "names": [list(row) for row in connection.execute(OBJECT_NAMES)],
                }
        finally:
            engine.dispose()

    # -- the case --------------------------------------------------------------------------

    def run(self) -> None:
        """All the steps of the case, in order."""
        self.setup()
        self.step("autogenerate", self.autogenerate)
        self.step("offline", self.offline)
        for tenant in self.tenants():
            self.step(f"upgrade {tenant or ''}".strip(), lambda t=tenant: self.upgrade(t))
        self.report["after_upgrade"] = self.catalog()
        models = importlib.import_module("myapp.models")
        queues: dict[str, Any] = models.QUEUES
        self.step("check", lambda: command.check(self.config()))
        remaining = self.tenants()
        if self.spec.get("tenants"):
            # The placeholder schema serves autogenerate and check only; tenants run without
            # it, so nothing below can pass by reading it instead of a tenant's schema.
            self.step("downgrade", lambda: self.downgrade(None))
            remaining.remove(None)
            self.step("compare tenants", lambda: self.compare_tenants(queues))
        self.step("verify", lambda: self.verify(queues))
        self.step("workers", lambda: self.workers(queues))
        for tenant in reversed(remaining):
            self.step(f"downgrade {tenant or ''}".strip(), lambda t=tenant: self.downgrade(t))
        self.report["after_downgrade"] = self.catalog()
        if self.spec.get("excluded_queue_table"):
            self.step("compare excluded", lambda: self.compare_excluded(models))

    def setup(self) -> None:
        """Tables the host has outside its models (``setup_sql``)."""
        engine = self.engine()
        with engine.begin() as connection:
            for statement in self.spec.get("setup_sql", []):
                connection.execute(text(statement))
        engine.dispose()

    def autogenerate(self) -> None:
        """``alembic revision --autogenerate``: the revision's source goes in the report."""
        command.revision(self.config(), message="initial", autogenerate=True, rev_id="0001")
        [revision] = sorted((self.root / "migrations" / "versions").glob("*.py"))
        self.report["revision"] = revision.read_text()

    def offline(self) -> None:
        """``alembic upgrade head --sql``: the script goes in the report."""
        buffer = io.StringIO()
        command.upgrade(self.config(buffer=buffer), "head", sql=True)
        self.report["offline_sql"] = buffer.getvalue()

    def upgrade(self, tenant: str | None) -> None:
        """``alembic [-x tenant=NAME] upgrade head``."""
        command.upgrade(self.config(tenant=tenant), "head")

    def downgrade(self, tenant: str | None) -> None:
        """``alembic [-x tenant=NAME] downgrade base``."""
        command.downgrade(self.config(tenant=tenant), "base")

    def verify(self, queues: dict[str, Any]) -> None:
        """``queue.verify`` of every queue, on every tenant's connection."""
        found: dict[str, str] = {}
        for tenant in self.spec.get("tenants") or [None]:
            engine = self.engine(tenant)
            for name, queue in queues.items():
                with engine.connect() as connection:
                    try:
                        queue.verify(connection)
                        found[f"{name}@{tenant}"] = "ok"
                    except Exception as exc:
                        found[f"{name}@{tenant}"] = f"{type(exc).__name__}: {exc}"
            engine.dispose()
        self.report["verify"] = found

    def compare_tenants(self, queues: dict[str, Any]) -> None:
        """Autogenerate's queue comparison on each tenant's translated connection.

        Alembic's own comparison of the host's tables does not follow a
        ``schema_translate_map`` (it reflects the translated schema but names the metadata's
        tables by the placeholder), so only the queue's part is compared here: the host's
        ``include_object`` keeps the queue's tables and leaves the rest out.
        """
        queue_tables = {
            table.name
            for queue in queues.values()
            for table in queue.metadata.sorted_tables
            if "sqla_queue" in table.info
        }

        def only_queue(obj: Any, name: str | None, type_: str, *_: Any) -> bool:
            return type_ != "table" or name in queue_tables

        found: dict[str, list[str]] = {}
        models = importlib.import_module("myapp.models")
        for tenant in [*self.spec["tenants"], self.spec["unmigrated_tenant"]]:
            engine = self.engine(tenant)
            with engine.connect() as connection:
                found[tenant] = _diffs(
                    connection,
                    models.TARGET_METADATA,
                    include_schemas=True,
                    include_object=only_queue,
                    include_name=lambda name, type_, _p, t=tenant: (
                        name in (None, t) if type_ == "schema" else name in queue_tables
                    ),
                )
            engine.dispose()
        self.report["tenant_diffs"] = found

    def compare_excluded(self, models: Any) -> None:
        """Autogenerate with the host's options, and one queue table excluded as well."""
        excluded = self.spec["excluded_queue_table"]
        options: dict[str, Any] = dict(importlib.import_module("myapp.alembic_options").OPTIONS)
        host = options.get("include_object")

        def include_object(obj: Any, name: str | None, type_: str, *rest: Any) -> bool:
            if type_ == "table" and name == excluded:
                return False
            return host is None or bool(host(obj, name, type_, *rest))

        options["include_object"] = include_object
        engine = self.engine()
        with engine.connect() as connection:
            self.report["excluded_diffs"] = _diffs(connection, models.TARGET_METADATA, **options)
        engine.dispose()

    def workers(self, queues: dict[str, Any]) -> None:
        """Per queue and tenant: enqueue two jobs, run a burst worker, record the outcomes."""
        outcomes: dict[str, list[list[Any]]] = {}
        for tenant in self.spec.get("tenants") or [None]:
            for name, queue in queues.items():
                key = f"{name}@{tenant}"
                if self.spec.get("async"):
                    outcomes[key] = asyncio.run(self.async_worker(queue))
                else:
                    outcomes[key] = self.sync_worker(queue, tenant)
        self.report["jobs"] = outcomes

    def worker_settings(self) -> dict[str, Any]:
        """The case's worker settings over a burst worker's defaults."""
        settings = {"concurrency": 2, "poll_interval": 0.1, "install_signal_handlers": False}
        return {**settings, **self.spec.get("worker_settings", {})}

    def sync_worker(self, queue: Any, tenant: str | None) -> list[list[Any]]:
        """Two jobs through the host's sessionmaker and a burst worker; their outcomes."""
        engine = self.engine(tenant)
        session_factory = sessionmaker(engine)
        double = queue.get_task("double")
        with session_factory() as session:
            ids = [double.enqueue(session, 1), double.enqueue(session, 2)]
            session.commit()
        queue.worker(session_factory, **self.worker_settings()).run(burst=True)
        with session_factory() as session:
            job = queue.Job
            rows = session.execute(
                select(job.status, job.result).where(job.id.in_(ids)).order_by(job.id)
            ).all()
        engine.dispose()
        return [list(row) for row in rows]

    async def async_worker(self, queue: Any) -> list[list[Any]]:
        """The same with the host's ``async_sessionmaker`` and an asyncio worker."""
        engine = create_async_engine(self.spec["async_url"], poolclass=NullPool)
        session_factory = async_sessionmaker(engine, expire_on_commit=False)
        double = queue.get_task("double")
        async with session_factory() as session:
            ids = [await double.enqueue(session, 1), await double.enqueue(session, 2)]
            await session.commit()
        await queue.async_worker(session_factory, **self.worker_settings()).run(burst=True)
        async with session_factory() as session:
            job = queue.Job
            result = await session.execute(
                select(job.status, job.result).where(job.id.in_(ids)).order_by(job.id)
            )
            rows = result.all()
        await engine.dispose()
        return [list(row) for row in rows]


class _Stop(Exception):
    """A step failed; its error is in the report."""


def _diffs(connection: Connection, metadata: Any, **options: Any) -> list[str]:
    """``compare_metadata`` with these options, each difference as a string."""
    context = MigrationContext.configure(connection, opts={"compare_type": True, **options})
    return [repr(diff) for diff in compare_metadata(context, metadata)]


@contextlib.contextmanager
def _sawarnings_are_errors() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", SAWarning)
        yield


def main(argv: list[str]) -> int:
    """Run the case in ``argv[0]`` and write its report; 0 even when a step failed."""
    root = Path(argv[0]).resolve()
    sys.path.insert(0, str(root))
    driver = Driver(root)
    with _sawarnings_are_errors(), contextlib.suppress(_Stop):
        driver.run()
    (root / "report.json").write_text(json.dumps(driver.report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
