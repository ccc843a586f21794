"""A key's head keeps its place on every path that puts a job back or moves it.

Jobs of one ``queue_id`` run one at a time, in the order they were enqueued (for jobs
without a due time of their own). A job that has started stays its key's head until it
finishes: a retry, a reschedule, a hand-back at shutdown, a reclaim, a pause of its task
and a cancel of the jobs behind it leave it first, whatever its new due time, and a
requeued job goes back in line behind the key's queued jobs.

Each test drives the worker's own statements (claim, completion, the promotion of the
keys of a flush, the reclaim and cleanup sweeps) on its own connections, in the order a
worker sends them, so that each path happens for certain rather than by chance; one
runs real workers for the hand-back at shutdown that the issue reports.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import statements
from sqla_queue.logic.outcomes import Outcome, OutcomeKind
from tests.support.app import ExecutionLog, keyed, queue
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration

EX = queue.tables.executions
CLAIM = statements.claim_statement(queue.tables)
LIMITED_CLAIM = statements.claim_statement(queue.tables, limited=True)
COMPLETE = statements.complete_statement(queue.tables)
CLEAR_DONE = statements.clear_done_statement(queue.tables)
PROMOTE = statements.promote_statement(queue.tables)
RECLAIM = statements.reclaim_statement(queue.tables)
CLEANUP = statements.cleanup_statement(queue.tables)
SWEEP = statements.orphan_sweep_statement(queue.tables)
ERROR = {"type": "RuntimeError", "message": "on purpose"}


def _claim(connection: Connection, worker: uuid.UUID, tasks: list[str] | None = None) -> list[Any]:
    params = {
        "tasks": tasks or ["keyed", "echo"],
        "batch": 10,
        "worker": worker,
        "lease": 30.0,
        "lease_map": "{}",
    }
    return [r for r in connection.execute(CLAIM, params).all() if r.id is not None]


def _claimed_ids(engine: Engine, worker: uuid.UUID, tasks: list[str] | None = None) -> list[int]:
    with engine.begin() as connection:
        return [r.id for r in _claim(connection, worker, tasks)]


def _outcome(
    engine: Engine, worker: uuid.UUID, job_id: int, kind: OutcomeKind, **extra: Any
) -> None:
    """Write one outcome, then promote its key, as the worker's flush does."""
    with engine.begin() as connection:
        attempt = connection.execute(select(EX.c.attempt).where(EX.c.id == job_id)).scalar_one()
        outcome = Outcome(job_id, attempt, kind, **extra).as_row()
        params = {"outcomes": json.dumps([outcome]), "worker": worker}
        assert [row[0] for row in connection.execute(COMPLETE, params)] == [job_id]
        _promote(connection, ["k"])


def _promote(connection: Connection, keys: list[str]) -> list[int]:
    connection.execute(CLEAR_DONE, {"keys": keys})
    return list(connection.execute(PROMOTE, {"keys": keys}).scalars())


def _enqueue_key(engine: Engine, count: int, task: Any = keyed) -> list[int]:
    """``count`` jobs of key "k", one transaction each, in order."""
    ids = []
    for seq in range(count):
        with Session(engine) as session, session.begin():
            ids.append(task.options(queue_id="k").enqueue(session, key="k", seq=seq))
    return ids


def _states(engine: Engine) -> dict[int, str]:
    with engine.connect() as connection:
        return dict(connection.execute(select(EX.c.id, EX.c.state)).all())


