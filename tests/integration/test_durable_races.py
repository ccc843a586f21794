"""Durable races of issue 30, forced with held-open transactions on separate connections.

Each test stages the interleaving it names: one transaction holds its locks open at a
precise point (a handler paused at a :class:`~tests.support.durable_races.Hold`, or the
flows of a staged attempt sent on a connection the test holds), another runs into them
(in a thread, which must block, or which must skip the row), and then the first commits.
Then a real worker finishes the job, to show that nothing was lost and nothing ran twice.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.conversation import drive
from sqla_queue.durable.admin import Signalled, StepRecord
from sqla_queue.durable.conditions import LOCKED_ROW_RECHECK
from sqla_queue.durable.run import Suspension
from sqla_queue.errors import StepNotCommittedError
from sqla_queue.statements.liveness import reclaim_statement
from sqla_queue.workflows.admin import cancel_jobs_flow
from sqla_queue.workflows.advance import ReleaseStatements
from tests.support.app import Shipment, StepWrite
from tests.support.durable_app import dj_until, shipped
from tests.support.durable_checks import outcome
from tests.support.durable_races import (
    StagedAttempt,
    dr_cancel_race,
    dr_relay,
    dr_wait_held,
    hold,
    pid_of,
    queue,
    reset_holds,
)
from tests.support.running import Blocked, pretend_claimed, wait_for

pytestmark = pytest.mark.integration

JOBS = queue.tables.jobs
EX = queue.tables.executions
RECLAIM = reclaim_statement(queue.tables)
#: An execution whose worker was last heard of an hour ago, on a 30 s lease: overdue.
LOST = {"alive_for": dt.timedelta(hours=1), "lease_seconds": 30.0}


def drain(SessionLocal: sessionmaker[Session]) -> None:
    """Run a sync worker until nothing is claimable."""
    queue.worker(SessionLocal, concurrency=2).run(burst=True)


@pytest.fixture
def background(SessionLocal: sessionmaker[Session]) -> Iterator[Callable[[], Blocked]]:
    """Start a burst worker in a thread (its handlers pause at their holds); at the end,
    open every hold and wait for the workers, before the test's database goes."""
    started: list[Blocked] = []

    def start() -> Blocked:
        started.append(Blocked(lambda: drain(SessionLocal)))
        return started[-1]

    yield start
    reset_holds()
    for each in started:
        each.thread.join(15)


def recheck_due(engine: Engine, job_id: int) -> bool:
    """Whether job ``job_id``'s suspension is due (its recheck or its deadline came)."""
    with engine.connect() as connection:
        due = select(EX.c.execute_at <= text("now()")).where(EX.c.id == job_id)
        return bool(connection.scalar(due))


def executions(engine: Engine, job_id: int) -> list[Any]:
    """Job ``job_id``'s execution rows (there is one at most, or none once it ended)."""
    with engine.connect() as connection:
        return list(
            connection.execute(
                select(EX.c.state, EX.c.wait, EX.c.worker_id, EX.c.attempt, EX.c.reclaims).where(
                    EX.c.id == job_id
                )
            ).all()
        )


def writes(engine: Engine, job_id: int) -> list[str]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(StepWrite.step).where(StepWrite.job_id == job_id).order_by(StepWrite.step)
        ).all()
    return [r.step for r in rows]


def refunds(engine: Engine) -> list[str]:
    """The compensations that ran (``dj_refund`` writes one row each), by what they undid."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(StepWrite.step).where(StepWrite.step.like("refund:%")).order_by(StepWrite.step)
        ).all()
    return [r.step for r in rows]


def blocked_behind(monitor: Engine, pid: int) -> list[tuple[int, str]]:
    """``(pid, query)`` of the server processes waiting for a lock that ``pid`` holds."""
    with monitor.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT pid, query FROM pg_stat_activity "
                "WHERE CAST(:holder AS integer) = ANY(pg_blocking_pids(pid))"
            ),
            {"holder": pid},
        ).all()
    return [(int(r.pid), str(r.query)) for r in rows]


def signal(bind: Any, job_id: int, name: str, payload: Any = None) -> Signalled:
    """``queue.signal`` on a sync ``bind``, in its transaction."""
    sent = queue.signal(bind, job_id, name, payload)
    assert isinstance(sent, Signalled)
    return sent


def steps_of(SessionLocal: sessionmaker[Session], job_id: int) -> list[StepRecord]:
    """Job ``job_id``'s committed checkpoints (``queue.job_steps``)."""
    with SessionLocal() as session:
        steps = queue.job_steps(session, job_id)
    assert isinstance(steps, list)
    return steps


