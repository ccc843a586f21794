"""Durable jobs at their edges (issue 36, section 3 and the durable items of section 5),
on a real PostgreSQL: a requeue after compensations, nested and repeated steps, typed
condition keys and ORM inserts, a timed-out wait re-raised, a condition's row locked by
the application, and the input that must be refused before anything is written."""

from __future__ import annotations

import json
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import statements
from sqla_queue.cli.main import main
from sqla_queue.cli.scaffold import EXIT_OK
from sqla_queue.conversation import run_flow
from sqla_queue.durable.compensate import compensations_flow
from sqla_queue.durable.statements import DurableStatements
from tests.support.app import Shipment, StepWrite
from tests.support.durable_checks import drain, outcome
from tests.support.durable_edges_app import (
    edge_after_break,
    edge_async_nested,
    edge_nested,
    edge_repeated,
    edge_saga,
    queue,
)
from tests.support.lifecycle import backend_pid, wait_until_blocked

pytestmark = pytest.mark.integration

TARGET = "tests.support.durable_app:queue"
JOBS = queue.tables.jobs
EXECUTIONS = queue.tables.executions


def rows_of(engine: Engine, job_id: int) -> list[str]:
    """The ``StepWrite`` rows of job ``job_id`` (and of its compensations), sorted."""
    with engine.connect() as connection:
        return sorted(
            connection.execute(select(StepWrite.step).where(StepWrite.job_id == job_id)).scalars()
        )


# -- a requeue after the compensations ran ------------------------------------------------


def _failed_and_compensated(engine: Engine, factory: sessionmaker[Session]) -> tuple[int, int]:
    """A saga that failed, whose compensation ran; (its id, its shipment's id)."""
    with factory.begin() as session:
        session.add(Shipment(id=1, status="new"))
        job = edge_saga.enqueue(session, 1)
    drain(factory)
    assert outcome(engine, job)[0] == "failed"
    drain(factory)  # the maintenance enqueued the compensation: run it
    assert rows_of(engine, job) == ["charge@1", "log@1", "undo:charge@1"]
    with factory() as session:
        steps = {s.name: s for s in queue.job_steps(session, job)}
    assert steps["charge"].compensated_by is not None
    with factory.begin() as session:
        session.execute(update(Shipment).where(Shipment.id == 1).values(status="ok"))
    return job, 1


def _reruns_the_compensated_step(engine: Engine, factory: sessionmaker[Session], job: int) -> None:
    with factory() as session:
        steps = {s.name: s for s in queue.job_steps(session, job)}
    # Reopened: the compensated step is gone, the plain one stays done.
    assert set(steps) == {"log"}
    drain(factory)
    # charge ran again (its first run was undone); log was not compensated: replayed.
    assert outcome(engine, job) == ("succeeded", ["charge 2", "log 1"])
    assert rows_of(engine, job) == ["charge@1", "charge@2", "log@1", "undo:charge@1"]
    with factory() as session:
        steps = {s.name: s for s in queue.job_steps(session, job)}
    assert steps["charge"].compensated_by is None and steps["charge"].has_compensation


def test_requeue_after_compensation_reruns_the_compensated_steps_api(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    job, _ = _failed_and_compensated(engine, SessionLocal)
    with SessionLocal.begin() as session:
        assert queue.requeue(session, [job]) == [job]
    _reruns_the_compensated_step(engine, SessionLocal, job)


def test_requeue_after_compensation_reruns_the_compensated_steps_cli(
    engine: Engine, db_url: str, SessionLocal: sessionmaker[Session], capsys: Any
) -> None:
    job, _ = _failed_and_compensated(engine, SessionLocal)
    status = main(["requeue", TARGET, "--url", db_url, str(job), "--json"])
    assert status == EXIT_OK, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)[0]["outcome"] == "requeued"
    _reruns_the_compensated_step(engine, SessionLocal, job)


