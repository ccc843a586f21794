"""Poison for workers (issue 12): one bad outcome, exception, setting or grant stops nothing.

One reproduction per defect the issue found on the worker's side. Each runs a burst
worker in a thread with a deadline, so a wedged worker fails the test instead of hanging
it, and each checks that:

* the poison job ends ``failed`` with its reason in ``errors`` (and, where a retry is
  possible, that the attempt counted and ``max_attempts`` applied);
* the other jobs of the same batch succeed;
* the worker does not wedge: ``run(burst=True)`` returns (or raises) within the deadline.

Names added by the fix are looked up inside the tests, never imported at the top, so the
module also runs against the code before the fix, where each test fails for its defect
(a timeout, a job left queued, a thread left running, a setting accepted).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, make_url, select, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import Reschedule, Retry, RetryPolicy, WorkerSettings
from tests.support.app import queue

pytestmark = pytest.mark.integration

JOBS = queue.tables.jobs
EX = queue.tables.executions
#: Seconds a burst run may take before the worker counts as wedged.
DEADLINE = 30.0
#: Retry at once: a poison job's second attempt runs in the same burst.
AT_ONCE = RetryPolicy(min_delay=0, max_delay=0, jitter=0)
GOOD = 4


# -- the poison tasks, registered for this module only --------------------------------------


class StrRaises(Exception):
    """An exception whose ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def poison_ok(n: int) -> int:
    """A job that succeeds: the batch companions of the poison."""
    return n


async def poison_ok_async(n: int) -> int:
    """The async twin of :func:`poison_ok`."""
    await asyncio.sleep(0.05)
    return n


def poison_sync(kind: str) -> Any:
    """Return or raise the poison named ``kind``."""
    if kind == "retry_after":
        raise Retry("much later", after=1e12)
    if kind == "retry_overflow":  # past PostgreSQL's own timestamp range too
        raise Retry("much later", after=1e15)
    if kind == "reschedule_in":
        return Reschedule(in_=1e12)
    if kind == "reschedule_at_max":
        return Reschedule(at=dt.datetime.max.replace(tzinfo=dt.UTC))
    if kind == "retry_at_naive":
        raise Retry("at a naive time", at=dt.datetime(2000, 1, 1))
    if kind == "nul_result":
        return {"text": "before\x00after"}
    if kind == "surrogate_result":
        return ["fine", "lone \ud800 surrogate"]
    if kind == "nul_message":
        raise ValueError("card \x00 declined")
    if kind == "surrogate_message":
        raise ValueError("card \udcff declined")
    if kind == "deep_result":
        return _deep(5_000)
    if kind == "str_raises":
        raise StrRaises()
    raise AssertionError(kind)


async def poison_async(kind: str) -> Any:
    """The async poisons: stop-the-process exceptions and a cancellation of its own."""
    await asyncio.sleep(0.01)
    if kind == "system_exit":
        raise SystemExit(3)
    if kind == "keyboard_interrupt":
        raise KeyboardInterrupt
    if kind == "cancelled":
        raise asyncio.CancelledError
    if kind == "sync_like":
        return poison_sync("nul_result")
    raise AssertionError(kind)


def poison_exit_sync(kind: str) -> None:
    """A ``def`` handler that asks the process to stop."""
    if kind == "system_exit":
        raise SystemExit(3)
    raise KeyboardInterrupt


@pytest.fixture(scope="module", autouse=True)
def poison_tasks() -> Iterator[None]:
    """Register the poison tasks on the test app's queue for this module, then remove them."""
    registered: list[Any] = [
        queue.task(name="poison_ok")(poison_ok),
        queue.task(name="poison_ok_async")(poison_ok_async),
        queue.task(name="poison_sync", max_attempts=2, retry=AT_ONCE)(poison_sync),
        queue.task(name="poison_async", max_attempts=2, retry=AT_ONCE)(poison_async),
        queue.task(name="poison_exit_async", max_attempts=1)(poison_async),
        queue.task(name="poison_exit_sync", max_attempts=1)(poison_exit_sync),
    ]
    yield
    for task in registered:
        queue._registry._tasks.pop(task.name, None)


# -- running a worker with a deadline --------------------------------------------------------


