"""Durable jobs under fire (issue 30): worker processes SIGKILLed while durable jobs run
their steps, sleep, and wait for signals.

Shared by ``tests/acceptance/test_durable_stress.py``. The scenario:

* three durable tasks on the test app's queue (worker processes load
  ``tests.support.durable_stress:queue``): :func:`ds_steps` (a few steps, one of them
  followed by a sleep), :func:`ds_limited` (a ``concurrency_limit`` task that sleeps
  between its steps) and :func:`ds_signal` (a step, a sleep, a wait for signal ``go``, a
  step that writes the payload). Every step writes one ``StepWrite`` row (primary key
  ``(job_id, step)``: a second commit of a step's writes raises) and holds its
  transaction open a moment after the write, so that kills land inside steps;
* every run of :func:`ds_signal` that got past its wait logs a row in ``ds_runs`` (its
  own transaction), so that the accounting can tell a wake from a re-run;
* worker processes (:class:`~tests.support.chaos.WorkerFleet`) drain them while one is
  SIGKILLed every ``kill_every`` seconds and every client backend of the database is
  terminated now and then; the tasks' short lease brings lost jobs back within the run;
* meanwhile this process sends each signal job its signal at a random moment (some
  before the job begins to wait, some after), some of them twice (the second send must
  store nothing and wake nobody), and samples ``job_executions``: what suspended rows
  hold, and how many executions of the limited task run or hold a seat.

The accounting is :func:`tests.support.durable_stress_check.verify_stress`.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_queue import JobContext, RetryPolicy
from sqla_queue.durable import Signalled
from tests.support.app import StepWrite, queue
from tests.support.chaos import WorkerFleet, WorkerLife, terminate_backends

__all__ = [
    "LIMIT",
    "SIGNAL",
    "TASKS",
    "PlannedJob",
    "Sample",
    "Send",
    "StressConfig",
    "StressRun",
    "create_tables",
    "expected_steps",
    "queue",
    "run_stress",
    "table_sql",
]

#: The concurrency limit of :func:`ds_limited`.
LIMIT = 2
#: The signal :func:`ds_signal` waits for.
SIGNAL = "go"
TASKS = ("ds_steps", "ds_limited", "ds_signal")

DDL = (
    "CREATE TABLE ds_runs (id bigserial PRIMARY KEY, job_id bigint NOT NULL, "
    "attempt int NOT NULL, pid int NOT NULL, phase text NOT NULL, payload jsonb, "
    "at timestamptz NOT NULL DEFAULT clock_timestamp())",
)

# A backend terminated under a handler fails its attempt: retried at once, many times.
_RETRY = RetryPolicy(min_delay=0.05, max_delay=0.2, factor=2.0, jitter=0.0)
_OPTIONS: dict[str, Any] = {
    "pass_context": True,
    "max_attempts": 25,
    "retry": _RETRY,
    # Short, so that the jobs of a SIGKILLed worker come back within the run; a job runs
    # once per wake, so it may be caught by several kills.
    "lost_interval": 1.5,
    "max_reclaims": 40,
}


def _written_step(ctx: JobContext[Session], name: str, value: Any, hold: float) -> Any:
    """Step ``name``: write its ``StepWrite`` row, keep the transaction open ``hold``
    seconds (a kill may land there), and commit both with the checkpoint."""
    with ctx.step(name) as step:
        if not step.done:
            ctx.session.add(StepWrite(job_id=ctx.job_id, step=name, value=json.dumps(value)))
            ctx.session.flush()
            if hold:
                time.sleep(hold)
            step.result = value
    return step.result


@queue.task(name="ds_steps", **_OPTIONS)
def ds_steps(
    ctx: JobContext[Session], steps: int, nap_after: int, nap: float, hold: float = 0.02
) -> int:
    """``steps`` steps (``s0``...), a sleep of ``nap`` seconds after step ``nap_after``;
    the sum of the steps' results (``i * i``)."""
    total = 0
    for i in range(steps):
        total += int(_written_step(ctx, f"s{i}", i * i, hold))
        if i == nap_after:
            ctx.sleep(nap)
    return total


