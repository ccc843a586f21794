"""Poison: a handler that kills its worker process every time ends ``failed``, not in a loop.

Each round starts a worker process (the CLI, ``--burst``). Its first act is a reclaim
sweep, which returns the poison job left ``running`` by the previous, dead worker (once its
1 s lease has run out); then it claims the job and dies with it. After ``max_reclaims``
losses have been allowed, the next claim refuses to run it and fails it with a clear
reason; that worker survives and runs the other jobs.

The workers run one job at a time and the poison job has the highest priority, so it is
the only job a dying worker holds: innocent jobs are never lost with it, and each one must
run exactly once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import func, literal_column, select
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import ExecutionLog, Result, crash, queue, record
from tests.support.processes import start_worker
from tests.support.running import wait_for

pytestmark = pytest.mark.acceptance

EX = queue.tables.executions
JOBS = queue.tables.jobs
CRASH_EXIT = 3  # the code the crash task passes to os._exit
MAX_ROUNDS = 8


def _ready_for_next_round(factory: sessionmaker[Session], job_id: int) -> bool:
    """The poison job is not held by a live heartbeat: pending, final, or past its lease."""
    expired = EX.c.alive_at < func.now() - literal_column("interval '1 second'") * (
        EX.c.lease_seconds + 0.1
    )
    with factory() as session:
        state = session.execute(select(EX.c.state, expired).where(EX.c.id == job_id)).one_or_none()
    return state is None or state[0] != "running" or bool(state[1])


def _run_round(db_url: str, log: Path) -> int:
    proc = start_worker(
        db_url,
        "--tasks",
        "crash,record",
        "--concurrency",
        "1",
        "--burst",
        "--poll-interval",
        "0.2",
        log_path=log,
    )
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_job_that_kills_its_worker_every_time_fails_after_max_reclaims(
    db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    max_reclaims = crash.task_options.max_reclaims
    # A short lease keeps the rounds quick: each waits for the previous one's to run out.
    assert max_reclaims == 2 and crash.task_options.lost_interval == 1.0
    with SessionLocal.begin() as session:
        poison = crash.options(priority=10).enqueue(session)
        innocents = [record.enqueue(session, value=f"innocent {i}") for i in range(20)]
    log = tmp_path / "workers.log"

    codes: list[int] = []
    began = time.monotonic()
    for _ in range(MAX_ROUNDS):
        wait_for(lambda: _ready_for_next_round(SessionLocal, poison), timeout=15)
        codes.append(_run_round(db_url, log))
        if codes[-1] != CRASH_EXIT:
            break
    elapsed = time.monotonic() - began
    output = log.read_text()
    print(f"rounds: {codes} in {elapsed:.1f}s")

    # It ran (and killed its worker) once, plus once per allowed loss; then it was refused.
    assert codes == [CRASH_EXIT] * (max_reclaims + 1) + [0], output
    with SessionLocal() as session:
        job = session.execute(select(JOBS).where(JOBS.c.id == poison)).one()
        assert job.status == "failed"
        assert job.finished_at is not None
        assert session.scalar(select(func.count()).select_from(EX).where(EX.c.id == poison)) == 0
        # The lost runs left no error of their own (their worker died); the refusal names why.
        assert len(job.errors) == 1, job.errors
        error = job.errors[0]
        assert error["type"] == "sqla_queue.JobLost"
        lost = max_reclaims + 1
        assert error["message"].startswith(f"lost {lost} times (max_reclaims={max_reclaims})")
        assert "crashed the process" in error["message"]
        # Every claim counts an attempt: the lost runs and the claim that refused the job.
        assert job.attempts == lost + 1 == error["attempt"]

        statuses = dict(
            session.execute(select(JOBS.c.id, JOBS.c.status).where(JOBS.c.id.in_(innocents))).all()
        )
        assert set(statuses.values()) == {"succeeded"}
        assert len(statuses) == len(innocents)
        runs = session.execute(
            select(ExecutionLog.job_id, func.count())
            .where(ExecutionLog.job_id.in_(innocents))
            .group_by(ExecutionLog.job_id)
        ).all()
        assert sorted(runs) == [(job_id, 1) for job_id in sorted(innocents)]
        assert session.scalar(select(func.count()).select_from(Result)) == len(innocents)

    # The loop is over: another worker finds nothing to run and the job stays failed.
    assert _run_round(db_url, log) == 0, log.read_text()
    with SessionLocal() as session:
        again = session.execute(select(JOBS).where(JOBS.c.id == poison)).one()
    assert (again.status, again.attempts, again.errors) == ("failed", job.attempts, job.errors)
