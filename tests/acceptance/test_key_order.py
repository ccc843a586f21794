"""Key order across worker processes, under every event that puts a job back or moves it.

Three worker processes (``sqla-queue worker``) run the jobs of four keys, of two tasks, while
a driver enqueues more, one transaction each, and in random order: stops a worker
gracefully while its handlers run (SIGTERM, a short grace: the running jobs are handed
back), kills one (SIGKILL: its jobs are reclaimed once their lease runs out), starts
replacements, cancels queued jobs, requeues failed ones, and pauses and resumes one of the
tasks. Handlers retry, reschedule, fail for good or hang (until their worker is stopped) on
their first run, as each job's plan says.

Every run records its start and, if it ends, its end in the database. Per key, then:

* the runs, in start order, with a job's successive runs taken as one, follow the order in
  which the jobs entered the key (enqueued, or requeued: a requeued job goes to the back),
  leaving out only cancelled jobs that never ran;
* every job that entered and was not cancelled ran once per entry;
* no run starts before the previous run of its key ended (a run with no end was cut off by
  its worker's stop or death).

The worker processes import this module as their app: its queue lives in a schema of
its own, created by the test.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import random
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    Text,
    create_engine,
    func,
    select,
    text,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import JobContext, Queue, Reschedule, RetryPolicy
from tests.support.processes import start_worker
from tests.support.running import wait_for

pytestmark = pytest.mark.acceptance

SCHEMA = "key_order"
TARGET = "tests.acceptance.test_key_order:queue"
KEYS = ("k0", "k1", "k2", "k3")
TASKS = ("ordered_a", "ordered_b")
WORKERS = 3
#: Seconds of events; the drain after them is bounded too.
DRIVE_FOR = 22.0
SEED = int(os.environ.get("SQLA_QUEUE_KEY_ORDER_SEED", "2026"))


class Base(DeclarativeBase):
    pass


class Run(Base):
    """One run of a handler: its job, its key, its start and (if it ended) its end."""

    __tablename__ = "runs"
    __table_args__ = {"schema": SCHEMA}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger)
    key: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.clock_timestamp()
    )
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


queue = Queue(
    Base,
    schema=SCHEMA,
    lost_interval=1.0,
    max_attempts=10,
    retry=RetryPolicy(min_delay=0.05, max_delay=0.2, factor=2.0, jitter=0.0),
)


def _run(ctx: JobContext[Session], key: str, plan: dict[str, str], pause: float) -> str:
    """Record the run; do what the job's plan says for this run (by its number)."""
    session = ctx.session
    row_id, number = session.execute(
        text(
            f"WITH r AS (INSERT INTO {SCHEMA}.runs (job_id, key, pid) "
            "VALUES (:job, :key, :pid) RETURNING id) "
            f"SELECT r.id, (SELECT count(*) FROM {SCHEMA}.runs WHERE job_id = :job) + 1 FROM r"
        ),
        {"job": ctx.job_id, "key": key, "pid": os.getpid()},
    ).one()
    session.commit()
    action = plan.get(str(number), "succeed")
    if action == "hang":
        time.sleep(60)  # until its worker is stopped or killed
    time.sleep(pause)
    session.execute(update(Run).where(Run.id == row_id).values(finished_at=func.clock_timestamp()))
    session.commit()
    if action in ("retry", "fail"):
        raise RuntimeError(f"run {number} {action}s on purpose")
    if action == "reschedule":
        return Reschedule(in_=0.05)  # type: ignore[return-value]
    return "done"


@queue.task(name="ordered_a", pass_context=True)
def ordered_a(ctx: JobContext[Session], key: str, plan: dict[str, str], pause: float) -> str:
    """A keyed job of the first task."""
    return _run(ctx, key, plan, pause)


@queue.task(name="ordered_b", pass_context=True)
def ordered_b(ctx: JobContext[Session], key: str, plan: dict[str, str], pause: float) -> str:
    """A keyed job of the second task (the one the driver pauses)."""
    return _run(ctx, key, plan, pause)


