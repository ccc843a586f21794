"""``sqla-queue jobs``, ``cancel`` and ``result`` (issue 14) against a real database."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from sqlalchemy import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.cli.main import main
from sqla_queue.cli.scaffold import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_FINISHED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
from sqla_queue.listing import list_jobs
from sqla_queue.statements.listing import JobListingParams, job_listing_statement
from tests.support.app import Order, boom, noop, queue, record
from tests.support.running import pretend_claimed, worker_thread
from tests.unit.test_admin_contracts import contract_problems

pytestmark = pytest.mark.integration
TARGET = "tests.support.app:queue"


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str], status: int = EXIT_OK) -> Any:
    """Run ``argv`` with ``--json``; check the status and return the parsed output."""
    assert main([*argv, "--json"]) == status, capsys.readouterr()
    return json.loads(capsys.readouterr().out)


def ids_of(rows: list[dict[str, Any]]) -> list[int]:
    return [row["id"] for row in rows]


# -- sqla-queue jobs -------------------------------------------------------------------------


def test_jobs_lists_newest_first_with_state_and_filters(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with SessionLocal.begin() as session:
        failed = boom.enqueue(session, message="disk full")
    assert main(["worker", TARGET, "--url", db_url, "--burst"]) == EXIT_OK
    with SessionLocal.begin() as session:
        order = Order(id=42, email="ada@example.com")
        session.add(order)
        session.flush()
        linked = record.options(about=order, unique_key="order-42").enqueue(session, "x")
        keyed = noop.options(queue_id="account-7").enqueue(session)
        later = noop.options(delay=3600).enqueue(session)
        running = noop.enqueue(session)
    with engine.begin() as connection:
        pretend_claimed(connection, running)
    capsys.readouterr()
    jobs = ["jobs", TARGET, "--url", db_url]

    everything = run_json(capsys, jobs)
    assert ids_of(everything) == [running, later, keyed, linked, failed]
    states = {row["id"]: row["state"] for row in everything}
    assert states == {
        running: "running",
        later: "scheduled",
        keyed: "pending",
        linked: "pending",
        failed: "failed",
    }
    first = everything[3]
    assert first["unique_key"] == "order-42"
    assert (first["about_table"], first["about_key"]) == ("orders", "42")
    assert everything[4]["last_error"]["message"] == "disk full"
    assert everything[4]["attempts"] == 1 and everything[4]["finished_at"] is not None

    assert ids_of(run_json(capsys, [*jobs, "--status", "failed"])) == [failed]
    assert ids_of(run_json(capsys, [*jobs, "--status", "running"])) == [running]
    assert ids_of(run_json(capsys, [*jobs, "--status", "queued"])) == [
        running,
        later,
        keyed,
        linked,
    ]
    assert ids_of(run_json(capsys, [*jobs, "--status", "scheduled,failed"])) == [later, failed]
    assert ids_of(run_json(capsys, [*jobs, "--status", "pending", "--status", "running"])) == [
        running,
        keyed,
        linked,
    ]
    assert ids_of(run_json(capsys, [*jobs, "--task", "record", "--task", "boom"])) == [
        linked,
        failed,
    ]
    assert ids_of(run_json(capsys, [*jobs, "--key", "order-42"])) == [linked]
    assert ids_of(run_json(capsys, [*jobs, "--key", "account-7"])) == [keyed]
    assert ids_of(run_json(capsys, [*jobs, "--key", "order-42", "--task", "noop"])) == []
    assert ids_of(run_json(capsys, [*jobs, "--about", "orders:42"])) == [linked]
    assert ids_of(run_json(capsys, [*jobs, "--about", "orders"])) == [linked]
    assert ids_of(run_json(capsys, [*jobs, "--about", "orders:43"])) == []
    assert ids_of(run_json(capsys, [*jobs, "--limit", "2"])) == [running, later]

    # The same state words as the mapped Job's `state` property.
    with SessionLocal() as session:
        for row in everything:
            job = session.get(queue.Job, row["id"])
            assert job is not None and job.state == row["state"], row

    # The table: one line per job, with its state, attempts and link.
    assert main(jobs) == EXIT_OK
    table = capsys.readouterr().out
    assert re.search(rf"^ *{running}  noop +running +0 of 1  ", table, re.M), table
    assert re.search(rf"^ *{linked}  record .*  order-42 +orders:42$", table, re.M), table
    assert main([*jobs, "--key", "nothing-has-it"]) == EXIT_OK
    assert capsys.readouterr().out.strip() == "no jobs"


def test_jobs_cancelling_state_and_row_deleted(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A running job asked to stop lists as cancelling; a link outlives its row."""
    with SessionLocal.begin() as session:
        order = Order(id=7, email="bo@example.com")
        session.add(order)
        session.flush()
        job_id = noop.options(about=order).enqueue(session)
    with engine.begin() as connection:
        pretend_claimed(connection, job_id)
    assert queue.cancel(SessionLocal, [job_id]) == {job_id: "requested"}
    with SessionLocal.begin() as session:
        session.delete(session.get(Order, 7))
    capsys.readouterr()
    rows = run_json(capsys, ["jobs", TARGET, "--url", db_url, "--status", "cancelling"])
    assert ids_of(rows) == [job_id]
    assert rows[0]["about_key"] == "7"
    assert ids_of(run_json(capsys, ["jobs", TARGET, "--url", db_url, "--about", "orders:7"])) == [
        job_id
    ]


