"""The command line at its edges (issue 26): hostile text from the database, ids and tasks
that do not exist, an 80-column terminal, a pipe, and every help screen."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.__main__ import build_parser, main
from sqla_queue.cli.scaffold import (
    EXIT_FAILED,
    EXIT_FINISHED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
)
from tests.support.app import boom, echo, noop, queue

pytestmark = pytest.mark.integration
TARGET = "tests.support.app:queue"

#: Clears the screen, retitles the window, rings the bell, starts a one-byte CSI (C1),
#: reverses the text that follows, and returns the cursor to overwrite the line.
HOSTILE = "x\x1b[2J\x1b]0;owned\x07\x9b31m\u202eevil\rend"
#: Every character that must never reach the terminal raw (a newline may: it ends lines).
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
#: How the table and message printers show HOSTILE.
SHOWN = "x\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202eevil\\rend"

#: Task names longer than any sane column, alike at both ends (a cut keeps both).
LONG_TASKS = (
    "reports.nightly.rebuild_every_customer_invoice_summary_for_the_previous_month",
    "reports.nightly.rebuild_every_customer_invoice_summary_for_the_previous_week",
)


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """Run ``sqla-queue argv``: its status, stdout and stderr."""
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def strings_in(value: Any) -> list[str]:
    """Every string in a decoded JSON document, keys and values."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (key, *strings_in(item))]
    if isinstance(value, list):
        return [text for item in value for text in strings_in(item)]
    return []


def assert_harmless(text: str) -> None:
    assert not RAW.search(text), repr(text)


# -- control characters never reach the terminal ---------------------------------------------


