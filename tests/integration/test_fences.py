"""The fences and the key's head-of-line check, each held where it alone decides (issue 42).

Each test stages, with the worker's own statements on connections of its own, the one state
in which the promise rests on a single predicate: a row that another worker holds at the
very attempt number a stale worker remembers, two pending jobs of one key written by
enqueues that raced, a running row of a key that an old release wrote. Each fails under the
mutant of ``nox -s mutants`` (tests/mutants/catalog.py) that drops that predicate.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, text, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.logic.outcomes import OutcomeKind
from sqla_queue.statements import heartbeat_statement
from sqla_queue.statements.durable import (
    advance_cursor_statement,
    checkpoint_statement,
    lock_execution_statement,
    record_met_statement,
    record_wait_statement,
)
from tests.support.app import keyed, noop, queue, slow_first
from tests.support.lifecycle import claim, complete, execution_row, status_of
from tests.support.running import pretend_claimed, wait_for, worker_thread

pytestmark = pytest.mark.integration

EX = queue.tables.executions
STEPS = queue.tables.job_steps
FAILURE = {"type": "RuntimeError", "message": "boom", "traceback": ""}
DURABLE_WRITES = ("checkpoint", "cursor", "wait", "met", "lock")
HEARTBEAT = heartbeat_statement(queue.tables)


def lose(connection: Connection, job_id: int) -> None:
    """Put a running execution back to pending as the reclaimer does with a lost one: no
    worker, no heartbeat, one more reclaim, the attempt kept (the next claim counts one)."""
    connection.execute(
        update(EX)
        .where(EX.c.id == job_id, EX.c.state == "running")
        .values(state="pending", worker_id=None, alive_at=None, reclaims=EX.c.reclaims + 1)
    )


def claim_one(connection: Connection, worker: uuid.UUID, task: str) -> Any:
    rows = claim(connection, worker, [task])
    assert len(rows) == 1, rows
    return rows[0]


# -- the completion's fence ----------------------------------------------------------------


def test_a_stale_completion_is_refused_while_another_worker_runs_the_job_at_its_attempt(
    engine: Engine,
) -> None:
    """A runs attempt 1 and is lost; B runs attempt 2 and fails the job; an operator
    requeues it (attempts start again at 0) and B claims it: attempt 1 again. A's late
    result for its attempt 1 names the job and the attempt B holds: only the worker tells
    them apart, and it must be refused, leaving B's run as it is."""
    with Session(engine) as session, session.begin():
        job = noop.enqueue(session)
    a, b = uuid.uuid4(), uuid.uuid4()
    with engine.begin() as connection:
        assert claim_one(connection, a, "noop").attempt == 1
    with engine.begin() as connection:
        lose(connection, job)
        assert claim_one(connection, b, "noop").attempt == 2
    with engine.begin() as connection:
        assert complete(connection, b, job, 2, OutcomeKind.FAILED, error=FAILURE) == [job]
    assert status_of(engine, job) == "failed"
    with engine.begin() as connection:
        assert queue.requeue(connection, [job]).requeued == [job]
    with engine.begin() as connection:
        assert claim_one(connection, b, "noop").attempt == 1

    with engine.begin() as connection:
        assert complete(connection, a, job, 1, OutcomeKind.SUCCEEDED, result="stale") == []
    row = execution_row(engine, job)
    assert (row.state, row.worker_id, row.attempt) == ("running", b, 1)
    assert status_of(engine, job) == "queued"
    # The same goes for a stale retry, which would put B's running job back to pending.
    with engine.begin() as connection:
        assert complete(connection, a, job, 1, OutcomeKind.RETRY, error=FAILURE) == []
    assert execution_row(engine, job).state == "running"

    with engine.begin() as connection:
        assert complete(connection, b, job, 1, OutcomeKind.SUCCEEDED, result="b") == [job]
    assert status_of(engine, job) == "succeeded"


def test_a_stale_completion_of_the_same_worker_is_refused_by_its_attempt(
    engine: Engine,
) -> None:
    """A runs attempt 1, is lost, and claims the job again: attempt 2, A's as well. The
    first attempt's late result names the job and the worker that hold it: only the attempt
    tells them apart."""
    with Session(engine) as session, session.begin():
        job = noop.enqueue(session)
    a = uuid.uuid4()
    with engine.begin() as connection:
        assert claim_one(connection, a, "noop").attempt == 1
    with engine.begin() as connection:
        lose(connection, job)
        assert claim_one(connection, a, "noop").attempt == 2
    with engine.begin() as connection:
        assert complete(connection, a, job, 1, OutcomeKind.SUCCEEDED, result="stale") == []
    row = execution_row(engine, job)
    assert (row.state, row.worker_id, row.attempt) == ("running", a, 2)
    with engine.begin() as connection:
        assert complete(connection, a, job, 2, OutcomeKind.SUCCEEDED) == [job]