@dataclass
class Run:
    """How a burst run ended."""

    stats: Any = None
    error: BaseException | None = None
    #: Worker threads started during the run and still alive after it.
    leftover_threads: list[str] | None = None


def _worker_threads(before: set[threading.Thread]) -> list[str]:
    return sorted(
        t.name
        for t in threading.enumerate()
        if t not in before and t.is_alive() and t.name.startswith("sqla-queue")
    )


def _run_with_deadline(target: Callable[[], Any], stop: Callable[[], None]) -> Run:
    run = Run()
    before = set(threading.enumerate())

    def body() -> None:
        try:
            run.stats = target()
        except BaseException as exc:  # SystemExit too: surfaced to the test below
            run.error = exc

    thread = threading.Thread(target=body, name="poison-test-runner", daemon=True)
    thread.start()
    thread.join(DEADLINE)
    if thread.is_alive():
        stop()
        thread.join(10)
        raise AssertionError(f"the worker wedged: run(burst=True) did not end in {DEADLINE}s")
    run.leftover_threads = _worker_threads(before)
    return run


def burst(factory: sessionmaker[Session], tasks: list[str], **settings: Any) -> Run:
    """Run a sync worker serving ``tasks`` until idle, in a thread, with a deadline."""
    options: dict[str, Any] = {
        "concurrency": 8,
        "install_signal_handlers": False,
        "shutdown_timeout": 10.0,
        "poll_interval": 0.1,
        **settings,
    }
    worker = queue.worker(factory, tasks=tasks, **options)
    return _run_with_deadline(lambda: worker.run(burst=True), worker.stop)


def burst_async(db_url: str, tasks: list[str], **settings: Any) -> Run:
    """Run an async worker serving ``tasks`` until idle, on its own loop in a thread."""
    options: dict[str, Any] = {
        "concurrency": 8,
        "install_signal_handlers": False,
        "shutdown_timeout": 10.0,
        "poll_interval": 0.1,
        **settings,
    }
    holder: list[Any] = []

    async def main() -> Any:
        engine = create_async_engine(db_url)
        try:
            worker = queue.async_worker(async_sessionmaker(engine), tasks=tasks, **options)
            holder.append(worker)
            return await worker.run(burst=True)
        finally:
            await engine.dispose()

    def stop() -> None:
        if holder:
            holder[0].stop()

    return _run_with_deadline(lambda: asyncio.run(main()), stop)


def enqueue(factory: sessionmaker[Session], task: str, *calls: dict[str, Any]) -> list[int]:
    with factory.begin() as session:
        return [queue.get_task(task).enqueue(session, **kw) for kw in calls]


def jobs(factory: sessionmaker[Session], ids: list[int]) -> dict[int, Any]:
    with factory() as session:
        rows = session.execute(select(JOBS).where(JOBS.c.id.in_(ids))).all()
    return {row.id: row for row in rows}


def running_left(factory: sessionmaker[Session]) -> int:
    with factory() as session:
        return int(
            session.scalar(select(func.count()).select_from(EX).where(EX.c.state == "running")) or 0
        )


def assert_poison_failed(
    factory: sessionmaker[Session], job_id: int, reason: str, *, attempts: int
) -> Any:
    job = jobs(factory, [job_id])[job_id]
    assert job.status == "failed", (job.status, job.attempts, job.errors)
    assert job.attempts == attempts, job.errors
    assert len(job.errors) == attempts, job.errors
    assert any(reason in e["message"] for e in job.errors), job.errors
    return job


def assert_good_succeeded(factory: sessionmaker[Session], ids: list[int]) -> None:
    found = jobs(factory, ids)
    assert {i: (j.status, j.result) for i, j in found.items()} == {
        i: ("succeeded", n) for n, i in enumerate(ids)
    }


def _good(factory: sessionmaker[Session], task: str = "poison_ok") -> list[int]:
    return enqueue(factory, task, *({"n": n} for n in range(GOOD)))