@queue.task(name="ds_limited", concurrency_limit=LIMIT, **_OPTIONS)
def ds_limited(ctx: JobContext[Session], naps: list[float], hold: float = 0.05) -> int:
    """A step, then for each of ``naps`` a sleep and a step: at most :data:`LIMIT` run at
    once, and a sleeping one must leave its seat to the others. The number of steps."""
    _written_step(ctx, "l0", 0, hold)
    for i, nap in enumerate(naps, start=1):
        ctx.sleep(nap)
        _written_step(ctx, f"l{i}", i, hold)
    return len(naps) + 1


@queue.task(name="ds_signal", **_OPTIONS)
def ds_signal(ctx: JobContext[Session], nap: float, hold: float = 0.02) -> Any:
    """A step, a sleep of ``nap`` seconds, the wait for signal ``go``, then a step that
    writes its payload: the payload."""
    _written_step(ctx, "before", "before", hold)
    ctx.sleep(nap)
    payload = ctx.wait_for_signal(SIGNAL)
    ctx.session.execute(
        text(
            "INSERT INTO ds_runs (job_id, attempt, pid, phase, payload) "
            "VALUES (:job, :attempt, :pid, 'resumed', CAST(:payload AS jsonb))"
        ),
        {
            "job": ctx.job_id,
            "attempt": ctx.attempt,
            "pid": os.getpid(),
            "payload": json.dumps(payload),
        },
    )
    ctx.session.commit()
    _written_step(ctx, "after", payload, hold)
    return payload


def create_tables(engine: Engine) -> None:
    """Create ``ds_runs`` in ``engine``'s database."""
    with engine.begin() as connection:
        for statement in DDL:
            connection.exec_driver_sql(statement)


def table_sql(template: str) -> str:
    """``template`` with ``{s}`` and ``{p}`` filled in: the queue's schema and prefix."""
    tables = queue.tables
    return template.format(s=tables.schema, p=tables.prefix)


# --- the plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedJob:
    """One job as planned: its task and keyword arguments; for a signal job, when its
    signal is sent, and whether a second one is.

    An ``early`` signal is sent ``send_at`` seconds after the workers start, whatever the
    job is doing then (often before its wait begins); a ``late`` one ``send_at`` seconds
    after this process saw the job suspended waiting for it (it must wake the job). A
    second send follows the first by ``resend_after`` seconds (``None``: none).
    """

    task: str
    kwargs: dict[str, Any]
    signal: str | None = None
    send_at: float = 0.0
    resend_after: float | None = None


def expected_steps(job: PlannedJob) -> dict[str, Any]:
    """The steps ``job`` commits, each with its result (for a signal job, the ``after``
    step's result is the payload, filled in by the caller)."""
    if job.task == "ds_steps":
        return {f"s{i}": i * i for i in range(job.kwargs["steps"])}
    if job.task == "ds_limited":
        return {f"l{i}": i for i in range(len(job.kwargs["naps"]) + 1)}
    return {"before": "before", "after": None}


def expected_waits(job: PlannedJob) -> tuple[set[str], set[str]]:
    """The wait checkpoints ``job`` must record, and those it may (an early signal's
    wait records nothing when the signal came first)."""
    if job.task == "ds_steps":
        return {"sleep#1"}, set()
    if job.task == "ds_limited":
        return {f"sleep#{i}" for i in range(1, len(job.kwargs["naps"]) + 1)}, set()
    wait = f"signal:{SIGNAL}"
    return ({"sleep#1", wait}, set()) if job.signal == "late" else ({"sleep#1"}, {wait})