def test_late_completion_is_fenced_off_while_the_new_attempt_holds_the_row(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """A real worker A runs attempt 1 (3 s); meanwhile its job is lost and B claims it
    (attempt 2) and holds it running. A's result arrives while B's row is there, so only
    the fence stands between A's result and B's run (where B had already finished and
    deleted the row, a completion without any fence would find nothing to write)."""
    with SessionLocal.begin() as session:
        job = slow_first.enqueue(session, seconds=3.0)
    worker_a = queue.worker(
        SessionLocal,
        tasks=["slow_first"],
        heartbeat_interval=60,
        reclaim_interval=60,
        install_signal_handlers=False,
    )
    b = uuid.uuid4()
    with worker_thread(worker_a) as stats_a:
        wait_for(lambda: getattr(execution_row(engine, job), "state", None) == "running")
        # Lost and claimed by B in one transaction, so that A's poller never sees it pending.
        with engine.begin() as connection:
            lose(connection, job)
            assert claim_one(connection, b, "slow_first").attempt == 2
        wait_for(
            lambda: worker_a.decider is not None and worker_a.decider.stats["fenced"] == 1,
            timeout=15,
        )
        row = execution_row(engine, job)
        assert (row.state, row.worker_id, row.attempt) == ("running", b, 2)
        assert status_of(engine, job) == "queued"
    assert (stats_a[0].fenced, stats_a[0].succeeded) == (1, 0)
    with engine.begin() as connection:
        assert complete(connection, b, job, 2, OutcomeKind.SUCCEEDED, result="b") == [job]
    with engine.connect() as connection:
        result = connection.execute(
            text(f"SELECT result FROM {queue.tables.jobs.fullname} WHERE id = :id"), {"id": job}
        ).scalar_one()
    assert result == "b"


def test_a_stale_heartbeat_neither_renews_nor_keeps_another_workers_run(engine: Engine) -> None:
    """A runs attempt 1 and is lost; B runs attempt 2 and fails the job; it is requeued and
    B claims it at attempt 1 again. A's beat for its attempt 1 names the job and the attempt
    B holds: it must not report the job as A's own (A would go on running it beside B) nor
    stamp B's execution alive."""
    with Session(engine) as session, session.begin():
        job = noop.enqueue(session)
    a, b = uuid.uuid4(), uuid.uuid4()
    with engine.begin() as connection:
        assert claim_one(connection, a, "noop").attempt == 1
    with engine.begin() as connection:
        lose(connection, job)
        assert claim_one(connection, b, "noop").attempt == 2
        assert complete(connection, b, job, 2, OutcomeKind.FAILED, error=FAILURE) == [job]
    with engine.begin() as connection:
        assert queue.requeue(connection, [job]).requeued == [job]
    with engine.begin() as connection:
        assert claim_one(connection, b, "noop").attempt == 1
    before = execution_row(engine, job).alive_at

    with engine.begin() as connection:
        assert beat(connection, a, job, 1) == []
    row = execution_row(engine, job)
    assert (row.state, row.worker_id, row.attempt, row.alive_at) == ("running", b, 1, before)
    with engine.begin() as connection:
        assert beat(connection, b, job, 1) == [(job, False)]
    assert execution_row(engine, job).alive_at != before


def beat(connection: Connection, worker: uuid.UUID, job: int, attempt: int) -> list[Any]:
    """The worker's heartbeat for one held execution: the rows it says are still its own."""
    params = {"worker": worker, "ids": [job], "attempts": [attempt], "hostname": "h"}
    params |= {"pid": 1, "tasks": ["noop"], "concurrency": 1}
    return [tuple(r) for r in connection.execute(HEARTBEAT, params)]


# -- the durable checkpoint's fence --------------------------------------------------------


def _fence(job: int, attempt: int, worker: uuid.UUID) -> dict[str, Any]:
    return {"job": job, "held_attempt": attempt, "worker": worker}


def _step(name: str, kind: str) -> dict[str, Any]:
    return {"step": name, "step_kind": kind, "step_version": 1}


def _durable_writes(connection: Connection, fence: dict[str, Any]) -> dict[str, list[Any]]:
    """Each fenced statement of a durable handler, for the attempt ``fence`` names: the
    rows each wrote (its job's id when it was let through)."""
    tables = queue.tables
    runs: dict[str, tuple[Any, dict[str, Any]]] = {
        "checkpoint": (
            checkpoint_statement(tables),
            {**_step("step", "step"), "step_result": "1", "step_compensate": None},
        ),
        "cursor": (
            advance_cursor_statement(tables),
            {**_step("cursor", "cursor"), "step_result": "2", "expected": "1"},
        ),
        "wait": (record_wait_statement(tables), {**_step("wait", "wait"), "timeout": 60.0}),
        "met": (
            record_met_statement(tables),
            {**_step("met", "wait"), "step_result": json.dumps({"met": True, "value": 1})},
        ),
        "lock": (lock_execution_statement(tables), {}),
    }
    written: dict[str, list[Any]] = {}
    for name, (statement, params) in runs.items():
        written[name] = [r[0] for r in connection.execute(statement, {**fence, **params})]
    return written


@pytest.mark.parametrize("stale", ["older attempt", "other worker"])
def test_a_stale_attempts_checkpoint_cursor_and_wait_record_are_refused(
    engine: Engine, stale: str
) -> None:
    """B holds the job at attempt 2. An attempt that no longer holds it, whether an older
    attempt of B itself or another worker's at attempt 2 (attempts go back: a suspension
    and a requeue give them back), commits no step, moves no cursor, records no wait and
    locks nothing; B's own attempt does all of them."""
    with Session(engine) as session, session.begin():
        job = noop.enqueue(session)
    b = uuid.uuid4()
    with engine.begin() as connection:
        pretend_claimed(connection, job, worker=b, attempt=2)
        # The cursor stands at 1: a stale batch that read it there must not move it.
        connection.execute(
            STEPS.insert().values(
                job_id=job, name="cursor", kind="cursor", version=1, attempt=1, result=1
            )
        )
    fence = _fence(job, 1, b) if stale == "older attempt" else _fence(job, 2, uuid.uuid4())
    with engine.begin() as connection:
        written = _durable_writes(connection, fence)
    assert written == {name: [] for name in DURABLE_WRITES}
    with engine.connect() as connection:
        steps = connection.execute(
            text(f"SELECT name, result FROM {STEPS.fullname} WHERE job_id = :id"), {"id": job}
        ).all()
    assert [tuple(s) for s in steps] == [("cursor", 1)]

    with engine.begin() as connection:
        written = _durable_writes(connection, _fence(job, 2, b))
    assert written == {name: [job] for name in DURABLE_WRITES}


# -- the claim's key checks ----------------------------------------------------------------


def test_two_raced_keyed_enqueues_are_claimed_one_at_a_time(engine: Engine) -> None:
    """Two enqueues of one key in concurrent transactions: neither sees the other's job,
    so both write it pending. A claim must still take only the first in (execute_at, id)
    order, the second once the first has finished; taking both would run the key twice
    (here, fail the claim on ``queue_running_uq``)."""
    with Session(engine) as one, Session(engine) as two:
        one.execute(text("SET LOCAL lock_timeout = '5s'"))
        two.execute(text("SET LOCAL lock_timeout = '5s'"))
        first = keyed.options(queue_id="acct").enqueue(one, key="acct", seq=0)
        second = keyed.options(queue_id="acct").enqueue(two, key="acct", seq=1)
        one.commit()
        two.commit()
    assert first < second
    with engine.connect() as connection:
        found = connection.execute(
            text(f"SELECT id, state FROM {EX.fullname} WHERE queue_id = 'acct'")
        ).all()
    states: dict[int, str] = {row.id: row.state for row in found}
    assert states == {first: "pending", second: "pending"}, "the enqueues did not race"
    w = uuid.uuid4()
    with engine.begin() as connection:
        rows = claim(connection, w, ["keyed"])
    assert [r.id for r in rows] == [first]
    with engine.begin() as connection:
        assert claim(connection, w, ["keyed"]) == []
        assert complete(connection, w, first, rows[0].attempt) == [first]
    with engine.begin() as connection:
        assert [r.id for r in claim(connection, w, ["keyed"])] == [second]


def test_a_job_due_before_a_running_row_of_an_old_release_waits_for_it(engine: Engine) -> None:
    """A running row written by a release before every claim set ``lease_seconds`` (NULL
    there) does not count as "started" for the key; a pending job of its key due before
    it is first in line, yet must not be claimed while it runs: only the claim's "nothing
    of the key is running" probe sees it."""
    with Session(engine) as session, session.begin():
        running = keyed.options(queue_id="acct").enqueue(session, key="acct", seq=0)
    with engine.begin() as connection:
        pretend_claimed(connection, running, lease_seconds=None)
    with Session(engine) as session, session.begin():
        early = keyed.options(queue_id="acct").enqueue(session, key="acct", seq=1)
    with engine.begin() as connection:
        # As the old release's enqueue wrote it: pending, due an hour before the running one.
        connection.execute(
            update(EX)
            .where(EX.c.id == early)
            .values(state="pending", execute_at=func.now() - text("interval '1 hour'"))
        )
    w = uuid.uuid4()
    with engine.begin() as connection:
        assert claim(connection, w, ["keyed"]) == []
    assert execution_row(engine, early).state == "pending"
