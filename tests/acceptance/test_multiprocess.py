"""Several worker processes on one database: every job runs exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import ExecutionLog, Result, queue, tally
from tests.support.processes import start_worker

pytestmark = pytest.mark.acceptance


def test_four_processes_run_eight_thousand_jobs_exactly_once(
    db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    total = 8_000
    with SessionLocal.begin() as session:
        ids = queue.enqueue_many(session, [tally.call(n=i) for i in range(total)])

    workers = [
        start_worker(
            db_url,
            "--tasks",
            "tally",
            "--concurrency",
            "5",  # 4 processes within the test's connection budget (tests/conftest.py)
            "--burst",
            log_path=tmp_path / f"worker{i}.log",
        )
        for i in range(4)
    ]
    codes = [w.wait(timeout=240) for w in workers]
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("worker*.log")))
    assert codes == [0, 0, 0, 0], logs

    with SessionLocal() as session:
        # Results has a unique key: a second execution of a job would have failed it.
        assert session.scalar(select(func.count()).select_from(Result)) == total
        assert set(session.scalars(select(Result.job_id))) == set(ids)
        executions = session.execute(
            select(func.count(), func.count(func.distinct(ExecutionLog.job_id)))
        ).one()
        assert tuple(executions) == (total, total)
        status = dict(
            session.execute(select(queue.Job.status, func.count()).group_by(queue.Job.status)).all()
        )
        assert status == {"succeeded": total}
        assert session.scalar(select(func.count()).select_from(queue.JobExecution)) == 0
        # All four processes did part of the work.
        pids = session.scalar(select(func.count(func.distinct(ExecutionLog.pid))))
        assert pids == 4
