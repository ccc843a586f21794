"""The ``sqla-queue`` commands against a real database."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
from collections.abc import Callable

import pytest
from sqlalchemy import func, make_url, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.cli.main import main
from sqla_queue.cli.values import parse_duration
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

    # An id that no job has is named, and the status says so (6, as for cancel).
    assert main(["requeue", TARGET, "--url", db_url, str(bad), "424242"]) == 6
    out = capsys.readouterr().out
    assert out == f"job {bad}: requeued\njob 424242: not_found (no job has this id)\n"

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
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows["limited1"][1:4] == ["1", "2", "2"]

    assert main(["limits", target, "--url", db_url, "unset", "limited1"]) == 0
    assert "limited1: limit now 1" in capsys.readouterr().out
    assert main(["limits", target, "--url", db_url, "set", "noop", "0"]) == 2
    assert "whole number" in capsys.readouterr().err
    assert main(["limits", target, "--url", db_url, "set", "noop"]) == 2


# -- usage errors: one line on stderr, status 2, nothing done (issue 12, item 8) ---------------

LIMITED = "tests.support.limited:queue"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["worker", TARGET, "--concurrency", "0"], r"--concurrency must be a whole number from 1"),
        (["worker", TARGET, "--batch-size", "-3"], r"--batch-size must be a whole number from 1"),
        (["worker", TARGET, "--poll-interval", "nan"], r"finite number of seconds"),
        (["worker", TARGET, "--listen-url", "db.internal"], r"listen_url must be a database URL"),
        (["--log-level", "NOPE", "verify", TARGET], r"unknown log level 'NOPE'"),
        (["failed", TARGET, "--limit", "-1"], r"--limit must be a whole number from 1"),
        (
            ["requeue", TARGET, "99999999999999999999"],
            r"a job id must be a whole number from 1 to 9223372036854775807",
        ),
        (["prune", TARGET, "--older-than=-1d"], r"cannot be negative"),
        (["prune", TARGET, "--older-than", "1e300d"], r"at most 999999999 days"),
        (["limits", LIMITED, "set", "noop", "99999999999"], r"from 1 to 2147483647"),
        (["limits", LIMITED, "set", "no_such_task", "3"], r"unknown task 'no_such_task'"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_usage_errors_are_one_line_with_status_2(
    argv: list[str],
    message: str,
    db_url: str,
    owner_engine: Engine,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*argv, "--url", db_url]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("sqla-queue: ") and err.count("\n") == 1, err
    assert re.search(message, err), err
    with owner_engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(queue.tables.limits)) == 0


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("notaurl", r"--url is not a database URL: 'notaurl'"),
        (
            "postgresql://u:secret@host:notaport/db",
            r"not a database URL: 'postgresql\+psycopg://u:\*\*\*@",
        ),
        ("mysql://u:secret@localhost/db", r"names a 'mysql' database .*needs PostgreSQL"),
    ],
)
def test_bad_urls_are_one_line_with_status_2(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["worker", TARGET, "--url", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "secret" not in err, err
    assert re.search(message, err), err


def test_a_bad_database_url_variable_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "notaurl")
    assert main(["verify", TARGET]) == 2
    err = capsys.readouterr().err
    assert err == "sqla-queue: $DATABASE_URL is not a database URL: 'notaurl'; " + (
        "expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE\n"
    )


def test_help_is_status_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "worker" in capsys.readouterr().out


# -- connection errors: the URL (password hidden) and the cause, status 1 --------------------


def _unreachable(db_url: str) -> str:
    return make_url(db_url).set(password="s3cret", port=1).render_as_string(hide_password=False)


def _no_database(db_url: str) -> str:
    return make_url(db_url).set(database="sqlaq_no_such_database").render_as_string(False)


def _no_role(db_url: str) -> str:
    return make_url(db_url).set(username="sqlaq_no_such_role").render_as_string(False)


@pytest.mark.parametrize(
    ("make", "cause"),
    [
        (_unreachable, r"cause: .*(refused|failed)"),
        (_no_database, r'cause: .*database "sqlaq_no_such_database" does not exist'),
        (_no_role, r'cause: .*role "sqlaq_no_such_role" does not exist'),
    ],
    ids=["server down", "unknown database", "authentication"],
)
@pytest.mark.parametrize(
    "command",
    [
        ["verify", TARGET],
        ["worker", TARGET, "--burst"],
        ["worker", TARGET, "--burst", "--async"],
        ["failed", TARGET],
        ["requeue", TARGET, "1"],
        ["prune", TARGET, "--older-than", "1d"],
        ["limits", TARGET],
    ],
    ids=lambda argv: " ".join(argv[:1] + argv[2:]),
)
def test_connection_errors_name_the_url_and_the_cause(
    command: list[str],
    make: Callable[[str], str],
    cause: str,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = make(db_url)
    assert main([*command, "--url", url]) == 1
    err = capsys.readouterr().err
    shown = make_url(url).render_as_string(hide_password=True)
    assert "Traceback" not in err and "s3cret" not in err, err
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0] == f"sqla-queue: cannot connect to {shown}"
    assert re.search(cause, lines[1]), err


def test_the_installed_command_exits_without_a_traceback(db_url: str) -> None:
    """The same through ``python -m sqla_queue``: the process's own status and stderr."""
    usage = subprocess.run(
        [
            sys.executable,
            "-m",
            "sqla_queue",
            "worker",
            TARGET,
            "--url",
            db_url,
            "--concurrency",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1, usage.stderr
    down = subprocess.run(
        [sys.executable, "-m", "sqla_queue", "verify", TARGET, "--url", _unreachable(db_url)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert down.returncode == 1 and "Traceback" not in down.stderr, down.stderr
    assert len(down.stderr.splitlines()) == 2 and "s3cret" not in down.stderr
