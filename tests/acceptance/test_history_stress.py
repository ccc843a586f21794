"""Partitioned history under load: three worker processes drain jobs while partitions are
created and dropped beside them, and every job runs exactly once.

The completions move rows into time partitions while the test's own connection keeps
running the maintenance (creating partitions ahead, backfilling past ones) and the prune
(dropping past partitions, which locks the branch the completions write to). Each
execution is recorded in its handler's committed transaction; at the end every job
succeeded, once, with one recorded run, and no job waits in a default partition.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import sessionmaker

from sqla_queue.history import maintain_history, prune_history
from sqla_queue.testing.databases import DatabaseFactory
from tests.support.history_app import logged, metadata, queue, runs
from tests.support.processes import start_worker

pytestmark = pytest.mark.acceptance

JOBS = 3000
WORKERS = 3
DEADLINE = 120.0


@pytest.fixture
def hq_url(db_factory: DatabaseFactory) -> Iterator[str]:
    url = db_factory.clone("template0")
    engine = create_engine(url)
    with engine.begin() as connection:
        queue.create_all(connection)
        runs.create(connection)
    engine.dispose()
    yield url
    db_factory.drop(url)


def churn_partitions(engine: Engine, rounds: int) -> int:
    """Create, backfill and drop partitions; how many were dropped."""
    dropped = 0
    for i in range(rounds):
        with engine.begin() as connection:
            # A past day's job makes backfill create that day's partition, which the
            # prune then drops again: DDL on the branch the completions write to.
            connection.execute(
                text(
                    "INSERT INTO hq_jobs (task, payload, max_attempts, scheduled_at, status, "
                    "finished_at) VALUES ('ok', '{}', 1, now(), 'succeeded', "
                    "now() - make_interval(days => :d))"
                ),
                {"d": 3 + i % 3},
            )
            maintain_history(connection, queue.tables, ahead=2, backfill=True)
        with engine.begin() as connection:
            report = prune_history(connection, queue.tables, older_than=dt.timedelta(days=2))
            dropped += len(report.partitions)
    return dropped


def test_drain_with_partition_ddl_running_beside_it(hq_url: str, tmp_path: Path) -> None:
    engine = create_engine(hq_url)
    sessions = sessionmaker(engine)
    with sessions.begin() as session:
        maintain_history(session, queue.tables, ahead=1)
        ids = queue.enqueue_many(session, [logged.call(n=i) for i in range(JOBS)])
    workers = [
        start_worker(
            hq_url,
            "--concurrency",
            "10",
            "--batch-size",
            "10",
            "--poll-interval",
            "0.05",
            log_path=tmp_path / f"worker{i}.log",
            target="tests.support.history_app:queue",
        )
        for i in range(WORKERS)
    ]
    dropped = 0
    try:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            dropped += churn_partitions(engine, 1)
            with engine.connect() as connection:
                left = connection.scalar(text("SELECT count(*) FROM hq_jobs_live"))
            if left == 0:
                break
        else:
            pytest.fail(f"the drain did not finish within {DEADLINE}s")
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(30)
    with engine.connect() as connection:
        statuses = dict(
            connection.execute(
                text("SELECT status, count(*) FROM hq_jobs WHERE id = ANY(:ids) GROUP BY 1"),
                {"ids": ids},
            ).all()
        )
        per_job = connection.execute(
            text("SELECT count(*), count(DISTINCT job_id), max(attempt) FROM hq_runs")
        ).one()
        waiting = connection.scalar(
            text(
                "SELECT count(*) FROM hq_jobs WHERE id = ANY(:ids) "
                "AND tableoid::regclass::text LIKE '%default'"
            ),
            {"ids": ids},
        )
    engine.dispose()
    logs = "\n".join(p.read_text() for p in tmp_path.glob("worker*.log"))
    assert statuses == {"succeeded": JOBS}, logs[-3000:]
    assert tuple(per_job) == (JOBS, JOBS, 1), "a job ran twice, or not at all"
    assert waiting == 0
    assert dropped > 0, "the prune never dropped a partition beside the drain"
    assert metadata.tables["hq_runs"] is runs
