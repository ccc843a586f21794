"""Exactly-once database effects under fire: the tasks, the tables and the chaos loop.

Used by ``tests/acceptance/test_exactly_once.py``. The two tasks are transactional
(issue 14, part 4): each writes its effects through ``ctx.session`` and returns, and the
worker commits the job's completion in that same transaction. The effects:

* ``exo_counter``: one row, ``n = n + 1`` per execution that commits (an atomic update: a
  read-modify-write would lose increments under concurrency, whatever the queue does);
* ``exo_effects``: one row per execution that commits, with the job id, the attempt and
  the worker's pid. There is deliberately no unique key on ``job_id``: a constraint would
  turn a second commit into an error before the queue's own fence is tested. A double
  effect shows as a second row instead.

``exo_reclaims`` is written by a trigger each time the reclaim sweep hands a lost
execution back (``job_executions.reclaims`` goes up): the database's own record that the
chaos made the queue reclaim jobs.

The chaos loop SIGKILLs worker processes (a new one takes each one's place), SIGSTOPs one
now and then for longer than the lease (its jobs are reclaimed meanwhile; when it resumes,
its handlers complete against executions that are no longer theirs, and the fence must
roll their transactions back), and terminates every backend of the database with
``pg_terminate_backend`` (the workers' claim, heartbeat, LISTEN and handler connections
alike). Worker processes load this module as ``tests.support.exactly_once:queue``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_queue import JobContext, RetryPolicy
from tests.support.app import queue
from tests.support.chaos import WorkerFleet, WorkerLife, catches_sigterm, terminate_backends

__all__ = [
    "ASYNC_TASK",
    "SYNC_TASK",
    "ExactlyOnceConfig",
    "ExactlyOnceRun",
    "ddl",
    "queue",
    "run_exactly_once",
]

SYNC_TASK = "exo_bump"
ASYNC_TASK = "exo_bump_async"

#: Chaos fails attempts on purpose (a cut connection fails the handler's transaction) and
#: loses running jobs (SIGKILL, SIGSTOP): leave room for many before a job would fail.
_OPTIONS: dict[str, Any] = {
    "pass_context": True,
    "transactional": True,
    "lost_interval": 1.0,
    "max_reclaims": 1_000,
    "max_attempts": 1_000,
    "retry": RetryPolicy(min_delay=0.05, max_delay=0.3, factor=2.0, jitter=0.25),
}

_EFFECT = text(
    "INSERT INTO exo_effects (job_id, attempt, pid, task) VALUES (:job, :attempt, :pid, :task)"
)
_BUMP = text("UPDATE exo_counter SET n = n + 1 WHERE id = 1")
#: Every job's transaction updates the one counter row and holds its lock until it
#: commits: without this, each waits for the one before it to flush the WAL (about 8 ms
#: here), and 3,000 jobs take minutes. Visibility is unchanged; only durability across a
#: crash of the server (not part of this chaos) is given up.
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")


def _params(ctx: JobContext[Any]) -> dict[str, Any]:
    return {"job": ctx.job_id, "attempt": ctx.attempt, "pid": os.getpid(), "task": ctx.task}


@queue.task(name=SYNC_TASK, **_OPTIONS)
def exo_bump(ctx: JobContext[Session], pause: float = 0.0) -> int:
    """Pause (so that kills land mid-job), then write both effects; the worker commits."""
    time.sleep(pause)
    ctx.session.execute(_ASYNC_COMMIT)
    ctx.session.execute(_EFFECT, _params(ctx))
    # Last, so the counter's row lock is held only for the completion and the commit.
    ctx.session.execute(_BUMP)
    return ctx.attempt


@queue.task(name=ASYNC_TASK, **_OPTIONS)
async def exo_bump_async(ctx: JobContext[AsyncSession], pause: float = 0.0) -> int:
    """The async twin of :func:`exo_bump`, for the async worker."""
    await asyncio.sleep(pause)
    await ctx.session.execute(_ASYNC_COMMIT)
    await ctx.session.execute(_EFFECT, _params(ctx))
    await ctx.session.execute(_BUMP)
    return ctx.attempt


def ddl() -> list[str]:
    """The effect tables and the reclaim log (run once on the test's database)."""
    ex = queue.tables.executions.fullname
    return [
        "CREATE TABLE exo_counter (id int PRIMARY KEY, n bigint NOT NULL)",
        "INSERT INTO exo_counter VALUES (1, 0)",
        "CREATE TABLE exo_effects (id bigserial PRIMARY KEY, job_id bigint NOT NULL, "
        "attempt int NOT NULL, pid int NOT NULL, task text NOT NULL, "
        "at timestamptz NOT NULL DEFAULT clock_timestamp())",
        "CREATE TABLE exo_reclaims (job_id bigint NOT NULL, reclaims int NOT NULL, "
        "at timestamptz NOT NULL DEFAULT clock_timestamp())",
        """
        CREATE FUNCTION exo_reclaim_log() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO exo_reclaims (job_id, reclaims) VALUES (NEW.id, NEW.reclaims);
            RETURN NULL;
        END $$
        """,
        f"""
        CREATE TRIGGER exo_reclaim AFTER UPDATE OF reclaims ON {ex}
        FOR EACH ROW WHEN (NEW.reclaims > OLD.reclaims)
        EXECUTE FUNCTION exo_reclaim_log()
        """,
    ]


@dataclass(frozen=True)
class ExactlyOnceConfig:
    """Sizes and rhythm of one run."""

    sync_jobs: int = 1_400
    async_jobs: int = 600
    sync_workers: int = 2
    async_workers: int = 1
    concurrency: int = 6
    #: Seconds between SIGKILLs, backend sweeps and SIGSTOPs (each jittered by a quarter;
    #: the first of each comes after a third of its interval).
    kill_every: float = 4.0
    terminate_every: float = 10.0
    stop_every: float = 15.0
    #: Besides the clock, these happen at these points of progress (fractions of the jobs
    #: done), so that a fast drain gets its share of chaos too.
    marks: tuple[tuple[float, str], ...] = (
        (0.10, "stop"),
        (0.20, "sweep"),
        (0.30, "kill"),
        (0.40, "sweep"),
        (0.50, "stop"),
        (0.60, "kill"),
        (0.70, "sweep"),
        (0.80, "kill"),
    )
    #: How long a SIGSTOPped worker stays stopped: past its jobs' 1 s lease and a sweep.
    stop_for: float = 2.5
    timeout: float = 150.0
    seed: int | None = None


@dataclass
class ExactlyOnceRun:
    """What the chaos loop did."""

    job_ids: list[int] = field(default_factory=list)
    kills: int = 0
    stops: int = 0
    #: Backends each ``pg_terminate_backend`` sweep ended.
    sweeps: list[int] = field(default_factory=list)
    drain_seconds: float | None = None
    fleets: list[WorkerFleet] = field(default_factory=list)
    #: Exit codes after the final SIGTERM of the workers then running (0 each, or a worker
    #: did not stop cleanly).
    stop_codes: list[int | None] = field(default_factory=list)

    def log_count(self, marker: str) -> int:
        """How many times ``marker`` appears in the workers' logs."""
        return sum(
            life.log_path.read_text(errors="replace").count(marker)
            for life in self._lives()
            if life.log_path.exists()
        )

    def _lives(self) -> list[WorkerLife]:
        return [life for fleet in self.fleets for life in fleet.lives]

    @property
    def startup_casualties(self) -> int:
        """Workers that never started: a sweep cut their first connection while it was
        being set up (see :func:`cut_at_startup`)."""
        return sum(life.unexpected and cut_at_startup(life) for life in self._lives())

    @property
    def unexpected_exits(self) -> int:
        """Workers that ended on their own once started (they should ride out every fault)."""
        return sum(life.unexpected and not cut_at_startup(life) for life in self._lives())

    def unexpected_logs(self, chars: int = 3000) -> str:
        """The end of the log of each worker that ended on its own, or that exited with an
        error after the final SIGTERM."""
        return "\n".join(
            f"--- pid {life.pid} (code {life.returncode}):\n"
            + life.log_path.read_text(errors="replace")[-chars:]
            for life in self._lives()
            if (life.unexpected and not cut_at_startup(life))
            or (not life.killed and not life.unexpected and life.returncode not in (0, None))
        )


def cut_at_startup(life: WorkerLife) -> bool:
    """Whether a worker exited because a sweep cut its very first connection.

    The worker's start-up schema check retries a connection lost under it, but an error
    while the connection is being set up (SQLAlchemy's first-connect queries) is not
    flagged as a lost connection by the psycopg dialect, so the CLI exits 1 with "cannot
    connect" (as for a database that cannot be reached at start-up, by design). That is a
    known start-up limitation, not a fault of a running worker: such a life wrote that
    one message and nothing else, and ran no job.
    """
    if life.returncode != 1 or not life.log_path.exists():
        return False
    log = life.log_path.read_text(errors="replace")
    lines = [line for line in log.splitlines() if line]
    # Only the CLI's last word (a first line and its indented cause): nothing was logged
    # before it, where a running worker hit by a sweep logs its database errors.
    return (
        bool(lines)
        and lines[0].startswith("sqla-queue: ")
        and all(line.startswith(" ") for line in lines[1:])
        and any(marker in log for marker in _CUT_MARKERS)
    )


#: What psycopg says of a connection that ``pg_terminate_backend`` cut.
_CUT_MARKERS = (
    "server closed the connection unexpectedly",
    "terminating connection due to administrator command",
)


def _working(fleets: list[WorkerFleet]) -> list[int]:
    """Pids of workers alive and past their start-up."""
    return [
        life.pid
        for fleet in fleets
        for life in fleet.lives
        if life.ended_at is None and catches_sigterm(life.pid)
    ]


def run_exactly_once(
    engine: Engine,
    db_url: str,
    config: ExactlyOnceConfig,
    log_dir: Path,
    *,
    say: Callable[[str], None] = lambda _m: None,
) -> ExactlyOnceRun:
    """Enqueue the jobs, run the fleets under fire until every job is final, stop them."""
    rng = random.Random(config.seed)
    run = ExactlyOnceRun()
    sync_task, async_task = queue.get_task(SYNC_TASK), queue.get_task(ASYNC_TASK)
    with Session(engine) as session, session.begin():
        specs = [sync_task.call(pause=rng.uniform(0.01, 0.04)) for _ in range(config.sync_jobs)]
        specs += [async_task.call(pause=rng.uniform(0.01, 0.04)) for _ in range(config.async_jobs)]
        run.job_ids = queue.enqueue_many(session, specs)
    common = ["--concurrency", str(config.concurrency), "--poll-interval", "0.2"]
    target = "tests.support.exactly_once:queue"
    # The fleets name their logs by life number and slot: one folder each.
    (log_dir / "sync").mkdir(exist_ok=True)
    (log_dir / "async").mkdir(exist_ok=True)
    sync_args, async_args = (
        ["--tasks", SYNC_TASK, *common],
        ["--async", "--tasks", ASYNC_TASK, *common],
    )
    run.fleets = [
        WorkerFleet(db_url, config.sync_workers, sync_args, log_dir / "sync", target),
        WorkerFleet(db_url, config.async_workers, async_args, log_dir / "async", target),
    ]
    ex = queue.tables.executions
    remaining = text(
        f"SELECT count(*) FROM {ex.fullname} WHERE task IN ('{SYNC_TASK}', '{ASYNC_TASK}')"
    )
    stopped: dict[int, float] = {}
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as admin:
        began = time.monotonic()
        for fleet in run.fleets:
            fleet.start_all()
        try:
            _drive(run, config, admin, remaining, rng, stopped, began, say)
        except BaseException:
            _resume(stopped, force=True)
            for fleet in run.fleets:
                fleet.kill_everything()
            raise
        _resume(stopped, force=True)
        for fleet in run.fleets:
            fleet.stop_all(30.0)
            run.stop_codes += [
                life.returncode for life in fleet.lives if not (life.killed or life.unexpected)
            ]
    return run


def _resume(stopped: dict[int, float], *, force: bool = False) -> None:
    now = time.monotonic()
    for pid, until in list(stopped.items()):
        if force or now >= until:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            del stopped[pid]


def _drive(
    run: ExactlyOnceRun,
    config: ExactlyOnceConfig,
    admin: Connection,
    remaining_sql: Any,
    rng: random.Random,
    stopped: dict[int, float],
    began: float,
    say: Callable[[str], None],
) -> None:
    total = config.sync_jobs + config.async_jobs
    left = total

    def kill() -> bool:
        for fleet in rng.sample(run.fleets, len(run.fleets)):
            killed = fleet.kill_random(rng)
            if killed is not None:
                run.kills += 1
                stopped.pop(killed.pid, None)
                return True
        return False

    def sweep() -> bool:
        count = terminate_backends(admin)
        run.sweeps.append(count)
        say(f"terminated {count} backends, {left} jobs left")
        return True

    def stop() -> bool:
        candidates = [pid for pid in _working(run.fleets) if pid not in stopped]
        if not candidates:
            return False
        pid = rng.choice(candidates)
        os.kill(pid, signal.SIGSTOP)
        stopped[pid] = time.monotonic() + config.stop_for
        run.stops += 1
        say(f"stopped pid {pid} for {config.stop_for:.1f}s, {left} jobs left")
        return True

    def jitter(seconds: float) -> float:
        return time.monotonic() + seconds * rng.uniform(0.75, 1.25)

    actions: dict[str, Callable[[], bool]] = {"kill": kill, "sweep": sweep, "stop": stop}
    every = {"kill": config.kill_every, "sweep": config.terminate_every, "stop": config.stop_every}
    due = {name: jitter(seconds / 3) for name, seconds in every.items()}
    marks = list(config.marks)
    deadline = began + config.timeout
    last_report = began
    while True:
        left = int(admin.execute(remaining_sql).scalar_one())
        now = time.monotonic()
        if left == 0:
            run.drain_seconds = now - began
            say(f"drained {total} jobs in {run.drain_seconds:.1f}s")
            return
        if now >= deadline:
            say(f"timeout: {left} jobs left after {config.timeout:.0f}s")
            return
        _resume(stopped)
        for fleet in run.fleets:
            for life in fleet.replace_exited():
                say(f"worker pid {life.pid} exited on its own with code {life.returncode}")
        # One marked action per round (several may be due at once); it stays due until done.
        if marks and 1 - left / total >= marks[0][0] and actions[marks[0][1]]():
            marks.pop(0)
        for name, seconds in every.items():
            if now >= due[name] and actions[name]():
                due[name] = jitter(seconds)
        if now - last_report >= 10:
            last_report = now
            say(f"{total - left}/{total} done, {run.kills} kills")
        time.sleep(0.1)
