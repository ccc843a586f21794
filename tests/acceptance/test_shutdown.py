"""SIGTERM on a real worker process (the CLI), for the sync and the async face.

The first SIGTERM stops claiming, tells handlers, waits up to ``--shutdown-timeout`` for
them, hands the unfinished ones back without using an attempt and exits 0. A second
SIGTERM exits at once (128 + 15); the jobs it abandons stay ``running`` until their lease
runs out, and then any worker reclaims and runs them.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, literal_column, select
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import statements
from tests.support.app import (
    ExecutionLog,
    Result,
    queue,
    record,
    record_async,
    sleepy,
    sleepy_async,
    slow_first,
)
from tests.support.chaos import catches_sigterm
from tests.support.processes import start_worker
from tests.support.running import wait_for

pytestmark = pytest.mark.acceptance

EX = queue.tables.executions
JOBS = queue.tables.jobs

SHUTDOWN_TIMEOUT = 2.0
#: What "a small margin" may add to shutdown_timeout: the final flush, thread and interpreter
#: teardown, on a busy shared machine.
EXIT_MARGIN = 3.0


def _log_rows(factory: sessionmaker[Session], job_ids: list[int]) -> list[Any]:
    with factory() as session:
        return list(
            session.execute(
                select(
                    ExecutionLog.job_id,
                    ExecutionLog.attempt,
                    ExecutionLog.pid,
                    ExecutionLog.finished_at,
                )
                .where(ExecutionLog.job_id.in_(job_ids))
                .order_by(ExecutionLog.id)
            )
        )


def _jobs(factory: sessionmaker[Session], job_ids: list[int]) -> dict[int, Any]:
    with factory() as session:
        rows = session.execute(select(JOBS).where(JOBS.c.id.in_(job_ids)))
        return {row.id: row for row in rows}


def _executions(factory: sessionmaker[Session], job_ids: list[int]) -> dict[int, Any]:
    with factory() as session:
        rows = session.execute(select(EX).where(EX.c.id.in_(job_ids)))
        return {row.id: row for row in rows}


def _stale(factory: sessionmaker[Session], job_ids: list[int]) -> int:
    """How many of ``job_ids`` are running with a heartbeat older than their lease."""
    stale = EX.c.alive_at < func.now() - literal_column("interval '1 second'") * EX.c.lease_seconds
    with factory() as session:
        query = (
            select(func.count())
            .select_from(EX)
            .where(EX.c.id.in_(job_ids), EX.c.state == "running", stale)
        )
        return int(session.scalar(query) or 0)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_sigterm_stops_claiming_finishes_cooperative_handlers_and_hands_back_the_rest(
    face: str, db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    long_task, extra_task = (sleepy, record) if face == "sync" else (sleepy_async, record_async)
    with SessionLocal.begin() as session:
        cooperative = [long_task.enqueue(session, seconds=30, cooperative=True) for _ in range(5)]
        stubborn = [long_task.enqueue(session, seconds=30, cooperative=False) for _ in range(5)]
    long_jobs = cooperative + stubborn
    args = [
        "--tasks",
        f"{long_task.name},{extra_task.name}",
        "--concurrency",
        "10",
        "--shutdown-timeout",
        str(SHUTDOWN_TIMEOUT),
        "--poll-interval",
        "0.2",
        *(["--async"] if face == "async" else []),
    ]
    log = tmp_path / "worker.log"
    proc = start_worker(db_url, *args, log_path=log)
    try:
        wait_for(lambda: len(_log_rows(SessionLocal, long_jobs)) == 10, timeout=60)
        # Work that arrives now waits for a free slot; after SIGTERM none may take it, even
        # when the cooperative handlers have given their slots back.
        with SessionLocal.begin() as session:
            extra = [extra_task.enqueue(session, value=f"extra {i}") for i in range(5)]
        assert catches_sigterm(proc.pid)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=SHUTDOWN_TIMEOUT + 30)
        elapsed = time.monotonic() - began
    finally:
        _stop(proc)
    output = log.read_text()
    print(f"{face} worker exited {elapsed:.2f}s after SIGTERM (shutdown_timeout 2)")

    assert code == 0, output
    # It waited for the stubborn handlers (up to the timeout), then no longer than a margin.
    assert SHUTDOWN_TIMEOUT - 0.1 <= elapsed < SHUTDOWN_TIMEOUT + EXIT_MARGIN, (elapsed, output)

    jobs = _jobs(SessionLocal, long_jobs + extra)
    executions = _executions(SessionLocal, long_jobs + extra)
    log_rows = _log_rows(SessionLocal, long_jobs + extra)
    # Ten executions started, all of them before SIGTERM: nothing was claimed after it.
    assert sorted(r.job_id for r in log_rows) == sorted(long_jobs)
    assert all(r.attempt == 1 and r.pid == proc.pid for r in log_rows)
    finished = {r.job_id for r in log_rows if r.finished_at is not None}

    for job_id in cooperative:
        job = jobs[job_id]
        assert (job.status, job.result, job.attempts, job.errors) == ("succeeded", "done", 1, [])
        assert job_id not in executions
    assert finished == set(cooperative)

    for job_id in stubborn:
        job = jobs[job_id]
        # Handed back: queued again, no attempt used, no error recorded.
        assert (job.status, job.attempts, job.errors, job.result) == ("queued", 0, [], None)
        ex = executions[job_id]
        assert (ex.state, ex.attempt, ex.worker_id, ex.alive_at, ex.reclaims) == (
            "pending",
            0,
            None,
            None,
            0,
        )

    for job_id in extra:
        ex = executions[job_id]
        assert (jobs[job_id].status, ex.state, ex.attempt, ex.worker_id) == (
            "queued",
            "pending",
            0,
            None,
        )
    with SessionLocal() as session:
        # Only the extra jobs write result rows.
        assert session.scalar(select(func.count()).select_from(Result)) == 0

    # The next claim of a handed-back job is its first attempt.
    with SessionLocal() as session:
        claimed = session.execute(
            statements.claim_statement(queue.tables),
            {
                "tasks": [long_task.name],
                "batch": 10,
                "worker": uuid.uuid4(),
                "lease": 30.0,
                "lease_map": "{}",
            },
        ).all()
        session.rollback()
    assert sorted((r.id, r.attempt) for r in claimed) == [(j, 1) for j in sorted(stubborn)]


def test_second_sigterm_exits_at_once_and_the_abandoned_jobs_are_reclaimed(
    db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    # slow_first ignores shutdown requests, and its lease is 1 s.
    lease = slow_first.task_options.lost_interval
    assert lease is not None and lease <= 2
    with SessionLocal.begin() as session:
        job_ids = [slow_first.enqueue(session, seconds=30) for _ in range(5)]
    log = tmp_path / "worker.log"
    proc = start_worker(
        db_url,
        "--tasks",
        "slow_first",
        "--concurrency",
        "10",
        "--shutdown-timeout",
        "60",
        log_path=log,
    )
    try:
        wait_for(lambda: len(_log_rows(SessionLocal, job_ids)) == 5, timeout=60)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        # The first SIGTERM is graceful: it waits for the handlers.
        assert proc.poll() is None, log.read_text()
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
        elapsed = time.monotonic() - began
    finally:
        _stop(proc)
    output = log.read_text()
    print(f"second SIGTERM: exit {code} after {elapsed:.2f}s")
    assert code == 128 + signal.SIGTERM, output
    assert elapsed < 1.0, elapsed

    # Abandoned, not handed back: still running under the dead worker until the lease ends.
    executions = _executions(SessionLocal, job_ids)
    assert {(ex.state, ex.attempt) for ex in executions.values()} == {("running", 1)}
    assert all(ex.worker_id is not None for ex in executions.values())

    wait_for(lambda: _stale(SessionLocal, job_ids) == len(job_ids), timeout=10)

    # Any worker's reclaim now returns them to the queue; this one runs them (attempt 2).
    rescuer = start_worker(db_url, "--tasks", "slow_first", "--burst", log_path=log)
    try:
        assert rescuer.wait(timeout=60) == 0, log.read_text()
    finally:
        _stop(rescuer)
    jobs = _jobs(SessionLocal, job_ids)
    assert {(j.status, j.result, j.attempts) for j in jobs.values()} == {
        ("succeeded", "attempt 2", 2)
    }
    assert _executions(SessionLocal, job_ids) == {}
    runs = _log_rows(SessionLocal, job_ids)
    for job_id in job_ids:
        mine = [(r.attempt, r.pid, r.finished_at is not None) for r in runs if r.job_id == job_id]
        assert mine == [(1, proc.pid, False), (2, rescuer.pid, True)], mine
