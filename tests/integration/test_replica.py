"""Handlers read a streaming replica through ``ctx.read_session``; the lifecycle stays on the
primary.

What this proves, on two real PostgreSQL clusters (tests/support/clusters.py): a primary,
and a hot standby made from it with ``pg_basebackup`` streaming its WAL, both on free
loopback ports. Skipped, with the reason, where such clusters cannot be made.

For the sync and the async worker alike:

- a handler's ``ctx.read_session`` is served by the replica (``pg_is_in_recovery()`` is
  true there, on the replica's port) and reads what was replicated to it; a row written on
  the primary after replay was paused is missing there, yet ``ctx.session`` (the primary)
  sees it;
- every lifecycle write (claim, heartbeat, completion) happens on the primary: with the
  replica's replay paused, the job ends ``succeeded`` on the primary while the replica still
  sees it queued, and once replay resumes the replica sees it succeeded; the replica's
  engine only ever ran the handler's ``SELECT``.

And without ``read_session_factory``, ``ctx.read_session`` raises an error naming the option
(there is no silent fallback to the primary); a factory of the wrong kind is refused when
the worker is made.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, create_engine, event, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import JobContext, Queue
from tests.support.app import QUEUE_SCHEMA
from tests.support.clusters import (
    REPLICATION_SETTINGS,
    ClusterError,
    TemporaryCluster,
    cluster_skip_reason,
    free_port,
    new_cluster_root,
)

pytestmark = pytest.mark.integration

#: A queue of its own on the replicated database: its tables are made there by the fixture.
queue = Queue(metadata=MetaData(), schema=QUEUE_SCHEMA, lost_interval=5.0)
#: What each handler saw, by job id (handlers run in the worker's threads or loop).
SEEN: dict[int, dict[str, Any]] = {}

_READ = text(
    "SELECT pg_is_in_recovery() AS in_recovery, inet_server_port() AS port, "
    "(SELECT body FROM replica_notes WHERE id = :id) AS body"
)
_NOTE = text("SELECT body FROM replica_notes WHERE id = :id")
_JOB_STATUS = text(f"SELECT status FROM {QUEUE_SCHEMA}.sqla_queue_jobs WHERE id = :id")


@queue.task(name="replica_read", pass_context=True)
def replica_read(ctx: JobContext[Session], old: int, new: int) -> None:
    """Read note ``old`` and the job's status on the replica, note ``new`` on the primary."""
    row = ctx.read_session.execute(_READ, {"id": old}).one()
    SEEN[ctx.job_id] = {
        "replica": dict(row._mapping),
        "new_on_replica": ctx.read_session.scalar(_NOTE, {"id": new}),
        "new_on_primary": ctx.session.scalar(_NOTE, {"id": new}),
        "job_on_replica": ctx.read_session.scalar(_JOB_STATUS, {"id": ctx.job_id}),
    }


@queue.task(name="replica_read_async", pass_context=True)
async def replica_read_async(ctx: JobContext[AsyncSession], old: int, new: int) -> None:
    """The async twin of :func:`replica_read`."""
    row = (await ctx.read_session.execute(_READ, {"id": old})).one()
    SEEN[ctx.job_id] = {
        "replica": dict(row._mapping),
        "new_on_replica": await ctx.read_session.scalar(_NOTE, {"id": new}),
        "new_on_primary": await ctx.session.scalar(_NOTE, {"id": new}),
        "job_on_replica": await ctx.read_session.scalar(_JOB_STATUS, {"id": ctx.job_id}),
    }


@queue.task(name="replica_missing", pass_context=True)
def replica_missing(ctx: JobContext[Session]) -> str:
    """Ask for a read session from a worker that has none; return the error's message."""
    try:
        ctx.read_session  # noqa: B018 - the property raises
    except RuntimeError as exc:
        return str(exc)
    return "no error"


@dataclass
class Replication:
    """A running primary and its streaming replica."""

    primary: TemporaryCluster
    replica: TemporaryCluster
    #: Statements the replica's engines ran, with the thread that ran each.
    replica_statements: list[tuple[str, str]] = field(default_factory=list)

    def watch(self, engine: Engine) -> None:
        """Record every statement ``engine`` (a replica's) runs."""

        def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            self.replica_statements.append((statement, threading.current_thread().name))

        event.listen(engine, "before_cursor_execute", record)


@pytest.fixture(scope="module")
def replication() -> Iterator[Replication]:
    """A primary with the queue's schema and a ``replica_notes`` table, and its replica."""
    reason = cluster_skip_reason(replication=True)
    if reason is not None:
        pytest.skip(f"cannot run a primary and a streaming replica here: {reason}")
    base = new_cluster_root("sqlaq-replica-")
    primary = replica = None
    try:
        primary = TemporaryCluster.create(
            base / "primary", port=free_port(), settings=REPLICATION_SETTINGS
        )
        primary.start()
        engine = create_engine(primary.url())
        try:
            with engine.begin() as connection:
                queue.create_all(connection)
                connection.execute(
                    text("CREATE TABLE replica_notes (id int PRIMARY KEY, body text NOT NULL)")
                )
        finally:
            engine.dispose()
        replica = primary.basebackup_replica(base / "replica", port=free_port())
        replica.wait_for_replay()
        yield Replication(primary, replica)
    except ClusterError as exc:
        pytest.fail(f"the test clusters did not come up: {exc}")
    finally:
        for cluster in (replica, primary):
            if cluster is not None:
                cluster.remove()
        shutil.rmtree(base, ignore_errors=True)


