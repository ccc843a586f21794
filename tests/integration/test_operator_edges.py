"""An operator's mistakes at the edges: refused by name, and nothing written (issue 26).

Item 10: ``resume`` of a task that does not exist said "resumed" and left a phantom task
in ``status`` and on the dashboard; every operator write that takes a task name now
refuses an unknown one as ``pause`` does. Item 11: ``prune(older_than=)`` beyond the
timestamp range raised ``DataError`` on a partitioned history, and the CLI called it
"cannot connect". Item 12: an ``about`` link too long for its index, a job id given as
``Decimal("2.9")`` (which cancelled job 2), a ``status`` scan cap beyond ``bigint``. The
pure checks (time zones, the CLI's error wording, ``assert_enqueued``'s expectations)
are in tests/unit/test_input_edges.py.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, func, insert, select, text
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue import UnknownTaskError
from sqla_queue.cli.main import main
from sqla_queue.history import history_partitions, maintain_history, prune_history
from sqla_queue.links import MAX_ABOUT_BYTES, MAX_ABOUT_TEXT
from sqla_queue.listing import list_jobs
from sqla_queue.spec import MAX_QUEUE_ID
from sqla_queue.testing.databases import DatabaseFactory
from tests.integration.test_pytest_plugin import APP as PLUGIN_APP
from tests.integration.test_pytest_plugin import INI as PLUGIN_INI
from tests.integration.test_pytest_plugin import _run as run_plugin_suite
from tests.support import history_app
from tests.support.app import noop, queue

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration

TARGET = "tests.support.app:queue"
CONTROLS = queue.tables.controls
LIMITS = queue.tables.limits
JOBS = queue.tables.jobs
EXECUTIONS = queue.tables.executions


def _stored_settings(engine: Engine) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every row of the controls and limits tables (as the owner sees them)."""
    with engine.connect() as connection:
        controls = connection.execute(
            select(CONTROLS.c.task, CONTROLS.c.paused, CONTROLS.c.rate_max).order_by(
                CONTROLS.c.task
            )
        ).all()
        limits = connection.execute(select(LIMITS).order_by(LIMITS.c.task)).all()
    return [tuple(r) for r in controls], [tuple(r) for r in limits]


def _job_rows(engine: Engine) -> tuple[int, int]:
    with engine.connect() as connection:
        jobs = connection.scalar(select(func.count()).select_from(JOBS)) or 0
        executions = connection.scalar(select(func.count()).select_from(EXECUTIONS)) or 0
    return int(jobs), int(executions)


# -- item 10: operator writes refuse an unknown task ----------------------------------------

# Each write that takes a task name, with what its refusal says it could not do.
OPERATOR_WRITES: list[tuple[str, Callable[[Session, str], None], str]] = [
    ("pause", queue.pause, "cannot pause"),
    ("resume", queue.resume, "cannot resume"),
    ("set-limit", lambda s, t: queue.set_limit(s, t, 3), "cannot store a concurrency limit"),
    ("unset-limit", lambda s, t: queue.set_limit(s, t, None), "cannot remove a concurrency"),
    ("set-rate", lambda s, t: queue.set_rate_limit(s, t, 5, per=1.0), "cannot store a rate"),
    ("unset-rate", lambda s, t: queue.set_rate_limit(s, t, None), "cannot remove a rate limit"),
]


@pytest.mark.parametrize(
    ("write", "refusal"), [pytest.param(w, r, id=name) for name, w, r in OPERATOR_WRITES]
)
def test_an_operator_write_for_an_unknown_task_is_refused_and_writes_nothing(
    SessionLocal: sessionmaker[Session],
    owner_engine: Engine,
    write: Callable[[Session, str], None],
    refusal: str,
) -> None:
    before = _stored_settings(owner_engine)
    with SessionLocal() as session:
        with pytest.raises(UnknownTaskError, match=rf"{refusal}.*unknown task 'no_such_task'"):
            write(session, "no_such_task")
        session.commit()  # whatever the call left in the transaction would be kept now
    assert _stored_settings(owner_engine) == before
    with SessionLocal() as session:
        names = [entry.task for entry in queue.status(session).tasks]
        assert "no_such_task" not in names
        assert "no_such_task" not in queue.controls(session)


