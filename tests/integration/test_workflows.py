"""Workflows end to end on a real PostgreSQL: written in the caller's transaction, run by
workers (sync and async), released by the transaction that finished each parent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import JobSpec
from sqla_queue.errors import WorkflowNotFoundError
from sqla_queue.workflows import Workflow, quorum
from tests.support.app import Order
from tests.support.workflow_app import (
    queue,
    wf_fail,
    wf_flaky,
    wf_gather,
    wf_gather_async,
    wf_split,
    wf_sum,
    wf_tx,
    wf_value,
)

pytestmark = pytest.mark.integration

JOBS = queue.tables.jobs
NODES = queue.tables.workflow_nodes


def drain(factory: sessionmaker[Session], **settings: Any) -> None:
    """Run a sync worker until no job is left."""
    queue.worker(factory, concurrency=2, **settings).run(burst=True)


def outcome(engine: Engine, job_id: int) -> tuple[str, Any]:
    with engine.connect() as connection:
        row = connection.execute(
            select(JOBS.c.status, JOBS.c.result).where(JOBS.c.id == job_id)
        ).one()
    return row.status, row.result


def node_state(engine: Engine, job_id: int) -> str:
    with engine.connect() as connection:
        return str(
            connection.execute(select(NODES.c.state).where(NODES.c.job_id == job_id)).scalar_one()
        )


def test_chain_runs_in_order_and_passes_results(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chain(wf_value.call(1), wf_value.call(2), wf_gather.call()).enqueue(session)
    assert list(handle.jobs) == ["wf_value", "wf_value#2", "wf_gather"]
    # Only the root is claimable: the others wait outside the claim's indexes.
    with engine.connect() as connection:
        runs = connection.execute(select(queue.tables.executions.c.id)).scalars().all()
    assert runs == [handle.jobs["wf_value"]]
    drain(SessionLocal)
    assert outcome(engine, handle.jobs["wf_gather"]) == ("succeeded", {"wf_value#2": 2})
    status = queue.workflow_status(engine, handle.id)
    assert status.state == "succeeded"
    assert status.node("wf_gather").parents == ["wf_value#2"]


def test_chord_gathers_every_result(engine: Engine, SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chord([wf_value.call(i) for i in range(20)], then=wf_sum.call()).enqueue(
            session
        )
    drain(SessionLocal)
    assert outcome(engine, handle.jobs["wf_sum"]) == ("succeeded", sum(range(20)))


def test_failed_parent_cancels_dependents_down_the_graph(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("fail")
    a = wf.add(wf_value.call("a"))
    b = wf.add(wf_fail.call())
    c = wf.add(wf_value.call("c"), after=[a, b], name="c")
    d = wf.add(wf_value.call("d"), after=c, name="d")
    wf.add(wf_gather.call(), after=[a, b], policy="all_finished", name="gather")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    drain(SessionLocal)
    jobs = handle.jobs
    assert outcome(engine, jobs[b.name])[0] == "failed"
    assert outcome(engine, jobs[c.name])[0] == "cancelled"
    assert outcome(engine, jobs[d.name])[0] == "cancelled"
    assert node_state(engine, jobs[d.name]) == "cancelled"
    assert outcome(engine, jobs["gather"]) == (
        "succeeded",
        {"wf_value": "a", "wf_fail": {"parent": "failed"}},
    )
    assert queue.workflow_status(engine, handle.id).state == "failed"


def test_quorum_runs_once_enough_parents_succeeded(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("quorum")
    parents = [wf.add(wf_value.call(1)), wf.add(wf_fail.call()), wf.add(wf_value.call(2))]
    wf.add(wf_sum.call(), after=parents, policy=quorum(2), name="enough")
    wf.add(wf_sum.call(), after=parents, policy=quorum(3), name="too_many")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    drain(SessionLocal)
    assert outcome(engine, handle.jobs["enough"]) == ("succeeded", 3)
    assert outcome(engine, handle.jobs["too_many"])[0] == "cancelled"


def test_hold_then_requeue_resumes_the_workflow(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("hold")
    first = wf.add(wf_flaky.options(max_attempts=1).call(failures=9, value=5), name="first")
    wf.add(wf_sum.call(), after=first, on_parent_failure="hold", name="then")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    drain(SessionLocal)
    assert node_state(engine, handle.jobs["then"]) == "held"
    assert queue.workflow_status(engine, handle.id).state == "held"
    # The operator fixes the cause and requeues the failed parent: it now succeeds.
    with SessionLocal.begin() as session:
        session.execute(
            JOBS.update()
            .where(JOBS.c.id == handle.jobs["first"])
            .values(payload={"args": [], "kwargs": {"failures": 0, "value": 5}})
        )
        assert queue.requeue(session, [handle.jobs["first"]]).requeued == [handle.jobs["first"]]
    drain(SessionLocal)
    assert outcome(engine, handle.jobs["then"]) == ("succeeded", 5)
    assert queue.workflow_status(engine, handle.id).state == "succeeded"


def test_requeue_of_failed_parent_reopens_cancelled_descendants(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("resume")
    first = wf.add(wf_flaky.options(max_attempts=1).call(failures=1, value=2), name="first")
    second = wf.add(wf_sum.call(), after=first, name="second")
    wf.add(wf_sum.call(), after=second, name="third")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    drain(SessionLocal)
    assert outcome(engine, handle.jobs["third"])[0] == "cancelled"
    with SessionLocal.begin() as session:
        queue.requeue(session, [handle.jobs["first"]])
    drain(SessionLocal)  # attempt 1 of the requeued job fails again: failures=1 counts anew
    assert outcome(engine, handle.jobs["first"])[0] == "failed"
    with SessionLocal.begin() as session:
        session.execute(
            JOBS.update()
            .where(JOBS.c.id == handle.jobs["first"])
            .values(payload={"args": [], "kwargs": {"failures": 0, "value": 2}})
        )
        queue.requeue(session, [handle.jobs["first"]])
    drain(SessionLocal)
    assert outcome(engine, handle.jobs["second"]) == ("succeeded", 2)
    assert outcome(engine, handle.jobs["third"]) == ("succeeded", 2)


@pytest.mark.parametrize("then", [True, False])
def test_expand_adds_nodes_and_dependents_wait_for_them(
    engine: Engine, SessionLocal: sessionmaker[Session], then: bool
) -> None:
    wf = Workflow("expand")
    split = wf.add(wf_split.call(4, then=then), name="split")
    wf.add(wf_gather.call(), after=split, name="after")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    drain(SessionLocal)
    status = queue.workflow_status(engine, handle.id)
    names = [node.name for node in status.nodes]
    parts = [f"split/wf_value@{i}" for i in range(4)]
    assert names[:2] == ["split", "after"]
    assert set(parts) <= set(names)
    gathered = outcome(engine, handle.jobs["after"])
    if then:
        assert gathered == ("succeeded", {"split/wf_sum@then": 6})
    else:
        assert gathered == ("succeeded", {part: i for i, part in enumerate(parts)})
    assert status.state == "succeeded"


def test_transactional_node_expands_in_its_transaction(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chain(wf_tx.call("x", parts=3), wf_gather.call()).enqueue(session)
    drain(SessionLocal)
    assert outcome(engine, handle.jobs["wf_gather"]) == ("succeeded", {"wf_tx/wf_sum@then": 3})


def test_async_worker_runs_a_chord(
    engine: Engine, AsyncSessionLocal: async_sessionmaker[AsyncSession]
) -> None:
    async def main() -> Any:
        async with AsyncSessionLocal.begin() as session:
            handle = await queue.chord(
                [wf_value.call(i) for i in range(5)], then=wf_gather_async.call()
            ).enqueue(session)
        await queue.async_worker(AsyncSessionLocal, concurrency=2).run(burst=True)
        return handle

    handle = asyncio.run(main())
    status, result = outcome(engine, handle.jobs["wf_gather_async"])
    assert status == "succeeded"
    assert result == {"wf_value" if i == 0 else f"wf_value#{i + 1}": i for i in range(5)}


def test_workflow_rolls_back_with_its_transaction(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal() as session:
        queue.chain(wf_value.call(1), wf_value.call(2)).enqueue(session)
        session.rollback()
    with engine.connect() as connection:
        assert connection.execute(select(NODES.c.job_id)).all() == []
        assert connection.execute(select(queue.tables.workflows.c.id)).all() == []


def test_unique_workflow_per_row(engine: Engine, SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        order = Order(id=7, email="a@b.c")
        session.add(order)
        session.flush()
        first = Workflow("fulfil", about=order, unique=True)
        first.add(wf_value.call(1))
        one = first.enqueue(session)
        again = Workflow("fulfil", about=order, unique=True)
        again.add(wf_value.call(2))
        two = again.enqueue(session)
    assert not one.existing and two.existing and two.id == one.id
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        third = Workflow("fulfil", about=(Order, 7), unique=True)
        third.add(wf_value.call(3))
        three = third.enqueue(session)
    assert not three.existing and three.id != one.id


def test_cancel_workflow_cancels_waiting_and_queued_nodes(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chain(wf_value.call(1), wf_value.call(2), wf_value.call(3)).enqueue(session)
    assert queue.cancel_workflow(engine, handle.id) == {"cancelled": 3, "requested": 0}
    drain(SessionLocal)
    status = queue.workflow_status(engine, handle.id)
    assert status.state == "cancelled"
    assert [node.shown_state for node in status.nodes] == ["cancelled"] * 3
    with pytest.raises(WorkflowNotFoundError):
        queue.workflow_status(engine, handle.id + 1000)


def test_cancel_of_a_waiting_node_cancels_its_dependents(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chain(wf_value.call(1), wf_value.call(2), wf_value.call(3)).enqueue(session)
    assert queue.cancel(engine, [handle.jobs["wf_value#2"]]) == {
        handle.jobs["wf_value#2"]: "cancelled"
    }
    drain(SessionLocal)
    assert outcome(engine, handle.jobs["wf_value"])[0] == "succeeded"
    assert outcome(engine, handle.jobs["wf_value#3"])[0] == "cancelled"


def test_bad_graphs_are_refused_before_anything_is_written(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("bad")
    a = wf.add(wf_value.call(1), name="a")
    with pytest.raises(ValueError, match="named 'a' already"):
        wf.add(wf_value.call(2), name="a")
    with pytest.raises(ValueError, match="more parents"):
        wf.add(wf_sum.call(), after=a, policy=quorum(2))
    with pytest.raises(ValueError, match="unique_key"):
        wf.add(wf_value.options(unique_key="k").call(3))
    other = Workflow("other")
    with pytest.raises(ValueError, match="another workflow"):
        other.add(wf_value.call(1), after=a)
    wf.add(JobSpec("no_such_task"))
    from sqla_queue import UnknownTaskError

    with SessionLocal.begin() as session, pytest.raises(UnknownTaskError):
        wf.enqueue(session)
    by_name = Workflow("by name")
    by_name.add(JobSpec("wf_value", (1,)))
    with SessionLocal.begin() as session, pytest.raises(ValueError, match="one queue"):
        by_name.enqueue(session)
    with SessionLocal.begin() as session, pytest.raises(UnknownTaskError):
        queue.enqueue_workflow(session, wf)
    with engine.connect() as connection:
        assert (
            connection.execute(text("SELECT count(*) FROM app_jobs.sqla_queue_jobs")).scalar() == 0
        )
