"""Everything that exists still holds inside a workflow (issue 29).

Each test combines workflows with one of the queue's other features, against a real
PostgreSQL with real workers (burst runs, or worker threads when a handler and its test
must meet at a gate, or when a job comes due later): queue_id lines, retries and
reschedules, the reclaim of lost jobs, cancel, pause, concurrency and rate limits,
priorities, bounded tasks, the history layouts (and pruning), unique workflows, the
binds, delays on nodes with parents; then a wide fan-in under two workers, and the
release on the worker's other faces (statements through SQLAlchemy, the async worker).
A test that fails on a library bug is marked ``xfail(strict=True)`` saying what the bug is.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import Queue
from sqla_queue.errors import QueueFull
from sqla_queue.testing.databases import DatabaseFactory
from sqla_queue.workflows import Workflow
from tests.support import bounded as bq
from tests.support import history_app, nohistory_app
from tests.support.app import ExecutionLog, Order, echo, gate, gated, reset_gates, slow_first
from tests.support.lifecycle import backend_pid, wait_until_blocked
from tests.support.running import Blocked, pretend_claimed, wait_for, worker_thread
from tests.support.workflow_app import wf_flaky, wf_gather, wf_gather_async, wf_value
from tests.support.workflow_combos import (
    URGENT_PRIORITY,
    queue,
    wfc_fragile,
    wfc_gather_hq,
    wfc_gather_nq,
    wfc_limited,
    wfc_log,
    wfc_maybe_hq,
    wfc_maybe_nq,
    wfc_reschedule,
    wfc_urgent,
)

pytestmark = pytest.mark.integration

JOBS = queue.tables.jobs
EX = queue.tables.executions
NODES = queue.tables.workflow_nodes
#: Quick workers: a job due in 0.1 s runs within a poll; signals stay the test runner's.
QUICK: dict[str, Any] = {"poll_interval": 0.05, "install_signal_handlers": False}


@pytest.fixture(autouse=True)
def _gates() -> Iterator[None]:
    yield
    reset_gates()


# -- helpers --------------------------------------------------------------------------------


def drain(factory: sessionmaker[Session], **settings: Any) -> None:
    """Run a sync worker of the test app's queue until nothing is due."""
    queue.worker(factory, **{"concurrency": 2, **settings}).run(burst=True)


def run_until(
    factory: sessionmaker[Session], condition: Callable[[], bool], **settings: Any
) -> None:
    """Run a worker in a thread until ``condition`` holds (for jobs that come due later)."""
    worker = queue.worker(factory, **{"concurrency": 2, **QUICK, **settings})
    with worker_thread(worker):
        wait_for(condition, timeout=20)


def job(engine: Engine, job_id: int) -> Any:
    """The job's row (status, result, attempts, times)."""
    with engine.connect() as connection:
        return connection.execute(select(JOBS).where(JOBS.c.id == job_id)).one()


def execution(engine: Engine, job_id: int) -> Any:
    """The job's execution row, or None."""
    with engine.connect() as connection:
        return connection.execute(select(EX).where(EX.c.id == job_id)).one_or_none()


def node_state(engine: Engine, job_id: int) -> str:
    with engine.connect() as connection:
        return str(
            connection.execute(select(NODES.c.state).where(NODES.c.job_id == job_id)).scalar_one()
        )


def finished(engine: Engine, ids: list[int]) -> bool:
    """Whether every job of ``ids`` has ended."""
    with engine.connect() as connection:
        statuses = connection.execute(select(JOBS.c.status).where(JOBS.c.id.in_(ids))).scalars()
        return all(status != "queued" for status in statuses)


def runs(engine: Engine, *, job_id: int | None = None) -> list[Any]:
    """The logged executions (``execution_log``, all or ``job_id``'s), in start order."""
    query = select(ExecutionLog).order_by(ExecutionLog.started_at, ExecutionLog.id)
    if job_id is not None:
        query = query.where(ExecutionLog.job_id == job_id)
    with Session(engine) as session:
        return list(session.scalars(query))


def no_overlap(rows: list[Any]) -> bool:
    """Whether the executions ``rows`` (in start order) ran one at a time."""
    return all(
        later.started_at >= earlier.finished_at for earlier, later in itertools.pairwise(rows)
    )


# -- 1. queue_id ----------------------------------------------------------------------------


