"""Concurrency limits under load: 8 worker processes, shuffled priorities, jobs arriving.

The maximum concurrency is measured from the start and end times each execution records
in the database, not from anything the workers report about themselves.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import ExecutionLog
from tests.support.limited import limited1, limited3, queue
from tests.support.processes import start_worker

pytestmark = pytest.mark.acceptance


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at equal times)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


@pytest.mark.parametrize(
    ("task", "limit", "total"),
    [(limited3, 3, 2_000), (limited1, 1, 500)],
    ids=["limit3", "limit1"],
)
def test_limit_holds_across_eight_processes(
    task: object,
    limit: int,
    total: int,
    db_url: str,
    SessionLocal: sessionmaker[Session],
    tmp_path: Path,
) -> None:
    rng = random.Random(limit)
    priorities = [rng.randrange(10) for _ in range(total)]
    first, rest = priorities[: total // 2], priorities[total // 2 :]
    with SessionLocal.begin() as session:
        queue.enqueue_many(session, [task.options(priority=p).call() for p in first])  # type: ignore[attr-defined]

    workers = [
        start_worker(
            db_url,
            "--tasks",
            task.name,  # type: ignore[attr-defined]
            "--concurrency",
            "4",
            # Half the workers may prefetch: a limited task's claim must still take no
            # more than a free seat can start (a held slot would otherwise sit idle).
            "--prefetch",
            str(4 * (i % 2)),
            "--poll-interval",
            "0.2",
            log_path=tmp_path / f"w{i}.log",
            target="tests.support.limited:queue",
        )
        for i in range(8)
    ]
    try:
        # The rest arrives while the workers run, in small shuffled-priority batches.
        for i in range(0, len(rest), 100):
            with SessionLocal.begin() as session:
                queue.enqueue_many(
                    session,
                    [task.options(priority=p).call() for p in rest[i : i + 100]],  # type: ignore[attr-defined]
                )
            time.sleep(0.05)
        deadline = time.monotonic() + 240
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
        codes = [w.wait(timeout=60) for w in workers]
    assert codes == [0] * 8, "\n".join(p.read_text() for p in tmp_path.glob("w*.log"))

    with SessionLocal() as session:
        runs = session.execute(
            select(
                func.extract("epoch", ExecutionLog.started_at),
                func.extract("epoch", ExecutionLog.finished_at),
                ExecutionLog.pid,
            )
        ).all()
        statuses = dict(
            session.execute(select(queue.Job.status, func.count()).group_by(queue.Job.status)).all()
        )
    assert statuses == {"succeeded": total}
    assert len(runs) == total
    assert all(end is not None for _, end, _ in runs)
    peak = max_overlap([(float(s), float(e)) for s, e, _ in runs])
    assert peak <= limit, f"{peak} ran at once, limit {limit}"
    # The limit was actually reached: the test would pass vacuously otherwise.
    assert peak == limit
