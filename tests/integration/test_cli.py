"""The ``sqla-queue`` commands against a real database."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.cli.main import main, parse_duration
from tests.support.app import boom, noop, queue

pytestmark = pytest.mark.integration
TARGET = "tests.support.app:queue"


def test_worker_verify_failed_requeue_prune(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich sizes its table to the terminal
    with SessionLocal.begin() as session:
        bad = boom.enqueue(session, message="disk full")
        noop.enqueue(session)

    assert main(["verify", TARGET, "--url", db_url]) == 0
    assert "schema OK" in capsys.readouterr().out

    assert main(["worker", TARGET, "--url", db_url, "--burst", "--concurrency", "2"]) == 0
    assert main(["failed", TARGET, "--url", db_url]) == 0
    listing = capsys.readouterr().out
    assert str(bad) in listing and "disk full" in listing

    assert main(["requeue", TARGET, "--url", db_url, str(bad), "424242"]) == 0
    out = capsys.readouterr().out
    assert f"requeued 1 job(s): [{bad}]" in out
    assert "left alone: [424242]" in out

    assert main(["prune", TARGET, "--url", db_url, "--older-than", "0s"]) == 0
    assert "pruned 1 finished job(s)" in capsys.readouterr().out


def test_async_worker_command(db_url: str, SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        job_id = noop.enqueue(session)
    assert main(["worker", TARGET, "--url", db_url, "--burst", "--async"]) == 0
    with SessionLocal() as session:
        job = session.get(queue.Job, job_id)
        assert job is not None and job.status == "succeeded"


def test_verify_names_what_is_missing(
    db_url: str, owner_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    with owner_engine.begin() as connection:
        connection.execute(text("DROP INDEX app_jobs.sqla_queue_job_executions_waiting_ix"))
    assert main(["verify", TARGET, "--url", db_url]) == 2
    err = capsys.readouterr().err
    assert "sqla_queue_job_executions_waiting_ix" in err
    assert "alembic upgrade head" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "tests.support.app"],  # no attribute
        ["worker", "no_such_module:queue"],
        ["worker", "tests.support.app:Base"],  # not a Queue
    ],
)
def test_bad_targets_are_one_line_errors(
    argv: list[str], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--url", db_url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sqla-queue: ") and "Traceback" not in err


def test_durations() -> None:
    assert parse_duration("7d") == dt.timedelta(days=7)
    assert parse_duration("90") == dt.timedelta(seconds=90)
    assert parse_duration("1.5h") == dt.timedelta(minutes=90)


def test_limits_command(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    target = "tests.support.limited:queue"
    assert main(["limits", target, "--url", db_url]) == 0
    listing = capsys.readouterr().out
    assert "limited3" in listing and "limited1" in listing

    assert main(["limits", target, "--url", db_url, "set", "noop", "4"]) == 0
    assert "noop: limit now 4" in capsys.readouterr().out
    assert main(["limits", target, "--url", db_url, "set", "limited1", "2"]) == 0
    capsys.readouterr()
    assert main(["limits", target, "--url", db_url]) == 0
    rows = {
        line.split("│")[1].strip(): line
        for line in capsys.readouterr().out.splitlines()
        if "│" in line
    }
    assert [c.strip() for c in rows["limited1"].split("│")[2:5]] == ["1", "2", "2"]

    assert main(["limits", target, "--url", db_url, "unset", "limited1"]) == 0
    assert "limited1: limit now 1" in capsys.readouterr().out
    assert main(["limits", target, "--url", db_url, "set", "noop", "0"]) == 2
    assert "whole number" in capsys.readouterr().err
    assert main(["limits", target, "--url", db_url, "set", "noop"]) == 2
