"""Prefetch on real worker processes: held jobs come back after the lost interval when their
worker dies, start in priority order, and each runs exactly once, sync and async.

The stress tests of limits, rate limits and key order run half their workers with
``--prefetch`` too (tests/acceptance/test_limit_stress.py, test_rate_limit_stress.py,
test_key_order.py).
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import ExecutionLog, Result, queue, record, record_async, slow_first
from tests.support.processes import start_worker
from tests.support.running import wait_for

pytestmark = pytest.mark.acceptance

EX = queue.tables.executions
JOBS = queue.tables.jobs


def test_jobs_prefetched_by_a_killed_worker_come_back_after_the_lost_interval(
    db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    # slow_first: lost interval 1 s; its first attempt sleeps, later ones return at once.
    with SessionLocal.begin() as session:
        ids = queue.enqueue_many(session, [slow_first.call(seconds=60) for _ in range(4)])
    holder = start_worker(
        db_url,
        "--tasks",
        "slow_first",
        "--concurrency",
        "1",
        "--prefetch",
        "3",
        log_path=tmp_path / "holder.log",
    )
    try:

        def all_held() -> bool:
            with SessionLocal() as session:
                held = session.scalar(
                    select(func.count()).where(EX.c.state == "running", EX.c.id.in_(ids))
                )
                started = session.scalar(select(func.count()).select_from(ExecutionLog))
            return held == 4 and started == 1

        wait_for(all_held, timeout=30)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        killed_at = time.monotonic()
    finally:
        if holder.poll() is None:
            holder.kill()
    rescuer = start_worker(
        db_url, "--tasks", "slow_first", "--concurrency", "4", log_path=tmp_path / "rescuer.log"
    )
    try:

        def all_done() -> bool:
            with SessionLocal() as session:
                done = session.scalar(
                    select(func.count()).where(JOBS.c.status == "succeeded", JOBS.c.id.in_(ids))
                )
            return done == 4

        wait_for(all_done, timeout=60)
        # The lost interval (1 s), a sweep and a claim: seconds, not the hours a lock
        # timeout would take.
        assert time.monotonic() - killed_at < 20
    finally:
        rescuer.send_signal(signal.SIGTERM)
        rescuer.wait(30)
    with SessionLocal() as session:
        first_attempts = session.scalar(
            select(func.count()).select_from(ExecutionLog).where(ExecutionLog.attempt == 1)
        )
        runs = session.execute(
            select(ExecutionLog.job_id, func.count()).group_by(ExecutionLog.job_id)
        ).all()
    # Only the job that had a seat started in the killed worker; the prefetched three
    # never ran there, and each ran once after the reclaim.
    assert first_attempts == 1
    assert sorted(count for _, count in runs) == [1, 1, 1, 2]


def test_each_worker_starts_its_prefetched_jobs_in_priority_order(
    db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    rng = random.Random(11)
    priorities = [rng.randrange(5) for _ in range(60)]
    with SessionLocal.begin() as session:
        ids = queue.enqueue_many(
            session, [record.options(priority=p).call(value=str(p)) for p in priorities]
        )
    priority_of = dict(zip(ids, priorities, strict=True))
    workers = [
        start_worker(
            db_url,
            "--tasks",
            "record",
            "--concurrency",
            "1",
            "--prefetch",
            "4",
            "--burst",
            log_path=tmp_path / f"w{i}.log",
        )
        for i in range(2)
    ]
    for worker in workers:
        assert worker.wait(120) == 0
    with SessionLocal() as session:
        starts = session.execute(
            select(ExecutionLog.pid, ExecutionLog.job_id).order_by(ExecutionLog.started_at)
        ).all()
    assert sorted(job_id for _, job_id in starts) == sorted(ids)  # each once
    by_worker: dict[int, list[int]] = {}
    for pid, job_id in starts:
        by_worker.setdefault(pid, []).append(priority_of[job_id])
    assert len(by_worker) == 2
    for sequence in by_worker.values():
        # Every job was pending before the workers started, and claims take the most
        # urgent first: a worker that starts its held jobs by priority never starts a
        # less urgent job before a more urgent one it holds or will claim.
        assert sequence == sorted(sequence, reverse=True)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_prefetching_worker_runs_every_job_exactly_once(
    face: str, db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    task = record_async if face == "async" else record
    with SessionLocal.begin() as session:
        ids = queue.enqueue_many(session, [task.call(value=str(i)) for i in range(300)])
    args = ["--async"] if face == "async" else []
    workers = [
        start_worker(
            db_url,
            *args,
            "--tasks",
            task.name,
            "--concurrency",
            "3",
            "--prefetch",
            "7",
            "--burst",
            log_path=tmp_path / f"w{i}.log",
        )
        for i in range(2)
    ]
    for worker in workers:
        assert worker.wait(120) == 0
    with SessionLocal() as session:
        values = session.scalars(select(Result.value)).all()
        statuses = session.execute(
            select(JOBS.c.status, JOBS.c.attempts, func.count())
            .where(JOBS.c.id.in_(ids))
            .group_by(JOBS.c.status, JOBS.c.attempts)
        ).all()
        left = session.scalar(select(func.count()).select_from(EX))
    assert sorted(values, key=int) == [str(i) for i in range(300)]
    assert statuses == [("succeeded", 1, 300)]
    assert left == 0