@dataclass(frozen=True)
class StressConfig:
    """Sizes and rhythm of one run; the seed comes from the environment by default."""

    step_jobs: int = 200
    limited_jobs: int = 24
    signal_jobs: int = 60
    seed: int = 0
    workers: int = 4
    concurrency: int = 4
    pool_size: int = 2
    poll_interval: float = 0.2
    kill_every: float = 2.0
    #: Mean seconds between two sweeps of ``pg_terminate_backend``.
    terminate_every: float = 4.0
    #: Early signals are sent between 0.5 s and this many seconds after the workers start.
    signal_window: float = 16.0
    #: Seconds between two samples of ``job_executions``.
    sample_every: float = 0.1
    timeout: float = 90.0
    stop_timeout: float = 20.0

    @classmethod
    def from_env(cls, **overrides: Any) -> StressConfig:
        """``$SQLA_QUEUE_DS_SEED`` (default: a random seed), over ``overrides``."""
        values: dict[str, Any] = {
            "seed": int(os.environ.get("SQLA_QUEUE_DS_SEED", random.randrange(2**31)))
        }
        values.update(overrides)
        return cls(**values)


def plan_jobs(config: StressConfig) -> list[PlannedJob]:
    """The run's jobs, shuffled so that every kind is claimed from the start."""
    rng = random.Random(config.seed)
    jobs: list[PlannedJob] = []
    for _ in range(config.step_jobs):
        steps = rng.randint(3, 6)
        nap = rng.uniform(0.5, 2.0)
        jobs.append(
            PlannedJob("ds_steps", {"steps": steps, "nap_after": rng.randrange(steps), "nap": nap})
        )
    for _ in range(config.limited_jobs):
        naps = [rng.uniform(0.5, 2.0) for _ in range(rng.randint(1, 2))]
        jobs.append(PlannedJob("ds_limited", {"naps": naps}))
    for _ in range(config.signal_jobs):
        late = rng.random() < 0.5
        send_at = rng.uniform(0.0, 1.5) if late else rng.uniform(0.5, config.signal_window)
        resend = rng.uniform(0.3, 3.0) if rng.random() < 0.3 else None
        args = {"nap": rng.uniform(0.5, 3.0)}
        jobs.append(PlannedJob("ds_signal", args, "late" if late else "early", send_at, resend))
    rng.shuffle(jobs)
    return jobs


def enqueue_jobs(engine: Engine, jobs: list[PlannedJob]) -> list[int]:
    """Enqueue ``jobs`` in one transaction; their ids, in order."""
    with Session(engine) as session, session.begin():
        calls = (queue.get_task(job.task).call(**job.kwargs) for job in jobs)
        return list(queue.enqueue_many(session, calls))


# --- the run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """One ``queue.signal`` this process sent (or tried to)."""

    job_id: int
    payload: Any
    #: Seconds after the workers started.
    at: float
    #: The second send of this job's signal (with another payload).
    repeat: bool
    stored: bool | None = None
    woke: bool | None = None
    status: str | None = None
    #: The send failed (its connection was cut): it may or may not have committed.
    error: str | None = None


@dataclass
class Sample:
    """What the samples of ``job_executions`` saw, over the whole run."""

    count: int = 0
    max_suspended: int = 0
    #: Suspended rows that held a worker, a heartbeat or a seat (must stay empty).
    holding: list[tuple[float, int, str | None, Any, int | None]] = field(default_factory=list)
    max_limited_running: int = 0
    max_limited_seats: int = 0
    #: The most limited executions suspended at once while others held the seats.
    max_limited_suspended: int = 0
    #: Samples where more than the limit ran or held a seat (must stay empty).
    over_limit: list[tuple[float, int, int]] = field(default_factory=list)


_SAMPLE_SQL = (
    "SELECT count(*) FILTER (WHERE state = 'suspended'), "
    "count(*) FILTER (WHERE task = 'ds_limited' AND state = 'running'), "
    "count(*) FILTER (WHERE task = 'ds_limited' AND slot IS NOT NULL), "
    "count(*) FILTER (WHERE task = 'ds_limited' AND state = 'suspended') "
    "FROM {s}.{p}job_executions"
)
_HOLDING_SQL = (
    "SELECT id, wait, worker_id, slot FROM {s}.{p}job_executions WHERE state = 'suspended' "
    "AND (worker_id IS NOT NULL OR slot IS NOT NULL OR alive_at IS NOT NULL)"
)

