"""Issue 36: ``cancel_workflow`` while workers complete the workflow's nodes never hands
its caller a ``DeadlockDetected``.

The two forced interleavings run the cancel on a connection of its own (in a thread,
proven to wait on a lock through ``pg_stat_activity``) against a completion held open on
another connection. The stress test cancels workflows while two workers in other threads
complete and release their nodes.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from sqla_queue.conversation import drive
from sqla_queue.workflows import Expansion, Workflow
from sqla_queue.workflows.advance import ReleaseStatements, advance_flow
from sqla_queue.workflows.write import expand_flow
from tests.support.running import Blocked, wait_for, worker_thread
from tests.support.workflow_app import queue, wf_gather, wf_sum, wf_value

pytestmark = pytest.mark.integration

JOBS = queue.tables.jobs
EX = queue.tables.executions
NODES = queue.tables.workflow_nodes
RELEASE = ReleaseStatements(queue.tables, notify=True)


def complete_without_release(connection: Connection, job_id: int) -> None:
    """What a worker's completion does first, in ``connection``'s open transaction: its
    execution deleted, its job succeeded (the release comes next)."""
    connection.execute(EX.delete().where(EX.c.id == job_id))
    connection.execute(
        update(JOBS)
        .where(JOBS.c.id == job_id)
        .values(status="succeeded", result=1, finished_at=func.now())
    )


def statuses(engine: Engine, ids: list[int]) -> list[str]:
    with engine.connect() as connection:
        found = dict(connection.execute(select(JOBS.c.id, JOBS.c.status)).all())
    return [found[i] for i in ids]


def live_executions(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(EX)).scalar_one())


def test_cancel_meets_a_completion_between_its_job_and_its_release(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """The completion holds its job's execution and then locks the next node to release
    it; the cancel waits for that execution. It used to hold that node already (a cycle)."""
    with SessionLocal.begin() as session:
        handle = queue.chain(wf_value.call(1), wf_value.call(2), wf_value.call(3)).enqueue(session)
    first, second, third = handle.jobs.values()
    with engine.connect() as completing:
        completing.begin()
        complete_without_release(completing, first)
        cancel = Blocked(lambda: queue.cancel_workflow(engine, handle.id))
        assert cancel.still_waiting(), "the cancel did not wait for the completion"
        assert drive(completing, advance_flow(RELEASE, [first])).released == [second]
        completing.commit()
    assert cancel.value() == {"cancelled": 2, "requested": 0}
    assert statuses(engine, [first, second, third]) == ["succeeded", "cancelled", "cancelled"]
    assert live_executions(engine) == 0
    assert queue.workflow_status(engine, handle.id).state == "cancelled"


def test_cancel_retries_a_deadlock_with_an_expanding_completion(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """An expansion reads the workflow's row (FOR SHARE) after its completion took its
    execution, while the cancel holds that row and waits for the execution: PostgreSQL
    breaks the cycle by rolling the cancel back, and the cancel runs again by itself."""
    wf = Workflow("expanding")
    split = wf.add(wf_value.call("split"), name="split")
    wf.add(wf_gather.call(), after=split, name="after")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    writer = queue._enqueuer.workflows
    statements = writer.statements_for(queue.tables)
    expansion = Expansion((wf_value.call(0), wf_value.call(1)), then=wf_sum.call())
    with engine.connect() as completing:
        completing.begin()
        complete_without_release(completing, handle.jobs["split"])
        cancel = Blocked(lambda: queue.cancel_workflow(engine, handle.id))
        assert cancel.still_waiting(), "the cancel did not wait for the completion"
        # Waits for the cancel's lock on the workflow's row until PostgreSQL rolls the
        # cancel back; then the expansion is written.
        added = drive(
            completing, expand_flow(statements, handle.jobs["split"], expansion, writer.defaults)
        )
        assert len(added) == 3
        drive(completing, advance_flow(RELEASE, [handle.jobs["split"]]))
        completing.commit()
    # The cancel's second attempt cancels the expansion's nodes too.
    assert cancel.value() == {"cancelled": 4, "requested": 0}
    status = queue.workflow_status(engine, handle.id)
    assert status.state == "cancelled"
    assert sorted(n.shown_state for n in status.nodes) == ["cancelled"] * 4 + ["succeeded"]
    assert live_executions(engine) == 0


def fan(index: int) -> Workflow:
    """A step, a fan-out of six, a callback after them, then a last step."""
    wf = Workflow(f"fan{index}")
    start = wf.add(wf_value.call(index), name="start")
    parts = [wf.add(wf_value.call(i), after=start, name=f"part{i}") for i in range(6)]
    gather = wf.add(wf_sum.call(), after=parts, name="gather")
    wf.add(wf_value.call("end"), after=gather, name="end")
    return wf


def test_cancel_workflow_beside_busy_workers_never_raises(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """80 cancels while two workers (threads, each with its own connections) complete and
    release the workflows' nodes: every cancel returns, and every workflow ends."""
    with SessionLocal.begin() as session:
        handles = [fan(i).enqueue(session) for i in range(80)]
    outcomes: list[dict[str, int]] = []
    workers = [queue.worker(SessionLocal, concurrency=4, batch_size=4) for _ in range(2)]
    with worker_thread(workers[0]), worker_thread(workers[1]):
        for handle in handles:
            # Cancelled once its fan-out was released: while the workers complete the
            # parts and release the callback.
            start = handle.jobs["start"]
            wait_for(lambda start=start: statuses(engine, [start]) != ["queued"])
            outcomes.append(queue.cancel_workflow(engine, handle.id))
    assert len(outcomes) == 80
    # What the cancels left running finishes or is cancelled; nothing stays undecided.
    queue.worker(SessionLocal, concurrency=2).run(burst=True)
    with engine.connect() as connection:
        undecided = connection.execute(
            select(func.count()).where(NODES.c.state.in_(["blocked", "held"]))
        ).scalar_one()
        queued = connection.execute(
            select(func.count()).where(JOBS.c.status == "queued")
        ).scalar_one()
    assert (undecided, queued) == (0, 0)
    assert {queue.workflow_status(engine, h.id).state for h in handles} == {"cancelled"}


def test_the_async_cancel_retries_the_deadlock_too(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """The same cycle as above, the cancel awaited on an AsyncEngine (its own event loop,
    in the waiting thread)."""
    wf = Workflow("expanding-async")
    split = wf.add(wf_value.call("split"), name="split")
    wf.add(wf_gather.call(), after=split, name="after")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    writer = queue._enqueuer.workflows
    statements = writer.statements_for(queue.tables)
    expansion = Expansion((wf_value.call(0),), then=None)

    def cancel_async() -> dict[str, int]:
        async def main() -> dict[str, int]:
            async_engine = create_async_engine(engine.url, poolclass=NullPool)
            try:
                done: dict[str, int] = await queue.cancel_workflow(async_engine, handle.id)
                return done
            finally:
                await async_engine.dispose()

        return asyncio.run(main())

    with engine.connect() as completing:
        completing.begin()
        complete_without_release(completing, handle.jobs["split"])
        cancel = Blocked(cancel_async)
        assert cancel.still_waiting(), "the cancel did not wait for the completion"
        added = drive(
            completing, expand_flow(statements, handle.jobs["split"], expansion, writer.defaults)
        )
        assert len(added) == 1
        drive(completing, advance_flow(RELEASE, [handle.jobs["split"]]))
        completing.commit()
    assert cancel.value() == {"cancelled": 2, "requested": 0}
    assert queue.workflow_status(engine, handle.id).state == "cancelled"
    assert live_executions(engine) == 0
