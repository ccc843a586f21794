"""Workflow races forced with held-open transactions on separate connections.

Each test stages the interleaving it names: one transaction holds its locks open while
another runs into them (in a thread, which must block), and then the first commits or
rolls back. A test that shared one connection between the two would prove nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.conversation import drive
from sqla_queue.workflows.admin import cancel_workflow_flow
from sqla_queue.workflows.advance import ReleaseStatements, advance_flow
from tests.support.app import gate, reset_gates
from tests.support.running import worker_thread
from tests.support.workflow_app import queue, wf_fail, wf_sum, wf_value

pytestmark = pytest.mark.integration

JOBS = queue.tables.jobs
EX = queue.tables.executions
NODES = queue.tables.workflow_nodes
RELEASE = ReleaseStatements(queue.tables, notify=True)


def end_job(connection: Connection, job_id: int, status: str = "succeeded", result: Any = 1) -> Any:
    """End ``job_id`` as a completion would (its execution gone, its status final), then
    advance its workflow: all in ``connection``'s open transaction."""
    connection.execute(EX.delete().where(EX.c.id == job_id))
    connection.execute(
        update(JOBS)
        .where(JOBS.c.id == job_id)
        .values(status=status, result=result, finished_at=func.now())
    )
    return drive(connection, advance_flow(RELEASE, [job_id]))


