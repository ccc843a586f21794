"""The worker registry, ``Queue.status`` and the ``status``/``top`` commands, on a real database."""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import logging
import os
import re
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest
from rich.console import Console
from sqlalchemy import Engine, create_engine, delete, func, insert, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.cli.status import add_status_parsers, run_status, run_top
from sqla_queue.statements.planner import planner_guard
from sqla_queue.statements.status import (
    failed_window_statement,
    finished_window_statement,
    running_by_worker_statement,
)
from sqla_queue.status import QueueStatus, read_status
from sqla_queue.worker.registry import WorkerRegistry
from sqla_queue.worker.services import ServiceEnv
from tests.support.app import boom, gate, gated, noop, queue, reset_gates
from tests.support.limited import limited1, limited2
from tests.support.running import pretend_claimed, wait_for, worker_thread

pytestmark = pytest.mark.integration

TARGET = "tests.support.limited:queue"
WORKERS = queue.tables.workers
EX = queue.tables.executions
JOBS = queue.tables.jobs
FAST = {"reclaim_interval": 0.2, "poll_interval": 0.1, "install_signal_handlers": False}


@pytest.fixture
def reader(db_url: str) -> Iterator[Engine]:
    """An engine of the test's own, apart from the worker's: at most two connections."""
    engine = create_engine(db_url, pool_size=2, max_overflow=0)
    yield engine
    engine.dispose()


@pytest.fixture(autouse=True)
def _open_gates() -> Iterator[None]:
    yield
    reset_gates()


def worker_rows(engine: Engine) -> list[dict[str, object]]:
    with engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(select(WORKERS))]


def status_of(engine: Engine) -> QueueStatus:
    with engine.connect() as connection:
        return queue.status(connection)


def service_env(engine: Engine, **overrides: object) -> ServiceEnv:
    values: dict[str, object] = {
        "tables": queue.tables,
        "engine": engine,
        "worker_id": uuid.uuid4(),
        "session_factory": None,
        "maintenance_interval": 0.2,
        "lease": 30.0,
        "shutdown_timeout": 5.0,
        "stop_flag": threading.Event(),
        "tasks": ("noop",),
        "concurrency": 3,
    }
    values.update(overrides)
    return ServiceEnv(**values)  # type: ignore[arg-type]


def add_worker_row(engine: Engine, seen_ago: float, hostname: str = "gone") -> uuid.UUID:
    worker_id = uuid.uuid4()
    with engine.begin() as connection:
        connection.execute(
            insert(WORKERS).values(
                worker_id=worker_id,
                hostname=hostname,
                pid=4242,
                tasks=["noop"],
                concurrency=1,
                started_at=func.now() - dt.timedelta(hours=1),
                seen_at=func.now() - dt.timedelta(seconds=seen_ago),
            )
        )
    return worker_id


# -- the registry -----------------------------------------------------------------------------


def test_a_running_worker_has_a_row_that_follows_its_handlers_and_goes_on_stop(
    SessionLocal: sessionmaker[Session], reader: Engine
) -> None:
    with SessionLocal.begin() as session:
        gated.enqueue(session, "registry")
    worker = queue.worker(SessionLocal, concurrency=2, **FAST)
    with worker_thread(worker):
        wait_for(lambda: len(worker_rows(reader)) == 1)
        row = worker_rows(reader)[0]
        assert row["worker_id"] == worker.decider.worker_id  # type: ignore[union-attr]
        assert row["hostname"] == socket.gethostname()
        assert row["pid"] == os.getpid()
        assert row["concurrency"] == 2
        assert {"noop", "gated", "limited1"} <= set(row["tasks"])  # type: ignore[call-overload]
        assert gate("registry").entered.wait(30)
        wait_for(lambda: worker_rows(reader)[0]["running"] == 1)
        shown = status_of(reader).workers
        assert [w.worker_id for w in shown] == [row["worker_id"]]
        assert shown[0].running == 1 and shown[0].seen_seconds_ago < 30
        gate("registry").open()
        wait_for(lambda: worker_rows(reader)[0]["running"] == 0)
        wait_for(lambda: worker_rows(reader)[0]["finished"] == 1)
        seen = worker_rows(reader)[0]["seen_at"]
        wait_for(lambda: worker_rows(reader)[0]["seen_at"] != seen)  # it keeps beating
    assert worker_rows(reader) == []


def test_a_burst_run_registers_nothing(SessionLocal: sessionmaker[Session], reader: Engine) -> None:
    with SessionLocal.begin() as session:
        noop.enqueue(session)
    queue.worker(SessionLocal, **FAST).run(burst=True)
    assert worker_rows(reader) == []


