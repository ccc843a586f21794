"""Keys (queue_id) with waiting jobs: the races between an enqueue and a finishing head.

A job enqueued behind an earlier job of its key is written ``waiting`` and holds that
earlier job's row with KEY SHARE until its transaction ends. These tests hold such an
enqueue open on its own connection while a worker's statements run on another, so each
interleaving happens for certain rather than by chance.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import statements
from sqla_queue.logic.outcomes import Outcome, OutcomeKind
from sqla_queue.worker.decider.keys import KeyPromotion
from tests.support.app import ExecutionLog, keyed, queue
from tests.support.running import wait_for

pytestmark = pytest.mark.integration

EX = queue.tables.executions
CLAIM = statements.claim_statement(queue.tables)
COMPLETE = statements.complete_statement(queue.tables)
CLEAR_DONE = statements.clear_done_statement(queue.tables)
PROMOTE = statements.promote_statement(queue.tables)


def _claim(connection: Connection, worker: uuid.UUID) -> list[Any]:
    params = {
        "tasks": ["keyed"],
        "batch": 10,
        "worker": worker,
        "lease": 30.0,
        "lease_map": "{}",
    }
    return [r for r in connection.execute(CLAIM, params).all() if r.id is not None]


def _succeed(connection: Connection, worker: uuid.UUID, job_id: int, attempt: int) -> list[int]:
    outcome = Outcome(job_id, attempt, OutcomeKind.SUCCEEDED).as_row()
    params = {"outcomes": json.dumps([outcome]), "worker": worker}
    return [row[0] for row in connection.execute(COMPLETE, params).all()]


def _states(engine: Engine) -> dict[int, str]:
    with engine.connect() as connection:
        return {row.id: row.state for row in connection.execute(select(EX.c.id, EX.c.state))}


def test_an_enqueue_in_flight_behind_a_finishing_head_is_promoted_once_it_commits(
    engine: Engine,
) -> None:
    worker = uuid.uuid4()
    with Session(engine) as session, session.begin():
        head = keyed.options(queue_id="acct").enqueue(session, key="acct", seq=0)
    with engine.begin() as connection:
        [claimed] = _claim(connection, worker)
    assert claimed.id == head

    enqueuer = Session(engine)
    enqueuer.begin()
    later = keyed.options(queue_id="acct").enqueue(enqueuer, key="acct", seq=1)
    # Behind a running head, the new job waits, and holds the head's row while it is open.
    assert enqueuer.execute(select(EX.c.state).where(EX.c.id == later)).scalar() == "waiting"

    with engine.begin() as connection:
        # The worker must never wait for a business transaction: fail fast if it would.
        connection.execute(text("SET LOCAL lock_timeout = '2s'"))
        assert _succeed(connection, worker, head, claimed.attempt) == [head]
        # The head is done, but the open enqueue holds it: it stays, and its key is named.
        assert connection.execute(CLEAR_DONE, {"keys": ["acct"]}).scalars().all() == ["acct"]
        assert connection.execute(PROMOTE, {"keys": ["acct"]}).scalars().all() == []
    assert _states(engine) == {head: "done"}

    enqueuer.commit()
    enqueuer.close()
    assert _states(engine) == {head: "done", later: "waiting"}

    # The worker's retry: the done row goes, then the key's next job is promoted and runs.
    with engine.begin() as connection:
        assert connection.execute(CLEAR_DONE, {"keys": ["acct"]}).scalars().all() == []
        assert connection.execute(PROMOTE, {"keys": ["acct"]}).scalars().all() == [later]
        assert [r.id for r in _claim(connection, worker)] == [later]
    assert _states(engine) == {later: "running"}


def test_a_finished_head_nobody_holds_is_deleted_and_its_successor_promoted_at_once(
    engine: Engine,
) -> None:
    worker = uuid.uuid4()
    with Session(engine) as session, session.begin():
        ids = [keyed.options(queue_id="acct").enqueue(session, key="acct", seq=n) for n in range(3)]
    assert [_states(engine)[i] for i in ids] == ["pending", "waiting", "waiting"]
    with engine.begin() as connection:
        [claimed] = _claim(connection, worker)
        assert claimed.id == ids[0]
    with engine.begin() as connection:
        assert _succeed(connection, worker, ids[0], claimed.attempt) == [ids[0]]
        assert connection.execute(CLEAR_DONE, {"keys": ["acct"]}).scalars().all() == []
        assert connection.execute(PROMOTE, {"keys": ["acct"]}).scalars().all() == [ids[1]]
        # Promoted once: the key's third job still waits for the second.
        assert connection.execute(PROMOTE, {"keys": ["acct"]}).scalars().all() == []
    assert _states(engine) == {ids[1]: "pending", ids[2]: "waiting"}


def test_a_burst_worker_waits_for_an_enqueue_it_raced_and_runs_its_job(
    SessionLocal: sessionmaker[Session], engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each time the worker tried to clear the key's finished row and found it held.
    parked_tries: list[set[str]] = []
    cleared = KeyPromotion.cleared

    def noting(self: KeyPromotion, results: Sequence[Sequence[Any]], now: float) -> None:
        if results:
            parked_tries.append({row[0] for row in results[0]})
        cleared(self, results, now)

    monkeypatch.setattr(KeyPromotion, "cleared", noting)
    with SessionLocal.begin() as session:
        head = keyed.options(queue_id="acct").enqueue(session, key="acct", seq=0, pause=0.5)
    worker = queue.worker(SessionLocal, concurrency=2, poll_interval=0.05)
    stats: list[Any] = []
    runner = threading.Thread(target=lambda: stats.append(worker.run(burst=True)))
    runner.start()
    wait_for(lambda: _states(engine).get(head) == "running", timeout=10)

    enqueuer = SessionLocal()
    enqueuer.begin()
    later = keyed.options(queue_id="acct").enqueue(enqueuer, key="acct", seq=1)
    # The head finishes while the enqueue is open: its row stays parked as done.
    wait_for(lambda: _states(engine).get(head) == "done", timeout=10)
    # The worker tries to clear the parked row, finds it held by the enqueue's lock (SKIP
    # LOCKED), and must go on trying: counted by its tries, not by the clock.
    before = len(parked_tries)
    try:
        wait_for(
            lambda: sum("acct" in t for t in parked_tries[before:]) >= 3 or not runner.is_alive(),
            timeout=10,
        )
        assert runner.is_alive(), "the burst worker stopped with a job of its key still owed"
        assert _states(engine).get(head) == "done"  # it never got past the enqueue's lock
    finally:
        enqueuer.commit()  # even on failure: the burst worker must be able to end
        enqueuer.close()
    runner.join(timeout=30)
    assert not runner.is_alive()

    assert stats[0].succeeded == 2
    assert _states(engine) == {}
    with SessionLocal() as session:
        order = session.scalars(select(ExecutionLog.job_id).order_by(ExecutionLog.started_at)).all()
    assert order == [head, later]


def test_a_job_due_before_its_running_head_waits_and_breaks_no_claim(engine: Engine) -> None:
    worker = uuid.uuid4()
    with Session(engine) as session, session.begin():
        head = keyed.options(queue_id="acct").enqueue(session, key="acct", seq=0)
    # Due an hour before the head, enqueued before the head starts but committed after:
    # the enqueue saw a head that had not started, so the job is pending, ahead of it.
    enqueuer = Session(engine)
    enqueuer.begin()
    early = keyed.options(
        queue_id="acct", run_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    ).enqueue(enqueuer, key="acct", seq=1)
    with engine.begin() as connection:
        assert [r.id for r in _claim(connection, worker)] == [head]
    enqueuer.commit()
    enqueuer.close()
    with Session(engine) as session, session.begin():
        other = keyed.options(queue_id="other").enqueue(session, key="other", seq=2)
    assert _states(engine) == {head: "running", early: "pending", other: "pending"}
    with engine.begin() as connection:
        # Claiming it would collide with the running head in queue_running_uq and fail the
        # whole batch; the other key's job is claimed instead.
        assert [r.id for r in _claim(connection, worker)] == [other]
    with engine.begin() as connection:
        attempt = connection.execute(select(EX.c.attempt).where(EX.c.id == head)).scalar_one()
        assert _succeed(connection, worker, head, attempt) == [head]
        connection.execute(CLEAR_DONE, {"keys": ["acct"]})
        assert [r.id for r in _claim(connection, worker)] == [early]


def test_a_job_enqueued_behind_a_started_head_waits_whatever_its_due_time(
    engine: Engine,
) -> None:
    worker = uuid.uuid4()
    with Session(engine) as session, session.begin():
        head = keyed.options(queue_id="acct").enqueue(session, key="acct", seq=0)
    with engine.begin() as connection:
        assert [r.id for r in _claim(connection, worker)] == [head]
    with Session(engine) as session, session.begin():
        # Due an hour before the running head: the head has started, and keeps its place.
        early = keyed.options(
            queue_id="acct", run_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
        ).enqueue(session, key="acct", seq=1)
    assert _states(engine) == {head: "running", early: "waiting"}


def test_a_job_enqueued_while_its_key_has_no_head_joins_the_waiting_jobs_in_order(
    engine: Engine,
) -> None:
    worker = uuid.uuid4()
    with Session(engine) as session, session.begin():
        head, first = (
            keyed.options(queue_id="acct").enqueue(session, key="acct", seq=n) for n in range(2)
        )
    with engine.begin() as connection:
        [claimed] = _claim(connection, worker)
    holder = Session(engine)
    holder.begin()
    keyed.options(queue_id="acct").enqueue(holder, key="acct", seq=2)  # holds the head
    with engine.begin() as connection:
        assert _succeed(connection, worker, head, claimed.attempt) == [head]
        assert connection.execute(CLEAR_DONE, {"keys": ["acct"]}).scalars().all() == ["acct"]
    # No pending or running row now, only a parked head and waiting jobs: a new job, due
    # before all of them, still waits, and is promoted first.
    with Session(engine) as session, session.begin():
        early = keyed.options(
            queue_id="acct", run_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
        ).enqueue(session, key="acct", seq=3)
    assert _states(engine)[early] == "waiting"
    holder.commit()
    holder.close()
    with engine.begin() as connection:
        assert connection.execute(CLEAR_DONE, {"keys": ["acct"]}).scalars().all() == []
        assert connection.execute(PROMOTE, {"keys": ["acct"]}).scalars().all() == [early]
    assert _states(engine)[first] == "waiting"


def test_a_batch_with_one_keyed_call_takes_the_keyed_statement(engine: Engine) -> None:
    # Calls without a queue_id take a statement without the key probes; a batch that mixes
    # them must still put its keyed call behind its key's head.
    with Session(engine) as session, session.begin():
        head = keyed.options(queue_id="acct").enqueue(session, key="acct", seq=0)
    with Session(engine) as session, session.begin():
        plain, behind = queue.enqueue_many(
            session,
            [
                keyed.call(key="none", seq=1),
                keyed.options(queue_id="acct").call(key="acct", seq=2),
            ],
        )
        alone = keyed.enqueue(session, key="none", seq=3)
    assert _states(engine) == {
        head: "pending",
        plain: "pending",
        behind: "waiting",
        alone: "pending",
    }
