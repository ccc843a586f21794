"""Partitioned history: finished jobs move into time partitions, and prune drops them.

Everything runs on a real PostgreSQL database made with ``Queue(history="partitioned")``'s
``create_all``: the rows' partitions are read from ``tableoid``, the plans from ``EXPLAIN``.
The Alembic path (``op.create_queue(..., history="partitioned")``, ``op.partition_history``
with rows, grants and ids carried over) is in tests/migration/test_history_migration.py.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import statements
from sqla_queue.history import history_partitions, maintain_history, prune_history
from sqla_queue.testing.databases import DatabaseFactory
from tests.support.history_app import boom, ok, queue
from tests.support.running import wait_for, worker_thread

pytestmark = pytest.mark.integration

T = queue.tables
JOBS = T.jobs.name
QUIET = {"install_signal_handlers": False, "poll_interval": 0.05}


@pytest.fixture
def hq_engine(db_factory: DatabaseFactory) -> Iterator[Engine]:
    """A fresh database holding only the partitioned queue."""
    url = db_factory.clone("template0")
    engine = create_engine(url)
    with engine.begin() as connection:
        queue.create_all(connection)
    yield engine
    engine.dispose()
    db_factory.drop(url)


@pytest.fixture
def hq_sessions(hq_engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(hq_engine)


def where_rows_are(connection: Connection) -> dict[str, int]:
    """How many jobs each partition holds, by partition name."""
    rows = connection.execute(
        text(f"SELECT tableoid::regclass::text, count(*) FROM {JOBS} GROUP BY 1")
    )
    return {str(name): int(count) for name, count in rows}


def age_finished_jobs(connection: Connection, days: int) -> None:
    """Move every finished job's finish time ``days`` into the past (a partition move)."""
    connection.execute(
        text(
            f"UPDATE {JOBS} SET finished_at = finished_at - make_interval(days => :d) "
            "WHERE status <> 'queued'"
        ),
        {"d": days},
    )


def run_burst(sessions: sessionmaker[Session]) -> None:
    queue.worker(sessions, **QUIET).run(burst=True)


def test_create_all_makes_the_partitioned_layout_and_verify_accepts_it(hq_engine: Engine) -> None:
    with hq_engine.connect() as connection:
        kinds = dict(
            connection.execute(
                text(
                    "SELECT relname::text, relkind::text FROM pg_class "
                    "WHERE relname LIKE 'hq_jobs%' AND relkind IN ('r', 'p')"
                )
            ).all()
        )
        queue.verify(connection)
    assert kinds == {
        "hq_jobs": "p",
        "hq_jobs_live": "r",
        "hq_jobs_done": "p",
        "hq_jobs_done_default": "r",
        "hq_jobs_failed": "p",
        "hq_jobs_failed_default": "r",
    }


def test_finished_jobs_land_in_time_partitions_and_requeue_brings_one_back(
    hq_engine: Engine, hq_sessions: sessionmaker[Session]
) -> None:
    with hq_sessions.begin() as session:
        report = maintain_history(session, T)
    assert len(report.created) == 8  # today and 3 days ahead, for both branches
    with hq_sessions.begin() as session:
        ids = [ok.enqueue(session, n=i) for i in range(4)]
        failed_id = boom.enqueue(session)
    with hq_engine.connect() as connection:
        assert where_rows_are(connection) == {"hq_jobs_live": 5}
    run_burst(hq_sessions)
    today = dt.datetime.now(dt.UTC).strftime("%Y%m%d00")
    with hq_engine.connect() as connection:
        assert where_rows_are(connection) == {
            f"hq_jobs_done_p{today}": 4,
            f"hq_jobs_failed_p{today}": 1,
        }
        results = dict(
            connection.execute(
                text(f"SELECT id, result FROM {JOBS} WHERE status = 'succeeded'")
            ).all()
        )
    assert sorted(results) == ids
    with hq_sessions.begin() as session:
        assert queue.requeue(session, [failed_id]) == [failed_id]
    with hq_engine.connect() as connection:
        assert where_rows_are(connection)["hq_jobs_live"] == 1


def test_maintain_moves_jobs_out_of_the_default_partition_and_is_idempotent(
    hq_engine: Engine, hq_sessions: sessionmaker[Session]
) -> None:
    with hq_sessions.begin() as session:
        [ok.enqueue(session) for _ in range(3)]
        boom.enqueue(session)
    run_burst(hq_sessions)  # no partition exists yet: the jobs wait in the defaults
    with hq_engine.connect() as connection:
        assert where_rows_are(connection) == {
            "hq_jobs_done_default": 3,
            "hq_jobs_failed_default": 1,
        }
    with hq_sessions.begin() as session:
        first = maintain_history(session, T, ahead=1)
    assert first.moved == 4
    with hq_sessions.begin() as session:
        again = maintain_history(session, T, ahead=1)
    assert again.created == () and again.moved == 0
    with hq_engine.connect() as connection:
        assert not any(name.endswith("_default") for name in where_rows_are(connection))


