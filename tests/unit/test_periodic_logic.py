"""Periodic schedules without a database: ticks, DST, catch-up, validation, statements."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql

from sqla_queue import Queue
from sqla_queue.errors import (
    InvalidIdentifierError,
    PayloadNotSerializableError,
    TaskAlreadyRegisteredError,
    UnknownTaskError,
)
from sqla_queue.models import build_tables
from sqla_queue.periodic import (
    MAX_CATCH_UP_LIMIT,
    Schedule,
    latest_tick,
    next_tick,
    plan_ticks,
    ticks_between,
)
from sqla_queue.statements import periodic as stmts

pytestmark = pytest.mark.unit

UTC = dt.UTC
NY = ZoneInfo("America/New_York")
RIGA = ZoneInfo("Europe/Riga")


def utc(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def cron(expr: str, tz: str = "UTC", **extra: Any) -> Schedule:
    return Schedule("s", "t", cron=expr, timezone=tz, **extra)


def every(seconds: float, **extra: Any) -> Schedule:
    return Schedule("s", "t", every=dt.timedelta(seconds=seconds), **extra)


# -- ticks --------------------------------------------------------------------------------


def test_every_ticks_are_epoch_multiples() -> None:
    s = every(15)
    at = utc(2026, 1, 1, 12, 0, 7)
    assert latest_tick(s, at) == utc(2026, 1, 1, 12, 0, 0)
    assert next_tick(s, at) == utc(2026, 1, 1, 12, 0, 15)
    # A tick itself: latest is the tick, next is strictly after it.
    assert latest_tick(s, utc(2026, 1, 1, 12, 0, 15)) == utc(2026, 1, 1, 12, 0, 15)
    assert next_tick(s, utc(2026, 1, 1, 12, 0, 15)) == utc(2026, 1, 1, 12, 0, 30)
    assert ticks_between(s, utc(2026, 1, 1, 12, 0, 0), utc(2026, 1, 1, 12, 1, 0)) == [
        utc(2026, 1, 1, 12, 0, 15),
        utc(2026, 1, 1, 12, 0, 30),
        utc(2026, 1, 1, 12, 0, 45),
        utc(2026, 1, 1, 12, 1, 0),
    ]


def test_every_hour_ticks_on_the_hour_whatever_the_input_zone() -> None:
    s = every(3600)
    local = dt.datetime(2026, 7, 1, 15, 20, tzinfo=RIGA)  # 12:20 UTC
    assert next_tick(s, local) == utc(2026, 7, 1, 13, 0)
    assert next_tick(s, local).tzinfo is UTC  # type: ignore[union-attr]


def test_cron_ticks_in_utc_and_strict_bounds() -> None:
    s = cron("*/5 * * * *")
    ticks = ticks_between(s, utc(2026, 3, 1, 10, 0), utc(2026, 3, 1, 10, 20))
    assert ticks == [utc(2026, 3, 1, 10, m) for m in (5, 10, 15, 20)]
    assert latest_tick(s, utc(2026, 3, 1, 10, 20)) == utc(2026, 3, 1, 10, 20)
    assert latest_tick(s, utc(2026, 3, 1, 10, 24, 59)) == utc(2026, 3, 1, 10, 20)
    assert ticks_between(s, utc(2026, 3, 1, 10, 0), utc(2026, 3, 1, 10, 20), limit=2) == [
        utc(2026, 3, 1, 10, 5),
        utc(2026, 3, 1, 10, 10),
    ]
    assert ticks_between(s, utc(2026, 3, 1, 10, 0), utc(2026, 3, 1, 9, 0)) == []


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="aware datetime"):
        next_tick(every(1), dt.datetime(2026, 1, 1))


# -- DST ----------------------------------------------------------------------------------


def test_new_york_spring_forward_daily_job_in_the_missing_hour_runs_once_after_it() -> None:
    # 2025-03-09: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist that day.
    s = cron("30 2 * * *", "America/New_York")
    ticks = ticks_between(s, utc(2025, 3, 7), utc(2025, 3, 11))
    local = [t.astimezone(NY).strftime("%m-%d %H:%M %Z") for t in ticks]
    assert local == ["03-07 02:30 EST", "03-08 02:30 EST", "03-09 03:00 EDT", "03-10 02:30 EDT"]
    # Days are 24 h of wall time, so the UTC gaps are 24 h, 23.5 h, 22.5 h.
    assert ticks[2] - ticks[1] == dt.timedelta(hours=23, minutes=30)


def test_new_york_fall_back_daily_job_in_the_repeated_hour_runs_once() -> None:
    # 2025-11-02: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice.
    s = cron("30 1 * * *", "America/New_York")
    ticks = ticks_between(s, utc(2025, 11, 1), utc(2025, 11, 4))
    assert ticks == [utc(2025, 11, 1, 5, 30), utc(2025, 11, 2, 5, 30), utc(2025, 11, 3, 6, 30)]


def test_new_york_fall_back_wildcard_hour_ticks_through_both_passes() -> None:
    s = cron("*/30 * * * *", "America/New_York")
    # 00:00 EDT (04:00 UTC) to 02:00 EST (07:00 UTC): three real hours, six ticks.
    ticks = ticks_between(s, utc(2025, 11, 2, 4, 0), utc(2025, 11, 2, 7, 0))
    assert ticks == [
        utc(2025, 11, 2, 4, 30),
        utc(2025, 11, 2, 5, 0),
        utc(2025, 11, 2, 5, 30),
        utc(2025, 11, 2, 6, 0),
        utc(2025, 11, 2, 6, 30),
        utc(2025, 11, 2, 7, 0),
    ]
    # Ticks compare as instants: the two 01:30s are an hour apart, not equal.
    one_thirty = [t for t in ticks if t.astimezone(NY).strftime("%H:%M") == "01:30"]
    assert len(one_thirty) == 2
    assert one_thirty[1] - one_thirty[0] == dt.timedelta(hours=1)


def test_riga_spring_forward_and_fall_back() -> None:
    # Riga: 2026-03-29 03:00 EET -> 04:00 EEST; 2026-10-25 04:00 EEST -> 03:00 EET.
    s = cron("30 3 * * *", "Europe/Riga")
    spring = ticks_between(s, utc(2026, 3, 28), utc(2026, 3, 30, 12))
    assert [t.astimezone(RIGA).strftime("%d %H:%M %Z") for t in spring] == [
        "28 03:30 EET",
        "29 04:00 EEST",
        "30 03:30 EEST",
    ]
    autumn = ticks_between(s, utc(2026, 10, 24, 12), utc(2026, 10, 26, 12))
    assert [t.astimezone(RIGA).strftime("%d %H:%M %Z") for t in autumn] == [
        "25 03:30 EEST",
        "26 03:30 EET",
    ]


def test_latest_tick_across_fall_back_sees_the_second_pass() -> None:
    s = cron("*/30 * * * *", "America/New_York")
    # 06:10 UTC is 01:10 EST, in the second pass of 01:xx: the latest tick is 01:00 EST.
    assert latest_tick(s, utc(2025, 11, 2, 6, 10)) == utc(2025, 11, 2, 6, 0)
    assert next_tick(s, utc(2025, 11, 2, 6, 10)) == utc(2025, 11, 2, 6, 30)


def test_cron_in_a_zone_differs_from_utc() -> None:
    riga = cron("0 9 * * *", "Europe/Riga")
    assert next_tick(riga, utc(2026, 1, 10, 0)) == utc(2026, 1, 10, 7)
    assert next_tick(riga, utc(2026, 7, 10, 0)) == utc(2026, 7, 10, 6)


# -- catch-up -----------------------------------------------------------------------------

NOW = utc(2026, 5, 1, 12, 0, 0)


def test_on_time_ticks_are_enqueued_ahead_up_to_the_horizon() -> None:
    s = every(1)
    plan = plan_ticks(s, NOW - dt.timedelta(seconds=2), NOW, horizon=3, grace=5)
    # Within grace: the two just past are on time, not missed; three more ahead.
    assert plan.enqueue == tuple(NOW + dt.timedelta(seconds=k) for k in range(-1, 4))
    assert plan.skipped == 0
    assert plan.last_tick == NOW + dt.timedelta(seconds=3)


def test_nothing_to_do_keeps_last_tick() -> None:
    s = every(60)
    last = NOW + dt.timedelta(seconds=60)
    plan = plan_ticks(s, last, NOW, horizon=10, grace=10)
    assert plan.enqueue == ()
    assert plan.last_tick == last


@pytest.mark.parametrize(
    ("policy", "limit", "expected_missed"),
    [("skip", 1, 0), ("one", 1, 1), ("all", 3, 3), ("all", 1000, 50)],
)
def test_catch_up_after_downtime(policy: str, limit: int, expected_missed: int) -> None:
    s = every(60, catch_up=policy, catch_up_limit=limit)
    # Down for 50 minutes: ticks 11:10..11:59 are missed (more than grace in the past).
    last = utc(2026, 5, 1, 11, 9)
    plan = plan_ticks(s, last, NOW, horizon=90, grace=30)
    missed = [t for t in plan.enqueue if t <= NOW - dt.timedelta(seconds=30)]
    on_time = [t for t in plan.enqueue if t > NOW - dt.timedelta(seconds=30)]
    assert len(missed) == expected_missed
    # The kept ones are the most recent missed ticks, oldest first.
    assert missed == [utc(2026, 5, 1, 11, 59 - k) for k in reversed(range(expected_missed))]
    assert on_time == [utc(2026, 5, 1, 12, 0), utc(2026, 5, 1, 12, 1)]
    assert plan.skipped == 50 - expected_missed
    assert plan.last_tick == utc(2026, 5, 1, 12, 1)


def test_skip_with_nothing_on_time_still_moves_past_the_missed_ticks() -> None:
    s = cron("0 3 * * *", catch_up="skip")
    plan = plan_ticks(s, utc(2026, 4, 20, 3), NOW, horizon=10, grace=10)
    assert plan.enqueue == ()
    # 04-21 to 05-01 at 03:00: eleven ticks, all more than the grace in the past.
    assert plan.skipped == 11
    assert plan.last_tick == utc(2026, 5, 1, 3)
    # The next pass has nothing more to do.
    again = plan_ticks(s, plan.last_tick, NOW, horizon=10, grace=10)
    assert again.enqueue == () and again.last_tick == plan.last_tick


def test_one_after_a_year_of_one_second_ticks_is_cheap_and_exact() -> None:
    s = every(1)
    last = NOW - dt.timedelta(days=365)
    plan = plan_ticks(s, last, NOW, horizon=2, grace=2)
    assert plan.enqueue[0] == NOW - dt.timedelta(seconds=2)
    assert len(plan.enqueue) == 1 + 4  # the latest missed, then (now-2, now+2]
    assert plan.skipped == 365 * 86400 - 2 - 1


def test_missed_cron_ticks_across_dst_with_all() -> None:
    s = cron("30 2 * * *", "America/New_York", catch_up="all", catch_up_limit=10)
    plan = plan_ticks(s, utc(2025, 3, 7, 12), utc(2025, 3, 10, 12), horizon=10, grace=10)
    assert plan.enqueue == (
        utc(2025, 3, 8, 7, 30),
        utc(2025, 3, 9, 7, 0),
        utc(2025, 3, 10, 6, 30),
    )
    assert plan.skipped == 0


def test_plan_refuses_bad_windows() -> None:
    with pytest.raises(ValueError, match="horizon and grace"):
        plan_ticks(every(1), NOW, NOW, horizon=-1, grace=0)


# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"cron": "* * *"}, ValueError, "needs 5 fields"),
        ({"cron": "* * * * * *"}, ValueError, "needs 5 fields"),
        ({"cron": "61 * * * *"}, ValueError, "invalid cron expression '61 \\* \\* \\* \\*'"),
        ({"cron": "0 0 30 2 *"}, ValueError, "cron expression"),
        ({"cron": 5}, TypeError, "must be a string"),
        ({}, TypeError, "exactly one of"),
        ({"cron": "* * * * *", "every": dt.timedelta(1)}, TypeError, "exactly one of"),
        ({"every": 5}, TypeError, "timedelta"),
        ({"every": dt.timedelta(milliseconds=500)}, ValueError, "every must be from"),
        ({"every": dt.timedelta(days=400)}, ValueError, "every must be from"),
        ({"every": dt.timedelta(hours=1), "timezone": "Europe/Riga"}, ValueError, "only applies"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, ValueError, "unknown timezone"),
        ({"cron": "* * * * *", "timezone": ""}, TypeError, "IANA zone name"),
        ({"cron": "* * * * *", "catch_up": "some"}, ValueError, "catch_up must be one of"),
        ({"cron": "* * * * *", "catch_up_limit": 0}, ValueError, "catch_up_limit must be"),
        (
            {"cron": "* * * * *", "catch_up_limit": MAX_CATCH_UP_LIMIT + 1},
            ValueError,
            "catch_up_limit must be",
        ),
        ({"cron": "* * * * *", "catch_up_limit": 2.0}, TypeError, "whole number"),
        ({"cron": "* * * * *", "args": "abc"}, TypeError, "args must be a list"),
        ({"cron": "* * * * *", "kwargs": [1]}, TypeError, "kwargs must be a mapping"),
        ({"cron": "* * * * *", "args": (object(),)}, PayloadNotSerializableError, "JSON"),
    ],
)
def test_invalid_schedules_fail_with_clear_errors(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Schedule("s", "t", **kwargs)


def test_invalid_schedule_name() -> None:
    with pytest.raises(InvalidIdentifierError, match="schedule name"):
        Schedule("bad name!", "t", cron="* * * * *")


def test_schedule_copies_its_arguments() -> None:
    kwargs = {"a": 1}
    s = Schedule("s", "t", cron="* * * * *", args=[1, 2], kwargs=kwargs)
    kwargs["a"] = 2
    assert s.args == (1, 2)
    assert s.kwargs == {"a": 1}
    assert s.describe == "* * * * * (UTC)"
    assert every(30).describe == "every 30 s"


# -- registration (no database) -----------------------------------------------------------


def test_periodic_registers_a_task_and_a_schedule() -> None:
    q = Queue(metadata=MetaData())

    @q.periodic("*/5 * * * *", name="reports.tick", timezone="Europe/Riga", kwargs={"k": 1})
    def tick(k: int) -> int:
        return k

    assert tick.name == "reports.tick"
    assert q.tasks["reports.tick"] is tick
    (schedule,) = q.worker_plan().schedules
    assert schedule.name == "reports.tick"
    assert schedule.task == "reports.tick"
    assert schedule.handle is tick
    assert schedule.catch_up == "one"
    assert schedule.timezone == "Europe/Riga"


def test_schedule_an_existing_task_twice_under_two_names() -> None:
    q = Queue(metadata=MetaData())

    @q.task(name="report")
    def report(kind: str) -> None:
        del kind

    q.schedule(report, "0 6 * * *", kwargs={"kind": "daily"})
    q.schedule("report", every=dt.timedelta(hours=1), name="report.hourly", args=["hourly"])
    names = sorted(s.name for s in q.worker_plan().schedules)
    assert names == ["report", "report.hourly"]
    with pytest.raises(TaskAlreadyRegisteredError, match=r"report\.hourly"):
        q.schedule(report, "0 7 * * *", name="report.hourly")
    with pytest.raises(UnknownTaskError):
        q.schedule("nope", "0 7 * * *")


def test_bad_periodic_registers_nothing() -> None:
    q = Queue(metadata=MetaData())
    decorator = q.periodic("not cron at all", name="broken")
    with pytest.raises(ValueError, match="invalid cron expression"):

        @decorator
        def broken() -> None:
            pass

    assert "broken" not in q.tasks
    assert q._registry.schedules == {}
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        q.periodic("* * * * *", bogus=1)


# -- statements ---------------------------------------------------------------------------

DIALECT = postgresql.psycopg.dialect()


def _compiled(stmt: Any) -> str:
    return " ".join(str(stmt.compile(dialect=DIALECT)).split())


def _binds(sql: str) -> set[str]:
    return set(re.findall(r"%\((\w+)\)s", sql))


@pytest.fixture
def tables() -> Any:
    return build_tables(MetaData(), schema="app", prefix="q_")


def test_advance_is_a_compare_and_set(tables: Any) -> None:
    sql = _compiled(stmts.advance_schedule_statement(tables))
    assert sql.startswith("UPDATE app.q_schedules SET")
    assert "WHERE app.q_schedules.name = %(schedule)s" in sql
    assert "app.q_schedules.last_tick = %(seen)s" in sql
    assert "app.q_schedules.last_tick < %(new_tick)s" in sql
    assert "updated_at=now()" in sql
    assert sql.endswith("RETURNING app.q_schedules.last_tick")
    assert _binds(sql) == set(stmts.AdvanceScheduleParams.__annotations__)


def test_create_never_overwrites(tables: Any) -> None:
    sql = _compiled(stmts.create_schedule_statement(tables))
    assert sql.startswith("INSERT INTO app.q_schedules (name, task, last_tick)")
    assert sql.endswith("ON CONFLICT (name) DO NOTHING")
    assert _binds(sql) == set(stmts.CreateScheduleParams.__annotations__)


def test_reads(tables: Any) -> None:
    sql = _compiled(stmts.read_schedules_statement(tables))
    assert "FROM app.q_schedules WHERE app.q_schedules.name = ANY (%(names)s" in sql
    assert "FOR UPDATE" not in sql
    assert _binds(sql) == set(stmts.ReadSchedulesParams.__annotations__)
    assert _binds(_compiled(stmts.all_schedules_statement(tables))) == set()
    assert (
        _compiled(stmts.database_now_statement()) == "SELECT clock_timestamp() AS clock_timestamp_1"
    )
