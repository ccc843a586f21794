"""Chaos drain: worker processes are SIGKILLed and their connections cut while they work.

Shared by ``tests/acceptance/test_chaos.py`` (a few minutes) and ``bench/chaos.py`` (as long
as you like). The scenario:

* ``jobs`` jobs of the ``chaos`` task (see :func:`tests.support.app.chaos`); each execution
  writes a row in ``execution_log`` with its worker's pid before it pauses, and marks the row
  finished in the transaction that writes the job's ``results`` row;
* ``workers`` worker processes started through the CLI, as users start them;
* every ``kill_every`` seconds (jittered) a random worker gets SIGKILL and a new one takes its
  place; each process's life (pid, start, end, how it ended) goes in the kill log;
* ``terminations`` times, at evenly spaced points of progress, every client backend of the
  database except the orchestrator's own is terminated with ``pg_terminate_backend``;
* once no execution is left, the workers get SIGTERM and must exit cleanly.

:func:`verify_chaos` then accounts for every execution. A job may run more than once for
exactly two reasons, and each extra execution must show which one:

1. its worker was killed while running it: the execution's pid belongs to a process in the
   kill log, and the execution started (and, if it got that far, finished) within that
   process's life;
2. the attempt failed and the failure is in the job's error history under that attempt, as a
   database connection error: ``pg_terminate_backend`` also cuts the handler's own
   connection, which fails its transaction. That is an ordinary, recorded failed attempt,
   retried by the task's policy, not a silent re-run.

Anything else (say, a live worker losing a job to a reclaim because its heartbeat stalled,
or a completion written twice) is reported as unexplained.

With ``ChaosConfig(poison=True)`` the run also carries the poison mix of issue 12, spread
among the normal jobs (see :data:`POISONS`): a retry and a reschedule far beyond the year
9999, a result holding a NUL, a result nested 5,000 deep, and an ``async def`` handler that
raises ``SystemExit``; plus one execution written straight into the table with a due time
in the year 20,000, which no enqueue accepts. Every poison job must end ``failed`` with its
reason, the far-future row must stay pending and untouched, every normal job must still
succeed, and the only worker that may exit on its own is the one the ``SystemExit``
stopped (gracefully, with the handler's exit code).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, func, select, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_queue import Queue, Reschedule, Retry, RetryPolicy, UnknownTaskError
from tests.support.app import ExecutionLog, Result, chaos, queue
from tests.support.processes import start_worker

__all__ = [
    "CONNECTION_FAULTS",
    "POISONS",
    "ChaosConfig",
    "ChaosReport",
    "ChaosRun",
    "Termination",
    "WorkerFleet",
    "WorkerLife",
    "catches_sigterm",
    "enqueue_chaos_jobs",
    "register_poison_tasks",
    "run_chaos",
    "summary",
    "terminate_backends",
    "verify_chaos",
]

#: Error types a chaos handler may record: its connection was cut under it.
CONNECTION_FAULTS = frozenset({"sqlalchemy.exc.OperationalError", "sqlalchemy.exc.InterfaceError"})

#: Slack when comparing database timestamps with the orchestrator's clock (same host).
CLOCK_SLACK = 0.05

#: Log lines worth counting in the summary: evidence that the faults were felt and survived.
_LOG_MARKERS = {
    "database error": "database error during",
    "heartbeat failed": "heartbeat failed",
    "listen reconnect": "LISTEN connection lost",
    "reclaim sweeps": "lost execution(s) of dead workers",
    # A live worker whose heartbeat fell behind its lease: should stay at zero.
    "lost while held": "reclaimed by another worker while held here",
    # Poison runs: the worker a handler's SystemExit stopped, and completions the database
    # refused (zero: the worker refuses unstorable outcomes before writing them).
    "handler stop": "a handler raised SystemExit",
    "isolated acks": "writing them one by one",
    "fenced": "result discarded",
}


#: The poison tasks, registered only where a poison run needs them (see
#: :func:`register_poison_tasks`): worker processes load ``tests.support.chaos:poisoned_queue``.
POISON_TASK = "chaos_poison"
POISON_EXIT_TASK = "chaos_poison_exit"
#: The exit code the poison's ``SystemExit`` asks for.
POISON_EXIT_CODE = 3
#: The poison mix: kind -> (task, words one of its job's errors must hold, as "type: message").
POISONS: dict[str, tuple[str, str]] = {
    "retry_far": (POISON_TASK, "the latest due time a job may have"),
    "reschedule_far": (POISON_TASK, "the latest due time a job may have"),
    "nul_result": (POISON_TASK, "contains a NUL character"),
    "deep_result": (POISON_TASK, "nested too deep"),
    "async_exit": (POISON_EXIT_TASK, "builtins.SystemExit"),
}
#: Where a row written straight into the executions table is due: no enqueue accepts it.
FAR_FUTURE_SQL = "timestamptz '20000-01-01 00:00:00+00'"


def _poison(kind: str) -> Any:
    """Return or raise the poison ``kind`` (one of :data:`POISONS`)."""
    if kind == "retry_far":
        raise Retry("in about 31,700 years", after=1e12)
    if kind == "reschedule_far":
        return Reschedule(in_=1e12)
    if kind == "nul_result":
        return {"text": "a NUL \x00 in a result"}
    if kind == "deep_result":
        value: Any = "bottom"
        for _ in range(5_000):
            value = [value]
        return value
    return None  # "never_due": it never runs


async def _poison_exit(kind: str) -> None:
    """An ``async def`` handler that asks its process to exit."""
    await asyncio.sleep(0)
    raise SystemExit(POISON_EXIT_CODE)


def register_poison_tasks() -> Queue:
    """Register the poison tasks on the test app's queue (once) and return the queue."""
    try:
        queue.get_task(POISON_TASK)
    except UnknownTaskError:
        # Two attempts, the second at once: a refused retry or reschedule counts as a
        # failed attempt, and max_attempts ends the job.
        queue.task(name=POISON_TASK, max_attempts=2, retry=RetryPolicy(0, 0, jitter=0))(_poison)
        queue.task(name=POISON_EXIT_TASK, max_attempts=1)(_poison_exit)
    return queue


