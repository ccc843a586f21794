"""Status and registry without a database: compiled statements, JSON shapes, rendering, CLI."""

from __future__ import annotations

import argparse
import datetime as dt
import io
import os
import re
import threading
import typing
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql

from sqla_queue.cli.status import add_status_parsers, format_age, render_status
from sqla_queue.models import build_tables
from sqla_queue.statements import registry, status
from sqla_queue.status import QueueStatus, TaskStatus, WorkerStatus
from sqla_queue.worker.registry import EXPIRE_AFTER, WorkerRegistry, finished_jobs
from sqla_queue.worker.services import ServiceEnv

pytestmark = pytest.mark.unit

SNAPSHOTS = Path(__file__).parent / "snapshots"
DIALECT = postgresql.psycopg.dialect()
TABLES = build_tables(MetaData(), schema="app", prefix="q_")

BUILDERS: dict[str, tuple[Callable[[Any], Any], type]] = {
    "status_execution_counts": (status.execution_counts_statement, status.ExecutionCountsParams),
    "status_running_by_worker": (
        status.running_by_worker_statement,
        status.RunningByWorkerParams,
    ),
    "status_finished_window": (status.finished_window_statement, status.FinishedWindowParams),
    "status_failed_window": (status.failed_window_statement, status.FailedWindowParams),
    "status_stored_settings": (status.stored_settings_statement, status.StoredSettingsParams),
    "status_live_workers": (status.live_workers_statement, status.LiveWorkersParams),
    "registry_beat": (registry.beat_worker_statement, registry.BeatWorkerParams),
    "registry_expire": (registry.expire_workers_statement, registry.ExpireWorkersParams),
    "registry_unregister": (
        registry.unregister_worker_statement,
        registry.UnregisterWorkerParams,
    ),
}


def compiled(stmt: Any) -> str:
    return str(stmt.compile(dialect=DIALECT))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_statement_matches_snapshot(name: str) -> None:
    """Regenerate with SQLA_QUEUE_UPDATE_SNAPSHOTS=1 after checking the change is intended."""
    sql = compiled(BUILDERS[name][0](TABLES)) + "\n"
    path = SNAPSHOTS / f"{name}.sql"
    if os.environ.get("SQLA_QUEUE_UPDATE_SNAPSHOTS") == "1":
        path.write_text(sql)
    assert sql == path.read_text()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_params_typeddict_names_every_bound_parameter(name: str) -> None:
    builder, params = BUILDERS[name]
    binds = set(builder(TABLES).compile(dialect=DIALECT).params)
    assert binds == set(typing.get_type_hints(params))


def test_the_windows_walk_their_partial_index_newest_first_and_stop() -> None:
    finished = " ".join(compiled(status.finished_window_statement(TABLES, cap=500)).split())
    # The predicate of finished_ix, and its order: a backward walk cut by the limit.
    assert "app.q_jobs.finished_at IS NOT NULL AND app.q_jobs.finished_at >= now() -" in finished
    assert "ORDER BY app.q_jobs.finished_at DESC LIMIT 500" in finished
    failed = " ".join(compiled(status.failed_window_statement(TABLES, window=3600.0)).split())
    # failed_ix is declared WHERE status = 'failed': the literal, never a bound value.
    assert "WHERE app.q_jobs.status = 'failed' AND" in failed
    assert "now() - 3600.0 * interval '1 second'" in failed


