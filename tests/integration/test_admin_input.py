"""The operator methods at the edges of their rules (issue 12, item 8).

The bad values themselves (a negative ``prune`` age, a limit out of range or for an
unknown task, a requeue id beyond bigint) are cases of ``test_bad_input.py``; these tests
check what is still accepted right at the edges.

Issue 12, item 8: ``prune(older_than=timedelta(days=-1))`` deleted every finished job;
limits could be stored for tasks that do not exist, or beyond the integer column; a
requeue id beyond bigint failed in the database.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import Engine, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import boom, noop, queue

pytestmark = pytest.mark.integration

JOBS = queue.tables.jobs
LIMITS = queue.tables.limits


def _finished_now(SessionLocal: sessionmaker[Session]) -> list[int]:
    """One succeeded and one failed job, both finished a moment ago."""
    with SessionLocal.begin() as session:
        ids = [noop.enqueue(session), boom.enqueue(session)]
    queue.worker(SessionLocal, install_signal_handlers=False).run(burst=True)
    return ids


def _job_count(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.count()).select_from(JOBS)) or 0)


def _stored(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        return {row.task: row.concurrency_limit for row in connection.execute(select(LIMITS))}


# -- prune ---------------------------------------------------------------------------------


def test_prune_with_the_largest_age_deletes_nothing(
    SessionLocal: sessionmaker[Session], engine: Engine
) -> None:
    _finished_now(SessionLocal)
    with SessionLocal.begin() as session:
        assert queue.prune(session, older_than=dt.timedelta.max, include_failed=True) == 0
    assert _job_count(engine) == 2


# -- set_limit -----------------------------------------------------------------------------


def test_a_declared_task_takes_a_limit_and_a_stale_limit_can_be_removed(
    SessionLocal: sessionmaker[Session], engine: Engine, owner_engine: Engine
) -> None:
    queue.declare_task("declared_elsewhere")
    with owner_engine.begin() as connection:
        connection.execute(insert(LIMITS).values(task="gone_task", concurrency_limit=2))
    with SessionLocal.begin() as session:
        queue.set_limit(session, "declared_elsewhere", 4)
        queue.set_limit(session, "gone_task", None)  # unset takes any valid name
    assert _stored(engine) == {"declared_elsewhere": 4}


def test_the_largest_limit_is_stored(SessionLocal: sessionmaker[Session], engine: Engine) -> None:
    with SessionLocal.begin() as session:
        queue.set_limit(session, "noop", 2**31 - 1)
    assert _stored(engine) == {"noop": 2**31 - 1}