def test_listing_statement_parameters_match_their_record(engine: Engine) -> None:
    """Every filter's bound name is in JobListingParams, with the SQL's type."""
    statement = job_listing_statement(
        queue.tables,
        states=["failed", "running"],
        tasks=True,
        key=True,
        about=True,
        about_key=True,
        ids=True,
    )
    assert contract_problems(statement, JobListingParams) == []
    with engine.connect() as connection:
        assert list_jobs(connection, queue.tables, limit=5, states=["running"], ids=[1]) == []
        with pytest.raises(ValueError, match="unknown job state 'nope'"):
            list_jobs(connection, queue.tables, limit=5, states=["nope"])


# -- sqla-queue cancel ------------------------------------------------------------------------


def test_cancel_prints_each_outcome_and_exits_by_the_worst(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SessionLocal.begin() as session:
        done = noop.enqueue(session)
    assert main(["worker", TARGET, "--url", db_url, "--burst"]) == EXIT_OK
    with SessionLocal.begin() as session:
        queued = noop.enqueue(session)
        running = noop.enqueue(session)
        spare = noop.enqueue(session)
    with engine.begin() as connection:
        pretend_claimed(connection, running)
    capsys.readouterr()
    cancel = ["cancel", TARGET, "--url", db_url]

    assert main([*cancel, str(queued), str(running), str(queued)]) == EXIT_OK
    assert capsys.readouterr().out.splitlines() == [
        f"job {queued}: cancelled",
        f"job {running}: requested (it is running: asked to stop, it ends cancelled "
        "unless it succeeds)",
    ]
    with SessionLocal() as session:
        assert session.get(queue.Job, queued).status == "cancelled"  # type: ignore[union-attr]
        execution = session.get(queue.JobExecution, running)
        assert execution is not None and execution.cancel_requested

    outcomes = run_json(capsys, [*cancel, str(done), str(queued)], EXIT_FINISHED)
    assert outcomes == [
        {"id": done, "outcome": "finished", "status": "succeeded"},
        {"id": queued, "outcome": "finished", "status": "cancelled"},
    ]
    # A missing id wins over a finished one; the other ids are still cancelled.
    assert main([*cancel, str(done), "987654", str(spare)]) == EXIT_NOT_FOUND
    assert capsys.readouterr().out.splitlines() == [
        f"job {done}: finished (already succeeded: nothing to cancel)",
        "job 987654: not_found (no job has this id)",
        f"job {spare}: cancelled",
    ]


def test_cancel_reaches_a_running_handler(
    db_url: str, SessionLocal: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end: the CLI cancels a job a worker is running; `result` then says so."""
    from tests.support.app import gate, gated, reset_gates

    with SessionLocal.begin() as session:
        job_id = gated.enqueue(session, "cli-cancel", until="cancel")
    worker = queue.worker(
        SessionLocal, heartbeat_interval=0.05, install_signal_handlers=False, poll_interval=0.05
    )
    try:
        with worker_thread(worker) as stats:
            assert gate("cli-cancel").entered.wait(15)
            assert main(["cancel", TARGET, "--url", db_url, str(job_id)]) == EXIT_OK
            assert "requested" in capsys.readouterr().out
            result = ["result", TARGET, "--url", db_url, str(job_id), "--timeout", "20"]
            assert main(result) == EXIT_CANCELLED
            assert capsys.readouterr().err == f"sqla-queue: job {job_id} was cancelled\n"
        assert stats[0].cancelled == 1
        assert gate("cli-cancel").saw_cancel is True
    finally:
        reset_gates()


# -- sqla-queue result ------------------------------------------------------------------------


def test_result_of_each_outcome(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SessionLocal.begin() as session:
        succeeded = record.enqueue(session, "hello")
        failed = boom.enqueue(session, message="disk full")
    assert main(["worker", TARGET, "--url", db_url, "--burst"]) == EXIT_OK
    with SessionLocal.begin() as session:
        cancelled = noop.enqueue(session)
        waiting = noop.options(delay=3600).enqueue(session)
    assert queue.cancel(SessionLocal, [cancelled]) == {cancelled: "cancelled"}
    capsys.readouterr()
    result = ["result", TARGET, "--url", db_url]

    assert main([*result, str(succeeded)]) == EXIT_OK
    assert capsys.readouterr().out == '"hello"\n'

    assert main([*result, str(failed)]) == EXIT_FAILED
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"sqla-queue: job {failed} failed: builtins.ValueError: disk full\n")
    assert "Traceback (most recent call last)" in err  # the handler's, as recorded

    assert main([*result, str(cancelled)]) == EXIT_CANCELLED
    assert capsys.readouterr().err == f"sqla-queue: job {cancelled} was cancelled\n"

    assert main([*result, str(waiting), "--timeout", "0"]) == EXIT_TIMEOUT
    err = capsys.readouterr().err
    assert err.startswith(f"sqla-queue: job {waiting} did not finish within 0 s"), err

    assert main([*result, "987654"]) == EXIT_NOT_FOUND
    assert capsys.readouterr().err.startswith("sqla-queue: no job has id 987654")

    assert run_json(capsys, [*result, str(succeeded)]) == {
        "id": succeeded,
        "outcome": "succeeded",
        "result": "hello",
    }
    report = run_json(capsys, [*result, str(failed)], EXIT_FAILED)
    assert report["outcome"] == "failed" and report["error"]["message"] == "disk full"
    assert report["message"].startswith(f"job {failed} failed")
    assert run_json(capsys, [*result, str(cancelled)], EXIT_CANCELLED)["outcome"] == "cancelled"
    report = run_json(capsys, [*result, str(waiting), "--timeout", "0"], EXIT_TIMEOUT)
    assert report["outcome"] == "timeout"
    assert run_json(capsys, [*result, "987654"], EXIT_NOT_FOUND)["outcome"] == "not_found"


def test_result_waits_for_the_worker(
    db_url: str, SessionLocal: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    with SessionLocal.begin() as session:
        job_id = record.enqueue(session, "later", pause=0.5)
    worker = queue.worker(SessionLocal, install_signal_handlers=False, poll_interval=0.05)
    with worker_thread(worker):
        assert main(["result", TARGET, "--url", db_url, str(job_id), "--timeout", "none"]) == 0
    assert capsys.readouterr().out == '"later"\n'
    with SessionLocal() as session:
        job = session.get(queue.Job, job_id)
        assert job is not None and job.awaited


# -- the other listings' --json ---------------------------------------------------------------


def test_failed_and_limits_print_json(
    db_url: str, SessionLocal: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    with SessionLocal.begin() as session:
        bad = boom.enqueue(session, message="no space")
    assert main(["worker", TARGET, "--url", db_url, "--burst"]) == EXIT_OK
    capsys.readouterr()
    rows = run_json(capsys, ["failed", TARGET, "--url", db_url, "--limit", str(2**63 - 1)])
    assert [(r["id"], r["task"], r["last_error"]["message"]) for r in rows] == [
        (bad, "boom", "no space")
    ]
    assert dt.datetime.fromisoformat(rows[0]["finished_at"])
    limited = "tests.support.limited:queue"
    listing = run_json(capsys, ["limits", limited, "--url", db_url])
    assert {"task": "limited1", "declared": 1, "stored": None, "effective": 1} in listing
    assert run_json(capsys, ["limits", limited, "--url", db_url, "set", "noop", "3"]) == {
        "task": "noop",
        "effective": 3,
    }


# -- usage and connection errors --------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["jobs", TARGET, "--status", "nope"], r"unknown job state 'nope'; use one of queued"),
        (["jobs", TARGET, "--status", ","], r"expected a job state"),
        (["jobs", TARGET, "--about", "orders:"], r"expected TABLE or TABLE:KEY"),
        (["jobs", TARGET, "--about", ":42"], r"expected TABLE or TABLE:KEY"),
        (["jobs", TARGET, "--limit", "0"], r"--limit must be a whole number from 1"),
        (["jobs", TARGET, "--key", ""], r"--key must not be empty"),
        (["cancel", TARGET], r"the following arguments are required: ids"),
        (["cancel", TARGET, "x"], r"a job id must be a whole number"),
        (["result", TARGET, "1", "--timeout", "-1"], r"cannot be negative"),
        (["result", TARGET, "1", "--timeout", "soon"], r"invalid duration 'soon'"),
        (["result", TARGET, "1", "--timeout", "99999999d"], r"timeout must be at most"),
        (["result", TARGET, "0"], r"a job id must be a whole number from 1"),
        (["result", TARGET, "1", "2"], r"unrecognized arguments: 2"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_usage_errors_are_one_line_with_status_2(
    argv: list[str], message: str, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--url", db_url]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("sqla-queue: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert re.search(message, err), err


def test_nothing_is_cancelled_on_a_usage_error(
    db_url: str, SessionLocal: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    with SessionLocal.begin() as session:
        job_id = noop.enqueue(session)
    assert main(["cancel", TARGET, "--url", db_url, str(job_id), "-5"]) == EXIT_USAGE
    with SessionLocal() as session:
        job = session.get(queue.Job, job_id)
        assert job is not None and job.status == "queued"


@pytest.mark.parametrize(
    "command",
    [["jobs", TARGET], ["cancel", TARGET, "1"], ["result", TARGET, "1"]],
    ids=lambda argv: argv[0],
)
def test_connection_errors_are_status_1(
    command: list[str], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = make_url(db_url).set(password="s3cret", port=1).render_as_string(hide_password=False)
    assert main([*command, "--url", url]) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 2 and "s3cret" not in err and "Traceback" not in err, err
    assert lines[0].startswith("sqla-queue: cannot connect to ")


def test_help_screens_name_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert all(word in out for word in ("jobs", "cancel", "result"))
    assert main(["cancel", "--help"]) == EXIT_OK
    assert "7  one of the jobs had already finished" in capsys.readouterr().out
    assert main(["result", "--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "3  the job failed" in out and "5  the job was still queued" in out
    assert main(["jobs", "--help"]) == EXIT_OK
    assert "cancelling (running, asked to stop)" in capsys.readouterr().out