def reclaim(connection: Connection) -> list[int]:
    """The reclaim sweep of a worker that runs nothing itself: the ids it put back."""
    return [row.id for row in connection.execute(RECLAIM, {"held": []})]


def staged(engine: Engine, job_id: int, **claim: Any) -> StagedAttempt:
    """Job ``job_id`` claimed by a worker that this test plays (attempt 1)."""
    worker = uuid.uuid4()
    with engine.begin() as connection:
        pretend_claimed(connection, job_id, worker=worker, **claim)
    return StagedAttempt(job_id, worker_id=worker)


def relay_after_before(
    engine: Engine, SessionLocal: sessionmaker[Session], **claim: Any
) -> tuple[int, StagedAttempt]:
    """A ``dr_relay`` job whose staged attempt committed step ``before``."""
    with SessionLocal.begin() as session:
        job = dr_relay.enqueue(session)
    attempt = staged(engine, job, **claim)
    with engine.begin() as connection:
        attempt.step(connection, "before")
    return job, attempt


# -- a signal against the start of its wait ------------------------------------------------


def test_a_wait_that_begins_while_a_signal_is_uncommitted_waits_for_it_and_goes_on(
    engine: Engine,
    owner_engine: Engine,
    SessionLocal: sessionmaker[Session],
    background: Callable[[], Blocked],
) -> None:
    with SessionLocal.begin() as session:
        job = dr_wait_held.enqueue(session, "signal-first")
    at_wait = hold("signal-first")
    worker = background()
    at_wait.reached()  # the job is claimed and running; its handler is about to wait
    with engine.connect() as sender:
        sender.begin()
        sent = signal(sender, job, "approved", {"by": "ada"})
        assert (sent.stored, sent.woke) == (True, False)
        at_wait.open()
        # The wait does not wait for the sender, whose transaction may stay open as long
        # as the application likes: it finds the job's signal lock taken, and suspends
        # to ask again a moment later. Its seat is free, and the burst run ends.
        sender_pid = pid_of(sender)
        wait_for(lambda: executions(engine, job)[0].state == "suspended", timeout=10)
        worker.value()
        assert blocked_behind(owner_engine, sender_pid) == []
        sender.commit()
    # When the recheck is due, the job runs again and finds the signal.
    wait_for(lambda: recheck_due(engine, job), timeout=10)
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", {"by": "ada"})
    # It found the signal on its second run; the wait is recorded as met, with the
    # payload, so that a replay goes on without asking again. The wait cost no attempt.
    assert [(s.name, s.result) for s in steps_of(SessionLocal, job)] == [
        ("signal:approved", {"met": True, "value": {"by": "ada"}})
    ]
    with engine.connect() as connection:
        attempts = connection.execute(select(JOBS.c.attempts).where(JOBS.c.id == job))
        assert attempts.scalar_one() == 1


def test_a_signal_sent_while_the_wait_suspends_waits_for_it_and_wakes_the_job(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    job, attempt = relay_after_before(engine, SessionLocal)
    with engine.connect() as waiter, engine.connect() as sender:
        waiter.begin()
        decided = attempt.wait_for_signal(waiter, "go")
        assert isinstance(decided, Suspension)  # locked, probed, suspended: not committed
        sender.begin()
        signalling = Blocked(lambda: signal(sender, job, "go", "payload"))
        assert signalling.still_waiting(), "the signal did not wait for the suspension"
        waiter.commit()
        sent = signalling.value()
        assert (sent.stored, sent.woke) == (True, True)
        sender.commit()
    (row,) = executions(engine, job)
    assert (row.state, row.wait, row.worker_id, row.attempt) == ("pending", None, None, 0)
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "payload")
    assert writes(engine, job) == ["after", "before"]


# -- a cancel against a running step -------------------------------------------------------


