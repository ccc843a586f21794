"""The testing helpers with workflows: ``drain()`` runs one to its end and lists its nodes
as they ran, eager mode runs one at the commit that wrote it, and the plugin's fixtures
do both in a user's suite."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.testing.helpers import DrainResult, RanJob, drain, eager
from sqla_queue.workflows import Workflow, WorkflowStatus
from tests.support.workflow_app import (
    queue,
    wf_fail,
    wf_gather,
    wf_gather_async,
    wf_split,
    wf_sum,
    wf_tx,
    wf_value,
)

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def assert_parents_ran_first(ran: dict[str, RanJob], status: WorkflowStatus) -> None:
    """Every node of ``status`` ran, each after all of its parents."""
    order = list(ran)
    assert sorted(order) == sorted(node.name for node in status.nodes)
    for node in status.nodes:
        for parent in node.parents:
            assert order.index(parent) < order.index(node.name), (parent, node.name, order)


def expanding_workflow() -> Workflow:
    """A root, then an expansion into three values and their sum, beside a second root;
    a gather waits for both branches."""
    wf = Workflow("fan")
    first = wf.add(wf_value.call(1), name="first")
    split = wf.add(wf_split.call(3), after=first, name="split")
    other = wf.add(wf_value.call(10), name="other")
    wf.add(wf_gather.call(), after=[split, other], name="gather")
    return wf


def test_drain_runs_a_chain_to_its_end_in_order(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = queue.chain(wf_value.call(1), wf_value.call(2), wf_gather.call()).enqueue(session)

    result = drain(queue, SessionLocal)

    assert result.tasks == ["wf_value", "wf_value", "wf_gather"]
    nodes = result.workflow(handle)
    assert list(nodes) == ["wf_value", "wf_value#2", "wf_gather"]
    assert [job.id for job in nodes.values()] == list(handle.jobs.values())
    assert nodes["wf_gather"].result == {"wf_value#2": 2}
    assert all(job.workflow_id == handle.id for job in result.jobs)
    assert result.workflow(handle.id) == nodes  # the id does as well as the handle
    assert queue.workflow_status(engine, handle.id).state == "succeeded"
    assert drain(queue, SessionLocal).jobs == ()


def test_drain_lists_an_expansion_where_it_ran_not_in_id_order(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        handle = expanding_workflow().enqueue(session)

    result = drain(queue, SessionLocal)

    result.raise_failures()
    nodes = result.workflow(handle)
    status = queue.workflow_status(engine, handle.id)
    assert status.state == "succeeded"
    assert_parents_ran_first(nodes, status)
    # The expansion's nodes were written after "gather" (higher ids) but ran before it.
    assert list(nodes)[-1] == "gather"
    assert result.ids != sorted(result.ids)
    assert nodes["split/wf_sum@then"].result == 0 + 1 + 2
    assert nodes["gather"].result == {"split/wf_sum@then": 3, "other": 10}
    assert result.stats.succeeded == len(status.nodes) == 8


def test_drain_orders_plain_jobs_as_they_ran(SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        wf_value.enqueue(session, "low")
        wf_value.options(priority=5).enqueue(session, "high")

    result = drain(queue, SessionLocal)

    assert [job.result for job in result.jobs] == ["high", "low"]
    assert [job.node for job in result.jobs] == [None, None]
    assert result.workflow(1) == {}


def test_drain_follows_each_nodes_policy_after_a_failure(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("policies")
    ok = wf.add(wf_value.call("a"), name="ok")
    bad = wf.add(wf_fail.call("boom"), name="bad")
    wf.add(wf_value.call("never"), after=[ok, bad], name="needs_both")
    wf.add(wf_gather.call(), after=[ok, bad], policy="all_finished", name="report")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)

    result = drain(queue, SessionLocal)

    nodes = result.workflow(handle)
    # The cancelled node never ran, so the drain does not list it; the status does.
    assert list(nodes) == ["ok", "bad", "report"]
    assert [job.node for job in result.failed] == ["bad"]
    assert nodes["bad"].error is not None and nodes["bad"].error["message"] == "boom"
    assert nodes["report"].result == {"ok": "a", "bad": {"parent": "failed"}}
    status = queue.workflow_status(engine, handle.id)
    assert status.node("needs_both").shown_state == "cancelled"
    assert status.state == "failed"
    with pytest.raises(AssertionError, match=r"\(wf_fail, now failed\): .*RuntimeError: boom"):
        result.raise_failures()


def test_drain_runs_async_and_transactional_nodes(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("kinds")
    tx = wf.add(wf_tx.call("tx", parts=2), name="tx")
    value = wf.add(wf_value.call(4), name="value")
    wf.add(wf_gather_async.call(), after=[tx, value], name="gather")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)

    result = drain(queue, SessionLocal)

    nodes = result.workflow(handle)
    assert_parents_ran_first(nodes, queue.workflow_status(engine, handle.id))
    assert nodes["gather"].result == {"tx/wf_sum@then": 1, "value": 4}


async def test_drain_runs_a_workflow_an_async_session_wrote(
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    AsyncSessionLocal: async_sessionmaker[AsyncSession],
) -> None:
    async with AsyncSessionLocal.begin() as session:
        handle = await expanding_workflow().enqueue(session)

    # drain() is synchronous: from async code, in a thread of its own.
    result = await asyncio.to_thread(drain, queue, SessionLocal)

    nodes = result.workflow(handle)
    assert_parents_ran_first(nodes, queue.workflow_status(engine, handle.id))
    assert nodes["gather"].result == {"split/wf_sum@then": 3, "other": 10}


def test_eager_runs_a_workflow_at_the_commit_that_wrote_it(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with eager(queue, SessionLocal) as hook:
        with SessionLocal.begin() as session:
            chord = queue.chord([wf_value.call(i) for i in range(3)], then=wf_sum.call())
            chord_handle = chord.enqueue(session)
            handle = expanding_workflow().enqueue(session)
        # Both ran, every node, before commit() returned: in one drain.
        assert len(hook.runs) == 1
        assert hook.workflow(chord_handle)["wf_sum"].result == 3
        nodes = hook.workflow(handle)
        status = queue.workflow_status(engine, handle.id)
        assert status.state == "succeeded"
        assert_parents_ran_first(nodes, status)
        assert nodes["gather"].result == {"split/wf_sum@then": 3, "other": 10}


def test_eager_follows_policies_and_reports_the_failed_node(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("eager_policies")
    bad = wf.add(wf_fail.call("eager boom"), name="bad")
    wf.add(wf_value.call(1), after=bad, name="cancelled_child")
    wf.add(wf_gather.call(), after=bad, policy="all_finished", name="report")
    with eager(queue, SessionLocal, raise_failures=False) as hook:
        with SessionLocal.begin() as session:
            handle = wf.enqueue(session)
        assert list(hook.workflow(handle)) == ["bad", "report"]
    assert hook.workflow(handle)["report"].result == {"bad": {"parent": "failed"}}
    assert queue.workflow_status(engine, handle.id).node("cancelled_child").shown_state == (
        "cancelled"
    )
    assert [job.node for job in hook.failed] == ["bad"]
    # Without raise_failures=False, the block's end raises this.
    with pytest.raises(AssertionError, match=r"\(wf_fail, now failed\): .*eager boom"):
        hook.raise_failures()


def test_eager_runs_nothing_of_a_rolled_back_workflow(
    SessionLocal: sessionmaker[Session],
) -> None:
    with eager(queue, SessionLocal) as hook, SessionLocal() as session:
        expanding_workflow().enqueue(session)
        session.rollback()
    assert hook.runs == []


# -- the plugin's fixtures, in a user's suite ----------------------------------------------

USER_TESTS = """
from tests.support.workflow_app import queue, wf_fail, wf_gather, wf_split, wf_value
from sqla_queue.workflows import Workflow