class Driver:
    """Enqueues, stops, kills, cancels, requeues and pauses; remembers each key's entries."""

    def __init__(self, db_url: str, tmp_path: Path, rng: random.Random) -> None:
        self.url = db_url
        self.tmp = tmp_path
        self.rng = rng
        self.engine = create_engine(db_url)
        self.entries: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.cancelled: dict[int, float] = {}
        self.workers: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self.paused = False
        self.events: list[str] = []

    def start_worker(self) -> None:
        self.started += 1
        self.workers.append(
            start_worker(
                self.url,
                "--concurrency",
                "3",
                # Every other worker prefetches: a key's next job is claimable only once
                # its head is done, prefetched or not.
                "--prefetch",
                str(3 * (self.started % 2)),
                "--poll-interval",
                "0.1",
                "--shutdown-timeout",
                "0.2",
                log_path=self.tmp / f"w{self.started}.log",
                target=TARGET,
            )
        )

    def enqueue(self) -> None:
        key = self.rng.choice(KEYS)
        task = ordered_a if self.rng.random() < 0.5 else ordered_b
        roll = self.rng.random()
        plan: dict[str, str] = {}
        options: dict[str, Any] = {"queue_id": key}
        if roll < 0.15:
            plan = {"1": "retry"}
        elif roll < 0.3:
            plan = {"1": "reschedule", "2": "retry"}
        elif roll < 0.4:
            plan, options["max_attempts"] = {"1": "fail"}, 1
        elif roll < 0.5:
            plan = {"1": "hang"}
        pause = self.rng.choice([0.0, 0.02, 0.1])
        entered = time.time()  # before: a worker may run the job as soon as it commits
        with Session(self.engine) as session, session.begin():
            job_id = task.options(**options).enqueue(session, key=key, plan=plan, pause=pause)
        self.entries[key].append((job_id, entered))

    def running_pids(self, older_than: float = 0.0) -> set[int]:
        """Workers running a handler now (started ``older_than`` seconds ago or more)."""
        with self.engine.connect() as connection:
            return set(
                connection.execute(
                    select(Run.pid).where(
                        Run.finished_at.is_(None),
                        Run.started_at < func.clock_timestamp() - dt.timedelta(seconds=older_than),
                    )
                ).scalars()
            )

    def stop_one(self, sig: signal.Signals, older_than: float = 0.0) -> None:
        """Stop (or kill) a worker that is running a handler, and start another."""
        busy = self.running_pids(older_than)
        alive = [w for w in self.workers if w.poll() is None and w.pid in busy]
        if not alive:
            return
        victim = self.rng.choice(alive)
        victim.send_signal(sig)
        victim.wait(timeout=30)
        self.events.append(f"{sig.name} {victim.pid}")
        self.start_worker()

    def cancel_one(self) -> None:
        with self.engine.connect() as connection:
            queued = (
                connection.execute(
                    select(queue.tables.executions.c.id).where(
                        queue.tables.executions.c.state.in_(["pending", "waiting"])
                    )
                )
                .scalars()
                .all()
            )
        if queued:
            job_id = self.rng.choice(queued)
            if queue.cancel(self.engine, [job_id]) == {job_id: "cancelled"}:
                self.cancelled[job_id] = time.time()
                self.events.append(f"cancel {job_id}")

    def requeue_failed(self) -> None:
        jobs = queue.tables.jobs
        with Session(self.engine) as session, session.begin():
            failed = session.execute(
                select(jobs.c.id, jobs.c.queue_id).where(jobs.c.status == "failed")
            ).all()
            if not failed:
                return
            job_id, key = self.rng.choice(failed)
            # Taken before: every run that starts after it is of the new entry.
            entered = time.time()
            # The plan is spent: the requeued job succeeds at its next run.
            assert queue.requeue(session, [job_id]) == [job_id]
        self.entries[key].append((job_id, entered))
        self.events.append(f"requeue {job_id}")

    def toggle_pause(self) -> None:
        with Session(self.engine) as session, session.begin():
            if self.paused:
                queue.resume(session, "ordered_b")
            else:
                queue.pause(session, "ordered_b")
        self.paused = not self.paused
        self.events.append("resume" if not self.paused else "pause")

    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.45:
            self.enqueue()
        elif roll < 0.55:
            self.stop_one(signal.SIGTERM)
        elif roll < 0.62:
            self.stop_one(signal.SIGKILL)
        elif roll < 0.75:
            self.cancel_one()
        elif roll < 0.88:
            self.requeue_failed()
        else:
            self.toggle_pause()


def _ran_in(driver: Driver) -> int:
    """How many worker processes have run a handler."""
    with driver.engine.connect() as connection:
        return connection.execute(select(func.count(Run.pid.distinct()))).scalar_one()


