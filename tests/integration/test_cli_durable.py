"""The operators' commands on durable jobs against a real database: suspended jobs in
``status`` and ``jobs`` (what each waits for, until when), ``job ID`` with its committed
steps, ``signal``, ``cancel`` of a suspended job, and ``durable versions`` / ``migrate``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.cli.main import main
from sqla_queue.cli.scaffold import EXIT_FINISHED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from tests.support.durable_app import dj_versioned, queue
from tests.support.durable_checks import drain, outcome, suspend_three

pytestmark = pytest.mark.integration
TARGET = "tests.support.durable_app:queue"
JOBS = queue.tables.jobs


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command; its exit status, stdout and stderr."""
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def run_json(
    capsys: pytest.CaptureFixture[str], db_url: str, *command: str, after: tuple[str, ...] = ()
) -> Any:
    """Run the command (``after``: its words after the queue) with ``--url`` and
    ``--json``; its document (exit status 0)."""
    status, out, err = run(capsys, *command, TARGET, "--url", db_url, *after, "--json")
    assert status == EXIT_OK, err
    return json.loads(out)


@pytest.fixture
def waiting(SessionLocal: sessionmaker[Session]) -> dict[str, int]:
    """Three jobs after a burst: one waits for a signal, one sleeps an hour, one succeeded."""
    return suspend_three(SessionLocal)