def test_a_beat_expires_rows_of_dead_workers_but_not_live_ones(reader: Engine) -> None:
    dead = add_worker_row(reader, seen_ago=600)
    quiet = add_worker_row(reader, seen_ago=30, hostname="quiet")
    registry = WorkerRegistry(service_env(reader))
    registry.beat()
    ids = {row["worker_id"] for row in worker_rows(reader)}
    assert dead not in ids
    assert ids == {quiet, registry.env.worker_id}
    own = next(r for r in worker_rows(reader) if r["worker_id"] == registry.env.worker_id)
    assert own["tasks"] == ["noop"] and own["concurrency"] == 3 and own["running"] == 0
    # Status lists the workers seen within a minute: the quiet one too.
    assert {w.hostname for w in status_of(reader).workers} == {"quiet", socket.gethostname()}
    # A row deleted under a live worker (swept while it was cut off) comes back.
    with reader.begin() as connection:
        connection.execute(delete(WORKERS))
    registry.beat()
    assert [r["worker_id"] for r in worker_rows(reader)] == [registry.env.worker_id]
    registry.unregister()
    assert worker_rows(reader) == []


def test_status_hides_workers_not_seen_for_a_minute(reader: Engine) -> None:
    add_worker_row(reader, seen_ago=90)
    assert status_of(reader).workers == ()
    with reader.connect() as connection:
        assert len(read_status(connection, queue.tables, live_within=120).workers) == 1


def test_the_registry_counts_from_the_worker_core(reader: Engine) -> None:
    stats = {"claimed": 9, "succeeded": 4, "failed": 2, "retried": 5, "cancelled": 1}
    env = service_env(reader, running_count=lambda: 2, worker_stats=lambda: stats)
    WorkerRegistry(env).beat()
    (row,) = worker_rows(reader)
    assert (row["running"], row["finished"]) == (2, 7)


def test_database_errors_are_logged_and_retried_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/nowhere")
    registry = WorkerRegistry(service_env(broken), beat_interval=0.02)
    with caplog.at_level(logging.WARNING, logger="sqla_queue.registry"):
        registry.start()
        wait_for(lambda: registry.failures >= 2, timeout=30)
        assert registry._thread is not None and registry._thread.is_alive()
        registry.request_stop()
        registry.join(30)
    assert not registry._thread.is_alive()
    assert "worker registry beat failed" in caplog.text
    assert "will expire" in caplog.text
    broken.dispose()


# -- status -----------------------------------------------------------------------------------


def stage(SessionLocal: sessionmaker[Session], reader: Engine) -> None:
    """A known queue: see the expected counts in the test below."""
    with SessionLocal.begin() as session:
        due = [noop.enqueue(session) for _ in range(3)]
        later = [noop.enqueue(session) for _ in range(2)]
        held = noop.enqueue(session)
        behind = noop.enqueue(session)
        seated = limited2.enqueue(session)
        limited1.enqueue(session)
        failures = [boom.enqueue(session) for _ in range(3)]
        finished = [noop.enqueue(session) for _ in range(3)]
        queue.pause(session, "boom")
        queue.set_limit(session, "limited1", 5)
    with reader.begin() as c:
        c.execute(
            update(EX)
            .where(EX.c.id == due[0])
            .values(execute_at=func.now() - dt.timedelta(seconds=120))
        )
        c.execute(
            update(EX)
            .where(EX.c.id.in_(later))
            .values(execute_at=func.now() + dt.timedelta(hours=1))
        )
        pretend_claimed(c, held)
        pretend_claimed(c, seated)
        c.execute(update(EX).where(EX.c.id == seated).values(slot=0))
        c.execute(update(EX).where(EX.c.id == behind).values(state="waiting", queue_id="k"))
        # Failed 10 s ago, 3 h ago (in the last day, not the last hour), 2 days ago.
        # Succeeded 10 s ago, 30 min ago, 2 h ago.
        ends = [
            (failures[0], "failed", 10),
            (failures[1], "failed", 3 * 3600),
            (failures[2], "failed", 2 * 86400),
            (finished[0], "succeeded", 10),
            (finished[1], "succeeded", 1800),
            (finished[2], "succeeded", 7200),
        ]
        for job_id, outcome, ago in ends:
            c.execute(delete(EX).where(EX.c.id == job_id))
            c.execute(
                update(JOBS)
                .where(JOBS.c.id == job_id)
                .values(status=outcome, finished_at=func.now() - dt.timedelta(seconds=ago))
            )