_WAITING_SQL = (
    "SELECT id FROM {s}.{p}job_executions WHERE id = ANY(:ids) AND state = 'suspended' "
    f"AND wait = 'signal:{SIGNAL}'"
)


@dataclass
class StressRun:
    """What happened during :func:`run_stress`."""

    config: StressConfig
    jobs: dict[int, PlannedJob]
    lives: list[WorkerLife] = field(default_factory=list)
    #: ``(seconds after start, backends terminated)`` of each sweep.
    terminations: list[tuple[float, int]] = field(default_factory=list)
    sends: list[Send] = field(default_factory=list)
    sample: Sample = field(default_factory=Sample)
    started_at: float = 0.0
    drained_at: float | None = None
    stop_seconds: float = 0.0

    @property
    def kills(self) -> list[WorkerLife]:
        """Processes the orchestrator SIGKILLed."""
        return [life for life in self.lives if life.killed]

    @property
    def drain_seconds(self) -> float | None:
        """Seconds from the first worker start until nothing was left to run."""
        return None if self.drained_at is None else self.drained_at - self.started_at


def run_stress(
    db_url: str,
    config: StressConfig,
    log_dir: Path,
    *,
    on_progress: Callable[[str], None] | None = None,
) -> StressRun:
    """Enqueue the jobs, then drain them with workers under fire while sending signals
    and sampling the executions. ``db_url`` must hold :func:`create_tables`'s table."""
    say = on_progress or (lambda _message: None)
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        planned = plan_jobs(config)
        ids = enqueue_jobs(engine, planned)
        run = StressRun(config=config, jobs=dict(zip(ids, planned, strict=True)))
        say(f"seed {config.seed}: enqueued {len(ids)} jobs")
        fleet = WorkerFleet(
            db_url,
            config.workers,
            [
                "--tasks",
                ",".join(TASKS),
                "--concurrency",
                str(config.concurrency),
                "--pool-size",
                str(config.pool_size),
                "--poll-interval",
                str(config.poll_interval),
            ],
            log_dir,
            target="tests.support.durable_stress:queue",
        )
        run.lives = fleet.lives
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as admin:
            run.started_at = time.time()
            fleet.start_all()
            try:
                _Driver(run, fleet, admin, engine, say).drive()
            except BaseException:
                fleet.kill_everything()
                raise
            run.stop_seconds = fleet.stop_all(config.stop_timeout)
    finally:
        engine.dispose()
    say(
        f"stopped {config.workers} workers in {run.stop_seconds:.1f}s; {len(run.kills)} "
        f"kills, {len(run.terminations)} backend sweeps, {len(run.sends)} sends"
    )
    return run


