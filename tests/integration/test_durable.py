"""Durable jobs end to end on a real PostgreSQL: steps committed with their writes and
replayed, waits that suspend the job outside the claim, signals, conditions on the app's
rows, cursors, compensations and versions, with sync and async workers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.errors import JobNotFoundError, PayloadNotSerializableError
from tests.support.app import Shipment, StepWrite
from tests.support.durable_app import (
    dj_async_signal,
    dj_async_steps,
    dj_crashy,
    dj_import,
    dj_saga,
    dj_signal,
    dj_sleepy,
    dj_steps,
    dj_until,
    dj_versioned,
    queue,
    shipped,
)
from tests.support.durable_checks import drain, outcome

pytestmark = pytest.mark.integration

JOBS = queue.tables.jobs
EXECUTIONS = queue.tables.executions


def drain_retries(engine: Engine, factory: sessionmaker[Session], job_id: int) -> None:
    """Drain until job ``job_id`` is no longer due for a retry (up to 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        drain(factory)
        state = execution(engine, job_id)
        if state is None or state.state != "pending" or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def execution(engine: Engine, job_id: int) -> Any:
    with engine.connect() as connection:
        return connection.execute(
            select(
                EXECUTIONS.c.state, EXECUTIONS.c.wait, EXECUTIONS.c.slot, EXECUTIONS.c.attempt
            ).where(EXECUTIONS.c.id == job_id)
        ).one_or_none()


def writes(engine: Engine, job_id: int) -> list[tuple[str, str | None]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(StepWrite.step, StepWrite.value)
            .where(StepWrite.job_id == job_id)
            .order_by(StepWrite.step)
        ).all()
    return [(r.step, r.value) for r in rows]


def test_steps_commit_with_their_writes(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = dj_steps.enqueue(session, 3)
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", 3)
    assert writes(engine, job) == [("s0", "0"), ("s1", "1"), ("s2", "2")]
    with SessionLocal() as session:
        steps = queue.job_steps(session, job)
    assert [(s.name, s.kind, s.result) for s in steps] == [
        ("s0", "step", 0),
        ("s1", "step", 1),
        ("s2", "step", 2),
    ]


def test_a_retry_skips_the_committed_steps(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = dj_crashy.enqueue(session, 4, 2)
    drain_retries(engine, SessionLocal, job)
    assert outcome(engine, job) == ("succeeded", [0, 10, 20, 30])
    # Steps 0 and 1 ran in attempt 1 only; 2 and 3 in attempt 2.
    assert writes(engine, job) == [("s0", "1"), ("s1", "1"), ("s2", "2"), ("s3", "2")]


def test_sleep_suspends_without_a_seat_and_wakes(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = dj_sleepy.enqueue(session, 30.0)
    drain(SessionLocal)
    state = execution(engine, job)
    assert state is not None
    assert (state.state, state.wait, state.slot, state.attempt) == ("suspended", "sleep", None, 0)
    with SessionLocal() as session:
        (suspended,) = queue.suspended_jobs(session)
    assert suspended.id == job and suspended.waits_for == "sleep"
    assert suspended.until is not None
    with SessionLocal.begin() as session:
        assert queue.fire_timers(session, [job]) == [job]
    drain(SessionLocal)
    # One attempt in all: the wait did not count as one.
    assert outcome(engine, job) == ("succeeded", 1)
    assert writes(engine, job) == [("after", None), ("before", None)]


def test_a_signal_sent_before_the_wait_is_not_lost(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = dj_signal.enqueue(session)
        sent = queue.signal(session, job, "approved", {"by": "ada"})
    assert (sent.stored, sent.woke, sent.status) == (True, False, "queued")
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", {"by": "ada"})


def test_a_signal_wakes_its_waiter(engine: Engine, SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        job = dj_signal.enqueue(session)
    drain(SessionLocal)
    assert execution(engine, job).wait == "signal:approved"
    with SessionLocal.begin() as session:
        sent = queue.signal(session, job, "approved", [1, 2])
        again = queue.signal(session, job, "approved", "second")
    assert (sent.stored, sent.woke) == (True, True)
    assert (again.stored, again.woke) == (False, False)
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", [1, 2])


def test_a_signal_wait_times_out(engine: Engine, SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        job = dj_signal.enqueue(session, timeout=3600)
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        queue.fire_timers(session)
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "timed out")


def test_signal_refuses_an_unknown_job_and_bad_payloads(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session, pytest.raises(JobNotFoundError):
        queue.signal(session, 987654321, "approved")
    with SessionLocal.begin() as session, pytest.raises(TypeError, match="JSON"):
        queue.signal(session, 1, "approved", {1, 2})
    with SessionLocal.begin() as session, pytest.raises(ValueError, match="name"):
        queue.signal(session, 1, "")
    # Refused before anything is sent: the sender's own transaction goes on.
    with SessionLocal.begin() as session:
        with pytest.raises(PayloadNotSerializableError, match=r"send signal 'approved'.*NUL"):
            queue.signal(session, 1, "approved", {"note": "a\x00b"})
        assert session.execute(select(func.count()).select_from(JOBS)).scalar_one() == 0


def test_a_flush_that_makes_the_condition_true_wakes_the_job(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        session.add(Shipment(id=7, status="new"))
        job = dj_until.enqueue(session, 7)
    drain(SessionLocal)
    assert execution(engine, job).state == "suspended"
    with SessionLocal.begin() as session:
        session.get(Shipment, 7).status = "packed"  # the condition is still false
    assert execution(engine, job).state == "suspended"
    with SessionLocal.begin() as session:
        session.get(Shipment, 7).status = "shipped"
    assert execution(engine, job).state == "pending"
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "shipped")


def test_a_core_update_wakes_through_the_condition(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:

    with SessionLocal.begin() as session:
        session.add(Shipment(id=8, status="new"))
        job = dj_until.enqueue(session, 8)
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        session.execute(update(Shipment).where(Shipment.id == 8).values(status="shipped"))
        assert shipped.wake(session, 8) == [job]
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "shipped")


def test_a_cursor_resumes_where_it_stopped(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = dj_import.enqueue(session, 50, 10, 30)
    drain_retries(engine, SessionLocal, job)
    assert outcome(engine, job) == ("succeeded", 50)
    by_item = dict(writes(engine, job))
    assert {by_item[f"item{i}"] for i in range(30)} == {"1"}
    assert {by_item[f"item{i}"] for i in range(30, 50)} == {"2"}


def test_compensations_run_in_reverse_once_the_job_failed(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = dj_saga.enqueue(session, True)
    drain(SessionLocal)
    assert outcome(engine, job)[0] == "failed"
    drain(SessionLocal)  # its maintenance enqueued the compensations; run them
    with engine.connect() as connection:
        refunds = connection.execute(
            select(StepWrite.step, JOBS.c.id)
            .join(JOBS, JOBS.c.id == StepWrite.job_id)
            .where(StepWrite.step.like("refund:%"))
            .order_by(JOBS.c.id)
        ).all()
    assert [r.step for r in refunds] == ["refund:ship", "refund:charge", "refund:reserve"]
    with SessionLocal() as session:
        steps = queue.job_steps(session, job)
    assert all(s.compensated_by is not None for s in steps)


def test_cancelling_a_suspended_job_runs_its_compensations(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = dj_saga.enqueue(session, False, wait=True)
    drain(SessionLocal)
    assert execution(engine, job).state == "suspended"
    assert queue.cancel(engine, [job]) == {job: "cancelled"}
    assert execution(engine, job) is None
    drain(SessionLocal)
    steps = dict(writes(engine, job))
    assert set(steps) == {"reserve", "charge", "ship"}
    with engine.connect() as connection:
        count = connection.execute(
            select(StepWrite.step).where(StepWrite.step.like("refund:%"))
        ).all()
    assert sorted(r.step for r in count) == ["refund:charge", "refund:reserve", "refund:ship"]


def test_a_changed_step_version_waits_for_an_operator(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = dj_versioned.enqueue(session, 1)
    drain(SessionLocal)
    assert execution(engine, job).wait == "signal:go"
    with SessionLocal.begin() as session:
        queue.signal(session, job, "go")
        session.execute(
            update(JOBS).where(JOBS.c.id == job).values(payload={"args": [2], "kwargs": {}})
        )
    drain(SessionLocal)  # the code is now version 2: the stored step is version 1
    assert execution(engine, job).wait == "version:reserve"
    with SessionLocal() as session:
        versions = queue.step_versions(session)
    assert [(v.task, v.step, v.version, v.jobs) for v in versions] == [
        ("dj_versioned", "reserve", 1, 1)
    ]
    with SessionLocal.begin() as session:
        migrated = queue.migrate_steps(
            session, task="dj_versioned", step="reserve", from_version=1, to_version=2
        )
    assert migrated == [job]
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", {"by": 1})


def test_async_worker_runs_steps_and_waits(
    engine: Engine, AsyncSessionLocal: async_sessionmaker[AsyncSession]
) -> None:
    async def scenario() -> tuple[int, int]:
        async with AsyncSessionLocal.begin() as session:
            steps = await dj_async_steps.enqueue(session, 3)
            waiter = await dj_async_signal.enqueue(session)
        await queue.async_worker(AsyncSessionLocal, concurrency=2).run(burst=True)
        async with AsyncSessionLocal.begin() as session:
            await queue.fire_timers(session)
        await queue.async_worker(AsyncSessionLocal, concurrency=2).run(burst=True)
        async with AsyncSessionLocal.begin() as session:
            sent = await queue.signal(session, waiter, "approved", "yes")
            assert sent.woke
        await queue.async_worker(AsyncSessionLocal, concurrency=2).run(burst=True)
        return steps, waiter

    steps, waiter = asyncio.run(scenario())
    assert outcome(engine, steps) == ("succeeded", 103)
    assert writes(engine, steps) == [("s0", "0"), ("s1", "1"), ("s2", "2")]
    assert outcome(engine, waiter) == ("succeeded", "yes")


def test_prune_takes_a_jobs_steps_and_signals_with_it(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    import datetime as dt

    with SessionLocal.begin() as session:
        job = dj_signal.enqueue(session)
        queue.signal(session, job, "approved", "ok")
        kept = dj_steps.enqueue(session, 2)
    drain(SessionLocal)
    with engine.begin() as connection:  # only the first job is old enough
        connection.execute(
            update(JOBS)
            .where(JOBS.c.id == job)
            .values(finished_at=JOBS.c.finished_at - dt.timedelta(days=2))
        )
    with SessionLocal.begin() as session:
        assert queue.prune(session, older_than=dt.timedelta(days=1)) == 1
    with engine.connect() as connection:
        signals = connection.execute(select(queue.tables.job_signals.c.job_id)).scalars().all()
        steps = connection.execute(select(queue.tables.job_steps.c.job_id)).scalars().all()
    assert signals == [] and set(steps) == {kept}


def test_a_durable_node_waits_then_releases_its_dependents(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    from tests.support.workflow_app import wf_gather

    with SessionLocal.begin() as session:
        handle = queue.chain(dj_signal.call(), wf_gather.call()).enqueue(session)
    waiter, gather = handle.jobs["dj_signal"], handle.jobs["wf_gather"]
    drain(SessionLocal)
    assert execution(engine, waiter).state == "suspended"
    assert execution(engine, gather) is None  # blocked behind its parent
    with SessionLocal.begin() as session:
        assert queue.signal(session, waiter, "approved", "go").woke
    drain(SessionLocal)
    assert outcome(engine, gather) == ("succeeded", {"dj_signal": "go"})


def test_cancelling_a_workflow_runs_its_durable_nodes_compensations(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    from tests.support.workflow_app import wf_value

    with SessionLocal.begin() as session:
        handle = queue.chain(dj_saga.call(False, wait=True), wf_value.call(1)).enqueue(session)
    saga = handle.jobs["dj_saga"]
    drain(SessionLocal)
    assert execution(engine, saga).wait == "signal:never"
    assert queue.cancel_workflow(engine, handle.id) == {"cancelled": 2, "requested": 0}
    drain(SessionLocal)
    assert outcome(engine, saga)[0] == "cancelled"
    assert outcome(engine, handle.jobs["wf_value"])[0] == "cancelled"
    refunds = [step for step, _ in writes(engine, saga) if step.startswith("refund")]
    assert refunds == []  # a compensation is a job of its own: its rows are under its id
    with engine.connect() as connection:
        compensated = (
            connection.execute(
                select(StepWrite.step)
                .where(StepWrite.step.like("refund:%"))
                .order_by(StepWrite.job_id)
            )
            .scalars()
            .all()
        )
    assert compensated == ["refund:ship", "refund:charge", "refund:reserve"]


def test_a_keyed_durable_job_yields_its_key_while_it_sleeps(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        sleeper = dj_sleepy.options(queue_id="acct-1").enqueue(session, 3600)
        after = dj_steps.options(queue_id="acct-1").enqueue(session, 1)
    drain(SessionLocal)
    assert execution(engine, sleeper).state == "suspended"
    assert outcome(engine, after) == ("succeeded", 0)
    with SessionLocal.begin() as session:
        queue.fire_timers(session, [sleeper])
    drain(SessionLocal)
    assert outcome(engine, sleeper) == ("succeeded", 1)


def test_a_running_worker_wakes_a_sleep_when_it_ends(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    import threading

    worker = queue.worker(SessionLocal, concurrency=2, reclaim_interval=5.0)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        with SessionLocal.begin() as session:
            job = dj_sleepy.enqueue(session, 0.5)
        began = time.monotonic()
        assert queue.result(engine, job, timeout=10) == 1
        # Woken at its due time, not at the next maintenance five seconds on.
        assert time.monotonic() - began < 3.0
    finally:
        worker.stop()
        thread.join(10)


def test_a_met_condition_stays_met_after_its_row_changed(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    from tests.support.durable_app import dj_until_then_sleep

    with SessionLocal.begin() as session:
        session.add(Shipment(id=9, status="shipped"))
        job = dj_until_then_sleep.enqueue(session, 9)
    drain(SessionLocal)
    assert execution(engine, job).wait == "sleep"
    with SessionLocal.begin() as session:
        assert queue.fire_timers(session, [job]) == [job]
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "done")


def test_fire_timers_leaves_waits_without_a_deadline_waiting(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        waiter = dj_signal.enqueue(session)  # no timeout
        sleeper = dj_sleepy.enqueue(session, 3600)
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        assert queue.fire_timers(session) == [sleeper]
    drain(SessionLocal)
    assert outcome(engine, sleeper) == ("succeeded", 1)
    assert execution(engine, waiter).wait == "signal:approved"


def test_async_cursor_and_condition_wait(
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
) -> None:
    from tests.support.durable_app import dj_async_import

    with SessionLocal.begin() as session:
        session.add(Shipment(id=11, status="new"))
        job = dj_async_import.enqueue(session, 11, 5)

    async def run() -> None:
        await queue.async_worker(AsyncSessionLocal, concurrency=2).run(burst=True)

    asyncio.run(run())
    assert execution(engine, job).wait == f"row:{shipped.name}:11"
    assert [step for step, _ in writes(engine, job)] == [f"item{i}" for i in range(5)]
    with SessionLocal.begin() as session:
        session.get(Shipment, 11).status = "shipped"  # the ORM flush wakes it
    asyncio.run(run())
    assert outcome(engine, job) == ("succeeded", 5)
    # The replay skipped the finished loop: each item was written once.
    assert len(writes(engine, job)) == 5


def test_a_replay_takes_the_branch_its_wait_took_even_if_a_signal_came_late(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    from tests.support.durable_app import dj_signal_then_sleep

    with SessionLocal.begin() as session:
        job = dj_signal_then_sleep.enqueue(session)
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        queue.fire_timers(session, [job])  # the wait's deadline passes
    drain(SessionLocal)
    assert execution(engine, job).wait == "sleep"
    with SessionLocal.begin() as session:
        late = queue.signal(session, job, "approved", "too late")
        queue.fire_timers(session, [job])
    assert (late.stored, late.woke) == (True, False)
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "timed out")


def test_one_flush_of_many_rows_wakes_each_waiter_in_one_statement(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    from sqlalchemy import event

    with SessionLocal.begin() as session:
        session.add_all([Shipment(id=20 + i, status="new") for i in range(5)])
        jobs = [dj_until.enqueue(session, 20 + i) for i in range(5)]
    drain(SessionLocal)
    assert {execution(engine, job).state for job in jobs} == {"suspended"}
    wakes: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "SET state='pending'" in statement:
            wakes.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        with SessionLocal.begin() as session:
            shipments = session.scalars(select(Shipment).order_by(Shipment.id)).all()
            for shipment in shipments[:4]:  # the fifth stays new: its job keeps waiting
                shipment.status = "shipped"
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(wakes) == 1
    assert [execution(engine, job).state for job in jobs] == ["pending"] * 4 + ["suspended"]


def test_a_step_result_that_cannot_be_stored_fails_the_attempt_and_writes_nothing(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    from tests.support.durable_app import dj_bad_result

    with SessionLocal.begin() as session:
        job = dj_bad_result.enqueue(session)
    drain(SessionLocal)
    status, _ = outcome(engine, job)
    assert status == "failed"
    with engine.connect() as connection:
        errors = connection.execute(select(JOBS.c.errors).where(JOBS.c.id == job)).scalar_one()
    assert "commit step 'bad'" in errors[-1]["message"] and "finite" in errors[-1]["message"]
    assert writes(engine, job) == []