def __getattr__(name: str) -> Any:
    """``poisoned_queue``: the test app's queue with the poison tasks, for worker processes."""
    if name == "poisoned_queue":
        return register_poison_tasks()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class ChaosConfig:
    """Sizes and rhythm of one chaos run."""

    jobs: int = 10_000
    workers: int = 4
    concurrency: int = 10
    #: The worker's own pool (``--pool-size``): with ``concurrency`` handler connections and
    #: the LISTEN one, a worker holds at most ``concurrency + pool_size + 1`` connections.
    pool_size: int = 3
    kill_every: float = 2.0
    terminations: int = 2
    pause: float = 0.05
    poll_interval: float = 0.2
    #: Seconds to wait for the drain before giving up (the verification then fails).
    timeout: float = 180.0
    #: Seconds the workers get to exit after SIGTERM.
    stop_timeout: float = 30.0
    seed: int | None = None
    #: Add the poison mix (:data:`POISONS`) and a far-future row to the run.
    poison: bool = False


@dataclass
class WorkerLife:
    """One worker process from start to end: the kill log is the list of these."""

    slot: int
    pid: int
    started_at: float
    log_path: Path
    ended_at: float | None = None
    killed: bool = False
    returncode: int | None = None
    #: Ended on its own before the orchestrator stopped it.
    unexpected: bool = False

    def covers(self, moment: float) -> bool:
        """Whether ``moment`` (epoch seconds) falls within this process's life."""
        end = self.ended_at if self.ended_at is not None else float("inf")
        return self.started_at - CLOCK_SLACK <= moment <= end + CLOCK_SLACK


@dataclass(frozen=True)
class Termination:
    """One ``pg_terminate_backend`` sweep."""

    at: float
    backends: int
    progress: float