def fan():
    wf = Workflow("fan")
    split = wf.add(wf_split.call(2), name="split")
    wf.add(wf_gather.call(), after=split, name="gather")
    return wf


def test_drain_fixture(sqla_queue_engine, sqla_queue_session_factory, sqla_queue_drain):
    with sqla_queue_session_factory.begin() as session:
        handle = fan().enqueue(session)
    result = sqla_queue_drain()
    assert list(result.workflow(handle)) == [
        "split", "split/wf_value@0", "split/wf_value@1", "split/wf_sum@then", "gather"
    ]
    assert result.workflow(handle)["gather"].result == {"split/wf_sum@then": 1}
    assert queue.workflow_status(sqla_queue_engine, handle.id).state == "succeeded"


def test_eager_fixture(sqla_queue_engine, sqla_queue_session_factory, sqla_queue_eager):
    with sqla_queue_session_factory.begin() as session:
        handle = fan().enqueue(session)
    assert list(sqla_queue_eager.workflow(handle))[-1] == "gather"
    assert queue.workflow_status(sqla_queue_engine, handle.id).state == "succeeded"


def test_eager_fixture_fails_on_a_failed_node(sqla_queue_session_factory, sqla_queue_eager):
    with sqla_queue_session_factory.begin() as session:
        queue.chain(wf_fail.call("kaput"), wf_value.call(1)).enqueue(session)
"""


def test_the_fixtures_run_workflows(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The user's suite imports this repository's workflow tasks.
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    pytester.makeini("[pytest]\nsqla_queue_app = tests.support.workflow_app:queue\n")
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at teardown of test_eager_fixture_fails_on_a_failed_node*"]
    )
    result.stdout.fnmatch_lines(["*(wf_fail, now failed): *RuntimeError: kaput*"])


def test_drain_result_workflow_is_empty_for_another_workflow() -> None:
    job = RanJob(1, "wf_value", "succeeded", 1, 1, None, workflow_id=7, node="a")
    result = DrainResult((job,), stats=None)  # type: ignore[arg-type]
    assert result.workflow(7) == {"a": job}
    assert result.workflow(8) == {}
