"""Bad input at the edges, checked without a database (issue 26, items 11 and 12).

Each check runs before anything reaches the database, so none of these tests needs one:
a time zone that depends on the host, a job id that is not a whole number, an ``about``
link too long for its index, ``assert_enqueued`` expectations no job could meet, and the
command line's wording of a driver error that is not a connection error. The same checks
against a real database (nothing written) are in tests/integration/test_operator_edges.py.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from sqlalchemy import MetaData
from sqlalchemy.exc import DataError, OperationalError, ProgrammingError

from sqla_queue import Queue
from sqla_queue.admin import check_job_ids
from sqla_queue.checks import check_whole_number
from sqla_queue.cli.main import database_error_message
from sqla_queue.history.partitions import _timestamp
from sqla_queue.links import MAX_ABOUT_BYTES, about_reference
from sqla_queue.periodic import Schedule, check_timezone
from sqla_queue.status import read_status
from sqla_queue.testing.helpers import assert_enqueued

pytestmark = pytest.mark.unit

URL = "postgresql+psycopg://app:secret@db.example:5432/shop"


# -- time zones: IANA names only -------------------------------------------------------------

HOST_DEPENDENT = [
    "localtime",  # the host's own zone: a link to whatever the machine is set to
    "posixrules",  # the host's default rules
    "Factory",  # a placeholder, no real zone
    "posix/Europe/Riga",  # the "posix/" copy of the database
    "right/UTC",  # the "right/" copy: counts leap seconds
    "/etc/localtime",
    "/usr/share/zoneinfo/UTC",
    "../zoneinfo/UTC",
    "Europe/../UTC",
    "zone.tab",
    "leapseconds",
    "UTC ",
    "Europe//Riga",
]


@pytest.mark.parametrize("name", HOST_DEPENDENT)
def test_a_zone_that_is_no_iana_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"timezone|IANA"):
        check_timezone(name)
    with pytest.raises(ValueError, match=r"timezone|IANA"):
        Schedule(name="report", task="report", cron="0 6 * * *", timezone=name)


@pytest.mark.parametrize("name", [None, "", 5, b"UTC"])
def test_a_zone_that_is_no_string_is_refused(name: Any) -> None:
    with pytest.raises(TypeError, match="timezone must be an IANA zone name"):
        check_timezone(name)


@pytest.mark.parametrize(
    "name",
    ["UTC", "Etc/UTC", "Europe/Riga", "America/Argentina/Buenos_Aires", "Etc/GMT+5", "EST5EDT"],
)
def test_iana_zone_names_are_accepted(name: str) -> None:
    assert str(check_timezone(name)) == name
    assert Schedule(name="report", task="report", cron="0 6 * * *", timezone=name).zone.key == name


def test_a_queue_registers_no_schedule_in_a_host_zone() -> None:
    queue = Queue(metadata=MetaData())

    @queue.task(name="report")
    def report() -> None: ...

    def digest() -> None: ...

    with pytest.raises(ValueError, match="'localtime' is not an IANA zone name"):
        queue.schedule(report, "0 6 * * *", timezone="localtime")
    with pytest.raises(ValueError, match="'localtime' is not an IANA zone name"):
        queue.periodic("0 6 * * *", name="digest", timezone="localtime")(digest)
    # Nothing was registered: both names are still free.
    assert "digest" not in queue.tasks
    queue.schedule(report, "0 6 * * *", timezone="UTC")
    queue.periodic("0 6 * * *", name="digest", timezone="Europe/Riga")(digest)


# -- job ids: whole numbers only, one checker for every API ------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        Decimal("2.9"),
        Decimal("2"),
        Fraction(5, 2),
        2.0,
        True,
        False,
        "2.9",
        " 2",
        "2 ",
        "1_000",
        "\u0662",  # ARABIC-INDIC DIGIT TWO: int() reads it as 2
        "",
        None,
        b"2",
    ],
)
def test_a_job_id_that_is_not_a_whole_number_is_refused(raw: Any) -> None:
    with pytest.raises(TypeError, match=r"a job id must be a whole number \(int\), got"):
        check_job_ids([raw])


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (2**63, r"got 9223372036854775808"),
        (-(2**63) - 1, r"got -9223372036854775809"),
        ("9" * 5000, r"got a number of 5000 digits"),
        ("-" + "9" * 20, r"got a number of 21 digits"),
    ],
    ids=["2**63", "below-bigint", "5000-digit-text", "21-digit-negative-text"],
)
def test_a_job_id_beyond_bigint_is_refused(raw: Any, match: str) -> None:
    with pytest.raises(ValueError, match=r"a job id must be from .* PostgreSQL bigint\)"):
        check_job_ids([raw])
    with pytest.raises(ValueError, match=match):
        check_job_ids([raw])


def test_whole_job_ids_are_read_as_before() -> None:
    assert check_job_ids([1, "2", "007", 2**63 - 1, "-9223372036854775808"]) == [
        1,
        2,
        7,
        2**63 - 1,
        -(2**63),
    ]


def test_a_whole_number_without_an_upper_bound_says_at_least() -> None:
    assert check_whole_number("count", 10**30, 0, None) == 10**30
    with pytest.raises(ValueError, match=r"^count must be at least 0, got -1$"):
        check_whole_number("count", -1, 0, None)


# -- about links that would overflow their index --------------------------------------------


def test_an_about_link_is_measured_in_bytes_together() -> None:
    wide = "\U0001f600"  # four bytes of UTF-8
    with pytest.raises(ValueError, match=rf"take 4096 bytes .* at most {MAX_ABOUT_BYTES}"):
        about_reference((wide * 512, wide * 512))
    # Right at the budget: accepted.
    table, key = wide * 512, wide * ((MAX_ABOUT_BYTES - 2048) // 4)
    assert len(table.encode()) + len(key.encode()) == MAX_ABOUT_BYTES
    assert about_reference((table, key)) == (table, key)
    with pytest.raises(ValueError, match=rf"take {MAX_ABOUT_BYTES + 1} bytes"):
        about_reference((table, key + "k"))


# -- status: values that go into SQL are bounded -------------------------------------------


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"scan_cap": 2**70}, ValueError),
        ({"scan_cap": 0}, ValueError),
        ({"scan_cap": 1.5}, TypeError),
        ({"live_within": float("inf")}, ValueError),
        ({"live_within": -5}, ValueError),
        ({"live_within": "60"}, TypeError),
    ],
)
def test_read_status_checks_its_numbers_before_touching_the_bind(
    options: dict[str, Any], error: type[Exception]
) -> None:
    # The bind is never used: the values are refused before any statement is built.
    with pytest.raises(error, match=next(iter(options))):
        read_status(None, None, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("cap", [2**63, 2**70])
def test_a_window_statement_refuses_a_cap_no_limit_holds(cap: int) -> None:
    from sqla_queue.models import build_tables
    from sqla_queue.statements.status import failed_window_statement, finished_window_statement

    tables = build_tables(MetaData())
    for build in (failed_window_statement, finished_window_statement):
        with pytest.raises(
            ValueError, match=r"cap must be a whole number from 1 to 9223372036854775807"
        ):
            build(tables, cap=cap)


# -- assert_enqueued: expectations that no job could meet ------------------------------------


@pytest.mark.parametrize(
    ("expected", "error", "match"),
    [
        ({"count": 1.5}, TypeError, r"count must be a whole number \(int\), got 1\.5"),
        ({"count": True}, TypeError, r"count must be a whole number \(int\), got True"),
        ({"count": Decimal(1)}, TypeError, r"count must be a whole number"),
        ({"count": "1"}, TypeError, r"count must be a whole number"),
        ({"count": -1}, ValueError, r"count must be at least 0, got -1"),
        ({"task": 5}, ValueError, r"task name must be a non-empty string"),
        ({"task": "no such task"}, ValueError, r"invalid task name"),
        ({"args": "ab"}, TypeError, r"args must be a list or tuple"),
        ({"args": {"a": 1}}, TypeError, r"args must be a list or tuple"),
        ({"kwargs": [("n", 1)]}, TypeError, r"kwargs must be a mapping"),
        ({"kwargs": {1: "n"}}, TypeError, r"kwargs must be a mapping"),
    ],
)
def test_assert_enqueued_refuses_an_impossible_expectation_at_the_call(
    expected: dict[str, Any], error: type[Exception], match: str
) -> None:
    queue = Queue(metadata=MetaData())
    # Refused at the call, before the block runs and before the session is used.
    with pytest.raises(error, match=match):
        assert_enqueued(queue, None, **expected)  # type: ignore[arg-type]


# -- partition bounds in any session time zone ----------------------------------------------


@pytest.mark.parametrize(
    "spelling",
    [
        "2026-12-10 00:00:00+00",
        "2026-12-09 19:00:00-05",
        "2026-12-10 05:45:00+05:45",
        "2026-12-10 00:44:30+00:44:30",
        "2026-12-16 23:59:00+167:59",
        "2026-12-03 00:01:00-167:59",
    ],
)
def test_a_partition_bound_is_read_in_any_session_offset(spelling: str) -> None:
    assert _timestamp(spelling) == dt.datetime(2026, 12, 10, tzinfo=dt.UTC)


# -- the command line never calls a refused command a connection failure ----------------------


class _DriverError(Exception):
    """A driver exception, with or without a SQLSTATE (as psycopg's carry it)."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("error", "says"),
    [
        # The driver could not convert a value it read: no SQLSTATE, not a connection error.
        (DataError("SELECT", {}, _DriverError("timestamp too small (before year 1)")), "failed"),
        (ProgrammingError("SELECT", {}, _DriverError("bad query")), "failed"),
        (DataError("SELECT", {}, _DriverError("out of range", "22008")), "refused"),
        (OperationalError("SELECT", {}, _DriverError("canceling statement", "57014")), "refused"),
        # The driver failed to reach the server (no SQLSTATE), or the server said so.
        (OperationalError("connect", {}, _DriverError("Connection refused")), "cannot connect"),
        (OperationalError("connect", {}, _DriverError("no such db", "3D000")), "cannot connect"),
        (OperationalError("connect", {}, _DriverError("starting up", "57P03")), "cannot connect"),
    ],
)
def test_only_a_connection_failure_is_reported_as_one(error: Any, says: str) -> None:
    message = database_error_message(error, URL)
    first = message.split("\n")[0]
    assert says in first
    assert ("cannot connect" in message) == (says == "cannot connect")
    assert "secret" not in message


@pytest.mark.parametrize("name", ["page_size", "chart_minutes", "scan_cap"])
def test_a_dashboard_setting_beyond_a_bigint_is_refused_by_name(name: str) -> None:
    """Each setting reaches SQL as an integer; past a bigint every page would fail raw."""
    from sqla_queue.dashboard.config import DashboardConfig

    with pytest.raises(ValueError, match=name):
        DashboardConfig(**{name: 2**70})