@dataclass
class ChaosRun:
    """What happened during :func:`run_chaos`."""

    config: ChaosConfig
    job_numbers: dict[int, int]
    lives: list[WorkerLife] = field(default_factory=list)
    terminations: list[Termination] = field(default_factory=list)
    started_at: float = 0.0
    drained_at: float | None = None
    stopped_at: float = 0.0
    #: Seconds from SIGTERM until the slowest worker exited.
    stop_seconds: float = 0.0
    #: Poison runs: job id -> its poison kind.
    poison_jobs: dict[int, str] = field(default_factory=dict)
    #: Poison runs: the execution written with a due time in the year 20,000.
    far_future: list[int] = field(default_factory=list)

    @property
    def kills(self) -> list[WorkerLife]:
        """Processes the orchestrator SIGKILLed."""
        return [life for life in self.lives if life.killed]

    @property
    def unexpected_exits(self) -> list[WorkerLife]:
        """Processes that ended without being killed or stopped."""
        return [life for life in self.lives if life.unexpected]

    @property
    def drain_seconds(self) -> float | None:
        """Seconds from the first worker start until no execution was left."""
        return None if self.drained_at is None else self.drained_at - self.started_at


class WorkerFleet:
    """A fixed number of CLI worker processes, with a log of every process's life."""

    def __init__(
        self,
        db_url: str,
        size: int,
        args: Iterable[str],
        log_dir: Path,
        target: str = "tests.support.app:queue",
    ) -> None:
        self.db_url = db_url
        self.size = size
        self.args = list(args)
        self.log_dir = log_dir
        self.target = target
        self.lives: list[WorkerLife] = []
        self._procs: dict[int, tuple[subprocess.Popen[bytes], WorkerLife]] = {}

    def start(self, slot: int) -> WorkerLife:
        """Start a worker in ``slot`` (which must be free)."""
        log_path = self.log_dir / f"life{len(self.lives):03d}-slot{slot}.log"
        started_at = time.time()
        proc = start_worker(self.db_url, *self.args, log_path=log_path, target=self.target)
        life = WorkerLife(slot=slot, pid=proc.pid, started_at=started_at, log_path=log_path)
        self.lives.append(life)
        self._procs[slot] = (proc, life)
        return life

    def start_all(self) -> None:
        """Fill every slot."""
        for slot in range(self.size):
            self.start(slot)

    def kill(self, slot: int) -> WorkerLife:
        """SIGKILL the worker in ``slot``, wait for it, and start a new one there."""
        proc, life = self._procs.pop(slot)
        proc.send_signal(signal.SIGKILL)
        life.returncode = proc.wait()
        # Taken after the process is gone: every write it made happened before this.
        life.ended_at = time.time()
        life.killed = True
        self.start(slot)
        return life

    def kill_random(self, rng: random.Random) -> WorkerLife | None:
        """SIGKILL a random working worker and replace it; ``None`` if none is working yet.

        Only workers past their start-up (their SIGTERM handler is in place, so they are in
        the run loop) are candidates: killing one that is still importing proves nothing.
        """
        working = [
            slot
            for slot, (proc, _) in sorted(self._procs.items())
            if proc.poll() is None and catches_sigterm(proc.pid)
        ]
        return self.kill(rng.choice(working)) if working else None

    def replace_exited(self) -> list[WorkerLife]:
        """Restart workers that ended on their own (a bug: they should ride out faults)."""
        gone = []
        for slot, (proc, life) in list(self._procs.items()):
            code = proc.poll()
            if code is not None:
                life.returncode = code
                life.ended_at = time.time()
                life.unexpected = True
                del self._procs[slot]
                gone.append(life)
                self.start(slot)
        return gone

    def stop_all(self, timeout: float) -> float:
        """SIGTERM every worker and wait; return the seconds from SIGTERM until the last exit.

        A worker restarted a moment ago may still be importing, before it handles SIGTERM,
        and would die of it: wait (up to ``timeout``) until each one catches the signal.
        Workers still alive ``timeout`` seconds after SIGTERM are killed.
        """
        procs = list(self._procs.values())
        ready_by = time.monotonic() + timeout
        while time.monotonic() < ready_by and not all(
            proc.poll() is not None or catches_sigterm(proc.pid) for proc, _ in procs
        ):
            time.sleep(0.05)
        began = time.monotonic()
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, life in procs:
            try:
                life.returncode = proc.wait(max(0.0, timeout - (time.monotonic() - began)))
            except subprocess.TimeoutExpired:
                proc.kill()
                life.returncode = proc.wait()
            life.ended_at = time.time()
        self._procs.clear()
        return time.monotonic() - began

    def kill_everything(self) -> None:
        """Last resort on an error path: leave no process behind."""
        for proc, life in self._procs.values():
            if proc.poll() is None:
                proc.kill()
            life.returncode = proc.wait()
            life.ended_at = time.time()
        self._procs.clear()


def catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a SIGTERM handler installed (Linux; elsewhere: assume so)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return True


def terminate_backends(admin: Connection) -> int:
    """Terminate every client backend of ``admin``'s database except ``admin``'s own.

    Returns how many were terminated.
    """
    rows = admin.execute(
        text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
    ).all()
    return sum(1 for (ok,) in rows if ok)


def enqueue_chaos_jobs(engine: Engine, config: ChaosConfig) -> dict[int, int]:
    """Enqueue the run's jobs; returns job id -> the number ``n`` it carries."""
    with Session(engine) as session, session.begin():
        ids = queue.enqueue_many(
            session, (chaos.call(n=n, pause=config.pause) for n in range(config.jobs))
        )
    return {job_id: n for n, job_id in enumerate(ids)}


def enqueue_poison(
    engine: Engine, config: ChaosConfig
) -> tuple[dict[int, int], dict[int, str], int]:
    """Enqueue the normal jobs with the poison mix spread among them, and one more poison
    job whose execution is then moved to the year 20,000 by hand.

    Returns (job id -> ``n`` of each normal job, job id -> kind of each poison job, the id
    of the far-future one).
    """
    register_poison_tasks()
    kinds = list(POISONS)
    step = max(1, config.jobs // (len(kinds) + 1))
    specs: list[Any] = []
    for n in range(config.jobs):
        if kinds and n and n % step == 0:
            kind = kinds.pop(0)
            specs.append((kind, queue.get_task(POISONS[kind][0]).call(kind=kind)))
        specs.append((n, chaos.call(n=n, pause=config.pause)))
    specs.extend((kind, queue.get_task(POISONS[kind][0]).call(kind=kind)) for kind in kinds)
    specs.append(("never_due", queue.get_task(POISON_TASK).call(kind="never_due")))
    ex = queue.tables.executions
    with Session(engine) as session, session.begin():
        ids = queue.enqueue_many(session, (spec for _, spec in specs))
        far = ids[-1]
        session.execute(ex.update().where(ex.c.id == far).values(execute_at=text(FAR_FUTURE_SQL)))
    tags = dict(zip(ids, (tag for tag, _ in specs), strict=True))
    numbers = {i: tag for i, tag in tags.items() if isinstance(tag, int)}
    poisons = {i: tag for i, tag in tags.items() if isinstance(tag, str) and i != far}
    return numbers, poisons, far


def run_chaos(
    db_url: str,
    config: ChaosConfig,
    log_dir: Path,
    *,
    on_progress: Callable[[str], None] | None = None,
) -> ChaosRun:
    """Enqueue the jobs, then run the workers under fire until every job is final.

    ``db_url`` must hold the test app's tables and the queue's schema. Worker output goes
    to one file per process life under ``log_dir``.
    """
    rng = random.Random(config.seed)
    say = on_progress or (lambda _message: None)
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        if config.poison:
            numbers, poisons, far = enqueue_poison(engine, config)
            run = ChaosRun(config=config, job_numbers=numbers, poison_jobs=poisons)
            run.far_future.append(far)
            tasks = f"chaos,{POISON_TASK},{POISON_EXIT_TASK}"
            target = "tests.support.chaos:poisoned_queue"
        else:
            run = ChaosRun(config=config, job_numbers=enqueue_chaos_jobs(engine, config))
            tasks, target = "chaos", "tests.support.app:queue"
        fleet = WorkerFleet(
            db_url,
            config.workers,
            [
                "--tasks",
                tasks,
                "--concurrency",
                str(config.concurrency),
                "--pool-size",
                str(config.pool_size),
                "--poll-interval",
                str(config.poll_interval),
            ],
            log_dir,
            target=target,
        )
        run.lives = fleet.lives
        ex = queue.tables.executions
        # The far-future row stays pending by design: it is not part of the drain.
        remaining_sql = select(func.count()).select_from(ex).where(ex.c.id.not_in(run.far_future))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as admin:
            run.started_at = time.time()
            fleet.start_all()
            try:
                _drive(run, fleet, admin, remaining_sql, rng, say)
            except BaseException:
                fleet.kill_everything()
                raise
            run.stopped_at = time.time()
            run.stop_seconds = fleet.stop_all(config.stop_timeout)
    finally:
        engine.dispose()
    say(
        f"stopped {config.workers} workers in {run.stop_seconds:.1f}s; "
        f"{len(run.kills)} kills, {len(run.terminations)} backend sweeps"
    )
    return run


def _drive(
    run: ChaosRun,
    fleet: WorkerFleet,
    admin: Connection,
    remaining_sql: Any,
    rng: random.Random,
    say: Callable[[str], None],
) -> None:
    config = run.config
    total = config.jobs + len(run.poison_jobs)
    marks = [(i + 1) / (config.terminations + 1) for i in range(config.terminations)]
    deadline = time.monotonic() + config.timeout
    next_kill = time.monotonic() + config.kill_every
    last_report = time.monotonic()
    # Two sweeps in one poll would hit the same fresh connections twice; space them out.
    next_sweep_allowed = 0.0
    while True:
        now = time.monotonic()
        remaining = int(admin.execute(remaining_sql).scalar_one())
        progress = 1.0 - remaining / total
        if remaining == 0:
            run.drained_at = time.time()
            say(f"drained {total} jobs in {run.drain_seconds:.1f}s")
            return
        if now >= deadline:
            say(f"timeout: {remaining} executions left after {config.timeout:.0f}s")
            return
        for life in fleet.replace_exited():
            say(f"worker pid {life.pid} exited on its own with code {life.returncode}")
        if marks and progress >= marks[0] and now >= next_sweep_allowed:
            marks.pop(0)
            count = terminate_backends(admin)
            run.terminations.append(Termination(time.time(), count, progress))
            next_sweep_allowed = now + 1.5
            say(f"terminated {count} backends at {progress:.0%}")
        if now >= next_kill:
            killed = fleet.kill_random(rng)
            if killed is not None:
                next_kill = now + config.kill_every * rng.uniform(0.75, 1.25)
                say(f"killed pid {killed.pid} (slot {killed.slot}) at {progress:.0%}")
        if now - last_report >= 10:
            last_report = now
            say(f"{total - remaining}/{total} final, {len(run.kills)} kills")
        time.sleep(0.2)


@dataclass
class ChaosReport:
    """The accounting of a chaos run; ``problems`` is empty when everything adds up."""

    jobs: int = 0
    succeeded: int = 0
    executions: int = 0
    extra_by_kill: int = 0
    extra_by_error: int = 0
    recorded_errors: Counter[str] = field(default_factory=Counter)
    log_counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    #: Poison runs: poison jobs that ended failed with their reason.
    poison_failed: int = 0
    #: Poison runs: workers the poison's SystemExit stopped (gracefully, exit code 3).
    poison_stops: int = 0

    @property
    def extra(self) -> int:
        """Executions beyond one per job."""
        return self.extra_by_kill + self.extra_by_error

    def problem(self, message: str) -> None:
        """Note one discrepancy."""
        self.problems.append(message)


@dataclass(frozen=True)
class _Execution:
    attempt: int
    pid: int
    started_at: float
    finished_at: float | None


def verify_chaos(db_url: str, run: ChaosRun) -> ChaosReport:
    """Account for every job and every execution of ``run`` (see the module docstring)."""
    report = ChaosReport(jobs=len(run.job_numbers))
    engine = create_engine(db_url, poolclass=NullPool)
    jobs_t = queue.tables.jobs
    try:
        with engine.connect() as conn:
            jobs = {
                row.id: row
                for row in conn.execute(
                    select(
                        jobs_t.c.id,
                        jobs_t.c.status,
                        jobs_t.c.attempts,
                        jobs_t.c.result,
                        jobs_t.c.errors,
                    ).where(jobs_t.c.task == "chaos")
                )
            }
            result_rows = conn.execute(select(Result.job_id, Result.value)).all()
            results: dict[int, str | None] = {row[0]: row[1] for row in result_rows}
            executions: dict[int, list[_Execution]] = {}
            for job_id, attempt, pid, started, finished in conn.execute(
                select(
                    ExecutionLog.job_id,
                    ExecutionLog.attempt,
                    ExecutionLog.pid,
                    func.extract("epoch", ExecutionLog.started_at),
                    func.extract("epoch", ExecutionLog.finished_at),
                )
            ):
                executions.setdefault(job_id, []).append(
                    _Execution(
                        attempt, pid, float(started), None if finished is None else float(finished)
                    )
                )
            ex = queue.tables.executions
            left = conn.execute(
                select(func.count()).select_from(ex).where(ex.c.id.not_in(run.far_future))
            )
            leftover = int(left.scalar_one())
            poison_rows = conn.execute(
                select(jobs_t.c.id, jobs_t.c.status, jobs_t.c.errors).where(
                    jobs_t.c.id.in_(list(run.poison_jobs))
                )
            ).all()
            far_rows = conn.execute(
                select(ex.c.id, ex.c.state, ex.c.attempt).where(ex.c.id.in_(run.far_future))
            ).all()
    finally:
        engine.dispose()

    if leftover:
        report.problem(f"{leftover} executions still in the queue")
    if set(jobs) != set(run.job_numbers):
        report.problem(f"{len(set(run.job_numbers) - set(jobs))} jobs missing from the jobs table")
    _check_poison(report, run, poison_rows, far_rows)
    for life in run.unexpected_exits:
        if run.poison_jobs and _stopped_by_poison(life):
            report.poison_stops += 1
            continue
        report.problem(f"worker pid {life.pid} exited on its own (code {life.returncode})")
    survivors = [life for life in run.lives if not life.killed and not life.unexpected]
    for life in survivors:
        if life.returncode != 0:
            report.problem(f"worker pid {life.pid} exited with {life.returncode} after SIGTERM")
    lives_by_pid: dict[int, list[WorkerLife]] = {}
    for life in run.lives:
        lives_by_pid.setdefault(life.pid, []).append(life)

    for job_id, n in sorted(run.job_numbers.items()):
        job = jobs.get(job_id)
        if job is None:
            continue
        errors: list[dict[str, Any]] = job.errors or []
        for entry in errors:
            report.recorded_errors[str(entry.get("type"))] += 1
        _check_job(
            report, job_id, n, job, errors, results, executions.get(job_id, []), lives_by_pid
        )
    report.executions = sum(len(v) for v in executions.values())
    strays = set(executions) - set(run.job_numbers)
    if strays:
        report.problem(f"executions logged for {len(strays)} unknown jobs")
    for life in run.lives:
        text_ = life.log_path.read_text(errors="replace") if life.log_path.exists() else ""
        for name, marker in _LOG_MARKERS.items():
            report.log_counts[name] += text_.count(marker)
    return report


def _stopped_by_poison(life: WorkerLife) -> bool:
    """Whether ``life`` ended as the poison's SystemExit asks: its code, after saying why."""
    if life.returncode != POISON_EXIT_CODE or not life.log_path.exists():
        return False
    return "a handler raised SystemExit" in life.log_path.read_text(errors="replace")


def _check_poison(
    report: ChaosReport, run: ChaosRun, rows: Iterable[Any], far_rows: Iterable[Any]
) -> None:
    """Every poison job failed with its reason; the far-future row is pending, untouched."""
    found = {row.id: row for row in rows}
    for job_id, kind in sorted(run.poison_jobs.items()):
        row = found.get(job_id)
        words = POISONS[kind][1]
        messages = (
            [f"{e.get('type')}: {e.get('message')}" for e in (row.errors or [])] if row else []
        )
        if row is None or row.status != "failed" or not any(words in m for m in messages):
            status = None if row is None else row.status
            report.problem(f"poison {kind} (job {job_id}): status {status}, errors {messages}")
        else:
            report.poison_failed += 1
    far = {row.id: row for row in far_rows}
    for job_id in run.far_future:
        row = far.get(job_id)
        if row is None or (row.state, row.attempt) != ("pending", 0):
            report.problem(f"far-future job {job_id} was touched: {row}")
    if run.poison_jobs and not any(_stopped_by_poison(life) for life in run.unexpected_exits):
        report.problem("no worker stopped on the poison's SystemExit")


def _check_job(
    report: ChaosReport,
    job_id: int,
    n: int,
    job: Any,
    errors: list[dict[str, Any]],
    results: dict[int, str | None],
    runs: list[_Execution],
    lives_by_pid: dict[int, list[WorkerLife]],
) -> None:
    where = f"job {job_id}"
    if job.status != "succeeded":
        report.problem(f"{where}: status {job.status}, errors {json.dumps(errors)[:500]}")
        return
    report.succeeded += 1
    if job.result != n:
        report.problem(f"{where}: result {job.result!r}, expected {n}")
    if results.get(job_id) != str(n):
        report.problem(f"{where}: results row {results.get(job_id)!r}, expected {n!r}")
    for entry in errors:
        if entry.get("type") not in CONNECTION_FAULTS:
            report.problem(f"{where}: unexpected error {entry.get('type')}: {entry.get('message')}")
    attempts = Counter(r.attempt for r in runs)
    doubled = sorted(a for a, c in attempts.items() if c > 1)
    if doubled:
        report.problem(f"{where}: attempts {doubled} executed more than once")
    final = [r for r in runs if r.attempt == job.attempts]
    if not final or final[0].finished_at is None:
        report.problem(f"{where}: no finished execution for its final attempt {job.attempts}")
    failed_attempts = {e.get("attempt") for e in errors if e.get("type") in CONNECTION_FAULTS}
    for execution in runs:
        if execution.attempt == job.attempts:
            continue
        if execution.attempt > job.attempts:
            report.problem(f"{where}: execution of attempt {execution.attempt} after the final one")
            continue
        killed = [
            life
            for life in lives_by_pid.get(execution.pid, [])
            if life.killed
            and life.covers(execution.started_at)
            and (execution.finished_at is None or life.covers(execution.finished_at))
        ]
        if killed:
            report.extra_by_kill += 1
        elif execution.attempt in failed_attempts:
            report.extra_by_error += 1
        else:
            report.problem(
                f"{where}: unexplained extra execution (attempt {execution.attempt}, "
                f"pid {execution.pid}, finished={execution.finished_at is not None}); "
                f"its process was not killed and the attempt recorded no error"
            )


def summary(run: ChaosRun, report: ChaosReport) -> str:
    """A few lines for humans: what was done to the workers and how the jobs came out."""
    sweeps = ", ".join(f"{t.backends} at {t.progress:.0%}" for t in run.terminations) or "none"
    drain = f"{run.drain_seconds:.1f}s" if run.drain_seconds is not None else "did not drain"
    lines = [
        f"jobs: {report.jobs}, succeeded: {report.succeeded}, drain: {drain}, "
        f"stop after SIGTERM: {run.stop_seconds:.1f}s",
        f"processes: {len(run.lives)} lives, {len(run.kills)} SIGKILLs, "
        f"{len(run.unexpected_exits)} unexpected exits; backends terminated: {sweeps}",
        f"executions: {report.executions} ({report.extra} extra: {report.extra_by_kill} by a "
        f"killed worker, {report.extra_by_error} retried after a recorded connection error)",
        f"recorded errors: {dict(report.recorded_errors) or 'none'}",
        *(
            [
                f"poison: {report.poison_failed}/{len(run.poison_jobs)} failed with their "
                f"reason, {report.poison_stops} worker(s) stopped by the poison's SystemExit, "
                f"{len(run.far_future)} far-future row(s) left pending"
            ]
            if run.poison_jobs
            else []
        ),
        f"worker log lines: {dict(report.log_counts)}",
        f"problems: {len(report.problems)}",
        *(f"  {p}" for p in report.problems[:20]),
    ]
    return "\n".join(lines)
