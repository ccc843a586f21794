"""The testing helpers with durable jobs: ``drain(fire_timers=True)`` drives a job through
its sleeps in one call, ``fire_timers`` and ``signal`` move a suspended job on in a
transaction of their own, eager mode runs what they wake, and the plugin's fixtures do
the same in a user's suite (the durable jobs guide's tests, run as written)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.testing.helpers import drain, eager, fire_timers, signal
from tests.docs.markdown import parse_page
from tests.support.app import StepWrite
from tests.support.durable_app import dj_signal, dj_sleepy, queue

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "durable.md"
EXECUTIONS = queue.tables.executions


def steps_written(engine: Engine, job_id: int) -> list[str]:
    with engine.connect() as connection:
        rows = connection.scalars(
            select(StepWrite.step).where(StepWrite.job_id == job_id).order_by(StepWrite.step)
        )
        return list(rows)


def test_drain_without_fire_timers_leaves_the_sleeper_suspended(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = dj_sleepy.enqueue(session, 3600.0)

    result = drain(queue, SessionLocal)

    assert [(s.id, s.task, s.waits_for) for s in result.suspended] == [(job, "dj_sleepy", "sleep")]
    assert result.suspended[0].until is not None
    assert result.stats.suspended == 1
    assert steps_written(engine, job) == ["before"]


def test_drain_with_fire_timers_runs_sleep_fire_resume_in_one_call(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        job = dj_sleepy.enqueue(session, 3600.0)

    result = drain(queue, SessionLocal, fire_timers=True)

    assert [(j.id, j.status, j.result) for j in result.jobs] == [(job, "succeeded", 1)]
    assert result.suspended == ()
    # Summed over both runs: the suspension of the first, the success of the second.
    assert (result.stats.suspended, result.stats.succeeded) == (1, 1)
    assert steps_written(engine, job) == ["after", "before"]


def test_fire_timers_times_out_a_wait_with_a_deadline(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        job = dj_signal.enqueue(session, timeout=3600)
    assert [s.waits_for for s in drain(queue, SessionLocal).suspended] == ["signal:approved"]

    assert fire_timers(queue, SessionLocal, [job]) == [job]
    result = drain(queue, SessionLocal)

    assert [(j.id, j.result) for j in result.jobs] == [(job, "timed out")]


def test_drain_fires_no_wait_without_a_deadline(SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        waiting = dj_signal.enqueue(session)
        sleeping = dj_sleepy.enqueue(session, 3600.0)

    result = drain(queue, SessionLocal, fire_timers=True)

    # The sleeper went through; the signal's waiter, with no deadline, still waits.
    assert [j.id for j in result.succeeded] == [sleeping]
    assert [(s.id, s.waits_for) for s in result.suspended] == [(waiting, "signal:approved")]


def test_signal_commits_and_the_next_drain_runs_the_woken_job(
    SessionLocal: sessionmaker[Session],
) -> None:
    with SessionLocal.begin() as session:
        job = dj_signal.enqueue(session)
    drain(queue, SessionLocal)

    sent = signal(queue, SessionLocal, job, "approved", {"by": "ada"})

    assert (sent.stored, sent.woke, sent.status) == (True, True, "queued")
    result = drain(queue, SessionLocal)
    assert [(j.id, j.result) for j in result.jobs] == [(job, {"by": "ada"})]
    assert signal(queue, SessionLocal, job, "approved").stored is False


def test_eager_runs_the_job_a_signal_wakes_at_its_commit(
    SessionLocal: sessionmaker[Session],
) -> None:
    with eager(queue, SessionLocal) as hook:
        with SessionLocal.begin() as session:
            job = dj_signal.enqueue(session)
        # The enqueue's commit ran the job up to its wait.
        assert hook.runs[-1].suspended[0].id == job
        signal(queue, SessionLocal, job, "approved", "yes")
        assert [(j.id, j.result) for j in hook.jobs] == [(job, "yes")]


def test_the_durable_guides_tests_run_as_written(pytester: pytest.Pytester) -> None:
    """docs/guides/durable.md: its app and its test files, run by pytest with the plugin."""
    files = parse_page(GUIDE).marked("file")
    names = [str(block.argument) for block in files]
    assert names == ["shop.py", "reviews.py", "test_reviews.py"], names
    for block in files:
        (pytester.path / str(block.argument)).write_text(block.source, encoding="utf-8")
    pytester.makeini("[pytest]\nsqla_queue_app = shop:queue\n")

    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "test_reviews.py"
    )

    result.assert_outcomes(passed=2)