def test_a_cancel_waits_for_a_step_in_its_commit_then_the_job_ends_cancelled(
    engine: Engine,
    owner_engine: Engine,
    SessionLocal: sessionmaker[Session],
    background: Callable[[], Blocked],
) -> None:
    with SessionLocal.begin() as session:
        job = dr_cancel_race.enqueue(session, "in-commit", "commit")
    in_commit, between = hold("in-commit"), hold("in-commit:between")
    worker = background()
    in_commit.reached()  # the checkpoint of "first" ran: it holds the execution FOR SHARE
    assert in_commit.pid is not None
    cancelling = Blocked(lambda: queue.cancel(engine, [job]))
    assert cancelling.still_waiting(), "the cancel did not wait for the step"
    # The cancel's statement, not only the heartbeat, waits for the step's transaction.
    waiting = blocked_behind(owner_engine, in_commit.pid)
    assert any(query.startswith("WITH asked") for _, query in waiting), waiting
    in_commit.open()
    assert cancelling.value() == {job: "requested"}
    between.reached()
    assert writes(engine, job) == ["first"]  # the step committed with its write
    between.open()
    worker.value()
    # The next step was refused: the job stops, cancelled.
    assert in_commit.refused == [("second", "cancelled")]
    assert outcome(engine, job)[0] == "cancelled"
    assert writes(engine, job) == ["first"]
    drain(SessionLocal)  # the maintenance sweep enqueues the compensation; run it
    assert refunds(engine) == ["refund:first"]
    drain(SessionLocal)  # a second sweep enqueues it no more
    assert refunds(engine) == ["refund:first"]
    (first,) = steps_of(SessionLocal, job)
    assert first.name == "first" and first.compensated_by is not None


def test_a_step_after_an_uncommitted_cancel_waits_then_is_refused(
    engine: Engine,
    owner_engine: Engine,
    SessionLocal: sessionmaker[Session],
    background: Callable[[], Blocked],
) -> None:
    with SessionLocal.begin() as session:
        job = dr_cancel_race.enqueue(session, "in-step", "writes")
    in_step = hold("in-step")
    worker = background()
    in_step.reached()  # "first" wrote its row; its checkpoint is next
    with engine.connect() as cancelling:
        cancelling.begin()
        release = ReleaseStatements(queue.tables, notify=True)
        assert drive(cancelling, cancel_jobs_flow(queue.tables, release, [job])) == {
            job: "requested"
        }
        in_step.open()
        # The checkpoint reads the execution FOR SHARE: it waits for the cancel's lock.
        cancel_pid = pid_of(cancelling)
        wait_for(
            lambda: in_step.pid in {pid for pid, _ in blocked_behind(owner_engine, cancel_pid)},
            timeout=10,
        )
        cancelling.commit()
    worker.value()
    assert in_step.refused == [("first", "cancelled")]
    assert outcome(engine, job)[0] == "cancelled"
    assert writes(engine, job) == []  # the step's write was rolled back with it
    drain(SessionLocal)  # its maintenance sweep finds nothing to compensate
    assert steps_of(SessionLocal, job) == []
    assert refunds(engine) == []  # no step committed: nothing to undo


# -- a wake against a reclaim --------------------------------------------------------------