def test_a_keyed_node_takes_its_place_in_line_when_released_behind_a_pending_job(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("keyed")
    root = wf.add(echo.call("root"), name="root")
    wf.add(wfc_log.options(queue_id="k").call("node"), after=root, name="node")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    node = handle.jobs["node"]
    # Written after the node (a later id), but in the key's line before the node's release.
    with SessionLocal.begin() as session:
        before = wfc_log.options(queue_id="k").enqueue(session, "before", pause=0.2)
    assert execution(engine, node) is None
    drain(SessionLocal, tasks=["echo"])
    released = execution(engine, node)
    assert released is not None and (released.state, released.queue_id) == ("waiting", "k")
    assert execution(engine, before).state == "pending"
    drain(SessionLocal)
    assert [row.key for row in runs(engine)] == ["before", "node"]
    assert no_overlap(runs(engine))
    assert job(engine, node).status == "succeeded"
    assert job(engine, before).status == "succeeded"


def test_a_keyed_node_released_while_its_key_runs_waits_for_it(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("keyed")
    root = wf.add(echo.call("root"), name="root")
    wf.add(wfc_log.options(queue_id="k").call("node"), after=root, name="node")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
        holder = gated.options(queue_id="k").enqueue(session, name="holder")
    node = handle.jobs["node"]
    holding = queue.worker(SessionLocal, tasks=["gated"], **QUICK)
    with worker_thread(holding):
        assert gate("holder").entered.wait(10)
        drain(SessionLocal, tasks=["echo"])  # the root ends: the node is released
        assert execution(engine, node).state == "waiting"
        drain(SessionLocal, tasks=["wfc_log"])  # nothing of the key may run yet
        assert job(engine, node).status == "queued"
        gate("holder").open()
        wait_for(lambda: job(engine, holder).status == "succeeded", timeout=10)
    drain(SessionLocal)
    (ran,) = runs(engine, job_id=node)
    assert ran.started_at >= job(engine, holder).finished_at
    assert job(engine, node).status == "succeeded"


def test_a_workflow_whose_nodes_share_a_key_runs_them_in_dependency_order(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    keyed = wfc_log.options(queue_id="same")
    wf = Workflow("one line")
    first = wf.add(keyed.call("first", pause=0.05), name="first")
    other_root = wf.add(keyed.call("other_root", pause=0.05), name="other_root")
    left = wf.add(keyed.call("left", pause=0.05), after=first, name="left")
    right = wf.add(keyed.call("right", pause=0.05), after=[first, other_root], name="right")
    join = wf.add(keyed.call("join"), after=[left, right], name="join")
    wf.add(keyed.call("tail"), after=join, name="tail")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    drain(SessionLocal, concurrency=4)
    assert queue.workflow_status(engine, handle.id).state == "succeeded"
    order = [row.key for row in runs(engine)]
    assert sorted(order) == sorted(handle.jobs)
    assert no_overlap(runs(engine))
    position = {name: order.index(name) for name in order}
    assert position["left"] > position["first"]
    assert position["right"] > max(position["first"], position["other_root"])
    assert position["join"] > max(position["left"], position["right"])
    assert order[-1] == "tail"


# -- 2. retries and Reschedule --------------------------------------------------------------


def test_dependents_wait_for_the_final_outcome_of_retries_and_reschedules(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("patience")
    flaky = wf.add(wf_flaky.call(failures=2, value=5), name="flaky")
    later = wf.add(wfc_reschedule.call(times=2, value="later"), name="later")
    wf.add(wfc_log.call("child"), after=[flaky, later], name="child")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    child = handle.jobs["child"]
    run_until(SessionLocal, lambda: finished(engine, [child]))
    retried = job(engine, handle.jobs["flaky"])
    assert (retried.status, retried.attempts) == ("succeeded", 3)
    rescheduled = runs(engine, job_id=handle.jobs["later"])
    assert len(rescheduled) == 3
    (ran,) = runs(engine, job_id=child)
    assert ran.started_at >= rescheduled[-1].finished_at
    assert job(engine, child).result == {
        "label": "child",
        "parents": {"flaky": 5, "later": "later"},
    }
    assert job(engine, child).attempts == 1


def test_a_node_that_exhausts_its_retries_cancels_its_dependents(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("gives up")
    flaky = wf.add(wf_flaky.call(failures=9, value=5), name="flaky")
    strict = wf.add(wfc_log.call("strict"), after=flaky, name="strict")
    wf.add(wfc_log.call("below"), after=strict, name="below")
    wf.add(wfc_log.call("lenient"), after=flaky, policy="all_finished", name="lenient")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    ids = list(handle.jobs.values())
    run_until(SessionLocal, lambda: finished(engine, ids))
    retried = job(engine, handle.jobs["flaky"])
    assert (retried.status, retried.attempts) == ("failed", 3)
    for name in ("strict", "below"):
        assert job(engine, handle.jobs[name]).status == "cancelled", name
        assert node_state(engine, handle.jobs[name]) == "cancelled", name
    assert job(engine, handle.jobs["lenient"]).result == {
        "label": "lenient",
        "parents": {"flaky": {"parent": "failed"}},
    }
    assert [row.key for row in runs(engine)] == ["lenient"]
    assert queue.workflow_status(engine, handle.id).state == "failed"


# -- 3. lost-job reclaim ---------------------------------------------------------------------


def test_a_lost_node_is_reclaimed_runs_again_and_releases_its_dependent_once(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chain(wfc_log.call("root"), wfc_log.call("child")).enqueue(session)
    root, child = handle.jobs["wfc_log"], handle.jobs["wfc_log#2"]
    # Its worker claimed it a minute ago and vanished without a heartbeat.
    with engine.begin() as connection:
        pretend_claimed(connection, root, alive_for=dt.timedelta(minutes=1))
    drain(SessionLocal)
    assert (job(engine, root).status, job(engine, root).attempts) == ("succeeded", 2)
    assert [row.attempt for row in runs(engine, job_id=root)] == [2]
    assert len(runs(engine, job_id=child)) == 1
    assert (job(engine, child).status, job(engine, child).attempts) == ("succeeded", 1)
    assert job(engine, child).result["parents"] == {"wfc_log": {"label": "root", "parents": {}}}


def test_the_stale_completion_of_a_reclaimed_node_releases_nothing_again(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """A's first attempt outlives its 1 s lease; B reclaims the node, runs it and releases
    the child; A's late completion is fenced off and releases nothing."""
    with SessionLocal.begin() as session:
        handle = queue.chain(slow_first.call(seconds=2.0), wfc_log.call("child")).enqueue(session)
    root, child = handle.jobs["slow_first"], handle.jobs["wfc_log"]
    # Neither A's heartbeat nor its registry (every 5 s at most) keeps its row fresh
    # before B looks: A is as good as dead to B.
    worker_a = queue.worker(
        SessionLocal, tasks=["slow_first"], heartbeat_interval=60, reclaim_interval=60, **QUICK
    )
    with worker_thread(worker_a) as stats_a:
        wait_for(lambda: execution(engine, root).state == "running")
        worker_b = queue.worker(
            SessionLocal, tasks=["slow_first", "wfc_log"], reclaim_interval=0.2, **QUICK
        )
        with worker_thread(worker_b):
            wait_for(lambda: job(engine, child).status == "succeeded", timeout=10)
            wait_for(
                lambda: worker_a.decider is not None and worker_a.decider.stats["fenced"] == 1,
                timeout=10,
            )
    assert stats_a[0].fenced == 1
    assert (job(engine, root).result, job(engine, root).attempts) == ("attempt 2", 2)
    assert len(runs(engine, job_id=child)) == 1
    assert job(engine, child).result == {
        "label": "child",
        "parents": {"slow_first": "attempt 2"},
    }
    assert execution(engine, child) is None


def test_a_node_lost_too_often_fails_and_its_dependents_follow_their_policies(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("fragile")
    root = wf.add(wfc_fragile.call("never"), name="root")
    wf.add(wfc_log.call("strict"), after=root, name="strict")
    wf.add(wfc_log.call("lenient"), after=root, policy="all_finished", name="lenient")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    jobs = handle.jobs
    # Lost once already (max_reclaims=1), and lost again: the reclaim makes it twice.
    with engine.begin() as connection:
        pretend_claimed(connection, jobs["root"], attempt=2, alive_for=dt.timedelta(minutes=1))
        connection.execute(EX.update().where(EX.c.id == jobs["root"]).values(reclaims=1))
    drain(SessionLocal)
    assert job(engine, jobs["root"]).status == "failed"
    assert "lost 2 times" in job(engine, jobs["root"]).errors[-1]["message"]
    assert (job(engine, jobs["strict"]).status, node_state(engine, jobs["strict"])) == (
        "cancelled",
        "cancelled",
    )
    assert job(engine, jobs["lenient"]).result == {
        "label": "lenient",
        "parents": {"root": {"parent": "failed"}},
    }


def test_a_pruned_parent_still_gives_its_result_to_its_dependent(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chain(wf_value.call(5), wfc_log.call("child")).enqueue(session)
    parent, child = handle.jobs["wf_value"], handle.jobs["wfc_log"]
    drain(SessionLocal, tasks=["wf_value"])
    with SessionLocal.begin() as session:
        assert queue.prune(session, older_than=dt.timedelta(0)) == 1
    drain(SessionLocal)
    assert job(engine, child).result == {"label": "child", "parents": {"wf_value": 5}}
    status = queue.workflow_status(engine, handle.id)
    assert [node.shown_state for node in status.nodes] == ["pruned", "succeeded"]
    assert status.node("wf_value").job_id == parent


# -- 4. cancel -------------------------------------------------------------------------------


def cancel_graph(root_call: Any) -> Workflow:
    """``root`` with a strict dependent (and one below it) and a lenient one."""
    wf = Workflow("cancel")
    root = wf.add(root_call, name="root")
    strict = wf.add(wfc_log.call("strict"), after=root, name="strict")
    wf.add(wfc_log.call("below"), after=strict, name="below")
    wf.add(wfc_log.call("lenient"), after=root, policy="all_finished", name="lenient")
    return wf


def check_cancelled_root(engine: Engine, workflow_id: int, jobs: dict[str, int]) -> None:
    assert job(engine, jobs["root"]).status == "cancelled"
    for name in ("strict", "below"):
        assert job(engine, jobs[name]).status == "cancelled", name
        assert node_state(engine, jobs[name]) == "cancelled", name
    assert job(engine, jobs["lenient"]).status == "succeeded"
    assert job(engine, jobs["lenient"]).result == {
        "label": "lenient",
        "parents": {"root": {"parent": "cancelled"}},
    }
    assert [row.key for row in runs(engine)] == ["lenient"]
    # A node was cancelled, not the workflow: its other nodes ran on.
    assert queue.workflow_status(engine, workflow_id).state == "failed"


@pytest.mark.parametrize("then", ["return", "raise"])
def test_cancel_of_a_running_node_follows_its_dependents_policies(
    engine: Engine, SessionLocal: sessionmaker[Session], then: str
) -> None:
    # gated has attempts to spare: a raise after the request still ends it cancelled.
    wf = cancel_graph(gated.call(name="running", until="cancel", then=then, value="late"))
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    jobs = handle.jobs
    worker = queue.worker(SessionLocal, heartbeat_interval=0.2, **QUICK)
    with worker_thread(worker):
        assert gate("running").entered.wait(10)
        assert queue.cancel(engine, [jobs["root"]]) == {jobs["root"]: "requested"}
        wait_for(lambda: finished(engine, list(jobs.values())), timeout=10)
    assert gate("running").saw_cancel is True
    assert job(engine, jobs["root"]).attempts == 1
    check_cancelled_root(engine, handle.id, jobs)


@pytest.mark.parametrize("keyed", [False, True])
def test_cancel_of_a_lost_node_advances_its_dependents_through_the_reclaim(
    engine: Engine, SessionLocal: sessionmaker[Session], keyed: bool
) -> None:
    root = echo.options(queue_id="k") if keyed else echo
    wf = cancel_graph(root.call("never"))
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
        # A keyed lost node is parked for its key's promotion: the job behind it runs on.
        behind = wf_value.options(queue_id="k").enqueue(session, "behind") if keyed else None
    jobs = handle.jobs
    with engine.begin() as connection:
        pretend_claimed(connection, jobs["root"], alive_for=dt.timedelta(minutes=1))
    assert queue.cancel(engine, [jobs["root"]]) == {jobs["root"]: "requested"}
    drain(SessionLocal)  # its maintenance reclaims the lost node: cancelled, not run again
    assert job(engine, jobs["root"]).attempts == 1
    check_cancelled_root(engine, handle.id, jobs)
    if behind is not None:
        assert job(engine, behind).status == "succeeded"


@pytest.mark.parametrize("how", ["cancel", "cancel_workflow"])
def test_cancel_of_a_released_node_waiting_in_its_keys_line(
    engine: Engine, SessionLocal: sessionmaker[Session], how: str
) -> None:
    wf = Workflow("cancel")
    first = wf.add(echo.call("first"), name="first")
    node = wf.add(wfc_log.options(queue_id="k").call("node"), after=first, name="node")
    wf.add(wfc_log.call("strict"), after=node, name="strict")
    wf.add(wfc_log.call("lenient"), after=node, policy="all_finished", name="lenient")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
        before = wfc_log.options(queue_id="k").enqueue(session, "before")
    jobs = handle.jobs
    drain(SessionLocal, tasks=["echo"])
    with SessionLocal.begin() as session:
        after = wfc_log.options(queue_id="k").enqueue(session, "after")
    assert execution(engine, jobs["node"]).state == "waiting"
    assert execution(engine, after).state == "waiting"
    if how == "cancel":
        assert queue.cancel(engine, [jobs["node"]]) == {jobs["node"]: "cancelled"}
    else:
        assert queue.cancel_workflow(engine, handle.id) == {"cancelled": 3, "requested": 0}
    drain(SessionLocal)
    # The key's line went on past the cancelled node, in its order.
    assert [row.key for row in runs(engine) if row.key != "lenient"] == ["before", "after"]
    assert job(engine, before).status == job(engine, after).status == "succeeded"
    assert job(engine, jobs["node"]).status == "cancelled"
    assert job(engine, jobs["strict"]).status == "cancelled"
    if how == "cancel":
        assert job(engine, jobs["lenient"]).result == {
            "label": "lenient",
            "parents": {"node": {"parent": "cancelled"}},
        }
    else:  # the whole workflow was cancelled: nothing of it runs any more
        assert job(engine, jobs["lenient"]).status == "cancelled"


@pytest.mark.parametrize("told", [True, False])
def test_cancel_of_the_workflow_while_a_node_runs_releases_nothing_after_it(
    engine: Engine, SessionLocal: sessionmaker[Session], told: bool
) -> None:
    """Told of the request (a heartbeat brings it), the node stops and ends cancelled. Not
    told in time (no heartbeat comes before it returns), its success stands, as the cancel
    guide says: and still releases nothing, not even its all_finished dependent."""
    until = "cancel" if told else "gate"
    wf = cancel_graph(gated.call(name="running", until=until, value="late"))
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    jobs = handle.jobs
    worker = queue.worker(SessionLocal, heartbeat_interval=0.2 if told else 60, **QUICK)
    with worker_thread(worker):
        assert gate("running").entered.wait(10)
        assert queue.cancel_workflow(engine, handle.id) == {"cancelled": 3, "requested": 1}
        gate("running").open()
        wait_for(lambda: finished(engine, list(jobs.values())), timeout=10)
    assert gate("running").saw_cancel is told
    statuses = {name: job(engine, job_id).status for name, job_id in jobs.items()}
    assert statuses == {
        "root": "cancelled" if told else "succeeded",
        "strict": "cancelled",
        "below": "cancelled",
        "lenient": "cancelled",
    }
    assert runs(engine) == []
    assert queue.workflow_status(engine, handle.id).state == "cancelled"


def test_cancel_of_a_held_node_advances_its_dependents(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("held")
    first = wf.add(wf_flaky.options(max_attempts=1).call(failures=9), name="first")
    held = wf.add(wfc_log.call("held"), after=first, on_parent_failure="hold", name="held")
    wf.add(wfc_log.call("strict"), after=held, name="strict")
    wf.add(wfc_log.call("lenient"), after=held, policy="all_finished", name="lenient")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    jobs = handle.jobs
    drain(SessionLocal)
    assert node_state(engine, jobs["held"]) == "held"
    assert queue.cancel(engine, [jobs["held"]]) == {jobs["held"]: "cancelled"}
    drain(SessionLocal)
    assert job(engine, jobs["strict"]).status == "cancelled"
    assert job(engine, jobs["lenient"]).result == {
        "label": "lenient",
        "parents": {"held": {"parent": "cancelled"}},
    }


# -- 5. pause --------------------------------------------------------------------------------


def test_a_paused_tasks_node_is_released_but_waits_and_its_dependents_with_it(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        queue.pause(session, "echo")
        handle = queue.chain(wf_value.call(1), echo.call("paused"), wfc_log.call("after")).enqueue(
            session
        )
    held, after = handle.jobs["echo"], handle.jobs["wfc_log"]
    drain(SessionLocal)
    assert job(engine, handle.jobs["wf_value"]).status == "succeeded"
    assert node_state(engine, held) == "released"
    assert (job(engine, held).status, execution(engine, held).state) == ("queued", "pending")
    assert node_state(engine, after) == "blocked" and execution(engine, after) is None
    with SessionLocal.begin() as session:
        queue.resume(session, "echo")
    drain(SessionLocal)
    assert job(engine, after).result == {"label": "after", "parents": {"echo": "paused"}}
    assert queue.workflow_status(engine, handle.id).state == "succeeded"


# -- 6. concurrency and rate limits ----------------------------------------------------------


def fan(width: int, pause: float) -> Workflow:
    """A root, ``width`` limited nodes after it, and a join after them."""
    wf = Workflow("fan")
    root = wf.add(wf_value.call(0), name="root")
    parts = [wf.add(wfc_limited.call(f"part{i}", pause), after=root) for i in range(width)]
    wf.add(wfc_log.call("join"), after=parts, name="join")
    return wf


def test_nodes_of_a_limited_task_respect_its_concurrency_limit(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        queue.set_limit(session, "wfc_limited", 1)
        handle = fan(4, 0.15).enqueue(session)
    drain(SessionLocal, concurrency=4)
    parts = [row for row in runs(engine) if row.key.startswith("part")]
    assert len(parts) == 4
    assert no_overlap(parts)
    assert queue.workflow_status(engine, handle.id).state == "succeeded"


def test_nodes_of_a_rate_limited_task_respect_its_rate(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        queue.set_rate_limit(session, "wfc_limited", 2, per=0.5)
        handle = fan(6, 0.0).enqueue(session)
    run_until(
        SessionLocal,
        lambda: finished(engine, [handle.jobs["join"]]),
        concurrency=6,
        reclaim_interval=0.2,
    )
    # The starts the rate limit recorded (at each claim, as the limit counts them).
    rate_starts = queue.tables.rate_starts
    with engine.connect() as connection:
        starts = sorted(
            stamp.timestamp()
            for stamp in connection.scalars(
                select(rate_starts.c.started_at).where(rate_starts.c.task == "wfc_limited")
            )
        )
    assert len(starts) == 6
    assert len([row for row in runs(engine) if row.key.startswith("part")]) == 6
    busiest = max(sum(1 for t in starts if end - 0.5 < t <= end) for end in starts)
    assert busiest <= 2
    assert starts[-1] - starts[0] >= 1.0 - 0.05
    assert queue.workflow_status(engine, handle.id).state == "succeeded"


# -- 7. priorities ---------------------------------------------------------------------------


def test_released_nodes_keep_their_task_and_call_priorities(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("priorities")
    root = wf.add(echo.call("root"), name="root")
    wf.add(wfc_urgent.call("declared"), after=root, name="declared")
    wf.add(wfc_urgent.options(priority=1).call("overridden"), after=root, name="overridden")
    for priority in (0, 5, -3, 9):
        wf.add(
            wfc_log.options(priority=priority).call(f"p{priority}"), after=root, name=f"p{priority}"
        )
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    drain(SessionLocal, tasks=["echo"])
    jobs = handle.jobs
    seen = {name: execution(engine, jobs[name]).priority for name in jobs if name != "root"}
    assert seen == {
        "declared": URGENT_PRIORITY,
        "overridden": 1,
        "p0": 0,
        "p5": 5,
        "p-3": -3,
        "p9": 9,
    }
    drain(SessionLocal, tasks=["wfc_log"], concurrency=1)
    assert [row.key for row in runs(engine)] == ["p9", "p5", "p0", "p-3"]


# -- 8. bounded tasks ------------------------------------------------------------------------


@pytest.fixture
def bounded_engine(db_url: str) -> Iterator[Engine]:
    """An engine on this test's database, with the bounded queue's tables created."""
    eng = create_engine(db_url, pool_size=4, max_overflow=4)
    with eng.begin() as connection:
        bq.create(connection)
    yield eng
    eng.dispose()


def test_a_workflow_of_a_bounded_task_is_written_beyond_its_bound_and_runs(
    bounded_engine: Engine,
) -> None:
    factory = sessionmaker(bounded_engine)
    with factory.begin() as session:
        standalone = [bq.capped.enqueue(session, n) for n in range(bq.CAPPED)]
    with factory.begin() as session, pytest.raises(QueueFull):
        bq.capped.enqueue(session, 99)
    wf = Workflow("bounded")
    root = wf.add(bq.free.call(0), name="root")
    parts = [wf.add(bq.capped.call(i), after=root) for i in range(5)]
    join = wf.add(bq.capped.call(100), after=parts, name="join")
    # Even one that would wait for room: a node does not wait on a bound.
    wf.add(bq.capped.options(wait_if_full=5.0).call(200), after=join, name="tail")
    wf.add(bq.capped.options(wait_if_full=5.0).call(300), name="capped_root")
    started = time.monotonic()
    with factory.begin() as session:
        handle = wf.enqueue(session)  # the bound is full: nodes are never refused
    assert time.monotonic() - started < 2.0
    with bounded_engine.connect() as connection:
        # The root of the bounded task counts at once; blocked nodes not yet.
        assert bq.pending(connection, "capped") == bq.CAPPED + 1
    # The root ends: five nodes of the full task are released beyond its bound.
    bq.queue.worker(factory, tasks=["free"]).run(burst=True)
    with bounded_engine.connect() as connection:
        assert bq.pending(connection, "capped") == bq.CAPPED + 1 + 5
    with factory.begin() as session, pytest.raises(QueueFull):
        bq.capped.enqueue(session, 99)  # released nodes count against the bound
    bq.queue.worker(factory, concurrency=2).run(burst=True)
    with bounded_engine.connect() as connection:
        statuses = dict(
            connection.execute(
                select(bq.JOBS.c.id, bq.JOBS.c.status).where(
                    bq.JOBS.c.id.in_([*standalone, *handle.jobs.values()])
                )
            ).all()
        )
    assert set(statuses.values()) == {"succeeded"} and len(statuses) == 3 + 9
    assert bq.queue.workflow_status(bounded_engine, handle.id).state == "succeeded"


# -- 9. history layouts ----------------------------------------------------------------------


def layout_workflow(app: Any, gather: Any) -> Workflow:
    """A chain into a chord (one part fails) into a gather, then one more node."""
    wf = Workflow("layout")
    root = wf.add(app.ok.call(1), name="root")
    parts = [wf.add(app.ok.call(n), after=root, name=f"ok{n}") for n in (2, 3)]
    parts.append(wf.add(app.boom.call(), after=root, name="boom"))
    gathered = wf.add(gather.call(), after=parts, policy="all_finished", name="gather")
    wf.add(gather.call(), after=gathered, name="tail")
    return wf


@contextmanager
def layout_database(db_factory: DatabaseFactory, app: Any, extra: list[Any]) -> Iterator[Engine]:
    """An engine on a fresh database holding only ``app``'s queue (and ``extra`` tables)."""
    url = db_factory.clone("template0")
    engine = create_engine(url)
    with engine.begin() as connection:
        app.queue.create_all(connection)
        for table in extra:
            table.create(connection)
    try:
        yield engine
    finally:
        engine.dispose()
        db_factory.drop(url)


@dataclass
class Layout:
    """A queue of one history layout, its app module, its tasks for these tests, an engine."""

    app: Any
    gather: Any
    maybe: Any
    engine: Engine

    @property
    def queue(self) -> Queue:
        return self.app.queue  # type: ignore[no-any-return]


@pytest.fixture(params=["none", "partitioned"])
def layout(request: pytest.FixtureRequest, db_factory: DatabaseFactory) -> Iterator[Layout]:
    """A fresh database holding only the queue of that history layout."""
    app: Any
    if request.param == "none":
        app, gather, maybe, extra = nohistory_app, wfc_gather_nq, wfc_maybe_nq, nohistory_app.steps
    else:
        app, gather, maybe, extra = history_app, wfc_gather_hq, wfc_maybe_hq, history_app.runs
    with layout_database(db_factory, app, [extra]) as engine:
        yield Layout(app, gather, maybe, engine)


def test_the_same_workflow_runs_on_each_history_layout(layout: Layout) -> None:
    app, gather, engine, q = layout.app, layout.gather, layout.engine, layout.queue
    factory = sessionmaker(engine)
    with factory.begin() as session:
        handle = layout_workflow(app, gather).enqueue(session)
        lone = app.ok.enqueue(session, 7)
    q.worker(factory, concurrency=2, **QUICK).run(burst=True)
    jobs = q.tables.jobs
    with engine.connect() as connection:
        kept = dict(
            connection.execute(
                select(jobs.c.id, jobs.c.result).where(jobs.c.id.in_(list(handle.jobs.values())))
            ).all()
        )
        lone_kept = connection.execute(select(jobs.c.id).where(jobs.c.id == lone)).all()
    # Every node's row is kept (history="none" keeps them, so the status still works).
    assert set(kept) == set(handle.jobs.values())
    gathered = {"ok2": 2, "ok3": 3, "boom": {"parent": "failed"}}
    assert kept[handle.jobs["gather"]] == gathered
    assert kept[handle.jobs["tail"]] == {"gather": gathered}
    status = q.workflow_status(engine, handle.id)
    assert status.state == "failed"  # one part failed for good
    assert {node.name: node.shown_state for node in status.nodes} == {
        "root": "succeeded",
        "ok2": "succeeded",
        "ok3": "succeeded",
        "boom": "failed",
        "gather": "succeeded",
        "tail": "succeeded",
    }
    assert len(lone_kept) == (0 if q is nohistory_app.queue else 1)


def test_a_failed_node_requeued_on_each_history_layout_resumes_its_workflow(
    layout: Layout,
) -> None:
    engine, q = layout.engine, layout.queue
    jobs_table = q.tables.jobs
    factory = sessionmaker(engine)
    wf = Workflow("requeued")
    first = wf.add(layout.maybe.options(max_attempts=1).call(fail=True), name="first")
    wf.add(layout.gather.call(), after=first, on_parent_failure="hold", name="then")
    with factory.begin() as session:
        handle = wf.enqueue(session)
    jobs = handle.jobs
    q.worker(factory, **QUICK).run(burst=True)
    assert q.workflow_status(engine, handle.id).state == "held"
    with factory.begin() as session:
        session.execute(
            jobs_table.update()
            .where(jobs_table.c.id == jobs["first"])
            .values(payload={"args": [], "kwargs": {"fail": False}})
        )
        q.requeue(session, [jobs["first"]])
    q.worker(factory, **QUICK).run(burst=True)
    with engine.connect() as connection:
        result = connection.execute(
            select(jobs_table.c.result).where(jobs_table.c.id == jobs["then"])
        ).scalar_one()
    assert result == {"first": "ok"}
    assert q.workflow_status(engine, handle.id).state == "succeeded"


def test_a_partition_pruned_under_a_waiting_node_keeps_its_input(
    db_factory: DatabaseFactory,
) -> None:
    q, tables = history_app.queue, history_app.queue.tables
    with layout_database(db_factory, history_app, [history_app.runs]) as engine:
        factory = sessionmaker(engine)
        with factory.begin() as session:
            q.maintain_history(session)
            wf = Workflow("pruned")
            root = wf.add(history_app.ok.call(5), name="root")
            wf.add(wfc_gather_hq.call(), after=root, name="gather")
            handle = wf.enqueue(session)
        q.worker(factory, tasks=[history_app.ok.name], **QUICK).run(burst=True)
        # The root's row ages ten days (a move to an older partition), which prune drops.
        with factory.begin() as session:
            session.execute(
                tables.jobs.update()
                .where(tables.jobs.c.id == handle.jobs["root"])
                .values(finished_at=tables.jobs.c.finished_at - dt.timedelta(days=10))
            )
            q.maintain_history(session, ahead=0, backfill=True)
            assert q.prune(session, older_than=dt.timedelta(days=7)) == 1
        q.worker(factory, **QUICK).run(burst=True)
        with engine.connect() as connection:
            result = connection.execute(
                select(tables.jobs.c.result).where(tables.jobs.c.id == handle.jobs["gather"])
            ).scalar_one()
        assert result == {"root": 5}
        status = q.workflow_status(engine, handle.id)
        assert [node.shown_state for node in status.nodes] == ["pruned", "succeeded"]


# -- 10. unique workflows under concurrency --------------------------------------------------


def unique_workflow(value: int) -> Workflow:
    wf = Workflow("x", about=(Order, 7), unique=True)
    wf.add(wf_value.call(value))
    return wf


def test_a_unique_workflow_enqueued_twice_at_once_is_written_once(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        session.add(Order(id=7, email="a@b.c"))
    with Session(engine) as one, Session(engine) as two:
        first = unique_workflow(1).enqueue(one)
        assert not first.existing
        pid = backend_pid(two)
        blocked = Blocked(lambda: unique_workflow(2).enqueue(two))
        wait_until_blocked(engine, pid)
        assert blocked.thread.is_alive()
        one.commit()
        second = blocked.value()
        two.commit()
    assert second.existing and second.id == first.id
    assert second.jobs == {}  # an existing workflow's handle names no jobs (documented)
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(NODES)).scalar_one() == 1
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        third = unique_workflow(3).enqueue(session)
    assert not third.existing and third.id != first.id
    # A cancelled workflow is not live either.
    queue.cancel_workflow(engine, third.id)
    with SessionLocal.begin() as session:
        fourth = unique_workflow(4).enqueue(session)
    assert not fourth.existing and fourth.id not in (first.id, third.id)


def test_a_unique_workflow_waiting_on_one_rolled_back_writes_its_own(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        session.add(Order(id=7, email="a@b.c"))
    with Session(engine) as one, Session(engine) as two:
        first = unique_workflow(1).enqueue(one)
        pid = backend_pid(two)
        blocked = Blocked(lambda: unique_workflow(2).enqueue(two))
        wait_until_blocked(engine, pid)
        one.rollback()
        second = blocked.value()
        two.commit()
    assert not second.existing
    drain(SessionLocal)
    assert job(engine, second.jobs["wf_value"]).result == 2
    assert first.jobs["wf_value"] != second.jobs["wf_value"]


# -- 11. binds -------------------------------------------------------------------------------


def nothing_written(engine: Engine) -> bool:
    with engine.connect() as connection:
        return all(
            connection.execute(select(func.count()).select_from(table)).scalar_one() == 0
            for table in (JOBS, EX, NODES, queue.tables.workflows, queue.tables.workflow_edges)
        )


def test_a_workflow_through_a_connection_runs_or_rolls_back(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with engine.connect() as connection:
        connection.begin()
        queue.chain(wf_value.call(1), wfc_log.call("gone")).enqueue(connection)
        connection.rollback()
    assert nothing_written(engine)
    with engine.begin() as connection:
        handle = queue.chain(wf_value.call(1), wfc_log.call("kept")).enqueue(connection)
    drain(SessionLocal)
    assert job(engine, handle.jobs["wfc_log"]).result == {
        "label": "kept",
        "parents": {"wf_value": 1},
    }


async def test_a_workflow_through_an_async_connection_runs_or_rolls_back(
    engine: Engine,
    async_engine: AsyncEngine,
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
) -> None:
    async with async_engine.connect() as connection:
        transaction = await connection.begin()
        await queue.chain(wf_value.call(1), wf_value.call(2)).enqueue(connection)
        await transaction.rollback()
    assert nothing_written(engine)
    async with async_engine.begin() as connection:
        handle = await queue.chain(wf_value.call(1), wf_value.call(2)).enqueue(connection)
    await queue.async_worker(AsyncSessionLocal, **QUICK).run(burst=True)
    status = await queue.workflow_status(AsyncSessionLocal, handle.id)
    assert status.state == "succeeded"
    assert job(engine, handle.jobs["wf_value#2"]).result == 2


# -- 12. delay and run_at on a node with parents ---------------------------------------------


def test_the_delay_of_a_node_with_parents_counts_from_its_release(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        now: dt.datetime = session.execute(select(func.now())).scalar_one()
        run_at = now + dt.timedelta(seconds=90)
        wf = Workflow("later")
        root = wf.add(echo.call("root"), name="root")
        wf.add(wf_value.options(delay=60).call("d"), after=root, name="delayed")
        wf.add(wf_value.options(run_at=run_at).call("r"), after=root, name="at")
        handle = wf.enqueue(session)
    jobs = handle.jobs
    time.sleep(0.5)  # the release comes measurably after the write
    drain(SessionLocal, tasks=["echo"])
    released_at = job(engine, jobs["root"]).finished_at
    delayed = execution(engine, jobs["delayed"])
    assert delayed.state == "pending"
    assert abs((delayed.execute_at - released_at) - dt.timedelta(seconds=60)) < dt.timedelta(
        seconds=0.2
    )
    written_at = job(engine, jobs["delayed"]).created_at
    assert delayed.execute_at - written_at >= dt.timedelta(seconds=60.4)
    assert job(engine, jobs["delayed"]).scheduled_at == delayed.execute_at
    assert execution(engine, jobs["at"]).execute_at == run_at
    drain(SessionLocal)  # neither is due yet
    assert job(engine, jobs["delayed"]).status == "queued"
    assert job(engine, jobs["at"]).status == "queued"


def test_the_delay_of_a_held_node_counts_from_its_release_after_the_requeue(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("held")
    first = wf.add(wf_flaky.options(max_attempts=1).call(failures=9, value=1), name="first")
    wf.add(wf_value.options(delay=60).call("d"), after=first, on_parent_failure="hold", name="d")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    jobs = handle.jobs
    drain(SessionLocal)
    assert node_state(engine, jobs["d"]) == "held" and execution(engine, jobs["d"]) is None
    failed_at = job(engine, jobs["first"]).finished_at
    time.sleep(0.5)
    with SessionLocal.begin() as session:
        session.execute(
            JOBS.update()
            .where(JOBS.c.id == jobs["first"])
            .values(payload={"args": [], "kwargs": {"failures": 0, "value": 1}})
        )
        assert queue.requeue(session, [jobs["first"]]).requeued == [jobs["first"]]
    drain(SessionLocal)
    released_at = job(engine, jobs["first"]).finished_at
    assert released_at - failed_at >= dt.timedelta(seconds=0.5)
    delayed = execution(engine, jobs["d"])
    assert delayed is not None and delayed.state == "pending"
    assert abs((delayed.execute_at - released_at) - dt.timedelta(seconds=60)) < dt.timedelta(
        seconds=0.2
    )
    assert job(engine, jobs["d"]).status == "queued"


# -- fan-in under concurrent workers ---------------------------------------------------------


def test_a_wide_fan_in_run_by_two_workers_releases_its_callback_once(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    width = 30
    with SessionLocal.begin() as session:
        handle = queue.chord(
            [wfc_log.call(f"part{i}") for i in range(width)], then=wfc_log.call("callback")
        ).enqueue(session)
    callback = handle.jobs["wfc_log#31"]
    one = queue.worker(SessionLocal, concurrency=4, **QUICK)
    two = queue.worker(SessionLocal, concurrency=4, **QUICK)
    with worker_thread(one), worker_thread(two):
        wait_for(lambda: finished(engine, [callback]), timeout=20)
    assert len(runs(engine, job_id=callback)) == 1
    result = job(engine, callback).result
    assert result["label"] == "callback" and len(result["parents"]) == width
    assert runs(engine)[-1].key == "callback"


# -- other worker faces ----------------------------------------------------------------------


@pytest.mark.parametrize("face", ["sqlalchemy_statements", "async_worker"])
def test_releases_run_alike_on_every_worker_face(
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
    face: str,
) -> None:
    """The completion's release and the reclaim's, on a sync worker that runs its statements
    through SQLAlchemy (not psycopg's raw cursors, with custom plans) and on an async one."""
    gather = wf_gather_async if face == "async_worker" else wf_gather
    wf = Workflow("faces")
    lost = wf.add(echo.options(queue_id="k").call("never"), name="lost")
    wf.add(wf_value.call("s"), after=lost, name="strict")
    wf.add(gather.call(), after=lost, policy="all_finished", name="lenient")
    first = wf.add(wf_value.options(queue_id="k2").call(1), name="first")
    second = wf.add(wf_value.options(queue_id="k2").call(2), after=first, name="second")
    wf.add(gather.call(), after=[first, second], name="joined")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    jobs = handle.jobs
    with engine.begin() as connection:
        pretend_claimed(connection, jobs["lost"], alive_for=dt.timedelta(minutes=1))
    assert queue.cancel(engine, [jobs["lost"]]) == {jobs["lost"]: "requested"}
    if face == "async_worker":
        asyncio.run(queue.async_worker(AsyncSessionLocal, concurrency=2, **QUICK).run(burst=True))
    else:
        drain(SessionLocal, raw_statements=False, generic_plans=False)
    assert job(engine, jobs["strict"]).status == "cancelled"
    assert job(engine, jobs["lenient"]).result == {"lost": {"parent": "cancelled"}}
    assert job(engine, jobs["joined"]).result == {"first": 1, "second": 2}
    assert queue.workflow_status(engine, handle.id).state == "failed"