class Blocked:
    """Run ``fn`` in a thread; tell whether it is still waiting."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: list[Any] = []
        self.error: list[BaseException] = []

        def run() -> None:
            try:
                self.result.append(fn())
            except BaseException as exc:
                self.error.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def still_waiting(self, seconds: float = 0.5) -> bool:
        self.thread.join(seconds)
        return self.thread.is_alive()

    def value(self) -> Any:
        self.thread.join(15)
        assert not self.thread.is_alive(), "the blocked transaction never went on"
        if self.error:
            raise self.error[0]
        return self.result[0]


def executions_of(engine: Engine, job_id: int) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).where(EX.c.id == job_id)).scalar_one())


def node_state(engine: Engine, job_id: int) -> str:
    with engine.connect() as connection:
        return str(
            connection.execute(select(NODES.c.state).where(NODES.c.job_id == job_id)).scalar_one()
        )


def chord_of_two(SessionLocal: sessionmaker[Session]) -> tuple[int, int, int]:
    with SessionLocal.begin() as session:
        handle = queue.chord([wf_value.call(1), wf_value.call(2)], then=wf_sum.call()).enqueue(
            session
        )
    return handle.jobs["wf_value"], handle.jobs["wf_value#2"], handle.jobs["wf_sum"]


def test_last_two_parents_at_once_release_the_callback_exactly_once(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    first, second, callback = chord_of_two(SessionLocal)
    with engine.connect() as one, engine.connect() as two:
        one.begin()
        done = end_job(one, first)
        # The other parent had not ended: this transaction is not the last, and holds
        # that parent's edge so its marking waits for this commit.
        assert done.released == []
        two.begin()
        blocked = Blocked(lambda: end_job(two, second))
        assert blocked.still_waiting(), "the second parent's marking did not wait"
        one.commit()
        assert blocked.value().released == [callback]
        two.commit()
    assert node_state(engine, callback) == "released"
    assert executions_of(engine, callback) == 1


def test_a_parent_rolled_back_keeps_the_callback_waiting_for_it(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    first, second, callback = chord_of_two(SessionLocal)
    with engine.connect() as one, engine.connect() as two:
        one.begin()
        end_job(one, first)
        two.begin()
        blocked = Blocked(lambda: end_job(two, second))
        assert blocked.still_waiting()
        one.rollback()  # the first parent's completion was fenced off: it never happened
        assert blocked.value().released == []
        two.commit()
    assert node_state(engine, callback) == "blocked"
    with engine.begin() as again:
        assert end_job(again, first).released == [callback]
    assert executions_of(engine, callback) == 1


def test_cancel_of_the_workflow_waits_for_a_release_then_cancels_the_released_job(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chain(wf_value.call(1), wf_value.call(2)).enqueue(session)
    parent, child = handle.jobs["wf_value"], handle.jobs["wf_value#2"]
    with engine.connect() as releasing, engine.connect() as cancelling:
        releasing.begin()
        assert end_job(releasing, parent).released == [child]
        cancelling.begin()
        blocked = Blocked(
            lambda: drive(cancelling, cancel_workflow_flow(queue.tables, RELEASE, handle.id))
        )
        assert blocked.still_waiting(), "the cancel did not wait for the release"
        releasing.commit()
        assert blocked.value() == {"cancelled": 1, "requested": 0}
        cancelling.commit()
    assert node_state(engine, child) == "released"
    assert executions_of(engine, child) == 0
    with engine.connect() as connection:
        status = connection.execute(select(JOBS.c.status).where(JOBS.c.id == child)).scalar_one()
    assert status == "cancelled"


def test_a_release_after_the_cancel_of_the_workflow_releases_nothing(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chain(wf_value.call(1), wf_value.call(2)).enqueue(session)
    parent, child = handle.jobs["wf_value"], handle.jobs["wf_value#2"]
    with engine.connect() as cancelling, engine.connect() as releasing:
        cancelling.begin()
        drive(cancelling, cancel_workflow_flow(queue.tables, RELEASE, handle.id))
        releasing.begin()
        # The parent was running when the cancel came: its completion still lands.
        blocked = Blocked(lambda: end_job(releasing, parent))
        assert blocked.still_waiting(), "the release did not wait for the cancel"
        cancelling.commit()
        assert blocked.value().released == []
        releasing.commit()
    assert node_state(engine, child) == "cancelled"
    assert executions_of(engine, child) == 0


def test_requeue_against_a_cancel_of_the_workflow(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chain(wf_fail.call(), wf_value.call(2)).enqueue(session)
    failing, child = handle.jobs["wf_fail"], handle.jobs["wf_value"]
    queue.worker(SessionLocal, concurrency=1).run(burst=True)
    assert node_state(engine, child) == "cancelled"
    # The requeue holds the workflow's row: the cancel waits, then cancels what it reopened.
    with SessionLocal() as requeueing, engine.connect() as cancelling:
        assert queue.requeue(requeueing, [failing]).requeued == [failing]
        assert node_state(engine, child) == "cancelled"  # not committed yet
        cancelling.begin()
        blocked = Blocked(
            lambda: drive(cancelling, cancel_workflow_flow(queue.tables, RELEASE, handle.id))
        )
        assert blocked.still_waiting(), "the cancel did not wait for the requeue"
        requeueing.commit()
        assert blocked.value() == {"cancelled": 2, "requested": 0}
        cancelling.commit()
    assert executions_of(engine, failing) == 0
    assert node_state(engine, child) == "cancelled"
    # And the other way round: after the cancel, a requeue finds the workflow cancelled.
    with SessionLocal.begin() as session:
        assert queue.requeue(session, [failing]).requeued == []


def test_an_expansion_fenced_off_writes_no_node(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    reset_gates()
    with SessionLocal.begin() as session:
        handle = queue.chain(
            queue.get_task("wf_split_gated").call("fence", 3), wf_value.call("after")
        ).enqueue(session)
    split = handle.jobs["wf_split_gated"]
    meeting = gate("fence")
    worker = queue.worker(SessionLocal, concurrency=1, tasks=["wf_split_gated"])
    with worker_thread(worker) as stats:
        assert meeting.entered.wait(15)
        # Another worker takes the execution over (as a reclaim and a new claim would).
        with engine.begin() as connection:
            connection.execute(update(EX).where(EX.c.id == split).values(attempt=EX.c.attempt + 1))
        meeting.open()
        # Stopping waits for the handler and its completion, which the fence refuses.
    assert stats[0].fenced == 1
    with engine.connect() as connection:
        names = (
            connection.execute(
                select(NODES.c.name)
                .where(NODES.c.workflow_id == handle.id)
                .order_by(NODES.c.job_id)
            )
            .scalars()
            .all()
        )
    assert names == ["wf_split_gated", "wf_value"]
    assert node_state(engine, handle.jobs["wf_value"]) == "blocked"
