"""A bounded task under 6 racing enqueuer processes and a slow worker (issue, part 5).

Six enqueuer processes (``multiprocessing`` spawn; four sync, two async) meet at a barrier,
then enqueue ``drained`` jobs (``max_pending=25``) as fast as they can for a few seconds:
one to three jobs per transaction, raising at once or waiting up to 0.3 s for room,
sometimes holding the transaction open a few milliseconds, rolling back one time in five
(see :func:`tests.support.bounded.enqueue_storm`). A worker process drains the task slowly
(one handler at a time, 80 ms each: at most 12.5 jobs a second, fewer than the
enqueuers commit even on a loaded machine), so the task is full most of the time.

The bound is checked two ways while it runs:

* at every commit that adds a ``drained`` execution, a deferred constraint trigger counts
  the task's pending and waiting executions (its own rows included, every earlier commit
  visible) and writes the count to an audit table;
* a sampler thread counts them from another connection every few milliseconds.

Neither may ever exceed 25. Then every job is accounted for: the committed ids are
exactly the task's jobs, all succeeded, and no rolled-back id exists.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.pool import NullPool

from tests.support import bounded as bq
from tests.support.processes import start_worker
from tests.support.running import wait_for

pytestmark = pytest.mark.acceptance

PROCESSES = 6
STORM_SECONDS = 10.0
EXECUTIONS = f"{bq.SCHEMA}.{bq.queue.tables.prefix}job_executions"
PENDING_SQL = (
    f"SELECT count(*) FROM {EXECUTIONS} WHERE task = 'drained' AND state IN ('pending', 'waiting')"
)

AUDIT_DDL = f"""
CREATE TABLE public.bounded_audit (
    id bigserial PRIMARY KEY,
    pending integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION public.bounded_audit_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.bounded_audit (pending) {PENDING_SQL};
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER bounded_audit_at_commit
    AFTER INSERT ON {EXECUTIONS}
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.task = 'drained')
    EXECUTE FUNCTION public.bounded_audit_count();
"""


class Sampler:
    """Counts the task's pending jobs from its own connection until stopped."""

    def __init__(self, db_url: str) -> None:
        self.engine = create_engine(db_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        self.samples: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with self.engine.connect() as connection:
            while not self.stop.is_set():
                self.samples.append(int(connection.exec_driver_sql(PENDING_SQL).scalar_one()))
                time.sleep(0.003)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.engine.dispose()


def run_storm(db_url: str, log_dir: Path) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    paths = [log_dir / f"enqueuer{i}.json" for i in range(PROCESSES)]
    procs = [
        ctx.Process(
            target=bq.enqueue_storm,
            args=(db_url, i, STORM_SECONDS, barrier, str(path)),
            daemon=True,
        )
        for i, path in enumerate(paths)
    ]
    for proc in procs:
        proc.start()
    # Spawned interpreters import SQLAlchemy and the library before the barrier: seconds
    # each on a loaded machine, so the deadline is generous (a hang still fails the test).
    deadline = time.monotonic() + STORM_SECONDS + 90
    try:
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES
    return [json.loads(path.read_text()) for path in paths]


def test_six_enqueuers_never_take_a_bounded_task_past_its_bound(
    db_url: str, tmp_path: Path
) -> None:
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.begin() as connection:
        bq.create(connection)
        connection.exec_driver_sql(AUDIT_DDL)
    worker = start_worker(
        db_url,
        "--concurrency",
        "1",
        "--poll-interval",
        "0.2",
        log_path=tmp_path / "worker.log",
        target="tests.support.bounded:queue",
    )
    try:
        with Sampler(db_url) as sampler:
            logs = run_storm(db_url, tmp_path)

            def drained() -> bool:
                with engine.connect() as connection:
                    left = connection.execute(text(f"SELECT count(*) FROM {EXECUTIONS}"))
                    return bool(left.scalar_one() == 0)

            wait_for(drained, timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)

    errors = [error for log in logs for error in log["errors"]]
    assert not errors, errors[0]
    committed = [i for log in logs for i in log["committed"]]
    rolled_back = {i for log in logs for i in log["rolled_back"]}
    refused = sum(log["full"] for log in logs)
    with engine.connect() as connection:
        jobs = dict(
            connection.execute(
                select(bq.JOBS.c.id, bq.JOBS.c.status).where(bq.JOBS.c.task == "drained")
            ).all()
        )
        audit = [row[0] for row in connection.execute(text("SELECT pending FROM bounded_audit"))]
    engine.dispose()

    # The storm was a storm: the task was full again and again, and jobs got through.
    assert refused >= 5, refused
    assert len(committed) >= 60, len(committed)
    assert rolled_back
    # The bound held at every commit and in every sample, and was reached.
    assert len(audit) == len(committed)
    assert max(audit) == bq.DRAINED, max(audit)
    assert len(sampler.samples) > 500
    assert max(sampler.samples) <= bq.DRAINED, max(sampler.samples)
    # Every job is accounted for.
    assert len(set(committed)) == len(committed)
    assert set(jobs) == set(committed)
    assert set(jobs.values()) == {"succeeded"}
    assert not rolled_back & set(jobs)
    print(
        f"committed {len(committed)}, rolled back {len(rolled_back)}, refused {refused}, "
        f"samples {len(sampler.samples)} (max {max(sampler.samples)}), "
        f"audited commits {len(audit)} (max {max(audit)})"
    )
