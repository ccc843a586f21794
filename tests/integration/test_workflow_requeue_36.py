"""Issue 36: the requeue of a workflow's node, refused or not, says why.

- a node that never ran, or of a cancelled workflow, is refused with a reason that says
  so (``RequeueReport.refused``), from the API, the CLI and the dashboard;
- a failed node of a workflow about a row, while another live workflow of its name about
  that row exists, is refused as a unique job whose key is held: never two live workflows
  for one order. The requeue takes the unique workflows' lock, so a unique enqueue that
  races it waits, then finds the requeued workflow live.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.workflows import Workflow, WorkflowHandle
from tests.support.app import Order
from tests.support.running import Blocked
from tests.support.workflow_app import queue, wf_fail, wf_value

pytestmark = pytest.mark.integration

TARGET = "tests.support.workflow_app:queue"
JOBS = queue.tables.jobs


def drain(factory: sessionmaker[Session]) -> None:
    """Run a sync worker until no job is left."""
    queue.worker(factory, concurrency=2).run(burst=True)


def status_of(engine: Engine, job_id: int) -> str:
    with engine.connect() as connection:
        return str(connection.execute(select(JOBS.c.status).where(JOBS.c.id == job_id)).scalar())


def failed_chain(factory: sessionmaker[Session]) -> WorkflowHandle:
    """wf_fail, then wf_value after it: run, the first fails and the second is ruled out."""
    with factory.begin() as session:
        handle = queue.chain(wf_fail.call(), wf_value.call(2), name="two").enqueue(session)
    drain(factory)
    return handle


def test_a_node_that_never_ran_is_refused_with_a_reason(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    handle = failed_chain(SessionLocal)
    parent, child = handle.jobs["wf_fail"], handle.jobs["wf_value"]
    assert status_of(engine, child) == "cancelled"
    with SessionLocal.begin() as session:
        report = queue.requeue(session, [child])
    assert report == []
    reason = report.refused[child]
    assert f"node 'wf_value' of workflow {handle.id}" in reason
    assert "never ran" in reason and "requeue that parent" in reason
    assert "only failed and cancelled" not in reason
    assert status_of(engine, child) == "cancelled"
    # Asked together with its failed parent: the parent goes back, the child waits for it.
    with SessionLocal.begin() as session:
        report = queue.requeue(session, [parent, child])
    assert report == [parent] and list(report.refused) == [child]
    assert queue.workflow_status(engine, handle.id).node("wf_value").shown_state == "blocked"


def test_a_node_of_a_cancelled_workflow_is_refused_with_a_reason(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    handle = failed_chain(SessionLocal)
    parent = handle.jobs["wf_fail"]
    queue.cancel_workflow(engine, handle.id)
    with SessionLocal.begin() as session:
        report = queue.requeue(session, [parent])
    assert report == []
    assert report.refused == {
        parent: f"it is node 'wf_fail' of workflow {handle.id}, which was cancelled: its "
        "nodes stay as they are"
    }
    assert status_of(engine, parent) == "failed"


def test_the_cli_and_the_dashboard_give_the_same_reason(
    db_url: str,
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sqla_queue.cli.main import main

    handle = failed_chain(SessionLocal)
    child = handle.jobs["wf_value"]
    assert main(["requeue", TARGET, "--url", db_url, str(child)]) == 7
    out = capsys.readouterr().out
    assert out.startswith(f"job {child}: left alone (it is node 'wf_value' of workflow")
    assert "never ran" in out and "only failed and cancelled" not in out

    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
        from starlette.testclient import TestClient
    app = queue.dashboard(engine, auth=lambda request: "ops")
    with TestClient(app, follow_redirects=False) as admin:
        page = admin.get(f"/jobs/{child}").text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token is not None
        refused = admin.post(f"/jobs/{child}/requeue", data={"csrf_token": token.group(1)})
    assert refused.status_code == 409
    assert "never ran" in refused.text
    assert status_of(engine, child) == "cancelled"


def fulfil(order: Any, call: Any) -> Workflow:
    wf = Workflow("fulfil", about=order, unique=True)
    wf.add(call, name="charge")
    return wf


def test_requeue_of_a_unique_workflow_node_while_a_newer_one_is_live_is_refused(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        order = Order(id=7, email="a@b.c")
        session.add(order)
        session.flush()
        old = fulfil(order, wf_fail.call()).enqueue(session)
    drain(SessionLocal)
    assert queue.workflow_status(engine, old.id).state == "failed"
    with SessionLocal.begin() as session:
        new = fulfil((Order, 7), wf_value.call("charged")).enqueue(session)
    assert not new.existing and new.id != old.id
    charge = old.jobs["charge"]
    with SessionLocal.begin() as session:
        report = queue.requeue(session, [charge])
    assert report == []
    reason = report.refused[charge]
    assert f"workflow {new.id} of the same name about the same row is live" in reason
    assert status_of(engine, charge) == "failed"
    assert queue.workflow_status(engine, old.id).state == "failed"
    # Once the newer workflow has ended, the old one may run again.
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        assert queue.requeue(session, [charge]) == [charge]
    assert queue.workflow_status(engine, old.id).state == "running"
    # ... and now it is the live one: a unique enqueue finds it.
    with SessionLocal.begin() as session:
        again = fulfil((Order, 7), wf_value.call("x")).enqueue(session)
    assert again.existing and again.id == old.id


def test_workflows_about_other_rows_or_names_do_not_count(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        old = fulfil((Order, 7), wf_fail.call()).enqueue(session)
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        fulfil((Order, 8), wf_value.call(1)).enqueue(session)
        other = Workflow("refund", about=(Order, 7), unique=True)
        other.add(wf_value.call(1))
        other.enqueue(session)
        # Neither about a row: no rule applies.
        free = queue.chain(wf_fail.call(), name="fulfil").enqueue(session)
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        fulfil((Order, 8), wf_value.call(1)).enqueue(session)  # live again, about order 8
    with SessionLocal.begin() as session:
        report = queue.requeue(session, [old.jobs["charge"], free.jobs["wf_fail"]])
    assert sorted(report) == sorted([old.jobs["charge"], free.jobs["wf_fail"]])
    assert report.refused == {}


def test_a_unique_enqueue_waits_for_a_requeue_and_finds_its_workflow_live(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        old = fulfil((Order, 7), wf_fail.call()).enqueue(session)
    drain(SessionLocal)
    with SessionLocal() as requeueing, SessionLocal() as enqueueing:
        assert queue.requeue(requeueing, [old.jobs["charge"]]) == [old.jobs["charge"]]
        blocked = Blocked(lambda: fulfil((Order, 7), wf_value.call("new")).enqueue(enqueueing))
        assert blocked.still_waiting(), "the unique enqueue did not wait for the requeue"
        requeueing.commit()
        found = blocked.value()
        enqueueing.commit()
    assert found.existing and found.id == old.id
    with engine.connect() as connection:
        count = connection.execute(select(queue.tables.workflows.c.id)).all()
    assert len(count) == 1