def test_backfill_creates_past_partitions_for_old_history(
    hq_engine: Engine, hq_sessions: sessionmaker[Session]
) -> None:
    with hq_sessions.begin() as session:
        [ok.enqueue(session) for _ in range(2)]
    run_burst(hq_sessions)
    with hq_engine.begin() as connection:
        age_finished_jobs(connection, 5)
    with hq_sessions.begin() as session:
        plain = maintain_history(session, T, ahead=0)
        assert plain.moved == 0  # only today's partition: the old jobs stay in the default
        filled = maintain_history(session, T, ahead=0, backfill=True)
    assert filled.moved == 2
    old_day = (dt.datetime.now(dt.UTC) - dt.timedelta(days=5)).strftime("%Y%m%d00")
    assert f"hq_jobs_done_p{old_day}" in filled.created
    with hq_engine.connect() as connection:
        assert where_rows_are(connection) == {f"hq_jobs_done_p{old_day}": 2}


def test_prune_drops_old_partitions_keeps_failed_and_frees_unique_keys(
    hq_engine: Engine, hq_sessions: sessionmaker[Session]
) -> None:
    with hq_sessions.begin() as session:
        [ok.enqueue(session, n=i) for i in range(5)]
        ok.options(unique_key="only-one").enqueue(session, n=99)
        boom.enqueue(session)
    run_burst(hq_sessions)
    with hq_engine.begin() as connection:
        age_finished_jobs(connection, 10)
        keys_before = connection.scalar(text(f"SELECT count(*) FROM {T.unique_keys.name}"))
    with hq_sessions.begin() as session:
        maintain_history(session, T, ahead=0, backfill=True)
    with hq_sessions.begin() as session:
        young = queue.prune(session, older_than=dt.timedelta(days=30))
        assert young == 0  # nothing is that old
        pruned = queue.prune(session, older_than=dt.timedelta(days=7))
    assert pruned == 6  # the succeeded ones; the failed job waits for inspection
    with hq_engine.connect() as connection:
        left = where_rows_are(connection)
        keys_after = connection.scalar(text(f"SELECT count(*) FROM {T.unique_keys.name}"))
    assert sum(left.values()) == 1 and all("failed" in name for name in left)
    assert keys_before == 1 and keys_after == 0
    with hq_sessions.begin() as session:
        report = prune_history(session, T, older_than=dt.timedelta(days=7), include_failed=True)
    assert report.jobs == 1 and report.detached is False
    with hq_engine.connect() as connection:
        assert where_rows_are(connection) == {}
        assert (
            connection.scalar(text("SELECT to_regclass(:n)"), {"n": report.partitions[0]}) is None
        )


def test_detach_keeps_the_partition_as_a_table_of_its_own(
    hq_engine: Engine, hq_sessions: sessionmaker[Session]
) -> None:
    with hq_sessions.begin() as session:
        [ok.enqueue(session) for _ in range(3)]
    run_burst(hq_sessions)
    with hq_engine.begin() as connection:
        age_finished_jobs(connection, 3)
    with hq_sessions.begin() as session:
        maintain_history(session, T, ahead=0, backfill=True)
        report = prune_history(session, T, older_than=dt.timedelta(days=2), detach=True)
    assert report.detached and report.jobs == 3
    (name,) = [p for p in report.partitions if p.startswith("hq_jobs_done_p")][:1]
    with hq_engine.connect() as connection:
        assert where_rows_are(connection) == {}
        assert connection.scalar(text(f"SELECT count(*) FROM {name}")) == 3
    with hq_sessions.begin() as session:
        names = {p.name for p in history_partitions(session, T)}
    assert name not in names


def explain(connection: Connection, statement: object, params: dict[str, object]) -> str:
    """PostgreSQL's plan of a Core statement, as text."""
    bound = statement.params(**params)  # type: ignore[attr-defined]
    compiled = bound.compile(connection, compile_kwargs={"literal_binds": True})
    # A bind that stays one (the NOTIFY channel) is passed as a parameter.
    rows = connection.exec_driver_sql("EXPLAIN " + str(compiled), dict(compiled.params)).all()
    return "\n".join(str(row[0]) for row in rows)


def test_the_hot_path_is_planned_on_the_live_partition_alone(
    hq_engine: Engine, hq_sessions: sessionmaker[Session]
) -> None:
    """The claim and the completion name ``status = 'queued'``: with generic plans too,
    PostgreSQL plans them on ``jobs_live`` and never touches a time partition. The control:
    a lookup by id alone visits every partition."""
    with hq_sessions.begin() as session:
        maintain_history(session, T, ahead=5)
    worker = uuid.uuid4()
    claim = {"tasks": ["ok"], "batch": 5, "worker": worker, "lease": 30.0, "lease_map": "{}"}
    complete = {"outcomes": json.dumps([]), "worker": worker}
    with hq_engine.connect() as connection:
        connection.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        for statement, params in (
            (statements.claim_statement(T), claim),
            (statements.complete_statement(T), complete),
        ):
            plan = explain(connection, statement, params)
            assert "hq_jobs_live" in plan
            assert "hq_jobs_done" not in plan and "hq_jobs_failed" not in plan
        control = explain(connection, select(T.jobs.c.payload).where(T.jobs.c.id == 1), {})
    assert "hq_jobs_done" in control