def test_resume_of_an_unknown_task_is_refused_by_the_command_line(
    db_url: str, owner_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _stored_settings(owner_engine)
    assert main(["resume", TARGET, "--url", db_url, "no_such_task"]) == 2
    captured = capsys.readouterr()
    assert "resumed" not in captured.out
    assert "unknown task 'no_such_task'" in captured.err
    assert _stored_settings(owner_engine) == before


def test_what_a_task_that_is_gone_left_stored_can_still_be_cleared(
    SessionLocal: sessionmaker[Session], owner_engine: Engine
) -> None:
    with owner_engine.begin() as connection:
        connection.execute(insert(CONTROLS).values(task="gone_paused", paused=True))
        connection.execute(
            insert(CONTROLS).values(task="gone_rated", paused=False, rate_max=2, rate_seconds=1.0)
        )
        connection.execute(insert(LIMITS).values(task="gone_limited", concurrency_limit=2))
    with SessionLocal.begin() as session:
        queue.resume(session, "gone_paused")
        queue.set_rate_limit(session, "gone_rated", None)
        queue.set_limit(session, "gone_limited", None)
    controls, limits = _stored_settings(owner_engine)
    assert controls == [("gone_paused", False, None), ("gone_rated", False, None)]
    assert limits == []
    # Undone once, there is nothing left to undo: the name is unknown again.
    with SessionLocal() as session, pytest.raises(UnknownTaskError, match="cannot resume"):
        queue.resume(session, "gone_paused")


def test_a_known_task_is_resumed_whether_or_not_it_was_paused(
    SessionLocal: sessionmaker[Session], owner_engine: Engine
) -> None:
    with SessionLocal.begin() as session:
        queue.resume(session, "noop")  # never paused: nothing to undo, and no error
        queue.pause(session, "noop")
    with SessionLocal.begin() as session:
        queue.resume(session, "noop")
    assert _stored_settings(owner_engine)[0] == [("noop", False, None)]


# -- item 11: prune of a partitioned history beyond the timestamp range ---------------------


@pytest.fixture
def hq_engine(db_factory: DatabaseFactory) -> Iterator[tuple[Engine, str]]:
    """A fresh database holding only the partitioned queue, and its URL."""
    url = db_factory.clone("template0")
    engine = create_engine(url)
    with engine.begin() as connection:
        history_app.queue.create_all(connection)
        maintain_history(connection, history_app.queue.tables)
    yield engine, url
    engine.dispose()
    db_factory.drop(url)


def _finish_one_job(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        history_app.ok.enqueue(session, n=1)
    history_app.queue.worker(sessionmaker(engine), install_signal_handlers=False).run(burst=True)


# PostgreSQL accepts session offsets up to 167:59 hours: the cutoff and the partitions'
# bounds must load in each.
@pytest.mark.parametrize("zone", ["UTC", "<X>+167:59", "<Y>-167:59", "Asia/Kathmandu"])
def test_pruning_partitions_with_the_largest_age_deletes_nothing_in_any_time_zone(
    hq_engine: tuple[Engine, str], zone: str
) -> None:
    engine, _ = hq_engine
    _finish_one_job(engine)
    tables = history_app.queue.tables
    with engine.connect() as connection:
        utc_bounds = [(p.name, p.lower) for p in history_partitions(connection, tables)]
    with engine.begin() as connection:
        connection.execute(text(f"SET LOCAL TIME ZONE '{zone}'"))
        assert [(p.name, p.lower) for p in history_partitions(connection, tables)] == utc_bounds
        assert maintain_history(connection, tables).created == ()  # every one is there
        report = prune_history(connection, tables, older_than=dt.timedelta.max, include_failed=True)
        assert (report.partitions, report.jobs) == ((), 0)
        assert history_app.queue.prune(connection, older_than=dt.timedelta(days=10**6)) == 0
    with engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(tables.jobs)) == 1


def test_the_prune_command_with_a_huge_age_on_a_partitioned_history_succeeds(
    hq_engine: tuple[Engine, str], capsys: pytest.CaptureFixture[str]
) -> None:
    engine, url = hq_engine
    _finish_one_job(engine)
    target = "tests.support.history_app:queue"
    assert main(["prune", target, "--url", url, "--older-than", "999999999d"]) == 0
    assert "cannot connect" not in capsys.readouterr().err


# -- item 12: about links that would overflow their index ----------------------------------


def _random_text(rng: random.Random, characters: int, alphabet: str) -> str:
    """Incompressible text: PostgreSQL compresses a long index entry that repeats itself."""
    return "".join(rng.choice(alphabet) for _ in range(characters))


# Characters of four UTF-8 bytes each (musical symbols, emoji).
WIDE = "".join(chr(c) for c in range(0x1F600, 0x1F650))


def test_an_about_link_too_long_for_its_index_is_refused_before_writing(
    SessionLocal: sessionmaker[Session], engine: Engine
) -> None:
    rng = random.Random(26)
    table = _random_text(rng, MAX_ABOUT_TEXT, WIDE)  # 2,048 bytes
    key = _random_text(rng, MAX_ABOUT_TEXT, WIDE)  # 2,048 bytes: 4,096 with the table's
    before = _job_rows(engine)
    with SessionLocal() as session:
        with pytest.raises(ValueError, match=r"about: the table name and the primary key take"):
            noop.options(about=(table, key)).enqueue(session)
        session.commit()
    assert _job_rows(engine) == before


def test_the_longest_indexed_texts_are_stored(
    SessionLocal: sessionmaker[Session], engine: Engine
) -> None:
    rng = random.Random(12)
    table = _random_text(rng, MAX_ABOUT_TEXT, WIDE)  # 2,048 bytes
    key = _random_text(rng, (MAX_ABOUT_BYTES - 2048) // 4, WIDE)  # the rest of the budget
    assert len(table.encode()) + len(key.encode()) == MAX_ABOUT_BYTES
    widest_key = _random_text(rng, MAX_QUEUE_ID, WIDE)  # 2,048 bytes
    with SessionLocal.begin() as session:
        linked = noop.options(about=(table, key)).enqueue(session)
        keyed = noop.options(queue_id=widest_key, unique_key=widest_key).enqueue(session)
    with SessionLocal() as session:
        assert session.scalars(queue.jobs_about((table, key))).one().id == linked
        job = session.get(queue.Job, keyed)
        assert job is not None and (job.queue_id, job.unique_key) == (widest_key, widest_key)


# -- item 12: job ids that are not whole numbers --------------------------------------------

# Ways to write job ``i`` (or next to it) that are not a whole number. Each used to reach
# int(), which truncates: cancel([Decimal("2.9")]) cancelled job 2.
NOT_WHOLE: list[tuple[str, Callable[[int], Any]]] = [
    ("decimal-fraction", lambda i: Decimal(i) + Decimal("0.9")),
    ("decimal-whole", Decimal),
    ("fraction", lambda i: Fraction(2 * i + 1, 2)),
    ("float-whole", float),
    ("bool", lambda i: True),
    ("text-fraction", lambda i: f"{i}.9"),
    ("text-spaced", lambda i: f" {i}"),
    (
        "text-non-ascii-digits",
        lambda i: str(i).translate({ord("0") + d: 0x660 + d for d in range(10)}),
    ),
]

# Every API that takes job ids, called with ``bad`` for one id.
ID_APIS: list[tuple[str, Callable[[Engine, Connection, Any], Any]]] = [
    ("cancel", lambda e, c, bad: queue.cancel(e, [bad])),
    ("requeue", lambda e, c, bad: queue.requeue(c, [bad])),
    ("result", lambda e, c, bad: queue.result(e, bad, timeout=0)),
    ("list-jobs", lambda e, c, bad: list_jobs(c, queue.tables, limit=10, ids=[bad])),
]


@pytest.mark.parametrize(("spell"), [pytest.param(f, id=name) for name, f in NOT_WHOLE])
@pytest.mark.parametrize(("api"), [pytest.param(call, id=name) for name, call in ID_APIS])
def test_a_job_id_that_is_not_a_whole_number_is_refused(
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    api: Callable[[Engine, Connection, Any], Any],
    spell: Callable[[int], Any],
) -> None:
    with SessionLocal.begin() as session:
        ids = [noop.enqueue(session) for _ in range(3)]
    with engine.connect() as connection:
        with pytest.raises(TypeError, match=r"a job id must be a whole number"):
            api(engine, connection, spell(ids[1]))
        connection.commit()
    with engine.connect() as connection:
        statuses = connection.execute(select(JOBS.c.status).order_by(JOBS.c.id)).scalars().all()
    assert statuses == ["queued"] * 3


@pytest.mark.parametrize(
    ("filters", "error", "match"),
    [
        ({"key": "a\x00b"}, ValueError, r"key filter 'a\\x00b' contains a NUL"),
        ({"tasks": ["noop\x00"]}, ValueError, r"tasks filter .* contains a NUL"),
        ({"about_table": "orders\x00"}, ValueError, r"about_table filter .* NUL"),
        ({"about_table": "orders", "about_key": "\ud800"}, ValueError, r"about_key .* surrogate"),
        ({"tasks": "noop"}, TypeError, r"tasks must be a list of strings, got 'noop'"),
        ({"states": "failed"}, TypeError, r"states must be a list of strings"),
        ({"key": 7}, TypeError, r"key: expected a string, got 7"),
    ],
)
def test_a_job_listing_filter_the_database_cannot_compare_is_refused(
    engine: Engine, filters: dict[str, Any], error: type[Exception], match: str
) -> None:
    with engine.connect() as connection:
        with pytest.raises(error, match=match):
            list_jobs(connection, queue.tables, limit=10, **filters)
        assert connection.scalar(select(1)) == 1  # refused before any statement


def test_the_largest_job_ids_are_accepted_and_simply_not_found(engine: Engine) -> None:
    biggest, smallest = 2**63 - 1, -(2**63)
    assert queue.cancel(engine, [biggest, str(biggest), smallest]) == {
        biggest: "not_found",
        smallest: "not_found",
    }


# -- item 12: status parameters bounded to what SQL holds ----------------------------------


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"scan_cap": 2**70}, ValueError, r"scan_cap must be from 1 to 9223372036854775807"),
        ({"scan_cap": 2**63}, ValueError, r"scan_cap must be from 1 to"),
        ({"scan_cap": 0}, ValueError, r"scan_cap must be from 1 to .*got 0"),
        ({"scan_cap": 2.5}, TypeError, r"scan_cap must be a whole number \(int\), got 2\.5"),
        ({"scan_cap": True}, TypeError, r"scan_cap must be a whole number \(int\), got True"),
        ({"scan_cap": Decimal(10)}, TypeError, r"scan_cap must be a whole number"),
    ],
)
def test_a_status_scan_cap_out_of_range_is_refused_by_name(
    engine: Engine, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with engine.connect() as connection:
        with pytest.raises(error, match=match):
            queue.status(connection, **options)
        # Refused before any statement: the transaction is still usable.
        assert connection.scalar(select(1)) == 1


@pytest.mark.parametrize(
    "live_within", [float("inf"), float("nan"), 0, -1.0, 10.0**20, dt.timedelta(days=10**6)]
)
def test_read_status_refuses_a_live_window_out_of_range(engine: Engine, live_within: Any) -> None:
    from sqla_queue.status import read_status

    with engine.connect() as connection, pytest.raises(ValueError, match="live_within must be"):
        read_status(connection, queue.tables, live_within=live_within)


def test_the_largest_scan_cap_is_accepted(SessionLocal: sessionmaker[Session]) -> None:
    with SessionLocal.begin() as session:
        noop.enqueue(session)
    with SessionLocal() as session:
        status = queue.status(session, scan_cap=2**63 - 1)
    assert status.task("noop").pending == 1


# -- item 12: the pytest plugin's assert_enqueued ------------------------------------------


def test_the_plugin_fixture_refuses_a_count_that_no_block_could_meet(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(shopapp=PLUGIN_APP)
    pytester.makeini(PLUGIN_INI)
    pytester.makepyfile(
        test_counts="""
        import pytest

        @pytest.mark.parametrize("count", [1.5, True, "1"])
        def test_not_whole(sqla_queue_assert_enqueued, count):
            # Refused at the call: the session is never used.
            with pytest.raises(TypeError, match="count must be a whole number"):
                sqla_queue_assert_enqueued(None, count=count)

        def test_negative(sqla_queue_assert_enqueued):
            with pytest.raises(ValueError, match="count must be at least 0, got -1"):
                sqla_queue_assert_enqueued(None, count=-1)
        """
    )
    run_plugin_suite(pytester).assert_outcomes(passed=4)
