"""Per-key serialization (queue_id) across worker processes.

At most one execution per queue_id runs at a time, in (execute_at, id) order, and a hot
key with a long backlog does not hold up other work.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
import time
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import ExecutionLog, keyed, noop, queue
from tests.support.processes import start_worker

pytestmark = pytest.mark.acceptance


def test_each_queue_id_runs_serially_in_order(
    db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    rng = random.Random(1234)
    base = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    # Three possible timestamps per key: many exact ties, broken by id.
    specs = []
    for i in range(100 * 40):
        key = f"acct-{rng.randrange(100)}"
        at = base + dt.timedelta(seconds=rng.choice([0, 1, 2]))
        specs.append(keyed.options(queue_id=key, run_at=at).call(key=key, seq=i))
    rng.shuffle(specs)
    with SessionLocal.begin() as session:
        ids = queue.enqueue_many(session, specs)
    expected: dict[str, list[int]] = defaultdict(list)
    with SessionLocal() as session:
        rows = session.execute(
            select(queue.Job.id, queue.Job.queue_id).order_by(queue.Job.scheduled_at, queue.Job.id)
        ).all()
    for job_id, key in rows:
        expected[key].append(job_id)

    workers = [
        start_worker(
            db_url,
            "--tasks",
            "keyed",
            "--concurrency",
            "2",  # 8 processes within the test's connection budget (tests/conftest.py)
            "--burst",
            log_path=tmp_path / f"w{i}.log",
        )
        for i in range(8)
    ]
    codes = [w.wait(timeout=300) for w in workers]
    assert codes == [0] * 8, "\n".join(p.read_text() for p in tmp_path.glob("w*.log"))

    with SessionLocal() as session:
        log = session.execute(
            select(
                ExecutionLog.job_id,
                ExecutionLog.key,
                ExecutionLog.started_at,
                ExecutionLog.finished_at,
                ExecutionLog.pid,
            ).order_by(ExecutionLog.started_at, ExecutionLog.id)
        ).all()
        left = session.execute(
            select(queue.JobExecution.state, func.count()).group_by(queue.JobExecution.state)
        ).all()
        assert left == [], "executions left behind, by state"
    assert len(log) == len(ids)
    assert len({row.pid for row in log}) > 1
    by_key: dict[str, list[tuple[int, dt.datetime, dt.datetime]]] = defaultdict(list)
    job_key = {job_id: key for key, job_ids in expected.items() for job_id in job_ids}
    for row in log:
        by_key[job_key[row.job_id]].append((row.job_id, row.started_at, row.finished_at))
    for key, runs in by_key.items():
        assert [job_id for job_id, _, _ in runs] == expected[key], key
        for (_, _, prev_end), (_, start, _) in itertools.pairwise(runs):
            assert start >= prev_end, f"{key}: overlapping executions"


def test_a_hot_queue_id_does_not_starve_other_jobs(
    db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    with SessionLocal.begin() as session:
        # The hot key's backlog comes first in claim order.
        queue.enqueue_many(
            session, [keyed.options(queue_id="hot").call(key="hot", seq=i) for i in range(5_000)]
        )
        others = queue.enqueue_many(session, [noop.call() for _ in range(500)])

    workers = [
        start_worker(
            db_url, "--tasks", "keyed,noop", "--concurrency", "4", log_path=tmp_path / f"w{i}.log"
        )
        for i in range(4)
    ]
    started = time.monotonic()
    try:
        while True:
            with SessionLocal() as session:
                done = session.scalar(
                    select(func.count())
                    .select_from(queue.Job)
                    .where(queue.Job.id.in_(others), queue.Job.status == "succeeded")
                )
                hot_done = session.scalar(select(func.count()).select_from(ExecutionLog))
            if done == len(others):
                break
            assert time.monotonic() - started < 120, f"only {done} of 500 done"
            time.sleep(0.2)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
    # The other jobs finished long before the hot key's serial backlog could have.
    assert hot_done is not None and hot_done < 5_000
