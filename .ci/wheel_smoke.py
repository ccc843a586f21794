"""Smoke test of an installed sqla_queue wheel, run by CI from a directory without the source.

Usage (with the interpreter of the virtualenv the wheel went into)::

    python -I wheel_smoke.py [--admin-url URL] [--demo-orders N]

``-I`` keeps the script's own directory and ``PYTHONPATH`` off ``sys.path``, so every import
comes from the installed wheel, which this script checks first. Then, in a database of its
own that it creates and drops on a PostgreSQL server (``--admin-url``, else
``$SQLA_QUEUE_TEST_URL``, else ``postgres@127.0.0.1:5432``):

* the package data and metadata: ``py.typed``, the version, the ``sqla-queue`` script;
* an application's path: tables created with ``metadata.create_all`` (with the executions
  table's storage parameters), ``queue.verify``, an enqueue committed and one rolled back, a
  burst worker, the job read back as succeeded with its result;
* Alembic's path: ``op.create_queue`` at the current schema version (the frozen SQL ships in
  the wheel), and the same verification passing on it;
* the demo, ``sqla-queue demo --url ...``, as the installed console script.

Exit status 0 when all of it passed; any failure raises.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata, resources
from pathlib import Path

from sqlalchemy import Engine, ForeignKey, String, create_engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def check(condition: object, what: str) -> None:
    """Fail with ``what`` unless ``condition`` holds (``assert`` would vanish under ``-O``)."""
    if not condition:
        raise SystemExit(f"wheel smoke test FAILED: {what}")
    print(f"  ok: {what}")


def check_installation() -> None:
    """The packages come from this virtualenv's site-packages, with their data files."""
    import alembic_ext
    import sqla_queue

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    for module in (sqla_queue, alembic_ext):
        where = Path(str(module.__file__)).resolve()
        check(where.is_relative_to(site), f"{module.__name__} imported from {where.parent}")
        check(
            resources.files(module.__name__).joinpath("py.typed").is_file(),
            f"{module.__name__} ships py.typed",
        )
    version = metadata.version("sqla-queue")
    check(sqla_queue.__version__ == version, f"sqla_queue.__version__ is {version}")
    check(
        resources.files("alembic_ext.versions").joinpath("v1.py").is_file(),
        "alembic_ext ships its frozen schema versions",
    )
    script = shutil.which("sqla-queue", path=str(Path(sys.executable).parent))
    check(script is not None, "the sqla-queue console script is installed")


class Base(DeclarativeBase):
    """The smoke application's declarative base."""


class Order(Base):
    """An application table next to the queue's."""

    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))


class Receipt(Base):
    """What the job writes, in the worker's transaction."""

    __tablename__ = "receipts"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"))


def check_application(engine: Engine) -> None:
    """Tables, verification, enqueue in a transaction, a burst worker, the job's outcome."""
    from sqla_queue import JobContext, JobStatus, Queue

    queue = Queue(Base)

    @queue.task(name="write_receipt", pass_context=True, max_attempts=2)
    def write_receipt(ctx: JobContext[Session], order_id: int) -> int:
        ctx.session.add(Receipt(order_id=order_id))
        ctx.session.commit()
        return order_id * 10

    Base.metadata.create_all(engine)
    executions = queue.tables.executions.name
    with engine.connect() as connection:
        queue.verify(connection)
        options = connection.scalar(
            text("SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = :name"),
            {"name": executions},
        )
    check(True, "metadata.create_all built a schema that queue.verify accepts")
    check(options == "fillfactor=70", f"{executions} has fillfactor=70 (found {options!r})")

    SessionLocal = sessionmaker(engine)
    with SessionLocal.begin() as session:
        session.add(Order(id=1, customer="ada"))
        session.flush()
        write_receipt.enqueue(session, 1)
    with SessionLocal() as session:
        session.add(Order(id=2, customer="bob"))
        session.flush()
        write_receipt.enqueue(session, 2)
        session.rollback()

    queue.worker(SessionLocal, concurrency=2).run(burst=True)

    with Session(engine) as session:
        jobs = session.scalars(select(queue.Job)).all()
        receipts = session.scalars(select(Receipt.order_id)).all()
    check(len(jobs) == 1, "the rolled-back enqueue left no job")
    job = jobs[0]
    check(job.status == JobStatus.SUCCEEDED, f"the burst worker ran the job ({job.status})")
    check(job.result == 10, f"the job's result was stored ({job.result!r})")
    check(receipts == [1], "the handler's own transaction committed")


def check_alembic(engine: Engine) -> None:
    """``op.create_queue`` runs the frozen SQL shipped in the wheel; verification accepts it."""
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from sqlalchemy import MetaData

    import alembic_ext
    from sqla_queue import SCHEMA_VERSION, Queue

    check(alembic_ext.is_installed(), "importing alembic_ext registers its operations")
    with engine.begin() as connection:
        operations = Operations(MigrationContext.configure(connection))
        operations.create_queue(schema="via_alembic", version=SCHEMA_VERSION)  # type: ignore[attr-defined]
        Queue(metadata=MetaData(), schema="via_alembic").verify(connection)
    check(True, f"op.create_queue(version={SCHEMA_VERSION}) built a schema verify accepts")


def run_demo(url: str, orders: int) -> None:
    """``sqla-queue demo`` as a user runs it, from the installed console script."""
    script = shutil.which("sqla-queue", path=str(Path(sys.executable).parent))
    assert script is not None
    command = [script, "demo", "--url", url, "--orders", str(orders)]
    print(f"  $ sqla-queue demo --url <fresh database> --orders {orders}", flush=True)
    completed = subprocess.run(command, check=False)
    check(completed.returncode == 0, f"sqla-queue demo exited {completed.returncode}")


def main() -> None:
    """Create a fresh database, run every check in it, drop it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("SQLA_QUEUE_TEST_URL") or DEFAULT_ADMIN_URL,
        help="a maintenance database on the server (default: $SQLA_QUEUE_TEST_URL, else local)",
    )
    parser.add_argument("--demo-orders", type=int, default=300, help="orders the demo places")
    args = parser.parse_args()

    print(f"wheel smoke test: Python {sys.version.split()[0]} in {sys.prefix}, cwd {Path.cwd()}")
    check_installation()

    admin_url = make_url(args.admin_url)
    if admin_url.drivername in ("postgresql", "postgres"):
        admin_url = admin_url.set(drivername="postgresql+psycopg")
    name = f"sqlaq_wheel_smoke_{os.getpid()}"
    url = admin_url.set(database=name).render_as_string(hide_password=False)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        engine = create_engine(url)
        try:
            check_application(engine)
            check_alembic(engine)
        finally:
            engine.dispose()
        run_demo(url, args.demo_orders)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    print("wheel smoke test: OK")


if __name__ == "__main__":
    main()