def test_a_reclaim_skips_an_overdue_job_that_suspends(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    job, attempt = relay_after_before(engine, SessionLocal, **LOST)
    with engine.connect() as waiter, engine.connect() as reclaimer:
        waiter.begin()
        assert isinstance(attempt.wait_for_signal(waiter, "go"), Suspension)
        reclaimer.begin()
        sweeping = Blocked(lambda: reclaim(reclaimer))
        assert sweeping.value() == []  # skipped: the waiter holds the row
        reclaimer.commit()
        waiter.commit()
    with engine.begin() as connection:
        assert reclaim(connection) == []  # suspended: no lease to be overdue on
    (row,) = executions(engine, job)
    assert (row.state, row.wait, row.worker_id, row.reclaims) == (
        "suspended",
        "signal:go",
        None,
        0,
    )
    with SessionLocal.begin() as session:
        assert signal(session, job, "go", 1).woke
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", 1)
    assert writes(engine, job) == ["after", "before"]


def test_a_wait_of_a_lost_attempt_after_an_uncommitted_reclaim_is_refused(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    job, attempt = relay_after_before(engine, SessionLocal, **LOST)
    with engine.connect() as reclaimer, engine.connect() as waiter:
        reclaimer.begin()
        assert reclaim(reclaimer) == [job]
        waiter.begin()
        waiting = Blocked(lambda: attempt.wait_for_signal(waiter, "go"))
        assert waiting.still_waiting(), "the wait did not wait for the reclaim"
        reclaimer.commit()
        with pytest.raises(StepNotCommittedError) as refused:
            waiting.value()
        assert refused.value.reason == "lost"
        waiter.rollback()
    (row,) = executions(engine, job)
    assert (row.state, row.wait, row.worker_id, row.reclaims) == ("pending", None, None, 1)
    drain(SessionLocal)  # the next attempt replays "before" and suspends on the signal
    assert executions(engine, job)[0].state == "suspended"
    with SessionLocal.begin() as session:
        assert signal(session, job, "go", 2).woke
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", 2)
    assert writes(engine, job) == ["after", "before"]


@pytest.mark.parametrize("first", ["signal", "reclaim"])
def test_a_signal_racing_the_reclaim_of_a_lost_running_job_leaves_one_run(
    engine: Engine, SessionLocal: sessionmaker[Session], first: str
) -> None:
    job, attempt = relay_after_before(engine, SessionLocal, **LOST)
    with engine.connect() as sender, engine.connect() as reclaimer:
        sender.begin()
        reclaimer.begin()
        # The sender locks no row of the queue, and the reclaim touches no signal: in
        # either order, neither waits for the other's open transaction.
        if first == "signal":
            sent = signal(sender, job, "go", "late")
            assert Blocked(lambda: reclaim(reclaimer)).value() == [job]
            sender.commit()
            reclaimer.commit()
        else:
            assert reclaim(reclaimer) == [job]
            sent = Blocked(lambda: signal(sender, job, "go", "late")).value()
            reclaimer.commit()
            sender.commit()
    # The job was running, not waiting: the signal is stored for its next run to find.
    assert (sent.stored, sent.woke) == (True, False)
    (row,) = executions(engine, job)
    assert (row.state, row.worker_id, row.reclaims) == ("pending", None, 1)
    # The lost attempt, late, cannot begin its wait any more.
    with engine.connect() as late:
        late.begin()
        with pytest.raises(StepNotCommittedError, match="reclaimed") as refused:
            attempt.wait_for_signal(late, "go")
        assert refused.value.reason == "lost"
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "late")
    assert writes(engine, job) == ["after", "before"]
    assert [s.name for s in steps_of(SessionLocal, job)] == ["before", "signal:go", "after"]


# -- a condition against the start of its wait ---------------------------------------------


def test_a_flush_while_the_condition_wait_suspends_waits_and_wakes_the_job(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        session.add(Shipment(id=30, status="new"))
        job = dj_until.enqueue(session, 30)
    attempt = staged(engine, job)
    with engine.connect() as waiter, SessionLocal() as writer:
        waiter.begin()
        # Checked (false, the row held FOR SHARE) and suspended, not committed yet.
        assert isinstance(attempt.wait_until(waiter, shipped, 30), Suspension)
        shipment = writer.get(Shipment, 30)
        assert shipment is not None
        shipment.status = "shipped"
        flushing = Blocked(writer.flush)
        assert flushing.still_waiting(), "the writer's flush did not wait for the waiter"
        waiter.commit()
        flushing.value()  # its wake ran after the suspension committed, and saw it
        writer.commit()
    (row,) = executions(engine, job)
    assert (row.state, row.wait) == ("pending", None)
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "shipped")


def test_a_condition_wait_that_begins_after_an_uncommitted_flush_does_not_wait_for_it(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """The writer's flush holds the row (its wake found nobody suspended): the probe does
    not wait for the writer, whose transaction may stay open as long as the app likes.
    The job suspends with a recheck a second later, which finds the committed row."""
    with SessionLocal.begin() as session:
        session.add(Shipment(id=31, status="new"))
        job = dj_until.enqueue(session, 31)
    attempt = staged(engine, job)
    with SessionLocal() as writer, engine.connect() as waiter:
        shipment = writer.get(Shipment, 31)
        assert shipment is not None
        shipment.status = "shipped"
        writer.flush()  # its wake found nobody suspended: the job is running
        waiter.begin()
        now = waiter.execute(text("SELECT now()")).scalar_one()
        suspended = attempt.wait_until(waiter, shipped, 31)  # no wait for the writer
        assert isinstance(suspended, Suspension)
        assert suspended.waits_for == "row:" + shipped.name + ":31"
        assert suspended.until is not None
        assert suspended.until <= now + dt.timedelta(seconds=LOCKED_ROW_RECHECK)
        waiter.commit()
        writer.commit()
    (row,) = executions(engine, job)
    assert row.state == "suspended"
    with SessionLocal.begin() as session:  # the recheck's time, without waiting for it
        session.execute(
            update(queue.tables.executions)
            .where(queue.tables.executions.c.id == job)
            .values(execute_at=func.now())
        )
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", "shipped")
    assert [(s.name, s.result) for s in steps_of(SessionLocal, job)][-1] == (
        "until#1",
        {"met": True, "value": None},
    )