def _prepare(replication: Replication, task: str, old: int, new: int) -> int:
    """Enqueue a job reading note ``old``; replicate it; pause replay; add note ``new``."""
    primary, replica = replication.primary, replication.replica
    replica.execute_sql("SELECT pg_wal_replay_resume()")  # left paused by a failed test?
    primary.execute_sql(f"INSERT INTO replica_notes VALUES ({old}, 'replicated {old}')")
    engine = create_engine(primary.url())
    try:
        with sessionmaker(engine).begin() as session:
            job_id = queue.get_task(task).enqueue(session, old=old, new=new)
    finally:
        engine.dispose()
    replica.wait_for_replay()
    replica.execute_sql("SELECT pg_wal_replay_pause()")
    primary.execute_sql(f"INSERT INTO replica_notes VALUES ({new}, 'not replayed yet')")
    return int(job_id)


def _check(replication: Replication, job_id: int, old: int) -> None:
    """The read came from the replica; the lifecycle happened on the primary only."""
    primary, replica = replication.primary, replication.replica
    seen = SEEN.pop(job_id)
    assert seen["replica"] == {
        "in_recovery": True,
        "port": replica.port,
        "body": f"replicated {old}",
    }
    assert seen["new_on_replica"] is None
    assert seen["new_on_primary"] == "not replayed yet"
    # The replica still showed the job queued while the primary had it running.
    assert seen["job_on_replica"] == "queued"
    status = f"SELECT status, attempts FROM {QUEUE_SCHEMA}.sqla_queue_jobs WHERE id = {job_id}"
    assert primary.execute_sql(status) == [("succeeded", 1)]
    assert replica.execute_sql(status) == [("queued", 0)]  # replay is paused
    statements = [sql for sql, _ in replication.replica_statements]
    assert statements and all(sql.lstrip().upper().startswith("SELECT") for sql in statements)
    replica.execute_sql("SELECT pg_wal_replay_resume()")
    replica.wait_for_replay()
    assert replica.execute_sql(status) == [("succeeded", 1)]


def test_a_sync_handler_reads_the_replica_and_the_lifecycle_stays_on_the_primary(
    replication: Replication,
) -> None:
    job_id = _prepare(replication, "replica_read", old=1, new=2)
    primary_engine = create_engine(replication.primary.url())
    replica_engine = create_engine(replication.replica.url())
    replication.replica_statements.clear()
    replication.watch(replica_engine)
    try:
        worker = queue.worker(
            sessionmaker(primary_engine),
            read_session_factory=sessionmaker(replica_engine),
            tasks=["replica_read"],
            install_signal_handlers=False,
        )
        stats = worker.run(burst=True)
    finally:
        primary_engine.dispose()
        replica_engine.dispose()
    assert (stats.claimed, stats.succeeded) == (1, 1)
    _check(replication, job_id, old=1)
    handler_threads = {name for _, name in replication.replica_statements}
    assert all(name.startswith("sqla-queue-handler") for name in handler_threads)


async def test_an_async_handler_reads_the_replica_and_the_lifecycle_stays_on_the_primary(
    replication: Replication,
) -> None:
    job_id = _prepare(replication, "replica_read_async", old=3, new=4)
    primary_engine = create_async_engine(replication.primary.url())
    replica_engine = create_async_engine(replication.replica.url())
    replication.replica_statements.clear()
    replication.watch(replica_engine.sync_engine)
    try:
        worker = queue.async_worker(
            async_sessionmaker(primary_engine),
            read_session_factory=async_sessionmaker(replica_engine),
            tasks=["replica_read_async"],
            install_signal_handlers=False,
        )
        stats = await worker.run(burst=True)
    finally:
        await primary_engine.dispose()
        await replica_engine.dispose()
    assert (stats.claimed, stats.succeeded) == (1, 1)
    _check(replication, job_id, old=3)


def test_without_a_read_factory_read_session_raises_naming_the_option(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        factory = sessionmaker(engine)
        with factory.begin() as session:
            job_id = replica_missing.enqueue(session)
        worker = queue.worker(factory, tasks=["replica_missing"], install_signal_handlers=False)
        assert worker.run(burst=True).succeeded == 1
        message = queue.result(engine, job_id, timeout=5)
    finally:
        engine.dispose()
    assert "read_session_factory" in message


def test_a_read_factory_of_the_wrong_kind_is_refused(tmp_path: Path) -> None:
    sync_engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    async_engine = create_async_engine("postgresql+psycopg://localhost/none")
    with pytest.raises(TypeError, match="async_sessionmaker"):
        queue.worker(
            sessionmaker(sync_engine),
            read_session_factory=async_sessionmaker(async_engine),  # type: ignore[arg-type]
        )
    with pytest.raises(TypeError, match="sessionmaker"):
        queue.async_worker(
            async_sessionmaker(async_engine),
            read_session_factory=sessionmaker(sync_engine),  # type: ignore[arg-type]
        )
    with pytest.raises(TypeError, match="session factory"):
        queue.worker(sessionmaker(sync_engine), read_session_factory="replica")  # type: ignore[arg-type]