def _drain_in_order(engine: Engine, worker: uuid.UUID) -> list[int]:
    """Claim and succeed the key's jobs one at a time; the order they ran in."""
    order: list[int] = []
    for _ in range(10):
        claimed = _claimed_ids(engine, worker)
        if not claimed:
            if not _states(engine):
                return order
            with engine.begin() as connection:  # a parked row: the sweep clears it
                keys = [k for k in connection.execute(CLEANUP, {"limit": 100}).scalars() if k]
                _promote(connection, keys)
            continue
        assert len(claimed) == 1, f"two jobs of one key claimed at once: {claimed}"
        order.extend(claimed)
        _outcome(engine, worker, claimed[0], OutcomeKind.SUCCEEDED)
    raise AssertionError(f"the key did not drain: {_states(engine)}")


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        (OutcomeKind.RELEASE, {}),
        (OutcomeKind.RETRY, {"error": ERROR, "delay": 0.0}),
        (OutcomeKind.RESCHEDULE, {"delay": 0.0}),
    ],
    ids=["hand-back at shutdown", "retry", "reschedule"],
)
def test_a_head_put_back_to_pending_runs_before_the_jobs_behind_it(
    engine: Engine, kind: OutcomeKind, extra: dict[str, Any]
) -> None:
    worker = uuid.uuid4()
    a, b, c = _enqueue_key(engine, 3)
    assert _claimed_ids(engine, worker) == [a]
    # Back to pending, due now: after b and c in (execute_at, id), first in its key.
    _outcome(engine, worker, a, kind, **extra)
    assert _states(engine) == {a: "pending", b: "waiting", c: "waiting"}
    assert _drain_in_order(engine, worker) == [a, b, c]


def test_a_head_retried_for_later_holds_its_key_until_it_runs(engine: Engine) -> None:
    worker = uuid.uuid4()
    a, b = _enqueue_key(engine, 2)
    assert _claimed_ids(engine, worker) == [a]
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    _outcome(engine, worker, a, OutcomeKind.RETRY, error=ERROR, execute_at=later)
    with engine.begin() as connection:
        # Every sweep that promotes keys leaves b waiting: a has started.
        assert _promote(connection, ["k"]) == []
        assert connection.execute(SWEEP, {"after": "", "limit": 100}).one().promoted == 0
    # A job enqueued now, due before a's retry, waits too.
    with Session(engine) as session, session.begin():
        c = keyed.options(queue_id="k").enqueue(session, key="k", seq=2)
    assert _states(engine) == {a: "pending", b: "waiting", c: "waiting"}
    assert _claimed_ids(engine, worker) == []
    with engine.begin() as connection:
        connection.execute(
            update(EX).where(EX.c.id == a).values(execute_at=dt.datetime.now(dt.UTC))
        )
    assert _drain_in_order(engine, worker) == [a, b, c]


def test_a_reclaimed_head_runs_before_a_job_due_before_it(engine: Engine) -> None:
    """Reclaimed, a lost head keeps its due time; a job enqueued while it ran with an
    earlier due time still waits for it."""
    worker = uuid.uuid4()
    [a] = _enqueue_key(engine, 1)
    assert _claimed_ids(engine, worker) == [a]
    with Session(engine) as session, session.begin():
        early = keyed.options(
            queue_id="k", run_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
        ).enqueue(session, key="k", seq=1)
    with engine.begin() as connection:
        connection.execute(
            text(f"UPDATE {queue.tables.schema}.{EX.name} SET alive_at = now() - interval '1h'")
        )
        assert [r.id for r in connection.execute(RECLAIM, {"held": []})] == [a]
        assert connection.execute(SWEEP, {"after": "", "limit": 100}).one().promoted == 0
    assert _states(engine) == {a: "pending", early: "waiting"}
    assert _drain_in_order(engine, uuid.uuid4()) == [a, early]


@pytest.mark.parametrize("behind", [True, False], ids=["job behind", "retried head"])
def test_a_cancel_in_a_key_keeps_the_order_of_the_rest(engine: Engine, behind: bool) -> None:
    worker = uuid.uuid4()
    a, b, c = _enqueue_key(engine, 3)
    assert _claimed_ids(engine, worker) == [a]
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    _outcome(engine, worker, a, OutcomeKind.RETRY, error=ERROR, execute_at=later)
    cancelled = b if behind else a
    assert queue.cancel(engine, [cancelled]) == {cancelled: "cancelled"}
    with engine.begin() as connection:
        # The sweep deletes the parked row and promotes its key, where its turn has come.
        keys = list(connection.execute(CLEANUP, {"limit": 100}).scalars())
        assert keys == ["k"]
        promoted = _promote(connection, keys)
    if behind:
        assert promoted == []
        assert _states(engine) == {a: "pending", c: "waiting"}
        with engine.begin() as connection:
            connection.execute(
                update(EX).where(EX.c.id == a).values(execute_at=dt.datetime.now(dt.UTC))
            )
        assert _drain_in_order(engine, worker) == [a, c]
    else:
        assert promoted == [b]
        assert _drain_in_order(engine, worker) == [b, c]