def test_status_counts_match_a_known_queue(
    SessionLocal: sessionmaker[Session], reader: Engine
) -> None:
    stage(SessionLocal, reader)
    with SessionLocal() as session:
        status = queue.status(session)
    noop_ = status.task("noop")
    assert (noop_.pending, noop_.scheduled, noop_.waiting, noop_.running) == (3, 2, 1, 1)
    assert noop_.oldest_due_seconds is not None and 120 <= noop_.oldest_due_seconds < 600
    assert (noop_.finished_last_minute, noop_.finished_last_hour) == (1, 2)
    assert (noop_.limit, noop_.seats_in_use, noop_.paused) == (None, 0, False)
    boom_ = status.task("boom")
    assert boom_.paused and boom_.pending == 0
    assert boom_.failed_last_day == 2
    assert (boom_.finished_last_minute, boom_.finished_last_hour) == (1, 1)
    seated = status.task("limited2")
    assert (seated.running, seated.limit, seated.seats_in_use, seated.pending) == (1, 2, 1, 0)
    stored = status.task("limited1")
    assert (stored.limit, stored.pending, stored.seats_in_use) == (5, 1, 0)
    # Every registered task is listed, even idle ones; an idle one shows zeros.
    assert {"echo", "gated"} <= {t.task for t in status.tasks}
    idle = status.task("echo")
    assert (idle.pending, idle.oldest_due_seconds, idle.finished_last_hour) == (0, None, 0)
    assert status.pending == 3 + 1 and status.running == 2 and not status.capped
    assert status.finished_last_minute == 2 and status.finished_last_hour == 3
    with pytest.raises(KeyError):
        status.task("nope")


def test_a_capped_window_says_its_counts_are_lower_bounds(
    SessionLocal: sessionmaker[Session], reader: Engine
) -> None:
    stage(SessionLocal, reader)
    with reader.connect() as connection:
        status = read_status(connection, queue.tables, scan_cap=2)
    assert status.capped
    assert status.finished_last_hour == 2  # 3 finished in the hour, 2 read
    with reader.connect() as connection:
        assert not read_status(connection, queue.tables, scan_cap=4).capped


def test_status_reads_an_empty_queue(reader: Engine) -> None:
    with reader.connect() as connection:
        status = read_status(connection, queue.tables)
    assert status.tasks == () and status.workers == () and status.pending == 0
    assert status.as_json()["tasks"] == []


@pytest.mark.parametrize(
    ("statement", "index"),
    [
        (finished_window_statement(queue.tables), "finished_ix"),
        (failed_window_statement(queue.tables), "failed_ix"),
    ],
)
@pytest.mark.parametrize("analyzed", [False, True])
def test_the_windows_walk_their_index_whatever_the_statistics(
    reader: Engine, statement: object, index: str, analyzed: bool
) -> None:
    """The history windows never read the whole of ``jobs``: a backward index walk, cut."""
    with reader.begin() as c:
        c.execute(
            text(
                f"INSERT INTO {JOBS.fullname} (task, payload, max_attempts, scheduled_at, "
                "status, finished_at) SELECT 'noop', '{}', 1, now(), "
                "CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'succeeded' END, "
                "now() - i * interval '1 second' FROM generate_series(1, 20000) i"
            )
        )
        if analyzed:
            c.execute(text(f"ANALYZE {JOBS.fullname}"))
    with reader.connect() as c:
        # The guard read_status applies around the windows (it spies on the real one).
        compiled = statement.compile(dialect=c.dialect)  # type: ignore[attr-defined]
        c.execute(planner_guard(generic_plans=False))
        plan = "\n".join(c.exec_driver_sql(f"EXPLAIN {compiled}").scalars())
    assert index in plan, plan
    assert "Index Scan Backward" in plan or "Index Only Scan Backward" in plan, plan
    assert "Seq Scan" not in plan, plan


