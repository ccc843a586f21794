"""How the command line shows text, times, attempts, durations and tables (no database)."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import re
import uuid

import pytest

from sqla_queue._durations import format_duration
from sqla_queue.cli.controls import format_rate, parse_rate
from sqla_queue.cli.render import (
    Cell,
    Column,
    EscapingFormatter,
    escape,
    fit_line,
    format_attempts,
    format_time,
    json_text,
    make_console,
    print_table,
    table_lines,
)
from sqla_queue.cli.status import render_status
from sqla_queue.periodic import Schedule
from sqla_queue.status import QueueStatus, TaskStatus, WorkerStatus

#: Every character that must never reach a terminal raw (a newline may: it ends lines).
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

# -- escaping -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("bell\x07", "bell\\x07"),
        ("\x9b31m", "\\x9b31m"),  # C1 CSI: one byte starts a terminal command
        ("del\x7f", "del\\x7f"),
        ("\x00nul", "\\x00nul"),
        ("a\nb\tc\rd", "a\\nb\\tc\\rd"),  # a table cell stays on one line
        ("\u202eevil", "\\u202eevil"),  # right-to-left override
        ("line\u2028sep", "line\\u2028sep"),
        ("naïve café ✓ 日本", "naïve café ✓ 日本"),  # printable text stays as it is
        ("C:\\path [red]x[/] :fire:", "C:\\path [red]x[/] :fire:"),
    ],
)
def test_escape_shows_every_control_character(text: str, shown: str) -> None:
    assert escape(text) == shown


def test_escape_of_several_lines_keeps_newlines_and_tabs_only() -> None:
    escaped = escape("Traceback:\n\tline 1\r\x1b[2Jhidden", multiline=True)
    assert escaped == "Traceback:\n\tline 1\\r\\x1b[2Jhidden"


@pytest.mark.parametrize(
    "value",
    [
        "\x1b[2J\x07\x9b\x7f\u202e\u2028 ü",
        {"key\x9b": ["\x1b", 1, None, True], "ok": "日本"},
        "\ud800 lone surrogate",
    ],
)
@pytest.mark.parametrize("indent", [None, 2])
def test_json_text_is_valid_json_with_no_raw_control(value: object, indent: int | None) -> None:
    text = json_text(value, indent=indent)
    assert json.loads(text) == value
    assert not RAW.search(text), repr(text)
    assert "ü" in text or "ü" not in json.dumps(value, ensure_ascii=False)  # still readable


def test_log_lines_are_escaped_and_keep_tracebacks() -> None:
    formatter = EscapingFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError("boom\x1b[2J")
    except ValueError:
        import sys

        record = logging.LogRecord("w", logging.ERROR, "f", 1, "job %s", ("x\x9b",), None)
        record.exc_info = sys.exc_info()
    line = formatter.format(record)
    assert line.startswith("ERROR job x\\x9b\nTraceback") and "boom\\x1b[2J" in line
    assert not RAW.search(line)


# -- times, attempts, durations, rates -----------------------------------------------------


def test_times_are_utc_to_the_second_with_a_z() -> None:
    riga = dt.timezone(dt.timedelta(hours=2))
    assert format_time(dt.datetime(2026, 12, 3, 21, 4, 5, 999, tzinfo=riga)) == (
        "2026-12-03 19:04:05Z"
    )
    assert format_time(dt.datetime(2026, 12, 3, 19, 4, 5)) == "2026-12-03 19:04:05Z"
    assert format_time(None) == "-"


def test_attempts_read_made_of_allowed() -> None:
    assert format_attempts(2, 5) == "2 of 5"


@pytest.mark.parametrize(
    ("value", "parts", "shown"),
    [
        (dt.timedelta(days=7), None, "7 d"),
        (10, None, "10 s"),
        (5400, None, "1 h 30 min"),
        (dt.timedelta(days=1, hours=2, minutes=3, seconds=4), None, "1 d 2 h 3 min 4 s"),
        (dt.timedelta(days=1, hours=2, minutes=3, seconds=4), 2, "1 d 2 h"),
        (3600, None, "1 h"),
        (0.4, None, "0.4 s"),
        (0.05, None, "0.05 s"),
        (2.5, None, "2.5 s"),
        (0, None, "0 s"),
        (90, None, "1 min 30 s"),
        (dt.timedelta(microseconds=1), None, "0 s"),
        (-30, None, "-30 s"),
        (dt.timedelta.max, 1, "999999999 d"),
    ],
)
def test_durations_read_as_a_person_writes_them(
    value: float | dt.timedelta, parts: int | None, shown: str
) -> None:
    assert format_duration(value, parts=parts) == shown


def test_a_schedule_describes_its_interval_in_words() -> None:
    every = Schedule(name="tick", task="tick", every=dt.timedelta(seconds=10))
    assert every.describe == "every 10 s"
    assert Schedule(name="t", task="t", every=dt.timedelta(hours=1, minutes=30)).describe == (
        "every 1 h 30 min"
    )


@pytest.mark.parametrize("rate", ["50/s", "100/10s", "1000/h", "5/7d", "2/90s", "3/1.5s"])
def test_a_rate_is_shown_as_it_is_typed(rate: str) -> None:
    assert format_rate(*parse_rate(rate)) == rate
    assert format_rate(5, 604_800.0) == "5/7d"


# -- tables ---------------------------------------------------------------------------------

COLUMNS = (
    Column("task", least=12),
    Column("pending", right=True, drop=3),
    Column("sched", right=True, drop=1),
    Column("error", least=8, cut="end", drop=2),
)
ROWS: list[list[Cell]] = [
    ["reports.rebuild_invoice_summaries", "3", "0", "ValueError: disk full on /var/lib"],
    ["noop", ("12", "bold red"), "1", "-"],
]


def plain(width: int | None) -> list[str]:
    return [line.plain for line in table_lines(COLUMNS, ROWS, width)]


def test_a_table_without_a_width_shows_everything() -> None:
    lines = plain(None)
    assert lines[0].split() == ["task", "pending", "sched", "error"]
    assert lines[1].startswith("reports.rebuild_invoice_summaries  ")
    assert lines[1].endswith("ValueError: disk full on /var/lib")
    assert lines[2].split() == ["noop", "12", "1", "-"]


@pytest.mark.parametrize("width", [80, 60, 40, 30, 24])
def test_a_table_fits_its_width_and_keeps_the_name(width: int) -> None:
    lines = plain(width)
    assert all(len(line) <= width for line in lines), lines
    assert lines[2].startswith("noop ")
    name = lines[1].split("  ")[0]
    head, _, tail = name.partition("…")
    assert len(name) >= 12 and "reports.rebuild_invoice_summaries".startswith(head)
    assert "reports.rebuild_invoice_summaries".endswith(tail)


def test_columns_go_in_their_drop_order_and_a_line_says_which() -> None:
    lines = plain(30)
    assert lines[0].split() == ["task", "pending"]
    # The note that names the hidden columns wraps; it is never cut.
    start = next(i for i, line in enumerate(lines) if line.startswith("(hidden, too narrow:"))
    note = " ".join(lines[start:])
    assert note.startswith("(hidden, too narrow: sched, e") and note.endswith("shows all)")
    assert all(len(line) <= 30 for line in lines[start:])


def test_cut_texts_keep_both_ends_of_names_and_the_start_of_messages() -> None:
    assert fit_line("myapp.jobs.send_invoice_reminder", 16, cut="middle") == "myapp.jo…eminder"
    assert fit_line("ValueError: disk full", 12) == "ValueError:…"
    assert fit_line("日本語のタスク", 7) == "日本語…"  # wide characters count twice
    assert fit_line("short", 80) == "short"


def test_tables_print_markup_and_emoji_codes_as_text() -> None:
    out = io.StringIO()
    print_table(
        [Column("task")], [["[red]x[/]"], [":fire:"], ["[/]"]], empty="-", console=make_console(out)
    )
    assert out.getvalue().split("\n")[1:4] == ["[red]x[/]", ":fire:", "[/]"]


# -- the status screen ----------------------------------------------------------------------

NOW = dt.datetime(2026, 12, 3, 19, 4, 5, tzinfo=dt.UTC)
LONG = "reports.nightly.rebuild_every_customer_invoice_summary_for_the_previous_month"


def task(name: str, **counts: int) -> TaskStatus:
    values: dict[str, object] = {
        "pending": 0,
        "scheduled": 0,
        "waiting": 0,
        "running": 0,
        "oldest_due_seconds": 5400.0,
        "limit": None,
        "seats_in_use": 0,
        "paused": False,
        "failed_last_day": 0,
        "finished_last_minute": 0,
        "finished_last_hour": 0,
    }
    return TaskStatus(task=name, **(values | counts))  # type: ignore[arg-type]


def long_status() -> QueueStatus:
    worker = WorkerStatus(
        worker_id=uuid.UUID(int=1),
        hostname="ip-10-0-12-34.eu-west-1.compute.internal",
        pid=4242,
        tasks=(LONG, "noop"),
        concurrency=16,
        running=3,
        finished=123_456,
        started_at=NOW - dt.timedelta(days=7),
        seen_at=NOW,
        seen_seconds_ago=1.25,
    )
    tasks = (task(LONG, pending=123_456, running=16), task("noop", pending=1))
    return QueueStatus(now=NOW, tasks=tasks, workers=(worker,))


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_status_screen_fits_and_names_every_task(width: int) -> None:
    out = io.StringIO()
    console = make_console(out)
    console.print(render_status(long_status(), title="myapp.jobs:queue", width=width))
    lines = out.getvalue().splitlines()
    assert all(len(line) <= width for line in lines), lines
    rows = [line for line in lines if line.startswith(("reports.", "noop "))]
    assert len(rows) == 2 and rows[1].split()[:3] == ["noop", "1", "0"]
    name = rows[0].split("  ")[0]
    assert len(name) >= 32 and "…" in name and LONG.endswith(name.partition("…")[2])
    assert "123456" in rows[0]  # its pending count
    assert "1 h 30 min" in out.getvalue() or width < 100  # oldest, in words, when shown


def test_the_status_screen_without_a_width_is_one_row_per_line() -> None:
    out = io.StringIO()
    make_console(out).print(render_status(long_status(), title="app:queue"))
    text = out.getvalue()
    assert f"\n{LONG}  " in text and "1 h 30 min" in text and "1.2 s ago" in text
    assert "2026-12-03 19:04:05Z" in text and "2026-11-26 19:04:05Z" in text
    assert "hidden" not in text