def test_a_paused_head_holds_its_key_against_other_tasks(engine: Engine) -> None:
    """The key's head is of a task now paused; the next job, of another task, waits."""
    from tests.support.app import echo

    worker = uuid.uuid4()
    with Session(engine) as session, session.begin():
        a = keyed.options(queue_id="k").enqueue(session, key="k", seq=0)
    with Session(engine) as session, session.begin():
        b = echo.options(queue_id="k").enqueue(session, value="b")
    assert _claimed_ids(engine, worker) == [a]
    _outcome(engine, worker, a, OutcomeKind.RETRY, error=ERROR, delay=0.0)
    # "keyed" is paused: workers claim "echo" alone.
    assert _claimed_ids(engine, worker, ["echo"]) == []
    with engine.begin() as connection:
        assert connection.execute(SWEEP, {"after": "", "limit": 100}).one().promoted == 0
    assert _claimed_ids(engine, worker, ["echo"]) == []
    # Resumed: a runs, then b.
    assert _drain_in_order(engine, worker) == [a, b]


@pytest.mark.parametrize("parked", [True, False], ids=["parked execution", "no execution"])
def test_a_requeued_keyed_job_goes_back_in_line(engine: Engine, parked: bool) -> None:
    worker = uuid.uuid4()
    a, b, c = _enqueue_key(engine, 3)
    if parked:
        # Cancelled while queued: its execution stays parked until a sweep deletes it.
        assert queue.cancel(engine, [a]) == {a: "cancelled"}
    else:
        assert _claimed_ids(engine, worker) == [a]
        _outcome(engine, worker, a, OutcomeKind.FAILED, error=ERROR)
    with engine.begin() as connection:
        _promote(connection, list(connection.execute(CLEANUP, {"limit": 100}).scalars()))
    assert _claimed_ids(engine, worker) == [b]
    _outcome(engine, worker, b, OutcomeKind.RETRY, error=ERROR, delay=0.0)
    with Session(engine) as session, session.begin():
        assert queue.requeue(session, [a]) == [a]
    # b has started and keeps the key; c was waiting before a came back.
    assert _states(engine) == {a: "waiting", b: "pending", c: "waiting"}
    assert _drain_in_order(engine, worker) == [b, c, a]


def test_a_requeue_into_an_idle_key_is_pending(engine: Engine) -> None:
    worker = uuid.uuid4()
    [a] = _enqueue_key(engine, 1)
    assert _claimed_ids(engine, worker) == [a]
    _outcome(engine, worker, a, OutcomeKind.FAILED, error=ERROR)
    with Session(engine) as session, session.begin():
        assert queue.requeue(session, [a]) == [a]
    assert _states(engine) == {a: "pending"}
    with engine.connect() as connection:
        lease = connection.execute(select(EX.c.lease_seconds).where(EX.c.id == a)).scalar()
    assert lease is None


