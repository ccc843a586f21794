"""Periodic ticks under churn: worker processes that race, die and restart.

Four ``sqla-queue worker`` processes run a one-second schedule (each has its own
scheduler, on its own connections). While they run, one is killed with SIGKILL, one is
stopped with SIGTERM and new ones start, twice over. Whatever the churn, the jobs table
must hold exactly one job per tick, with no tick missing, across the whole window, and
the schedule's row must agree with the last job. Always one worker at least stays up, so
every tick is enqueued on time (the catch-up policy is not what fills the window).
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, func, select

from tests.support import periodic_app
from tests.support.processes import ROOT

pytestmark = pytest.mark.acceptance

TARGET = "tests.support.periodic_app:queue"


def start_logged_worker(db_url: str, log_path: Path) -> subprocess.Popen[bytes]:
    """A ``sqla-queue worker`` process logging at INFO, so its start can be awaited."""
    command = [
        sys.executable,
        "-m",
        "sqla_queue",
        "--log-level",
        "INFO",
        "worker",
        TARGET,
        "--url",
        db_url,
        "--concurrency",
        "2",
        "--poll-interval",
        "0.2",
        "--shutdown-timeout",
        "5",
    ]
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_started(log_path: Path, timeout: float = 30.0) -> None:
    """Wait until the worker logged that it runs (its scheduler started with it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if " started: tasks " in log_path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"worker did not start:\n{log_path.read_text()}")


@pytest.fixture
def pengine(db_url: str) -> Iterator[Engine]:
    eng = create_engine(db_url, pool_size=2)
    with eng.begin() as connection:
        periodic_app.queue.create_all(connection)
    yield eng
    eng.dispose()


def test_each_tick_once_with_four_workers_killed_and_restarted(
    db_url: str, pengine: Engine, tmp_path: Path
) -> None:
    counter = iter(range(100))
    workers: list[subprocess.Popen[bytes]] = []

    def start(count: int) -> list[subprocess.Popen[bytes]]:
        """Start ``count`` workers at once; return when each has started."""
        paths = [tmp_path / f"w{next(counter)}.log" for _ in range(count)]
        started = [start_logged_worker(db_url, path) for path in paths]
        workers.extend(started)
        for path in paths:
            wait_started(path)
        return started

    def stop(process: subprocess.Popen[bytes], how: signal.Signals) -> int:
        process.send_signal(how)
        return process.wait(timeout=30)

    def clock() -> dt.datetime:
        with pengine.connect() as connection:
            return connection.execute(select(func.clock_timestamp())).scalar_one()

    first = start(4)
    ready = clock()
    codes: list[int] = []
    try:
        time.sleep(4)
        stop(first[0], signal.SIGKILL)
        time.sleep(2)
        codes.append(stop(first[1], signal.SIGTERM))
        start(2)
        time.sleep(3)
        stop(first[2], signal.SIGKILL)
        time.sleep(1)
        codes.append(stop(first[3], signal.SIGTERM))
        start(1)
        time.sleep(4)
        ended = clock()
    finally:
        alive = [process for process in workers if process.poll() is None]
        for process in alive:
            process.send_signal(signal.SIGTERM)
        codes.extend(process.wait(timeout=30) for process in alive)
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("w*.log")))
    assert codes == [0] * len(codes), logs

    jobs = periodic_app.queue.tables.jobs
    schedules = periodic_app.queue.tables.schedules
    with pengine.connect() as connection:
        due = list(
            connection.scalars(
                select(jobs.c.scheduled_at).where(jobs.c.task == "tick").order_by(jobs.c.id)
            )
        )
        last_tick = connection.scalar(select(schedules.c.last_tick))
        succeeded = connection.scalar(select(func.count()).where(jobs.c.status == "succeeded"))
    ticks = sorted(due)
    assert len(ticks) == len(set(ticks)), f"ticks enqueued twice: {len(ticks) - len(set(ticks))}"
    assert all(t.microsecond == 0 for t in ticks)
    gaps = [(a, b) for a, b in itertools.pairwise(ticks) if b - a != dt.timedelta(seconds=1)]
    assert not gaps, f"missing ticks between {gaps}"
    # The window covers the run: it begins by the time the first workers are up (a new
    # schedule fires first at the tick after its row is stored), and it reaches beyond
    # the end (ticks are enqueued ahead of time).
    assert ticks[0] <= ready + dt.timedelta(seconds=2), (ready, ticks[0], logs)
    assert ticks[-1] >= ended
    assert len(ticks) >= 18
    # The row and the jobs agree: no tick was claimed without its job.
    assert last_tick == ticks[-1]
    # Jobs were enqueued in tick order (each pass writes its ticks oldest first).
    assert due == ticks
    # And the workers ran them.
    assert succeeded is not None and succeeded >= 12
    print(f"{len(ticks)} ticks, each enqueued once, {succeeded} ran; {len(workers)} workers")
