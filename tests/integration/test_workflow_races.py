"""Workflow races forced with held-open transactions on separate connections.

Each test stages the interleaving it names: one transaction holds its locks open while
another runs into them (in a thread, which must block), and then the first commits or
rolls back. A test that shared one connection between the two would prove nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.conversation import drive
from sqla_queue.workflows import Workflow
from sqla_queue.workflows.admin import cancel_workflow_flow
from sqla_queue.workflows.advance import ReleaseStatements, advance_flow
from tests.support.app import gate, reset_gates
from tests.support.running import Blocked, worker_thread
from tests.support.workflow_app import queue, wf_fail, wf_gather, wf_sum, wf_value

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


def test_a_cascade_and_a_sibling_completion_do_not_deadlock(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """J1 fails and Q succeeds; N waits for both, C for N and Q. J1's transaction cancels N
    and then marks N's edge to C; Q's must not hold that edge while it waits for N."""
    wf = Workflow("diamond")
    j1 = wf.add(wf_fail.call(), name="J1")
    q = wf.add(wf_value.call(1), name="Q")
    n = wf.add(wf_gather.call(), name="N", after=[j1, q])
    wf.add(wf_gather.call(), name="C", after=[n, q])
    with SessionLocal.begin() as session:
        handle = queue.enqueue_workflow(session, wf)
    jobs = handle.jobs
    with engine.connect() as failing, engine.connect() as succeeding:
        failing.begin()
        ended(failing, jobs["J1"], "failed")
        rows = failing.execute(RELEASE.advance, {"ids": [jobs["J1"]]}).all()
        assert ("candidate", jobs["N"]) in rows
        succeeding.begin()
        ended(succeeding, jobs["Q"], "succeeded")
        rows = succeeding.execute(RELEASE.advance, {"ids": [jobs["Q"]]}).all()
        # Q's transaction may decide N, so N's edge to C is no evidence for it: it is a
        # candidate for C too, and holds no share lock on N's edge.
        assert {("candidate", jobs["N"]), ("candidate", jobs["C"])} <= set(rows)
        failing.execute(RELEASE.lock, {"ids": [jobs["N"]]}).all()
        assert failing.execute(RELEASE.decide, {"ids": [jobs["N"]]}).all() == [
            ("cancelled", jobs["N"])
        ]
        blocked = Blocked(
            lambda: succeeding.execute(RELEASE.lock, {"ids": sorted([jobs["N"], jobs["C"]])}).all()
        )
        assert blocked.still_waiting(), "the sibling did not wait for N's lock"
        # The cascade marks N's edge to C: it must not wait for the sibling.
        assert drive(failing, advance_flow(RELEASE, [jobs["N"]])).cancelled == [jobs["C"]]
        failing.commit()
        blocked.value()
        assert succeeding.execute(RELEASE.decide, {"ids": [jobs["N"], jobs["C"]]}).all() == []
        succeeding.commit()
    assert node_state(engine, jobs["C"]) == "cancelled"


def ended(connection: Connection, job_id: int, status: str) -> None:
    """End ``job_id`` with ``status`` in ``connection``'s transaction (no advance)."""
    connection.execute(EX.delete().where(EX.c.id == job_id))
    connection.execute(
        update(JOBS).where(JOBS.c.id == job_id).values(status=status, finished_at=func.now())
    )


def test_a_requeue_and_a_release_lock_nodes_in_one_order(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """P fails: K (hold) is held, X (all_finished) waits for Q. Q's completion locks K then
    X; a requeue of P reopens both: it must take them in the same order."""
    wf = Workflow("requeue-race")
    p = wf.add(wf_fail.call(), name="P")
    q = wf.add(wf_value.call(1), name="Q")
    wf.add(wf_gather.call(), name="K", after=[p, q], on_parent_failure="hold")
    wf.add(wf_gather.call(), name="X", after=[p, q], policy="all_finished")
    with SessionLocal.begin() as session:
        handle = queue.enqueue_workflow(session, wf)
    jobs = handle.jobs
    with engine.begin() as connection:
        ended(connection, jobs["P"], "failed")
        drive(connection, advance_flow(RELEASE, [jobs["P"]]))
    assert node_state(engine, jobs["K"]) == "held"
    with engine.connect() as holder, engine.connect() as worker:
        # A third transaction holds K, so that both others line up behind it.
        holder.begin()
        holder.execute(select(NODES.c.job_id).where(NODES.c.job_id == jobs["K"]).with_for_update())
        worker.begin()
        ended(worker, jobs["Q"], "succeeded")
        candidates = sorted(
            row[1]
            for row in worker.execute(RELEASE.advance, {"ids": [jobs["Q"]]}).all()
            if row[0] == "candidate"
        )
        assert candidates == sorted([jobs["K"], jobs["X"]])

        def release() -> Any:
            worker.execute(RELEASE.lock, {"ids": candidates}).all()
            decided = worker.execute(RELEASE.decide, {"ids": candidates}).all()
            worker.commit()
            return decided

        def requeue() -> Any:
            with SessionLocal.begin() as session:
                return queue.requeue(session, [jobs["P"]]).requeued

        releasing = Blocked(release)
        assert releasing.still_waiting()
        requeueing = Blocked(requeue)
        assert requeueing.still_waiting()
        holder.rollback()
        releasing.value()
        assert requeueing.value() == [jobs["P"]]
    # X ran on Q and P's failure; K waits for the requeued P again.
    assert node_state(engine, jobs["K"]) == "blocked"