def test_rows_written_by_an_older_release_keep_the_started_head_first(engine: Engine) -> None:
    """A schema upgrade mid-flight: version 2 wrote a key's later jobs ``pending``, and
    its workers retried a head to a later time. The current claim still runs that head
    before the jobs that came after it."""
    worker = uuid.uuid4()
    a, b = _enqueue_key(engine, 2)
    assert _claimed_ids(engine, worker) == [a]
    with engine.begin() as connection:
        # As the version-2 release left them: b pending behind the running head.
        connection.execute(update(EX).where(EX.c.id == b).values(state="pending"))
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    with engine.begin() as connection:
        attempt = connection.execute(select(EX.c.attempt).where(EX.c.id == a)).scalar_one()
        # That release's completion: back to pending at the retry time, no promotion.
        outcome = Outcome(a, attempt, OutcomeKind.RETRY, error=ERROR, execute_at=later).as_row()
        connection.execute(COMPLETE, {"outcomes": json.dumps([outcome]), "worker": worker})
    assert _claimed_ids(engine, worker) == []
    wait_for(lambda: dt.datetime.now(dt.UTC) > later, timeout=5)
    assert _drain_in_order(engine, worker) == [a, b]


def test_a_lost_slot_race_leaves_the_key_in_order(engine: Engine) -> None:
    """Two claims race for the one seat of a limited task: the loser's claim, a keyed
    head among its picks, fails on the seat and rolls back whole, and the head keeps its
    place."""
    with Session(engine) as session, session.begin():
        queue.set_limit(session, "keyed", 1)
        plain = keyed.enqueue(session, key="-", seq=9)
    a, b = _enqueue_key(engine, 2)
    params = {
        "tasks": ["keyed"],
        "batch": 1,
        "lease": 30.0,
        "lease_map": "{}",
        "limit_map": "{}",
        "seat_offset": 0,
    }
    errors: list[BaseException] = []

    def lose() -> None:
        # Its snapshot cannot see the winner's seat: it gives seat 0 to the key's head,
        # waits on the winner's row in the slot index, and collides once that commits.
        try:
            with engine.begin() as connection:
                connection.execute(LIMITED_CLAIM, {**params, "worker": uuid.uuid4()}).all()
        except IntegrityError as exc:
            errors.append(exc)

    with engine.connect() as winner:
        winner.begin()
        won = [r.id for r in winner.execute(LIMITED_CLAIM, {**params, "worker": uuid.uuid4()})]
        assert won == [plain]
        thread = threading.Thread(target=lose, daemon=True)
        thread.start()
        wait_for(lambda: _waiting_on_a_lock(engine), timeout=10)
        winner.commit()
        thread.join(10)
    assert len(errors) == 1 and "slot_uq" in str(errors[0])
    assert _states(engine) == {a: "pending", b: "waiting", plain: "running"}
    with engine.begin() as connection:
        connection.execute(EX.delete().where(EX.c.id == plain))
    assert _drain_in_order(engine, uuid.uuid4()) == [a, b]


def _waiting_on_a_lock(engine: Engine) -> bool:
    with engine.connect() as connection:
        query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        return bool(connection.exec_driver_sql(query).scalar())


def test_a_worker_stopped_while_it_runs_a_head_hands_it_back_in_place(
    SessionLocal: sessionmaker[Session], engine: Engine
) -> None:
    """The issue's report: A then B with one queue_id; the worker running A is stopped
    gracefully and hands A back; the next worker runs A before B."""
    with SessionLocal.begin() as session:
        a = keyed.options(queue_id="k").enqueue(session, key="k", seq=0, pause=1.5)
    with SessionLocal.begin() as session:
        b = keyed.options(queue_id="k").enqueue(session, key="k", seq=1)
    first = queue.worker(SessionLocal, tasks=["keyed"], poll_interval=0.05, shutdown_timeout=0.2)
    with worker_thread(first):
        wait_for(lambda: _states(engine).get(a) == "running", timeout=10)
    assert _states(engine) == {a: "pending", b: "waiting"}
    handed_back = dt.datetime.now(dt.UTC)
    second = queue.worker(SessionLocal, tasks=["keyed"], poll_interval=0.05)
    assert second.run(burst=True).succeeded == 2
    with SessionLocal() as session:
        # The abandoned first run of a logs itself too, when its sleep ends: left out.
        runs = session.scalars(
            select(ExecutionLog.job_id)
            .where(ExecutionLog.started_at >= handed_back)
            .order_by(ExecutionLog.started_at)
        ).all()
    assert runs == [a, b]