class _Driver:
    """The orchestrator's loop: signals, samples, kills, backend sweeps, until drained."""

    def __init__(
        self,
        run: StressRun,
        fleet: WorkerFleet,
        admin: Connection,
        engine: Engine,
        say: Callable[[str], None],
    ) -> None:
        self.run = run
        self.fleet = fleet
        self.admin = admin
        self.engine = engine
        self.say = say
        self.rng = random.Random(run.config.seed + 1)
        # (due, job id, repeat): each send until it went through without an error.
        self.due: list[tuple[float, int, bool]] = sorted(
            (job.send_at, job_id, False)
            for job_id, job in run.jobs.items()
            if job.signal == "early"
        )
        #: Late signals not yet due: their jobs were not seen waiting yet.
        self.unseen = {job_id for job_id, job in run.jobs.items() if job.signal == "late"}

    def elapsed(self) -> float:
        """Seconds since the workers started."""
        return time.time() - self.run.started_at

    def drive(self) -> None:
        """Loop until nothing is left to run and no signal to send, or the timeout."""
        run, config, rng = self.run, self.run.config, self.rng
        now = time.monotonic()
        deadline = now + config.timeout
        next_kill = now + config.kill_every
        # The first sweep once the workers are up: before, there is nothing to cut.
        next_sweep = now + rng.uniform(0.75, 1.25) * config.terminate_every
        last_report = now
        while True:
            now = time.monotonic()
            self.send_due()
            left = self.sample()
            if left == 0 and not self.due and not self.unseen:
                run.drained_at = time.time()
                self.say(f"drained {len(run.jobs)} jobs in {run.drain_seconds:.1f}s")
                return
            if now >= deadline:
                self.say(
                    f"timeout: {left} executions left, {len(self.due)} sends due, "
                    f"{len(self.unseen)} late signal jobs never seen waiting"
                )
                return
            for life in self.fleet.replace_exited():
                self.say(f"worker pid {life.pid} exited on its own with code {life.returncode}")
            if now >= next_sweep:
                next_sweep = now + rng.uniform(0.5, 1.5) * config.terminate_every
                count = terminate_backends(self.admin)
                run.terminations.append((self.elapsed(), count))
                self.say(f"terminated {count} backends at {self.elapsed():.1f}s")
            if now >= next_kill and self.fleet.kill_random(rng) is not None:
                next_kill = now + config.kill_every * rng.uniform(0.75, 1.25)
            if now - last_report >= 10:
                last_report = now
                self.say(f"{left} executions left, {len(run.kills)} kills at {self.elapsed():.1f}s")
            time.sleep(config.sample_every)

    def send_due(self) -> None:
        """Send the signals whose time has come; one whose connection was cut is noted and
        sent again (same payload) at the next pass."""
        while self.due and self.due[0][0] <= self.elapsed():
            _, job_id, repeat = self.due[0]
            payload = {"job": job_id, "repeat": repeat}
            try:
                with Session(self.engine) as session, session.begin():
                    sent = queue.signal(session, job_id, SIGNAL, payload)
                    assert isinstance(sent, Signalled)  # a sync session's answer
            except DBAPIError as error:
                reason = str(error.orig or error).splitlines()[0]
                self.run.sends.append(Send(job_id, payload, self.elapsed(), repeat, error=reason))
                return
            self.due.pop(0)
            self.run.sends.append(
                Send(job_id, payload, self.elapsed(), repeat, sent.stored, sent.woke, sent.status)
            )
            again = self.run.jobs[job_id].resend_after
            if not repeat and again is not None:
                self.schedule(self.elapsed() + again, job_id, True)

    def schedule(self, at: float, job_id: int, repeat: bool) -> None:
        """Send ``job_id``'s signal (again, if ``repeat``) ``at`` seconds after the start."""
        self.due.append((at, job_id, repeat))
        self.due.sort()

    def sample(self) -> int:
        """Sample ``job_executions``; the number of executions left."""
        sample = self.run.sample
        row = self.admin.execute(text(table_sql(_SAMPLE_SQL))).one()
        suspended, running, seats, sleeping = (int(v) for v in row)
        sample.count += 1
        sample.max_suspended = max(sample.max_suspended, suspended)
        sample.max_limited_running = max(sample.max_limited_running, running)
        sample.max_limited_seats = max(sample.max_limited_seats, seats)
        sample.max_limited_suspended = max(sample.max_limited_suspended, sleeping)
        if running > LIMIT or seats > LIMIT:
            sample.over_limit.append((self.elapsed(), running, seats))
        for held in self.admin.execute(text(table_sql(_HOLDING_SQL))):
            sample.holding.append((self.elapsed(), int(held[0]), held[1], held[2], held[3]))
        if self.unseen:
            waiting = self.admin.execute(text(table_sql(_WAITING_SQL)), {"ids": list(self.unseen)})
            for (job_id,) in waiting:
                self.unseen.discard(job_id)
                self.schedule(self.elapsed() + self.run.jobs[job_id].send_at, job_id, False)
        left = self.admin.execute(text(table_sql("SELECT count(*) FROM {s}.{p}job_executions")))
        return int(left.scalar_one())
