"""The Alembic path to partitioned history, on a real database.

* ``op.create_queue(..., history="partitioned")`` makes what ``Queue(history="partitioned")``
  verifies, and autogenerate writes it for such a queue, leaving the time partitions alone.
* ``op.partition_history`` converts a plain queue holding jobs: every row, the
  next id and the grants carry over, finished jobs then move into time partitions with
  ``maintain --backfill``; ``op.unpartition_history`` goes back, and a plain model verifies.
* A queue partitioned at version 5 or 6 is still partitioned after the steps to the latest
  version, which leave the jobs table alone.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator

import pytest
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Connection, Integer, MetaData, Table, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

import alembic_ext  # noqa: F401  (registers the operations)
from alembic_ext import CreateQueueOp, PartitionHistoryOp, UnpartitionHistoryOp, UpgradeQueueOp
from alembic_ext.versions import LATEST_VERSION
from sqla_queue import Queue
from sqla_queue.history import maintain_history
from tests.migration.conftest import engine_for
from tests.migration.test_comparator_database import autogenerate

pytestmark = pytest.mark.migration

PREFIX = "hm_"


@pytest.fixture
def engine(empty_db_url: str) -> Iterator[Engine]:
    eng = engine_for(empty_db_url)
    yield eng
    eng.dispose()


def queue_for(history: str) -> Queue:
    queue = Queue(metadata=MetaData(), prefix=PREFIX, history=history)

    @queue.task(name="work")
    def work(n: int) -> int:
        return n

    return queue


def apply(connection: Connection, *ops: object) -> None:
    operations = Operations(MigrationContext.configure(connection))
    for op in ops:
        operations.invoke(op)  # type: ignore[arg-type]


def fill(connection: Connection) -> None:
    """Jobs in every state a history holds: queued, succeeded long ago, failed, unique."""
    connection.execute(
        text(
            f"INSERT INTO {PREFIX}jobs (task, payload, max_attempts, scheduled_at, status, "
            "finished_at, unique_key) SELECT 'work', '{}'::jsonb, 1, now(), "
            "CASE WHEN i % 10 = 0 THEN 'queued' WHEN i % 10 = 1 THEN 'failed' "
            "ELSE 'succeeded' END, "
            "CASE WHEN i % 10 = 0 THEN NULL ELSE now() - make_interval(days => i % 5) END, "
            "CASE WHEN i = 7 THEN 'u7' END FROM generate_series(1, 200) AS i"
        )
    )


def counts(connection: Connection) -> dict[str, int]:
    rows = connection.execute(text(f"SELECT status, count(*) FROM {PREFIX}jobs GROUP BY 1"))
    return {str(status): int(n) for status, n in rows}


def test_create_queue_partitioned_is_what_the_model_verifies(engine: Engine) -> None:
    queue = queue_for("partitioned")
    with engine.begin() as connection:
        apply(
            connection, CreateQueueOp(None, PREFIX, version=LATEST_VERSION, history="partitioned")
        )
    with engine.connect() as connection:
        queue.verify(connection)
        with pytest.raises(Exception, match=f"{PREFIX}jobs_pkey"):
            queue_for("plain").verify(connection)


@pytest.mark.parametrize("from_version", [5, 6])
def test_a_queue_partitioned_at_an_older_version_stays_partitioned_through_the_steps(
    engine: Engine, from_version: int
) -> None:
    with engine.begin() as connection:
        apply(connection, CreateQueueOp(None, PREFIX, version=from_version, history="partitioned"))
        fill(connection)
        before = counts(connection)
        apply(connection, UpgradeQueueOp(from_version, LATEST_VERSION, None, PREFIX))
    with engine.connect() as connection:
        queue_for("partitioned").verify(connection)
        assert counts(connection) == before


def test_autogenerate_writes_the_layout_and_leaves_time_partitions_alone(engine: Engine) -> None:
    queue = queue_for("partitioned")
    metadata = queue.metadata
    Table("accounts", metadata, Column("id", Integer, primary_key=True))
    with engine.connect() as connection:
        ops = autogenerate(connection, metadata)
    assert ops[0] == CreateQueueOp(None, PREFIX, version=LATEST_VERSION, history="partitioned")
    with engine.begin() as connection:
        apply(connection, ops[0])
        maintain_history(connection, queue.tables, ahead=2)
        connection.execute(text("CREATE TABLE accounts (id INTEGER PRIMARY KEY)"))
    with engine.connect() as connection:
        again = autogenerate(connection, metadata)
    # The partitions are the queue's: no drop_table for hm_jobs_done_p..., nothing at all.
    assert again == []


def test_partition_history_carries_rows_ids_and_grants_and_goes_back(engine: Engine) -> None:
    role = f"hm_app_{uuid.uuid4().hex[:8]}"
    with engine.begin() as connection:
        apply(connection, CreateQueueOp(None, PREFIX, version=LATEST_VERSION))
        fill(connection)
        connection.execute(text(f"CREATE ROLE {role}"))
        connection.execute(text(f"GRANT SELECT, INSERT ON {PREFIX}jobs TO {role}"))
        before = counts(connection)
        last_id = connection.scalar(text(f"SELECT max(id) FROM {PREFIX}jobs"))
    try:
        with engine.begin() as connection:
            apply(connection, PartitionHistoryOp(None, PREFIX, version=LATEST_VERSION))
        partitioned = queue_for("partitioned")
        with engine.begin() as connection:
            partitioned.verify(connection)
            assert counts(connection) == before
            assert connection.scalar(
                text(f"SELECT has_table_privilege('{role}', '{PREFIX}jobs', 'INSERT')")
            )
            report = maintain_history(connection, partitioned.tables, ahead=1, backfill=True)
            assert report.moved == sum(n for s, n in before.items() if s != "queued")
            homes = connection.execute(
                text(f"SELECT DISTINCT tableoid::regclass::text FROM {PREFIX}jobs")
            ).scalars()
            assert not any(h.endswith("_default") for h in homes)
        with Session(engine) as session, session.begin():
            new_id = partitioned.get_task("work").enqueue(session, n=1)
        assert new_id > last_id
        with engine.begin() as connection:
            pruned = partitioned.prune(connection, older_than=dt.timedelta(days=10))
            assert pruned == 0
            apply(connection, UnpartitionHistoryOp(None, PREFIX, version=LATEST_VERSION))
        with engine.begin() as connection:
            queue_for("plain").verify(connection)
            after = counts(connection)
            assert after == {**before, "queued": before["queued"] + 1}
            assert connection.scalar(
                text(f"SELECT has_table_privilege('{role}', '{PREFIX}jobs', 'SELECT')")
            )
            kind = connection.scalar(
                text(f"SELECT relkind::text FROM pg_class WHERE relname = '{PREFIX}jobs'")
            )
            assert kind == "r"
    finally:
        with engine.begin() as connection:
            connection.execute(text(f"DROP OWNED BY {role}"))
            connection.execute(text(f"DROP ROLE {role}"))