def test_job_texts_are_escaped_in_failed_jobs_and_result(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the whole message fits: escaped, not cut
    with SessionLocal.begin() as session:
        failed = boom.enqueue(session, message=HOSTILE)
        echoed = echo.enqueue(session, HOSTILE)
        keyed = noop.options(unique_key=f"key{HOSTILE}", delay=3600).enqueue(session)
    assert main(["worker", TARGET, "--url", db_url, "--burst"]) == EXIT_OK
    capsys.readouterr()
    url = ["--url", db_url]

    status, out, _ = run(capsys, ["failed", TARGET, *url])
    assert status == EXIT_OK and SHOWN in out
    assert_harmless(out)
    status, out, _ = run(capsys, ["jobs", TARGET, *url])
    assert status == EXIT_OK and f"key{SHOWN}" in out
    assert_harmless(out)
    status, out, err = run(capsys, ["result", TARGET, *url, str(failed)])
    assert status == EXIT_FAILED and out == "" and SHOWN in err
    assert_harmless(err)
    # A payload: printed as JSON whose string escapes every control character.
    status, out, _ = run(capsys, ["result", TARGET, *url, str(echoed)])
    assert status == EXIT_OK and json.loads(out) == HOSTILE
    assert_harmless(out)

    # --json stays valid JSON with the very same text in it.
    status, out, _ = run(capsys, ["failed", TARGET, *url, "--json"])
    assert_harmless(out)
    assert json.loads(out)[0]["last_error"]["message"] == HOSTILE
    status, out, _ = run(capsys, ["jobs", TARGET, *url, "--json"])
    assert_harmless(out)
    assert {row["id"]: row["unique_key"] for row in json.loads(out)}[keyed] == f"key{HOSTILE}"
    status, out, _ = run(capsys, ["result", TARGET, *url, str(failed), "--json"])
    assert status == EXIT_FAILED
    assert_harmless(out)
    assert json.loads(out)["error"]["message"] == HOSTILE
    status, out, _ = run(capsys, ["result", TARGET, *url, str(echoed), "--json"])
    assert_harmless(out)
    assert json.loads(out)["result"] == HOSTILE


def plant_hostile_rows(owner_engine: Engine) -> None:
    """Rows that another tool (or a hostile writer) stored: every text is HOSTILE."""
    tables = queue.tables
    with owner_engine.begin() as connection:
        connection.execute(
            tables.controls.insert(),
            [{"task": f"paused{HOSTILE}", "paused": True, "rate_max": 5, "rate_seconds": 7.0}],
        )
        connection.execute(
            tables.limits.insert(), [{"task": f"limited{HOSTILE}", "concurrency_limit": 2}]
        )
        connection.execute(
            tables.workers.insert(),
            [
                {
                    "worker_id": uuid.uuid4(),
                    "hostname": f"host{HOSTILE}",
                    "pid": 4242,
                    "tasks": [f"task{HOSTILE}"],
                    "concurrency": 4,
                }
            ],
        )
        connection.execute(
            tables.daemons.insert(),
            [{"name": f"daemon{HOSTILE}", "instance": 0, "last_error": HOSTILE}],
        )
        connection.execute(
            tables.schedules.insert(),
            [
                {
                    "name": f"schedule{HOSTILE}",
                    "task": f"task{HOSTILE}",
                    "last_tick": dt.datetime(2026, 12, 3, 19, 4, 5, tzinfo=dt.UTC),
                }
            ],
        )


@pytest.mark.parametrize(
    "command",
    [["status"], ["top", "--once"], ["daemons"], ["periodic"], ["limits"], ["rate-limit"]],
    ids=" ".join,
)
def test_stored_texts_are_escaped_in_every_listing(
    command: list[str],
    db_url: str,
    owner_engine: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    plant_hostile_rows(owner_engine)
    name, *options = command
    status, out, err = run(capsys, [name, TARGET, "--url", db_url, *options])
    assert status == EXIT_OK, err
    assert_harmless(out + err)
    assert SHOWN in out
    if name != "top":
        status, out, err = run(capsys, [name, TARGET, "--url", db_url, *options, "--json"])
        assert status == EXIT_OK, err
        assert_harmless(out + err)
        assert any(HOSTILE in text for text in strings_in(json.loads(out)))


def test_worker_logs_and_error_lines_are_escaped(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The worker logs each failure with the handler's message: a log line is printed text.
    with SessionLocal.begin() as session:
        boom.enqueue(session, message=HOSTILE)
    worker = subprocess.run(
        [sys.executable, "-m", "sqla_queue", "worker", TARGET, "--url", db_url, "--burst"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    logged = worker.stderr.decode("utf-8", errors="surrogateescape")
    assert worker.returncode == 0 and "ValueError" in logged, logged
    assert SHOWN in logged
    assert_harmless(logged)
    # Refusals that repeat what the operator typed (or pasted).
    status, _, err = run(capsys, ["pause", TARGET, "--url", db_url, f"t{HOSTILE}"])
    assert status == EXIT_USAGE and err.count("\n") == 1
    assert_harmless(err)
    status, _, err = run(capsys, ["status", TARGET, "--url", db_url, HOSTILE])
    assert status == EXIT_USAGE and f"unrecognized arguments: {SHOWN}" in err
    assert_harmless(err)


# -- requeue and resume: what does not exist is refused and named -----------------------------


def test_requeue_names_ids_not_found_and_jobs_left_alone(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SessionLocal.begin() as session:
        failed = boom.enqueue(session, message="disk full")
        done = noop.enqueue(session)
    assert main(["worker", TARGET, "--url", db_url, "--burst"]) == EXIT_OK
    capsys.readouterr()
    requeue = ["requeue", TARGET, "--url", db_url]

    status, out, _ = run(capsys, [*requeue, "424242"])
    assert status == EXIT_NOT_FOUND
    assert out == "job 424242: not_found (no job has this id)\n"

    status, out, _ = run(capsys, [*requeue, str(done)])
    assert status == EXIT_FINISHED
    assert out.startswith(f"job {done}: left alone (it is succeeded")

    status, out, _ = run(capsys, [*requeue, str(failed), str(done), "424242", "--json"])
    assert status == EXIT_NOT_FOUND
    assert [(e["id"], e["outcome"]) for e in json.loads(out)] == [
        (failed, "requeued"),
        (done, "left_alone"),
        (424242, "not_found"),
    ]
    with SessionLocal() as session:
        jobs: list[Any] = list(session.scalars(select(queue.Job)))
    assert {job.id: job.status for job in jobs} == {failed: "queued", done: "succeeded"}

    status, out, _ = run(capsys, [*requeue, str(failed)])  # queued now: left alone
    assert status == EXIT_FINISHED and "left alone" in out


def test_requeue_says_which_unique_key_holds_a_job_back(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SessionLocal.begin() as session:
        failed = boom.options(unique_key="account-7").enqueue(session, message="disk full")
    assert main(["worker", TARGET, "--url", db_url, "--burst"]) == EXIT_OK
    with SessionLocal.begin() as session:  # the key is free again: another job takes it
        holder = boom.options(unique_key="account-7", delay=3600).enqueue(session)
    capsys.readouterr()
    status, out, _ = run(capsys, ["requeue", TARGET, "--url", db_url, str(failed)])
    assert status == EXIT_FINISHED
    assert out == (
        f"job {failed}: left alone (its unique key 'account-7' is held by job {holder})\n"
    )
    with SessionLocal() as session:
        job: Any = session.get(queue.Job, failed)
        assert job.status == "failed"


def test_resume_of_an_unknown_task_is_refused_like_pause(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    for command in ("pause", "resume"):
        status, out, err = run(capsys, [command, TARGET, "--url", db_url, "no_such_task"])
        assert status == EXIT_USAGE and out == "", (command, out)
        assert err.startswith(f"sqla-queue: cannot {command}") and err.count("\n") == 1, err
        assert "Traceback" not in err and "no_such_task" in err
    # Nothing was stored: no phantom task in the status.
    status, out, _ = run(capsys, ["status", TARGET, "--url", db_url, "--json"])
    assert "no_such_task" not in out
    status, out, _ = run(capsys, ["resume", TARGET, "--url", db_url, "noop"])
    assert status == EXIT_OK and out == "noop: resumed\n"


# -- every help screen: a description and the exit statuses ---------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    actions = build_parser()._subparsers._group_actions  # type: ignore[union-attr]
    (action,) = actions
    return dict(action.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_help_screen_has_a_description_and_its_exit_statuses(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert main([name, "--help"]) == EXIT_OK
    text = capsys.readouterr().out
    usage, _, rest = text.partition("\n\n")
    assert usage.startswith(f"usage: sqla-queue {name}")
    description = rest.split("\n\n")[0]
    assert len(description) > 60 and not description.startswith(("positional", "options")), text
    assert text.index("exit status:") > text.index("options:"), text  # the epilog
    statuses = text[text.index("exit status:") :]
    for code in ("0", "1", "2"):
        assert re.search(rf"^  {code} +\S", statuses, re.M), (code, statuses)


def test_the_top_help_screen_lists_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == EXIT_OK
    text = capsys.readouterr().out
    assert "exit status" in text and "  0  success" in text and "  2  a usage error" in text


# -- status and top at 80 and 100 columns, and in a pipe --------------------------------------


def plant_long_names(owner_engine: Engine) -> None:
    """Two paused tasks with long names, and a live worker on a long host serving them."""
    tables = queue.tables
    with owner_engine.begin() as connection:
        connection.execute(
            tables.controls.insert(), [{"task": name, "paused": True} for name in LONG_TASKS]
        )
        connection.execute(
            tables.workers.insert(),
            [
                {
                    "worker_id": uuid.uuid4(),
                    "hostname": "ip-10-0-12-34.eu-west-1.compute.internal",
                    "pid": 4242,
                    "tasks": list(LONG_TASKS),
                    "concurrency": 16,
                }
            ],
        )


def task_names_shown(lines: list[str]) -> list[str]:
    """The first cell of each row of the tasks table (header to the blank line)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("task "))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith("("):
            break
        rows.append(line.split("  ")[0])
    return rows


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("command", [["status"], ["top", "--once"]], ids=["status", "top"])
def test_status_fits_the_terminal_and_names_every_task(
    width: int,
    command: list[str],
    db_url: str,
    owner_engine: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plant_long_names(owner_engine)
    monkeypatch.setenv("COLUMNS", str(width))
    status, out, err = run(capsys, [command[0], TARGET, "--url", db_url, *command[1:]])
    assert status == EXIT_OK, err
    lines = out.splitlines()
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    shown = task_names_shown(lines)
    # Every known task has a row, named: short names whole, long ones cut in the middle.
    assert {"noop", "boom", "echo"} <= set(shown)
    long_rows = [name for name in shown if name.startswith("reports.nightly")]
    assert len(long_rows) == 2 and len(set(long_rows)) == 2, shown
    # Each cut row stands for exactly one of the long names (matched by its head and its
    # tail: sorting the cut rows need not keep the names' order).
    matched = set()
    for row in long_rows:
        head, _, tail = row.rstrip().partition("…")
        assert len(row.rstrip()) >= 32, row
        names = [n for n in LONG_TASKS if n.startswith(head) and n.endswith(tail)]
        assert len(names) == 1, (row, names)
        matched.add(names[0])
    assert matched == set(LONG_TASKS)
    # The counts that matter most are there, and the paused flag.
    header = next(line for line in lines if line.startswith("task "))
    assert header.split()[:3] == ["task", "pending", "running"] and "paused" in header


def test_status_in_a_pipe_shows_everything_one_row_per_line(
    db_url: str,
    owner_engine: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plant_long_names(owner_engine)
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: no terminal, no $COLUMNS
    status, out, _ = run(capsys, ["status", TARGET, "--url", db_url])
    assert status == EXIT_OK
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("task "))
    assert header.split() == [
        "task", "pending", "sched", "waiting", "running", "suspended", "oldest", "seats",
        "paused", "fail/24h", "done/1m", "done/1h",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(LONG_TASKS)}
    assert set(rows) == set(LONG_TASKS)  # whole names, one row each
    assert all(cells[8] == "yes" for cells in rows.values())
    worker = next(line for line in lines if "ip-10-0-12-34" in line)
    assert worker.endswith(", ".join(LONG_TASKS))
    assert not any("hidden" in line for line in lines)


def test_listings_fit_80_columns(
    db_url: str,
    owner_engine: Engine,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with SessionLocal.begin() as session:
        boom.enqueue(session, message="a long message " * 20)
        noop.options(unique_key="k" * 60).enqueue(session)
    assert main(["worker", TARGET, "--url", db_url, "--burst"]) == EXIT_OK
    plant_hostile_rows(owner_engine)
    monkeypatch.setenv("COLUMNS", "80")
    capsys.readouterr()
    for command in ("failed", "jobs", "daemons", "periodic", "limits", "rate-limit"):
        status, out, err = run(capsys, [command, TARGET, "--url", db_url])
        assert status == EXIT_OK, err
        assert all(len(line) <= 80 for line in out.splitlines()), (command, out)


# -- one way to show times, attempts and durations ------------------------------------------


def test_times_and_attempts_read_the_same_in_failed_jobs_and_result(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with SessionLocal.begin() as session:
        failed = boom.options(max_attempts=1).enqueue(session, message="disk full")
    assert main(["worker", TARGET, "--url", db_url, "--burst"]) == EXIT_OK
    with SessionLocal() as session:
        job: Any = session.get(queue.Job, failed)
        finished = job.finished_at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    capsys.readouterr()
    url = ["--url", db_url]
    _, listed, _ = run(capsys, ["failed", TARGET, *url])
    _, jobs, _ = run(capsys, ["jobs", TARGET, *url])
    _, _, result = run(capsys, ["result", TARGET, *url, str(failed)])
    for text in (listed, jobs, result):
        assert finished in text and "1 of 1" in text, text
    assert f"attempt 1 of 1, failed at {finished}" in result


def test_prune_prints_its_age_as_a_person_writes_it(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, ["prune", TARGET, "--url", db_url, "--older-than", "7d"])
    assert status == EXIT_OK and out.startswith("pruned 0 finished job(s) older than 7 d:\n")
    status, out, _ = run(capsys, ["prune", TARGET, "--url", db_url, "--older-than", "5400"])
    assert out.startswith("pruned 0 finished job(s) older than 1 h 30 min:\n")
