"""A rate limit under load: 6 worker processes claim one rate-limited task at once.

Each start is recorded by the database clock (``rate_starts``), under the task's control
row; the test reads those times back and checks every window of the period, and that each
job ran exactly once (the handler's own log and its unique result row).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import ExecutionLog, Result, queue, record
from tests.support.processes import start_worker

pytestmark = pytest.mark.acceptance

LIMIT, PERIOD, TOTAL, PROCESSES = 50, 1.0, 400, 6


def busiest_window(times: list[float], period: float) -> int:
    """The most starts in any window ``(t - period, t]``; the busiest such window ends at
    a start, so checking those windows checks them all."""
    best, first = 0, 0
    for last, end in enumerate(times):
        while times[first] <= end - period:
            first += 1
        best = max(best, last - first + 1)
    return best


def stopped(worker: subprocess.Popen[bytes]) -> int | None:
    """The exit code of a worker asked to stop; a hung one dumps its threads (SIGABRT with
    PYTHONFAULTHANDLER set) into its log, for the failure message."""
    try:
        return worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.send_signal(signal.SIGABRT)
        worker.wait(timeout=10)
        return None


def test_no_window_exceeds_the_limit_across_six_processes(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")
    with SessionLocal.begin() as session:
        queue.set_rate_limit(session, "record", LIMIT, per=PERIOD)
        queue.enqueue_many(session, [record.call(value=str(i)) for i in range(TOTAL)])
    workers = [
        start_worker(
            db_url,
            "--tasks",
            "record",
            "--concurrency",
            "3",  # 6 processes within the test's connection budget (tests/conftest.py)
            "--prefetch",  # half of them prefetch: a rated claim still takes free seats only
            str(3 * (i % 2)),
            "--poll-interval",
            "0.2",
            log_path=tmp_path / f"w{i}.log",
        )
        for i in range(PROCESSES)
    ]
    try:
        deadline = time.monotonic() + 120
        while True:
            with SessionLocal() as session:
                left = session.scalar(select(func.count()).select_from(queue.JobExecution))
            if left == 0:
                break
            assert time.monotonic() < deadline, f"{left} jobs left"
            time.sleep(0.2)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        codes = [stopped(w) for w in workers]
    assert codes == [0] * PROCESSES, "\n".join(p.read_text() for p in tmp_path.glob("w*.log"))

    starts = queue.tables.rate_starts
    with SessionLocal() as session:
        times = [
            float(t)
            for t in session.scalars(
                select(func.extract("epoch", starts.c.started_at))
                .where(starts.c.task == "record")
                .order_by(starts.c.started_at)
            )
        ]
        recorded_jobs = session.scalar(select(func.count(func.distinct(starts.c.job_id))))
        executions = session.scalar(select(func.count()).select_from(ExecutionLog))
        results = session.scalar(select(func.count()).select_from(Result))
        statuses = dict(
            session.execute(select(queue.Job.status, func.count()).group_by(queue.Job.status)).all()
        )
    assert statuses == {"succeeded": TOTAL}
    assert executions == results == recorded_jobs == len(times) == TOTAL
    peak = busiest_window(times, PERIOD)
    span = times[-1] - times[0]
    print(f"\n{TOTAL} starts over {span:.2f}s; busiest {PERIOD:g}s window: {peak} (limit {LIMIT})")
    assert peak <= LIMIT
    # The limit was reached (the test would pass vacuously otherwise), and it held the
    # 400 starts to about 8 windows' worth of time.
    assert peak == LIMIT
    assert span >= (TOTAL / LIMIT - 1) * PERIOD - 0.01