# -- item 1, handler side: a next run after the latest due time ------------------------------


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("retry_after", "latest due time"),
        ("retry_overflow", "latest due time"),
        ("reschedule_in", "latest due time"),
        ("reschedule_at_max", "outside the due times a job may have"),
        ("retry_at_naive", "must be timezone-aware"),
    ],
)
def test_a_far_future_retry_or_reschedule_fails_alone(
    SessionLocal: sessionmaker[Session], kind: str, reason: str
) -> None:
    (poison,) = enqueue(SessionLocal, "poison_sync", {"kind": kind})
    good = _good(SessionLocal)

    run = burst(SessionLocal, ["poison_sync", "poison_ok"])

    assert run.error is None, run.error
    # Refused at outcome time: a failed attempt with the reason, max_attempts (2) applies.
    assert_poison_failed(SessionLocal, poison, reason, attempts=2)
    assert_good_succeeded(SessionLocal, good)
    assert running_left(SessionLocal) == 0


# -- item 3: NUL and lone surrogates in results and error messages ---------------------------


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("nul_result", "result['text'] contains a NUL character"),
        ("surrogate_result", "result[1] contains a lone surrogate code point U+D800"),
        ("nul_message", "card \ufffd declined"),
        ("surrogate_message", "card \ufffd declined"),
    ],
)
def test_nul_or_lone_surrogate_in_a_result_or_error_fails_the_job_alone(
    SessionLocal: sessionmaker[Session], kind: str, reason: str
) -> None:
    (poison,) = enqueue(SessionLocal, "poison_sync", {"kind": kind})
    good = _good(SessionLocal)

    run = burst(SessionLocal, ["poison_sync", "poison_ok"])

    assert run.error is None, run.error
    job = assert_poison_failed(SessionLocal, poison, reason, attempts=2)
    if kind.endswith("message"):
        # The error text was sanitized, and says so; the traceback too.
        assert "replaced with U+FFFD" in job.errors[-1]["message"]
        assert "\ufffd" in job.errors[-1]["traceback"]
    assert_good_succeeded(SessionLocal, good)
    assert running_left(SessionLocal) == 0


def test_an_async_handlers_nul_result_fails_alone_in_the_async_worker(
    db_url: str, SessionLocal: sessionmaker[Session]
) -> None:
    (poison,) = enqueue(SessionLocal, "poison_async", {"kind": "sync_like"})
    good = _good(SessionLocal, "poison_ok_async")

    run = burst_async(db_url, ["poison_async", "poison_ok_async"])

    assert run.error is None, run.error
    assert_poison_failed(SessionLocal, poison, "contains a NUL character", attempts=2)
    assert_good_succeeded(SessionLocal, good)