@pytest.mark.parametrize(
    "kwargs", [{"cap": 0}, {"cap": True}, {"cap": 1.5}, {"window": 0}, {"window": "1; DROP"}]
)
def test_window_values_are_checked_before_reaching_the_sql(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        status.failed_window_statement(TABLES, **kwargs)


def test_beat_is_an_upsert_that_keeps_started_at() -> None:
    sql = compiled(registry.beat_worker_statement(TABLES))
    assert "ON CONFLICT (worker_id) DO UPDATE SET" in sql
    assert "started_at" not in sql.split("DO UPDATE SET")[1]
    expire = compiled(registry.expire_workers_statement(TABLES))
    assert "worker_id != %(worker_id)s::UUID" in expire


def test_finished_jobs_counts_final_outcomes_only() -> None:
    stats = {"claimed": 10, "succeeded": 3, "failed": 2, "retried": 4, "fenced": 1}
    assert finished_jobs(stats) == 5
    assert finished_jobs({**stats, "cancelled": 2}) == 7


def env(maintenance_interval: float = 0.2) -> ServiceEnv:
    return ServiceEnv(
        tables=TABLES,
        engine=None,  # type: ignore[arg-type]
        worker_id=uuid.uuid4(),
        session_factory=None,
        maintenance_interval=maintenance_interval,
        lease=30.0,
        shutdown_timeout=5.0,
        stop_flag=threading.Event(),
    )


def test_beats_follow_maintenance_up_to_five_seconds_and_expiry_is_three_beats() -> None:
    assert WorkerRegistry(env(0.2)).beat_interval == 0.2
    assert WorkerRegistry(env(60.0)).beat_interval == 5.0
    assert WorkerRegistry(env()).expire_after == EXPIRE_AFTER
    assert WorkerRegistry(env(), beat_interval=30.0).expire_after == 90.0


def test_service_env_fields_added_for_the_registry_are_optional() -> None:
    made = env()
    assert (made.tasks, made.concurrency, made.running_count, made.worker_stats) == (
        (),
        0,
        None,
        None,
    )


# -- the dataclasses ------------------------------------------------------------------------------

NOW = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def sample(*, capped: bool = False) -> QueueStatus:
    tasks = (
        TaskStatus("emails", 12, 3, 0, 2, 95.5, 4, 2, False, 1, 30, 1800),
        TaskStatus("reports", 0, 0, 1, 0, None, None, 0, True, 0, 0, 7, suspended=3),
    )
    workers = (
        WorkerStatus(
            worker_id=uuid.UUID(int=1),
            hostname="web-1",
            pid=4242,
            tasks=("emails", "reports"),
            concurrency=8,
            running=2,
            finished=1234,
            started_at=NOW - dt.timedelta(hours=1),
            seen_at=NOW - dt.timedelta(seconds=2),
            seen_seconds_ago=2.0,
        ),
    )
    return QueueStatus(now=NOW, tasks=tasks, workers=workers, capped=capped)


def test_json_shapes() -> None:
    shown = sample().as_json()
    assert shown["now"] == "2025-01-02T03:04:05+00:00" and shown["capped"] is False
    assert shown["tasks"][0] == {
        "task": "emails",
        "pending": 12,
        "scheduled": 3,
        "waiting": 0,
        "running": 2,
        "suspended": 0,
        "oldest_due_seconds": 95.5,
        "limit": 4,
        "seats_in_use": 2,
        "paused": False,
        "failed_last_day": 1,
        "finished_last_minute": 30,
        "finished_last_hour": 1800,
    }
    assert shown["workers"] == [
        {
            "worker_id": "00000000-0000-0000-0000-000000000001",
            "hostname": "web-1",
            "pid": 4242,
            "tasks": ["emails", "reports"],
            "concurrency": 8,
            "running": 2,
            "finished": 1234,
            "started_at": "2025-01-02T02:04:05+00:00",
            "seen_at": "2025-01-02T03:04:03+00:00",
            "seen_seconds_ago": 2.0,
        }
    ]
    # Every field is in the JSON, under its own name.
    assert set(shown["tasks"][0]) == set(TaskStatus.__dataclass_fields__)
    assert set(shown["workers"][0]) == set(WorkerStatus.__dataclass_fields__)


def test_totals_and_lookup() -> None:
    s = sample()
    assert (s.pending, s.running, s.finished_last_minute, s.finished_last_hour) == (12, 2, 30, 1807)
    assert s.suspended == 3
    assert s.task("reports").paused
    with pytest.raises(KeyError):
        s.task("nope")
    with pytest.raises(AttributeError):
        s.tasks[0].pending = 1  # type: ignore[misc]


# -- rendering ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (0.04, "0.04 s"),
        (9.94, "9.9 s"),
        (12.7, "12 s"),
        (185, "3 min 5 s"),
        (2 * 3600 + 14 * 60, "2 h 14 min"),
        (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"),
        (-1.0, "0 s"),
    ],
)
def test_format_age(seconds: float | None, shown: str) -> None:
    assert format_age(seconds) == shown


def screen(renderable: Any) -> str:
    console = Console(record=True, width=160, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def cells(text: str, first: str) -> list[str]:
    """The cells of the table row that starts with ``first``: two spaces or more apart."""
    line = next(line for line in text.splitlines() if line.startswith(f"{first} "))
    return re.split(r" {2,}", line.strip())


def test_render_status_shows_every_column() -> None:
    text = screen(render_status(sample(), title="app:queue"))
    assert text.splitlines()[0].startswith("app:queue  2025-01-02")
    assert "pending 12  running 2  suspended 3  done/min 30  workers 1 (2/8 busy)" in text
    assert cells(text, "emails") == [
        "emails", "12", "3", "0", "2", "0", "1 min 35 s", "2/4", "no", "1", "30", "1800"
    ]  # fmt: skip
    assert cells(text, "reports") == [
        "reports", "0", "0", "1", "0", "3", "-", "-", "yes", "0", "0", "7"
    ]  # fmt: skip
    worker = cells(text, "00000000")
    assert worker[1:3] == ["web-1", "4242"]
    assert worker[4:] == ["2 s ago", "2/8", "1234", "emails, reports"]


def test_render_marks_capped_counts_as_lower_bounds() -> None:
    text = screen(render_status(sample(capped=True)))
    assert cells(text, "emails")[-2:] == [">=30", ">=1800"]
    assert "done/min >=30" in text


def test_render_an_empty_queue() -> None:
    text = screen(render_status(QueueStatus(now=NOW, tasks=(), workers=())))
    assert "no tasks" in text and "no live workers" in text


# -- the parsers ----------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="sqla-queue")
    add_status_parsers(built.add_subparsers(dest="command", required=True))
    return built


def test_top_options() -> None:
    args = parser().parse_args(["top", "app:queue"])
    assert (args.interval, args.once, args.iterations, args.json) == (2.0, False, None, False)
    args = parser().parse_args(["top", "app:queue", "--interval", "0.5", "--iterations", "3"])
    assert (args.interval, args.iterations) == (0.5, 3)
    assert parser().parse_args(["status", "app:queue", "--json"]).json


@pytest.mark.parametrize(
    "argv",
    [
        ["top", "app:queue", "--once", "--iterations", "2"],
        ["top", "app:queue", "--interval", "0"],
        ["top", "app:queue", "--iterations", "0"],
        ["status"],
    ],
)
def test_bad_options_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(argv)
    assert exc.value.code == 2


def test_help_documents_the_exit_statuses() -> None:
    for command in ("status", "top"):
        text = parser()._subparsers._group_actions[0].choices[command].format_help()  # type: ignore[union-attr]
        assert "exit status:" in text and "  0  " in text and "  1  " in text