# -- the commands -----------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sqla-queue")
    add_status_parsers(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


def test_status_json_is_the_status_as_json(
    SessionLocal: sessionmaker[Session],
    reader: Engine,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stage(SessionLocal, reader)
    registry = WorkerRegistry(service_env(reader))
    registry.beat()
    assert run_status(parse("status", TARGET, "--url", db_url, "--json")) == 0
    shown = json.loads(capsys.readouterr().out)
    expected = status_of(reader).as_json()
    assert set(shown) == {"now", "capped", "tasks", "workers"}
    by_task = {t["task"]: t for t in shown["tasks"]}
    assert by_task["noop"]["pending"] == 3 and by_task["boom"]["paused"] is True
    assert by_task["limited2"]["seats_in_use"] == 1 and by_task["limited2"]["limit"] == 2
    assert [t["task"] for t in shown["tasks"]] == [t["task"] for t in expected["tasks"]]
    (worker,) = shown["workers"]
    assert worker["worker_id"] == str(registry.env.worker_id)
    assert worker["pid"] == os.getpid() and worker["tasks"] == ["noop"]


def test_status_table_names_tasks_and_workers(
    SessionLocal: sessionmaker[Session],
    reader: Engine,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    stage(SessionLocal, reader)
    WorkerRegistry(service_env(reader)).beat()
    assert run_status(parse("status", TARGET, "--url", db_url)) == 0
    out = capsys.readouterr().out
    noop_line = next(line for line in out.splitlines() if line.startswith("noop "))
    assert noop_line.split()[1:5] == ["3", "2", "1", "1"]
    assert "boom" in out and "yes" in out
    assert "1/2" in out and socket.gethostname() in out


def top_console() -> Console:
    return Console(record=True, width=200, file=io.StringIO(), force_terminal=True)


def test_top_once_draws_one_frame(
    SessionLocal: sessionmaker[Session], reader: Engine, db_url: str
) -> None:
    stage(SessionLocal, reader)
    WorkerRegistry(service_env(reader)).beat()
    console = top_console()
    assert run_top(parse("top", TARGET, "--url", db_url, "--once"), console=console) == 0
    screen = console.export_text()
    assert screen.count("tasks") >= 1 and "workers" in screen
    # Cells are two spaces or more apart (one space may sit inside a cell: "3 min 5 s").
    rows = {cells[0]: cells for cells in (re.split(r" {2,}", line) for line in screen.splitlines())}
    assert rows["noop"][1:6] == ["3", "2", "1", "1", "0"]  # pending .. running, suspended
    assert rows["limited2"][7:9] == ["1/2", "no"]
    assert rows["boom"][8:10] == ["yes", "2"]
    assert "pending 4  running 2" in screen


def test_top_redraws_until_its_frames_are_done(
    SessionLocal: sessionmaker[Session], reader: Engine, db_url: str
) -> None:
    console = top_console()
    args = parse("top", TARGET, "--url", db_url, "--iterations", "3", "--interval", "0.05")
    assert run_top(args, console=console) == 0
    assert "Ctrl-C to quit" in console.export_text()


def test_top_json_prints_one_document_per_frame(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse(
        "top", TARGET, "--url", db_url, "--json", "--iterations", "2", "--interval", "0.05"
    )
    assert run_top(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(set(json.loads(line)) == {"now", "capped", "tasks", "workers"} for line in lines)


def test_top_ends_cleanly_on_ctrl_c(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqla_queue.cli.status as status_cli

    class Interrupted:
        """``time`` as the command sees it: Ctrl-C arrives during the first wait."""

        @staticmethod
        def sleep(seconds: float) -> None:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_cli, "time", Interrupted)
    console = top_console()
    assert run_top(parse("top", TARGET, "--url", db_url), console=console) == 0
    assert "noop" in console.export_text()


def test_the_guard_covers_the_windows_and_leaves_the_callers_settings(reader: Engine) -> None:
    from sqlalchemy import event

    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *rest: object) -> None:
        seen.append(" ".join(statement.split())[:60])

    event.listen(reader, "before_cursor_execute", record)
    try:
        with reader.begin() as c:
            read_status(c, queue.tables)
            assert c.exec_driver_sql("SHOW enable_seqscan").scalar_one() == "on"
            assert c.exec_driver_sql("SHOW enable_sort").scalar_one() == "on"
    finally:
        event.remove(reader, "before_cursor_execute", record)
    start = seen.index("SAVEPOINT sqla_queue_status")
    guarded = seen[start : start + 6]
    assert guarded[1].startswith("SELECT set_config('enable_seqscan', 'off', true)")
    assert "worker_id" in guarded[2] and "recent" in guarded[3] and "failures" in guarded[4]
    assert guarded[5] == "ROLLBACK TO SAVEPOINT sqla_queue_status"


def test_running_per_worker_reads_the_running_index(
    SessionLocal: sessionmaker[Session], reader: Engine
) -> None:
    with SessionLocal.begin() as session:
        ids = [noop.enqueue(session) for _ in range(3)]
    with reader.begin() as c:
        one = pretend_claimed(c, ids[0])
        pretend_claimed(c, ids[1], worker=one)
        other = pretend_claimed(c, ids[2])
        c.execute(planner_guard(generic_plans=False))
        compiled = running_by_worker_statement(queue.tables).compile(dialect=c.dialect)
        plan = "\n".join(c.exec_driver_sql(f"EXPLAIN {compiled}").scalars())
        result = c.execute(running_by_worker_statement(queue.tables))
        rows = {row.worker_id: row.running for row in result}
    assert "running_ix" in plan and "Seq Scan" not in plan, plan
    assert rows == {one: 2, other: 1}