def test_a_completion_the_database_refuses_is_isolated_and_fails_only_its_job(
    SessionLocal: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence: an outcome that passed every check but that the database
    still refuses (a data error, which retrying cannot fix). The worker writes the batch's
    outcomes one by one, fails the job at fault with the database's reason, and goes on."""
    from sqla_queue.worker import handlers

    # Let the NUL result through to the database, as if a check had missed it.
    monkeypatch.setattr(handlers, "check_outcome", lambda outcome, now: outcome.encoded)
    (poison,) = enqueue(SessionLocal, "poison_sync", {"kind": "nul_result"})
    good = _good(SessionLocal)

    run = burst(SessionLocal, ["poison_sync", "poison_ok"], ack_delay=0.5)

    assert run.error is None, run.error
    job = jobs(SessionLocal, [poison])[poison]
    assert (job.status, job.attempts) == ("failed", 1), job.errors
    (error,) = job.errors
    assert error["type"] == "sqla_queue.OutcomeNotWritten"
    assert "SQLSTATE 22P05" in error["message"], error
    assert_good_succeeded(SessionLocal, good)
    assert running_left(SessionLocal) == 0


# -- item 4: KeyboardInterrupt / SystemExit from a handler -----------------------------------


@pytest.mark.parametrize("exc_kind", ["system_exit", "keyboard_interrupt"])
@pytest.mark.parametrize("face", ["async_worker", "sync_worker"])
def test_an_async_handlers_exit_stops_the_worker_like_sigterm(
    db_url: str, SessionLocal: sessionmaker[Session], face: str, exc_kind: str
) -> None:
    (poison,) = enqueue(SessionLocal, "poison_exit_async", {"kind": exc_kind})
    good = _good(SessionLocal, "poison_ok_async")
    tasks = ["poison_exit_async", "poison_ok_async"]

    run = burst_async(db_url, tasks) if face == "async_worker" else burst(SessionLocal, tasks)

    expected = SystemExit if exc_kind == "system_exit" else KeyboardInterrupt
    # run() raises the handler's exception again, after a graceful stop...
    assert isinstance(run.error, expected), run.error
    # ...in which every worker thread ended: heartbeat, listener, handler pool, loop.
    assert run.leftover_threads == [], run.leftover_threads
    # The attempt was recorded as a failure with its reason (max_attempts is 1).
    job = assert_poison_failed(SessionLocal, poison, "", attempts=1)
    assert job.errors[0]["type"] == f"builtins.{expected.__name__}"
    # Its batch companions finished during the stop; nothing is left running.
    assert_good_succeeded(SessionLocal, good)
    assert running_left(SessionLocal) == 0


@pytest.mark.parametrize("exc_kind", ["system_exit", "keyboard_interrupt"])
def test_a_def_handlers_exit_stops_the_worker_the_same_way(
    SessionLocal: sessionmaker[Session], exc_kind: str
) -> None:
    (poison,) = enqueue(SessionLocal, "poison_exit_sync", {"kind": exc_kind})
    good = _good(SessionLocal)

    run = burst(SessionLocal, ["poison_exit_sync", "poison_ok"])

    expected = SystemExit if exc_kind == "system_exit" else KeyboardInterrupt
    assert isinstance(run.error, expected), run.error
    assert run.leftover_threads == [], run.leftover_threads
    assert_poison_failed(SessionLocal, poison, "", attempts=1)
    assert_good_succeeded(SessionLocal, good)
    assert running_left(SessionLocal) == 0


# -- item 5: outcomes that cannot be built ---------------------------------------------------


@pytest.mark.parametrize(
    ("task", "kind", "reason", "error_type"),
    [
        (
            "poison_sync",
            "deep_result",
            "nested too deep",
            "sqla_queue.logic.outcomes.InvalidOutcomeError",
        ),
        ("poison_sync", "str_raises", "<str() of this StrRaises raised RuntimeError>", None),
        ("poison_async", "cancelled", "", "asyncio.exceptions.CancelledError"),
    ],
)
def test_an_outcome_that_cannot_be_built_is_a_failed_attempt(
    SessionLocal: sessionmaker[Session],
    task: str,
    kind: str,
    reason: str,
    error_type: str | None,
) -> None:
    (poison,) = enqueue(SessionLocal, task, {"kind": kind})
    good = _good(SessionLocal)

    run = burst(SessionLocal, [task, "poison_ok"])

    assert run.error is None, run.error
    # Each attempt counted, and max_attempts (2) ended the job.
    job = assert_poison_failed(SessionLocal, poison, reason, attempts=2)
    if error_type is not None:
        assert {e["type"] for e in job.errors} == {error_type}, job.errors
    assert_good_succeeded(SessionLocal, good)
    assert running_left(SessionLocal) == 0


# -- item 6: a role that lost a privilege, a table that is gone ------------------------------


@pytest.fixture
def role(db_url: str) -> Iterator[Callable[[bool], str]]:
    """A login role on this test's database; call it to grant (or not) the worker's tables.

    ``grant(True)`` gives what a worker needs except the limits table; ``grant(False)``
    gives nothing but USAGE on the queue's schema. Returns the URL to log in as the role.
    """
    name = f"sqlaq_poison_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    owner = create_engine(db_url, isolation_level="AUTOCOMMIT")
    schema = queue.tables.schema
    with owner.connect() as connection:
        connection.execute(text(f'CREATE ROLE "{name}" LOGIN'))

    def grant(tables: bool) -> str:
        with owner.connect() as connection:
            connection.execute(text(f'GRANT USAGE ON SCHEMA "{schema}" TO "{name}"'))
            if tables:
                # The workers table: the reclaim reads whose rows are alive.
                for table in (JOBS, EX, queue.tables.workers):
                    connection.execute(
                        text(
                            f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{schema}"."{table.name}" '
                            f'TO "{name}"'
                        )
                    )
                connection.execute(
                    text(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{name}"')
                )
        return make_url(db_url).set(username=name).render_as_string(hide_password=False)

    yield grant
    with owner.connect() as connection:
        connection.execute(text(f'DROP OWNED BY "{name}"'))
        connection.execute(text(f'DROP ROLE "{name}"'))
    owner.dispose()


def _stopped_with(run: Run, *words: str) -> str:
    assert run.error is not None, "run(burst=True) returned without saying what is wrong"
    assert type(run.error).__name__ == "WorkerStoppedError", repr(run.error)
    message = str(run.error)
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize("tables", [True, False], ids=["no-limits-grant", "no-grants"])
def test_a_worker_without_a_privilege_stops_and_names_the_fix(
    db_url: str, SessionLocal: sessionmaker[Session], role: Callable[[bool], str], tables: bool
) -> None:
    good = _good(SessionLocal)
    engine = create_engine(role(tables))
    try:
        # verify_schema=False: this is about privileges lost at run time.
        run = burst(sessionmaker(engine), ["poison_ok"], verify_schema=False)
    finally:
        engine.dispose()

    message = _stopped_with(run, "permission denied", "42501", "docs/guides/deployment.md")
    assert queue.tables.limits.name in message  # the grant the guide lists
    if tables:
        assert f"permission denied for table {queue.tables.limits.name}" in message
    # Nothing was claimed and left behind.
    assert {j.status for j in jobs(SessionLocal, good).values()} == {"queued"}
    assert running_left(SessionLocal) == 0


def test_a_worker_whose_table_is_gone_stops_and_names_the_fix(
    SessionLocal: sessionmaker[Session], owner_engine: Engine
) -> None:
    good = _good(SessionLocal)
    limits = queue.tables.limits
    with owner_engine.begin() as connection:
        connection.execute(text(f'DROP TABLE "{limits.schema}"."{limits.name}"'))

    run = burst(SessionLocal, ["poison_ok"], verify_schema=False)

    _stopped_with(run, limits.name, "42P01", "alembic upgrade head")
    assert {j.status for j in jobs(SessionLocal, good).values()} == {"queued"}


# -- item 7: worker settings and plans -------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"heartbeat_interval": -1}, "heartbeat_interval"),
        ({"heartbeat_interval": math.nan}, "heartbeat_interval"),
        ({"heartbeat_interval": 0}, "heartbeat_interval"),
        ({"reclaim_interval": math.inf}, "reclaim_interval"),
        ({"poll_interval": math.nan}, "poll_interval"),
        ({"poll_interval": 1e300}, "poll_interval"),
        ({"shutdown_timeout": math.nan}, "shutdown_timeout"),
        ({"shutdown_timeout": -1}, "shutdown_timeout"),
        ({"ack_delay": math.inf}, "ack_delay"),
        ({"ack_delay": "0.1"}, "ack_delay"),
        ({"concurrency": True}, "concurrency"),
        ({"concurrency": 2.5}, "concurrency"),
        ({"concurrency": 0}, "concurrency"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": False}, "batch_size"),
        ({"tasks": "poison_ok"}, "tasks"),
        ({"tasks": []}, "tasks"),
        ({"tasks": [1]}, "tasks"),
        ({"listen": "yes"}, "listen"),
        ({"listen_url": "db.internal"}, "listen_url"),
        ({"listen_url": 5432}, "listen_url"),
        ({"verify_schema": 0}, "verify_schema"),
    ],
)
def test_bad_worker_settings_are_refused_naming_the_setting(
    settings: dict[str, Any], named: str
) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        WorkerSettings(**settings)
    assert named in str(info.value)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"lease": math.nan}, "lost_interval"),
        ({"lease": 0.0}, "lost_interval"),
        ({"lease": -1.0}, "lost_interval"),
        ({"max_reclaims": -1}, "max_reclaims"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"declared_limit": 0}, "concurrency_limit"),
    ],
)
def test_a_worker_refuses_a_task_runtime_it_cannot_run(change: dict[str, Any], named: str) -> None:
    from dataclasses import replace

    runtime = queue.worker_plan(["poison_ok"]).tasks["poison_ok"]
    with pytest.raises((TypeError, ValueError)) as info:
        replace(runtime, **change)
    assert named in str(info.value)


def test_a_worker_refuses_a_non_finite_queue_lost_interval() -> None:
    from dataclasses import replace

    plan = queue.worker_plan(["poison_ok"])
    with pytest.raises(ValueError, match="lost_interval"):
        replace(plan, default_lease=math.nan)