def test_requeue_after_compensation_reruns_the_compensated_steps_dashboard(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
        from starlette.testclient import TestClient

    job, _ = _failed_and_compensated(engine, SessionLocal)
    with TestClient(queue.dashboard(engine, auth=lambda request: "ops")) as client:
        client.follow_redirects = False
        page = client.get(f"/jobs/{job}")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token is not None
        done = client.post(f"/jobs/{job}/requeue", data={"csrf_token": token[1]})
        assert done.status_code == 303
        assert done.headers["location"] == f"/jobs/{job}?done=requeued"
    _reruns_the_compensated_step(engine, SessionLocal, job)


def test_requeue_before_the_sweep_keeps_the_uncompensated_steps(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """A requeue that comes before the compensation sweep: nothing was undone, so the
    steps stay done, and the sweep never undoes them afterwards."""
    with SessionLocal.begin() as session:
        session.add(Shipment(id=2, status="new"))
        job = edge_saga.enqueue(session, 2)
    drain(SessionLocal)  # fails; its compensation is not swept before the next drain
    assert outcome(engine, job)[0] == "failed"
    with SessionLocal.begin() as session:
        session.execute(update(Shipment).where(Shipment.id == 2).values(status="ok"))
        assert queue.requeue(session, [job]) == [job]
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", ["charge 1", "log 1"])
    assert rows_of(engine, job) == ["charge@1", "log@1"]


def test_a_requeue_waits_for_a_sweep_in_flight_then_reruns_what_it_compensated(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """The sweep holds the failed job (it has read its steps, not committed): the requeue
    waits for it, then sees the step it marked, and reopens it. Without the wait, the
    requeue would keep the step done while the sweep undoes it."""
    with SessionLocal.begin() as session:
        session.add(Shipment(id=3, status="ok"))
        job = edge_saga.enqueue(session, 3)
        session.flush()
        session.execute(update(Shipment).where(Shipment.id == 3).values(status="new"))
    drain(SessionLocal)
    assert outcome(engine, job)[0] == "failed"
    with SessionLocal.begin() as session:
        session.execute(update(Shipment).where(Shipment.id == 3).values(status="ok"))
    tables = queue.tables
    with engine.connect() as sweeper:
        sweeper.begin()
        enqueued = run_flow(
            sweeper,
            compensations_flow(
                DurableStatements.of(tables),
                statements.enqueue_statement(tables, keyed=True, notify=True),
            ),
        )
        assert len(enqueued) == 1
        with ThreadPoolExecutor(1) as pool, engine.connect() as requeuer:
            pid = backend_pid(requeuer)
            requeuer.commit()

            def requeue() -> list[int]:
                with requeuer.begin():
                    return list(queue.requeue(requeuer, [job]))

            done = pool.submit(requeue)
            wait_until_blocked(engine, pid)
            sweeper.commit()
            assert done.result(timeout=30) == [job]
    _reruns_the_compensated_step(engine, SessionLocal, job)


# -- steps and cursors do not nest, and each name runs once per run -----------------------


@pytest.mark.parametrize("inner", ["step", "cursor", "in-batch"])
def test_a_step_or_cursor_inside_another_is_refused(
    engine: Engine, SessionLocal: sessionmaker[Session], inner: str
) -> None:
    with SessionLocal.begin() as session:
        job = edge_nested.enqueue(session, inner)
    drain(SessionLocal)
    status, message = outcome(engine, job)
    assert status == "succeeded"
    assert "do not nest" in message and "'inner'" in message, message
    assert "'outer'" in message
    # Nothing of the outer block was committed by the inner one.
    assert rows_of(engine, job) == []
    with SessionLocal() as session:
        assert queue.job_steps(session, job) == []


@pytest.mark.parametrize("inner", ["step", "in-batch"])
def test_async_nesting_is_refused(
    engine: Engine, SessionLocal: sessionmaker[Session], inner: str
) -> None:
    with SessionLocal.begin() as session:
        job = edge_async_nested.enqueue(session, inner)
    drain(SessionLocal)
    status, message = outcome(engine, job)
    assert status == "succeeded" and "do not nest" in message, message


def test_a_step_after_a_cursor_left_with_break_is_not_nested(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = edge_after_break.enqueue(session)
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", [7])


@pytest.mark.parametrize("kind", ["step", "run_step", "cursor"])
def test_a_name_used_twice_in_one_run_is_refused(
    engine: Engine, SessionLocal: sessionmaker[Session], kind: str
) -> None:
    with SessionLocal.begin() as session:
        job = edge_repeated.enqueue(session, kind)
    drain(SessionLocal)
    status, message = outcome(engine, job)
    assert status == "succeeded"
    name = "import" if kind == "cursor" else "charge"
    assert f"{name!r} runs twice in one run" in message, message


def test_a_step_that_raised_may_run_again_under_its_name(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = edge_repeated.enqueue(session, "retry")
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "retried 2")