def _queued(driver: Driver) -> int:
    with driver.engine.connect() as connection:
        return connection.execute(
            select(func.count()).select_from(queue.tables.executions)
        ).scalar_one()


def _left(driver: Driver) -> list[Any]:
    ex = queue.tables.executions
    with driver.engine.connect() as connection:
        return [
            tuple(row)
            for row in connection.execute(
                select(
                    ex.c.id,
                    ex.c.task,
                    ex.c.queue_id,
                    ex.c.state,
                    ex.c.execute_at,
                    ex.c.lease_seconds,
                    ex.c.attempt,
                ).order_by(ex.c.queue_id, ex.c.execute_at)
            )
        ]


def test_each_key_runs_in_enqueue_order_through_every_event(db_url: str, tmp_path: Path) -> None:
    setup = create_engine(db_url)
    with setup.begin() as connection:
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        queue.create_all(connection)
        Base.metadata.create_all(connection, tables=[Run.__table__])  # type: ignore[list-item]
    setup.dispose()

    rng = random.Random(SEED)
    driver = Driver(db_url, tmp_path, rng)
    try:
        for _ in range(WORKERS):
            driver.start_worker()
        for _ in range(24):
            driver.enqueue()
        # Worker processes take seconds to start on a busy machine: events begin once
        # they run jobs.
        wait_for(lambda: _ran_in(driver) >= 2, timeout=60, interval=0.2)
        deadline = time.monotonic() + DRIVE_FOR
        while time.monotonic() < deadline:
            driver.step()
            time.sleep(rng.uniform(0.1, 0.3))
        if driver.paused:
            driver.toggle_pause()
        # The drain: a hung handler goes on until its worker is stopped.
        drain_until = time.monotonic() + 40.0
        while _queued(driver) and time.monotonic() < drain_until:
            time.sleep(0.5)
            driver.stop_one(signal.SIGTERM, older_than=1.0)
        assert _queued(driver) == 0, f"left queued: {_left(driver)}; events: {driver.events}"
    finally:
        for worker in driver.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in driver.workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    _check(driver)
    driver.engine.dispose()


def _check(driver: Driver) -> None:
    with Session(driver.engine) as session:
        runs = session.execute(
            select(Run.job_id, Run.key, Run.started_at, Run.finished_at).order_by(
                Run.started_at, Run.id
            )
        ).all()
        statuses = dict(
            session.execute(select(queue.tables.jobs.c.id, queue.tables.jobs.c.status)).all()
        )
    by_key: dict[str, list[Any]] = defaultdict(list)
    for run in runs:
        by_key[run.key].append(run)
    kinds = {e.split()[0] for e in driver.events}
    assert {"SIGTERM", "SIGKILL", "cancel", "requeue", "pause"} <= kinds, driver.events
    for key, entries in driver.entries.items():
        key_runs = by_key[key]
        for earlier, later in itertools.pairwise(key_runs):
            if earlier.finished_at is not None:
                assert later.started_at >= earlier.finished_at, (
                    f"{key}: job {later.job_id} started before job {earlier.job_id} ended"
                )
        # Each run, as (job, which of its entries): a requeued job's runs after its
        # requeue are of its second entry. A job's successive runs of one entry are one.
        ran: list[tuple[int, int]] = []
        for run in key_runs:
            at = run.started_at.timestamp()
            label = (run.job_id, sum(1 for j, t in entries if j == run.job_id and t <= at) - 1)
            if not ran or ran[-1] != label:
                ran.append(label)
        expected: list[tuple[int, int]] = []
        for job_id, _ in entries:
            expected.append((job_id, sum(1 for j, _ in expected if j == job_id)))
        _assert_follows(key, ran, expected)
        missing = [e for e in expected if e[0] not in driver.cancelled and ran.count(e) != 1]
        assert not missing, (
            f"{key}: entries that did not run exactly once: {missing} "
            f"({[statuses.get(j) for j, _ in missing]}); ran {ran}, entered {expected}"
        )


def _assert_follows(key: str, ran: list[Any], expected: list[Any]) -> None:
    """``ran`` is ``expected`` with some entries left out, in the same order."""
    position = 0
    for entry in ran:
        while position < len(expected) and expected[position] != entry:
            position += 1
        assert position < len(expected), (
            f"{key}: job {entry[0]} ran out of order; ran {ran}, entered {expected}"
        )
        position += 1