def test_status_counts_suspended_jobs(
    db_url: str,
    waiting: dict[str, int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = run_json(capsys, db_url, "status")
    by_task = {t["task"]: t for t in shown["tasks"]}
    assert by_task["dj_signal"]["suspended"] == 1
    assert by_task["dj_sleepy"]["suspended"] == 1
    assert by_task["dj_steps"]["suspended"] == 0
    assert by_task["dj_signal"]["pending"] == by_task["dj_signal"]["running"] == 0

    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: every column
    status, out, _ = run(capsys, "status", TARGET, "--url", db_url)
    assert status == EXIT_OK
    lines = out.splitlines()
    assert "suspended 2" in lines[0]
    header = next(line.split() for line in lines if line.startswith("task "))
    column = header.index("suspended")
    assert header[column - 1] == "running"
    row = next(line.split() for line in lines if line.startswith("dj_signal "))
    assert row[column] == "1"


def test_jobs_lists_suspended_jobs_with_their_waits(
    db_url: str,
    waiting: dict[str, int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = run_json(capsys, db_url, "jobs", after=("--status", "suspended"))
    by_id = {row["id"]: row for row in rows}
    assert set(by_id) == {waiting["signal"], waiting["sleepy"]}
    assert by_id[waiting["signal"]]["state"] == "suspended"
    assert by_id[waiting["signal"]]["waits_for"] == "signal:approved"
    assert by_id[waiting["signal"]]["until"] is None
    assert by_id[waiting["sleepy"]]["waits_for"] == "sleep"
    assert by_id[waiting["sleepy"]]["until"] is not None
    # A job that is not suspended has neither.
    (done,) = run_json(capsys, db_url, "jobs", after=("--status", "succeeded"))
    assert done["id"] == waiting["steps"] and done["waits_for"] is done["until"] is None

    monkeypatch.setenv("COLUMNS", "200")
    status, out, _ = run(capsys, "jobs", TARGET, "--url", db_url)
    assert status == EXIT_OK
    header, *lines = out.splitlines()
    assert header.split()[:6] == ["id", "task", "state", "waits", "for", "until"]
    line = {int(text.split()[0]): text for text in lines}
    assert "signal:approved" in line[waiting["signal"]]
    assert "no deadline" in line[waiting["signal"]]
    assert line[waiting["sleepy"]].split()[3] == "sleep"
    assert line[waiting["steps"]].split()[2:5] == ["succeeded", "-", "-"]
    # Without a suspended job in the list, the two columns are not there.
    status, out, _ = run(capsys, "jobs", TARGET, "--url", db_url, "--status", "succeeded")
    assert "waits for" not in out.splitlines()[0]


def test_job_shows_the_committed_steps(
    db_url: str,
    waiting: dict[str, int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = run_json(capsys, db_url, "job", after=(str(waiting["steps"]),))
    assert shown["job"]["state"] == "succeeded"
    assert [(s["name"], s["kind"], s["result"]) for s in shown["steps"]] == [
        ("s0", "step", 0),
        ("s1", "step", 1),
    ]
    assert all(s["compensated_by"] is None and s["committed_at"] for s in shown["steps"])
    sleepy = run_json(capsys, db_url, "job", after=(str(waiting["sleepy"]),))
    assert sleepy["job"]["waits_for"] == "sleep"
    assert sleepy["steps"][0]["name"] == "before"

    monkeypatch.setenv("COLUMNS", "200")
    status, out, _ = run(capsys, "job", TARGET, "--url", db_url, str(waiting["signal"]))
    assert status == EXIT_OK
    head, columns, wait = out.splitlines()
    assert head.split()[:4] == ["job", str(waiting["signal"]), "dj_signal", "suspended"]
    assert "waits for signal:approved" in head and "until no deadline" in head
    assert columns.split() == [
        "step", "kind", "version", "attempt", "committed", "compensation", "result",
    ]  # fmt: skip
    assert wait.split()[:2] == ["signal:approved", "wait"]
    status, out, _ = run(capsys, "job", TARGET, "--url", db_url, str(waiting["steps"]))
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert set(rows) == {"s0", "s1"} and rows["s1"][-1] == "1"

    status, _, err = run(capsys, "job", TARGET, "--url", db_url, "987654321")
    assert status == EXIT_NOT_FOUND and "987654321" in err


def test_signal_wakes_the_job_and_says_what_happened(
    db_url: str,
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    waiting: dict[str, int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = str(waiting["signal"])
    signal = ["signal", TARGET, "--url", db_url]
    status, out, _ = run(capsys, *signal, job, "approved", "--payload", '{"by": "ops"}')
    assert status == EXIT_OK
    assert (
        out == f"job {job}: signal 'approved' stored; the job was waiting for it and runs again\n"
    )
    status, out, _ = run(capsys, *signal, job, "approved", "--payload", "2", "--json")
    assert status == EXIT_FINISHED
    assert json.loads(out)["outcome"] == "not_stored"
    drain(SessionLocal)
    assert outcome(engine, waiting["signal"]) == ("succeeded", {"by": "ops"})
    # To a finished job: stored, never read (7); to no job (6); bad input: usage (2).
    status, out, _ = run(capsys, *signal, job, "late", "--json")
    assert status == EXIT_FINISHED and json.loads(out)["outcome"] == "finished"
    status, _, err = run(capsys, *signal, "987654321", "approved")
    assert status == EXIT_NOT_FOUND and "987654321" in err
    status, _, err = run(capsys, *signal, job, "approved", "--payload", "{nope")
    assert status == EXIT_USAGE and "not JSON" in err
    status, _, err = run(capsys, *signal, job, "x" * 201)
    assert status == EXIT_USAGE and "name" in err


def test_cancel_ends_a_suspended_job_at_once(
    db_url: str,
    engine: Engine,
    waiting: dict[str, int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = str(waiting["sleepy"])
    status, out, _ = run(capsys, "cancel", TARGET, "--url", db_url, job)
    assert (status, out) == (EXIT_OK, f"job {job}: cancelled\n")
    assert outcome(engine, waiting["sleepy"])[0] == "cancelled"
    (left,) = run_json(capsys, db_url, "jobs", after=("--status", "suspended"))
    assert left["id"] == waiting["signal"]
    shown = run_json(capsys, db_url, "job", after=(job,))
    assert shown["job"]["state"] == "cancelled" and shown["job"]["waits_for"] is None


def test_durable_versions_and_migrate(
    db_url: str,
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with SessionLocal.begin() as session:
        job = dj_versioned.enqueue(session, 1)
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        queue.signal(session, job, "go")
        # The code is now version 2: the stored step is version 1, and the job waits.
        session.execute(
            update(JOBS).where(JOBS.c.id == job).values(payload={"args": [2], "kwargs": {}})
        )
    drain(SessionLocal)
    (row,) = run_json(capsys, db_url, "jobs", after=("--status", "suspended"))
    assert row["waits_for"] == "version:reserve"

    versions = run_json(capsys, db_url, "durable", "versions")
    assert versions == [{"task": "dj_versioned", "step": "reserve", "version": 1, "jobs": 1}]
    monkeypatch.setenv("COLUMNS", "200")
    status, out, _ = run(capsys, "durable", "versions", TARGET, "--url", db_url)
    assert status == EXIT_OK
    assert [line.split() for line in out.splitlines()] == [
        ["task", "step", "version", "jobs"],
        ["dj_versioned", "reserve", "1", "1"],
    ]

    migrate = ["durable", "migrate", TARGET, "--url", db_url, "--task", "dj_versioned"]
    status, out, _ = run(capsys, *migrate, "--step", "reserve", "--from", "3", "--to", "4")
    assert status == EXIT_OK and "nothing migrated" in out
    status, out, _ = run(capsys, *migrate, "--step", "reserve", "--from", "1", "--to", "2")
    assert status == EXIT_OK
    assert out == f"migrated step 'reserve' of 1 dj_versioned job(s) from version 1 to 2: {job}\n"
    status, _, _ = run(capsys, *migrate, "--step", "reserve", "--from", "0", "--to", "2")
    assert status == EXIT_USAGE
    drain(SessionLocal)
    assert outcome(engine, job) == ("succeeded", {"by": 1})
    status, out, _ = run(capsys, "durable", "versions", TARGET, "--url", db_url)
    assert out.strip() == "no stored steps of queued jobs"