async def test_async_sessions_prune_and_maintain_through_the_same_flow(
    hq_engine: Engine, hq_sessions: sessionmaker[Session]
) -> None:
    with hq_sessions.begin() as session:
        [ok.enqueue(session) for _ in range(2)]
    run_burst(hq_sessions)
    with hq_engine.begin() as connection:
        age_finished_jobs(connection, 4)
    async_engine = create_async_engine(hq_engine.url)
    try:
        async with async_engine.begin() as connection:
            made = await maintain_history(connection, T, ahead=0, backfill=True)
            assert made.moved == 2
            gone = await queue.prune(connection, older_than=dt.timedelta(days=2))
            assert gone == 2
    finally:
        await async_engine.dispose()


def test_a_plain_queue_refuses_the_partition_functions(SessionLocal: sessionmaker[Session]) -> None:
    from tests.support.app import queue as plain

    with SessionLocal() as session, pytest.raises(ValueError, match="history='partitioned'"):
        maintain_history(session, plain.tables)


def test_a_running_worker_creates_the_partitions_and_moves_waiting_jobs(
    hq_engine: Engine, hq_sessions: sessionmaker[Session]
) -> None:
    """The worker's history service runs at start: the finished jobs that waited in the
    default partitions move into today's partition, and the next days are ready."""
    with hq_sessions.begin() as session:
        [ok.enqueue(session) for _ in range(3)]
    run_burst(hq_sessions)  # a burst run starts no services: the jobs wait in the default
    with hq_engine.connect() as connection:
        assert where_rows_are(connection) == {"hq_jobs_done_default": 3}

    def partitions() -> set[str]:
        with hq_sessions() as session:
            return {p.name for p in history_partitions(session, T) if not p.is_default}

    today = dt.datetime.now(dt.UTC)
    wanted = {
        f"hq_jobs_{branch}_p{(today + dt.timedelta(days=d)):%Y%m%d}00"
        for branch in ("done", "failed")
        for d in range(4)
    }
    with worker_thread(queue.worker(hq_sessions, **QUIET)):
        wait_for(lambda: partitions() >= wanted, timeout=20)
    with hq_engine.connect() as connection:
        assert where_rows_are(connection) == {f"hq_jobs_done_p{today:%Y%m%d}00": 3}


def test_result_waits_through_a_completion_that_moves_the_row(
    hq_engine: Engine, hq_sessions: sessionmaker[Session]
) -> None:
    """Forced race: ``queue.result`` marks the job awaited while a held-open transaction
    finishes it, moving its row out of ``jobs_live``. PostgreSQL refuses the waiting UPDATE
    (it cannot follow the moved row); the result still comes back."""
    with hq_sessions.begin() as session:
        job_id = ok.enqueue(session, n=7)
    holder = hq_engine.connect()
    holder.begin()
    holder.execute(
        text(
            f"UPDATE {JOBS} SET status = 'succeeded', finished_at = now(), result = '7' "
            "WHERE id = :id"
        ),
        {"id": job_id},
    )
    got: list[object] = []
    waiter = threading.Thread(
        target=lambda: got.append(queue.result(hq_engine, job_id, timeout=20))
    )
    waiter.start()

    def blocked() -> bool:
        with hq_engine.connect() as connection:
            waiting = connection.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            )
        return bool(waiting)

    wait_for(blocked, timeout=10)
    holder.commit()
    holder.close()
    waiter.join(20)
    assert got == [7]


def test_the_command_line_maintains_prunes_and_refuses_a_plain_queue(
    hq_engine: Engine, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from sqla_queue.cli.main import main

    url = hq_engine.url.render_as_string(hide_password=False)
    target = "tests.support.history_app:queue"
    assert main(["maintain", target, "--url", url, "--ahead", "1", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed["created"]) == 4 and len(listed["partitions"]) == 6
    args = ["prune", target, "--url", url, "--older-than", "1d", "--detach"]
    assert main(args) == 0
    assert "detached 0 partition(s)" in capsys.readouterr().out
    # The plain test app: refused with the reason, nothing done (exit status 2).
    plain = "tests.support.app:queue"
    assert main(["maintain", plain, "--url", db_url]) == 2
    assert main(["prune", plain, "--url", db_url, "--older-than", "1d", "--detach"]) == 2
    assert "history='partitioned'" in capsys.readouterr().err
