"""A live install moved from schema version 1 to each later one, up to 7, with Alembic, mid-flight.

The host app's history up to revision 0002 created the queue at version 1. Workers of the
version-1 release (``tests/migration/v1_worker``: that release's own claim and completion
SQL) are running jobs when the committed revision 0003 steps the queue to version 2
(``alembic upgrade 0003``), and:

* every row survives, and the executions that were running keep ``slot`` NULL;
* the version-1 workers keep going: they claim and complete with their own SQL after it.

Then workers of the version-2 release (``tests/migration/v2_worker``, likewise) run keyed
jobs too, with later jobs of their keys queued behind them as version 2 wrote them
(``pending``), when the committed revision 0004 steps the queue to version 3, and:

* every row survives the step unchanged;
* both old releases keep going with their own SQL, and a version-2 worker still takes its
  keys in order.

The version-3 release then deploys: its producers write a key's later jobs ``waiting``, and
its workers (``tests/migration/v3_worker``) run jobs too. A version-2 worker never claims a
waiting job, even one whose predecessor it finished and that has nothing left ahead. The
committed revision 0005 steps the queue to version 4 while the executions of all three old
releases are still running, and:

* every row survives the step unchanged, and the new columns hold their defaults;
* all three old releases keep going with their own SQL.

The version-4 release then deploys: its producers write the columns version 4 added (a job
awaited by a caller, jobs linked to an invoice, a unique job with its key), and its workers
(``tests/migration/v4_worker``) run jobs too. The committed revision 0006 steps the queue to
version 5 while the executions of all four old releases are still running, and:

* the worker's schema check lists exactly what versions 6 and 7 add after the step;
* every row survives the step unchanged (it adds tables and an index, no column), unique
  keys included, and the new tables start empty;
* the old workers keep going: versions 1, 3 and 4 claim and complete with their own SQL
  after it, a version-4 completion still notifies the caller awaiting its job, and a
  version-2 worker still claims nothing out of turn.

The version-5 release then deploys: its producers enqueue urgent mails (one awaited by a
caller), and its workers (``tests/migration/v5_worker``) run them. The committed revision
0007 steps the queue to version 6 while the executions of all five old releases are still
running, and:

* the worker's schema check lists exactly what version 7 adds after the step;
* every row survives the step unchanged but for the new ``workflow`` column, false in every
  execution, unique keys included, and the new tables start empty;
* the old workers keep going: versions 1, 3, 4 and 5 claim and complete with their own SQL
  after it, a version-5 completion still notifies the caller awaiting its job, an
  execution a version-5 producer writes after the step is no workflow node, and a
  version-2 worker still claims nothing out of turn.

The version-6 release then deploys: its producers enqueue urgent mails (one awaited by a
caller), and its workers (``tests/migration/v6_worker``) run them. The library is upgraded
to the version-7 release: autogenerate writes the step from 6 to 7, exactly as committed in
revision 0008, ``alembic upgrade head`` runs it while the executions of all six old
releases are still running, and:

* the worker's schema check lists nothing after the step;
* every row survives the step unchanged but for the new ``wait`` column, NULL in every
  execution, unique keys included, and the new tables start empty;
* the old workers keep going: versions 1, 3, 4, 5 and 6 claim and complete with their own
  SQL after it, a version-6 completion still notifies the caller awaiting its job, an
  execution a version-6 producer writes after the step waits for nothing, none of them
  claims a durable job of the version-7 release that is suspended (however urgent and
  overdue), and a version-2 worker still claims nothing out of turn;
* the count gate covers the slot-less executions of the version-1 workers, so a version-7
  worker stays within the task's limit of 2 while they run, and takes capacity slots once
  they are done;
* a version-7 worker never runs a key while a version-2 worker holds it, promotes (by its
  sweep) the waiting job whose predecessor a version-2 worker finished, runs each key's
  jobs one at a time in ``(execute_at, id)`` order, and drains everything else, including
  an execution of a dead version-1 worker, a job the version-4 release enqueued and the
  durable job once a signal woke it.

The rows each release wrote, and the readers, are in :mod:`tests.migration.mid_flight`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from sqla_queue.schema.verify import find_missing
from tests.migration.conftest import HostProject, engine_for, libpq_url
from tests.migration.hostapp.models import REPORT_LIMIT, queue
from tests.migration.mid_flight import (
    ADDED_BY_VERSION_3,
    ADDED_BY_VERSION_4,
    ADDED_BY_VERSION_5,
    ADDED_BY_VERSION_6,
    ADDED_BY_VERSION_7,
    COMMITTED_0003,
    COMMITTED_0004,
    COMMITTED_0005,
    COMMITTED_0006,
    COMMITTED_0007,
    COMMITTED_0008,
    FINISHED_CHANNEL,
    MARK_AS_VERSION_4,
    ROWS_V1,
    ROWS_V2,
    VERSION_5_TABLES,
    VERSION_6_DEFAULTS,
    VERSION_6_TABLES,
    VERSION_7_DEFAULTS,
    VERSION_7_TABLES,
    WAIT_MARKS,
    WAKE_AS_VERSION_7,
    WHERE,
    WORKFLOW_MARKS,
    beat,
    enqueue_as_version_1,
    enqueue_as_version_2,
    enqueue_as_version_3,
    enqueue_as_version_4,
    enqueue_urgent_mails,
    op_calls,
    read_states,
    rows_by_name,
    schema_missing,
    suspend_as_version_7,
    unique_keys,
    without_execution_columns,
    without_version_4,
)
from tests.migration.v1_worker import V1Worker
from tests.migration.v2_worker import V2Worker
from tests.migration.v3_worker import V3Worker
from tests.migration.v4_worker import V4Worker
from tests.migration.v5_worker import V5Worker
from tests.migration.v6_worker import V6Worker

pytestmark = pytest.mark.migration


def test_a_live_install_upgrades_from_version_1_to_each_later_one_to_7_mid_flight(
    v6_history_project: HostProject,
) -> None:
    project = v6_history_project
    revisions = [p.name[:4] for p in project.revision_files()]
    assert revisions == ["0001", "0002", "0003", "0004", "0005", "0006", "0007"]
    config = project.config()
    command.upgrade(config, "0002")  # op.create_queue(..., version=1)
    engine = engine_for(project.url)
    reporter, mailer, dead = V1Worker(), V1Worker(), V1Worker()
    with engine.begin() as connection:
        assert find_missing(connection, queue.tables)[1] == 1
        enqueue_as_version_1(connection)
        running = reporter.claim(connection, ["render_report"], batch=REPORT_LIMIT)
        assert sorted(c.id for c in running) == [2, 3]
        [lost] = dead.claim(connection, ["mail_invoice"], batch=1)
        assert lost.id == 8
        # That worker died: no heartbeat for ten minutes, far beyond its 30 s lease.
        connection.execute(
            text(
                "UPDATE work.sqla_queue_job_executions "
                "SET alive_at = now() - interval '10 minutes' WHERE worker_id = :w"
            ),
            {"w": dead.worker_id},
        )
        before_v2 = connection.execute(ROWS_V1).all()

    # The step to version 2 is the committed revision, written when the library moved to 2.
    assert op_calls(COMMITTED_0003) == {
        "upgrade": [f"op.upgrade_queue(from_version=1, to_version=2, {WHERE})"],
        "downgrade": [f"op.upgrade_queue(from_version=2, to_version=1, {WHERE})"],
    }
    project.alembic("upgrade", "0003")

    syncer = V2Worker()
    with engine.begin() as connection:
        # Version 2, complete but for what versions 3 to 7 add.
        added = ADDED_BY_VERSION_3 | ADDED_BY_VERSION_4 | ADDED_BY_VERSION_5
        added |= ADDED_BY_VERSION_6 | ADDED_BY_VERSION_7
        assert schema_missing(connection) == (added, 2)
        assert connection.execute(ROWS_V1).all() == before_v2
        slots = connection.execute(text("SELECT slot FROM work.sqla_queue_job_executions"))
        assert set(slots.scalars()) == {None}
        # A version-1 worker keeps going after the step, with its own SQL.
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 9
        assert mailer.succeed(connection, [mail], result=9) == [9]

        # Version-2 workers run keyed jobs: one head per key, the rest queued behind it.
        enqueue_as_version_2(connection)
        heads = syncer.claim(connection, ["sync_customer"], batch=10)
        assert sorted((c.id, c.queue_id) for c in heads) == [(11, "customer-1"), (16, "customer-2")]
        states = read_states(connection)
        assert [states[n] for n in (12, 13, 14, 15)] == [("queued", "pending", None)] * 4
        before_v3 = connection.execute(ROWS_V2).all()
    by_id = {c.id: c for c in heads}

    # The step to version 3 is the committed revision, written when the library moved to 3.
    assert op_calls(COMMITTED_0004) == {
        "upgrade": [f"op.upgrade_queue(from_version=2, to_version=3, {WHERE})"],
        "downgrade": [f"op.upgrade_queue(from_version=3, to_version=2, {WHERE})"],
    }
    project.alembic("upgrade", "0004")

    sender = V3Worker()
    with engine.begin() as connection:
        later = ADDED_BY_VERSION_4 | ADDED_BY_VERSION_5 | ADDED_BY_VERSION_6 | ADDED_BY_VERSION_7
        assert schema_missing(connection) == (later, 3)
        assert connection.execute(ROWS_V2).all() == before_v3
        slots = connection.execute(text("SELECT slot FROM work.sqla_queue_job_executions"))
        assert set(slots.scalars()) == {None}
        # Both old releases keep going after the step, with their own SQL.
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 10
        assert mailer.succeed(connection, [mail], result=10) == [10]
        assert syncer.succeed(connection, [by_id[11]], result="done by version 2") == [11]
        # The next of customer-1 in (execute_at, id) order, and only that one.
        [next_head] = syncer.claim(connection, ["sync_customer"], batch=10)
        assert next_head.id == 13
        assert syncer.succeed(connection, [next_head], result="done by version 2") == [13]

        # The version-3 release deploys: its producers put a key's later jobs in `waiting`.
        enqueue_as_version_3(connection)
        # A version-2 worker finishes the job that 17 waits for; it knows nothing of
        # waiting jobs, so 17 stays waiting, with nothing left ahead of it.
        assert syncer.succeed(connection, [by_id[16]], result="done by version 2") == [16]
        # It never claims a waiting job: it takes customer-1's head and holds it.
        [held] = syncer.claim(connection, ["sync_customer"], batch=10)
        assert held.id == 15
        # Its workers run the mails.
        sent = sender.claim(connection, ["mail_invoice"], batch=2)
        assert sorted(c.id for c in sent) == [19, 20]
        states = read_states(connection)
        assert states[17] == states[18] == ("queued", "waiting", None)
        assert states[15] == ("queued", "running", None)
        before_v4 = rows_by_name(connection)

    # The step to version 4 is the committed revision, written when the library moved to 4.
    assert op_calls(COMMITTED_0005) == {
        "upgrade": [f"op.upgrade_queue(from_version=3, to_version=4, {WHERE})"],
        "downgrade": [f"op.upgrade_queue(from_version=4, to_version=3, {WHERE})"],
    }
    project.alembic("upgrade", "0005")

    carrier = V4Worker()
    with engine.begin() as connection:
        later = ADDED_BY_VERSION_5 | ADDED_BY_VERSION_6 | ADDED_BY_VERSION_7
        assert schema_missing(connection) == (later, 4)
        assert without_version_4(rows_by_name(connection)) == before_v4
        keys = connection.execute(text("SELECT count(*) FROM work.sqla_queue_unique_keys"))
        assert keys.scalar_one() == 0
        # All three old releases keep going after the step, with their own SQL.
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 21
        assert mailer.succeed(connection, [mail], result=21) == [21]
        assert sender.succeed(connection, sent, result="done by version 3") == [19, 20]
        [mail] = sender.claim(connection, ["mail_invoice"], batch=2)
        assert mail.id == 22
        assert sender.succeed(connection, [mail], result="done by version 3") == [22]
        # A version-2 worker still claims nothing out of turn: customer-1 is its own
        # (15 runs) and 17 is waiting, with nothing ahead of it.
        assert syncer.claim(connection, ["sync_customer"], batch=10) == []
        states = read_states(connection)
        assert states[17] == states[18] == ("queued", "waiting", None)

        # The version-4 release deploys: its producers write its new columns, and its
        # workers run mails, beside a version-3 worker that has not been replaced yet.
        enqueue_as_version_4(connection)
        delivered = carrier.claim(connection, ["mail_invoice"], batch=2)
        assert sorted(c.id for c in delivered) == [23, 24]
        [posted] = sender.claim(connection, ["mail_invoice"], batch=1)
        assert posted.id == 25
        before_v5 = rows_by_name(connection)
        keys_before_v5 = unique_keys(connection)
        assert [(k["key"], k["job_id"]) for k in keys_before_v5] == [("inv-25", 25)]

    # The step to version 5 is the committed revision, written when the library moved to 5.
    assert op_calls(COMMITTED_0006) == {
        "upgrade": [f"op.upgrade_queue(from_version=4, to_version=5, {WHERE})"],
        "downgrade": [f"op.upgrade_queue(from_version=5, to_version=4, {WHERE})"],
    }
    project.alembic("upgrade", "0006")

    with engine.begin() as connection:
        assert schema_missing(connection) == (ADDED_BY_VERSION_6 | ADDED_BY_VERSION_7, 5)
        # Version 5 adds no column: every row is exactly as it was, keys included.
        assert rows_by_name(connection) == before_v5
        assert unique_keys(connection) == keys_before_v5
        for name in VERSION_5_TABLES:
            count = connection.execute(text(f"SELECT count(*) FROM work.sqla_queue_{name}"))
            assert count.scalar_one() == 0, name

    # The old workers keep going after the step, with their own SQL; a version-4
    # completion still tells the caller awaiting its job (23) that it finished.
    with psycopg.connect(libpq_url(project.url), autocommit=True) as listener:
        listener.execute(f'LISTEN "{FINISHED_CHANNEL}"')
        with engine.begin() as connection:
            assert carrier.succeed(connection, delivered, result="done by version 4") == [23, 24]
        notes = [n.payload for n in listener.notifies(timeout=1.0, stop_after=1)]
    assert notes == ["23"]
    with engine.begin() as connection:
        assert sender.succeed(connection, [posted], result="done by version 3") == [25]
        [mail] = sender.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 26
        assert sender.succeed(connection, [mail], result="done by version 3") == [26]
        [mail] = carrier.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 27
        assert carrier.succeed(connection, [mail], result="done by version 4") == [27]
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 28
        assert mailer.succeed(connection, [mail], result=28) == [28]
        # A version-2 worker still claims nothing out of turn.
        assert syncer.claim(connection, ["sync_customer"], batch=10) == []
        states = read_states(connection)
        assert states[17] == states[18] == ("queued", "waiting", None)
        assert states[29] == ("queued", "pending", None)

    # The version-5 release deploys: its producers enqueue urgent mails, 30 awaited by a
    # caller, and its workers run them beside the older releases not replaced yet.
    courier = V5Worker()
    with engine.begin() as connection:
        enqueue_urgent_mails(connection, range(30, 33), ago=10)
        awaited = {"awaited": True, "about_table": None, "about_key": None, "unique_key": None}
        connection.execute(MARK_AS_VERSION_4, {"id": 30, **awaited})
        shipped = courier.claim(connection, ["mail_invoice"], batch=2)
        assert sorted(c.id for c in shipped) == [30, 31]
        before_v6 = rows_by_name(connection)
        keys_before_v6 = unique_keys(connection)

    # The step to version 6 is the committed revision, written when the library moved to 6.
    assert op_calls(COMMITTED_0007) == {
        "upgrade": [f"op.upgrade_queue(from_version=5, to_version=6, {WHERE})"],
        "downgrade": [f"op.upgrade_queue(from_version=6, to_version=5, {WHERE})"],
    }
    project.alembic("upgrade", "0007")

    with engine.begin() as connection:
        assert schema_missing(connection) == (ADDED_BY_VERSION_7, 6)
        # Version 6 adds one column, false in every execution: the rest is as it was.
        rows = without_execution_columns(rows_by_name(connection), VERSION_6_DEFAULTS)
        assert rows == before_v6
        assert unique_keys(connection) == keys_before_v6
        for name in VERSION_6_TABLES:
            count = connection.execute(text(f"SELECT count(*) FROM work.sqla_queue_{name}"))
            assert count.scalar_one() == 0, name

    # The old workers keep going after the step, with their own SQL; a version-5
    # completion still tells the caller awaiting its job (30) that it finished.
    with psycopg.connect(libpq_url(project.url), autocommit=True) as listener:
        listener.execute(f'LISTEN "{FINISHED_CHANNEL}"')
        with engine.begin() as connection:
            assert courier.succeed(connection, shipped, result="done by version 5") == [30, 31]
        notes = [n.payload for n in listener.notifies(timeout=1.0, stop_after=1)]
    assert notes == ["30"]
    with engine.begin() as connection:
        # The version-5 release's producers keep enqueueing: their executions, which name
        # no workflow column, are no workflow nodes.
        enqueue_urgent_mails(connection, range(33, 36), ago=5)
        marks = connection.execute(WORKFLOW_MARKS, {"ids": [32, 33, 34, 35]}).all()
        assert [tuple(m) for m in marks] == [(n, False) for n in (32, 33, 34, 35)]
        [mail] = courier.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 32
        assert courier.succeed(connection, [mail], result="done by version 5") == [32]
        [mail] = carrier.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 33
        assert carrier.succeed(connection, [mail], result="done by version 4") == [33]
        [mail] = sender.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 34
        assert sender.succeed(connection, [mail], result="done by version 3") == [34]
        [mail] = mailer.claim(connection, ["mail_invoice"], batch=1)
        assert mail.id == 35
        assert mailer.succeed(connection, [mail], result=35) == [35]
        # A version-2 worker still claims nothing out of turn.
        assert syncer.claim(connection, ["sync_customer"], batch=10) == []
        states = read_states(connection)
        assert states[17] == states[18] == ("queued", "waiting", None)
        assert states[29] == ("queued", "pending", None)

    # The version-6 release deploys: its producers enqueue urgent mails, 36 awaited by a
    # caller, and its workers run them beside the older releases not replaced yet.
    dispatcher = V6Worker()
    with engine.begin() as connection:
        enqueue_urgent_mails(connection, range(36, 39), ago=4)
        connection.execute(MARK_AS_VERSION_4, {"id": 36, **awaited})
        dispatched = dispatcher.claim(connection, ["mail_invoice"], batch=2)
        assert sorted(c.id for c in dispatched) == [36, 37]
        before_v7 = rows_by_name(connection)
        keys_before_v7 = unique_keys(connection)

    # The library is now the version-7 release: autogenerate writes the step, as committed.
    command.revision(config, autogenerate=True, message="upgrade sqla_queue", rev_id="0008")
    [generated] = [p for p in project.revision_files() if p.name.startswith("0008")]
    assert (
        op_calls(generated)
        == op_calls(COMMITTED_0008)
        == {
            "upgrade": [f"op.upgrade_queue(from_version=6, to_version=7, {WHERE})"],
            "downgrade": [f"op.upgrade_queue(from_version=7, to_version=6, {WHERE})"],
        }
    )

    project.alembic("upgrade", "head")

    SessionLocal = sessionmaker(engine)
    with engine.begin() as connection:
        assert schema_missing(connection) == (set(), 7)
        assert find_missing(connection, queue.tables) == ([], 7)
        # Version 7 adds one column, NULL in every execution: the rest is as it was.
        rows = without_execution_columns(rows_by_name(connection), VERSION_7_DEFAULTS)
        assert rows == before_v7
        assert unique_keys(connection) == keys_before_v7
        for name in VERSION_7_TABLES:
            count = connection.execute(text(f"SELECT count(*) FROM work.sqla_queue_{name}"))
            assert count.scalar_one() == 0, name

    # The old workers keep going after the step, with their own SQL; a version-6
    # completion still tells the caller awaiting its job (36) that it finished.
    with psycopg.connect(libpq_url(project.url), autocommit=True) as listener:
        listener.execute(f'LISTEN "{FINISHED_CHANNEL}"')
        with engine.begin() as connection:
            done = dispatcher.succeed(connection, dispatched, result="done by version 6")
            assert done == [36, 37]
        notes = [n.payload for n in listener.notifies(timeout=1.0, stop_after=1)]
    assert notes == ["36"]
    with engine.begin() as connection:
        # The version-6 release's producers keep enqueueing: their executions, which name
        # no wait column, wait for nothing.
        enqueue_urgent_mails(connection, range(39, 43), ago=2)
        marks = connection.execute(WAIT_MARKS, {"ids": [38, 39, 40, 41, 42]}).all()
        assert [tuple(m) for m in marks] == [(n, None) for n in (38, 39, 40, 41, 42)]
        # A durable job of the version-7 release waits for a signal, overdue and urgent:
        # every old release's claim passes over it, for it names only the states it knows.
        suspend_as_version_7(connection, 43, "signal:approved")
        for worker, n, by in (
            (dispatcher, 38, "done by version 6"),
            (courier, 39, "done by version 5"),
            (carrier, 40, "done by version 4"),
            (sender, 41, "done by version 3"),
            (mailer, 42, 42),
        ):
            [mail] = worker.claim(connection, ["mail_invoice"], batch=1)
            assert mail.id == n, worker
            assert worker.succeed(connection, [mail], result=by) == [n]
        # A version-2 worker still claims nothing out of turn.
        assert syncer.claim(connection, ["sync_customer"], batch=10) == []
        states = read_states(connection)
        assert states[43] == ("queued", "suspended", None)
        assert states[17] == states[18] == ("queued", "waiting", None)
        assert states[29] == ("queued", "pending", None)
        # The signal comes, and wakes it as the version-7 release does: a new worker runs it.
        assert connection.execute(WAKE_AS_VERSION_7, {"id": 43}).rowcount == 1

    def run_new_worker() -> None:
        # More threads than the limit: only the database's gate can keep reports at 2.
        worker = queue.worker(
            SessionLocal, concurrency=6, install_signal_handlers=False, poll_interval=0.05
        )
        worker.run(burst=True)

    # The version-1 worker's two reports fill the limit, and the version-2 worker holds
    # customer-1: the new worker runs the mail it reclaims and the job it promotes.
    with engine.begin() as connection:
        beat(connection, reporter, syncer)
    run_new_worker()
    with engine.connect() as connection:
        states = read_states(connection)
    assert states[lost.id] == ("succeeded", None, None)  # reclaimed from the dead worker
    assert states[17] == ("succeeded", None, None)  # promoted by the sweep
    assert states[29] == ("succeeded", None, None)  # enqueued by the version-4 release
    assert [states[n] for n in (2, 3)] == [("queued", "running", None)] * 2
    assert [states[n] for n in range(4, 8)] == [("queued", "pending", None)] * 4
    assert states[15] == ("queued", "running", None)
    assert [states[n] for n in (12, 14)] == [("queued", "pending", None)] * 2
    assert states[18] == ("queued", "waiting", None)

    # The old workers finish their jobs; their fenced completions still match their rows.
    with engine.begin() as connection:
        assert reporter.succeed(connection, running, result="done by version 1") == [2, 3]
        assert syncer.succeed(connection, [held], result="done by version 2") == [15]

    run_new_worker()
    with engine.connect() as connection:
        states = read_states(connection)
        results: dict[int, Any] = dict(
            connection.execute(text("SELECT id, result FROM work.sqla_queue_jobs")).all()
        )
    engine.dispose()

    assert states == dict.fromkeys(range(1, 44), ("succeeded", None, None)), "a job was lost"
    assert results[2] == results[3] == "done by version 1"
    assert all(results[n] == "done by version 3" for n in (19, 20, 22, 25, 26, 34, 41))
    assert all(results[n] == "done by version 4" for n in (23, 24, 27, 33, 40))
    assert all(results[n] == "done by version 5" for n in (30, 31, 32, 39))
    assert all(results[n] == "done by version 6" for n in (36, 37, 38))
    assert (results[21], results[28], results[29], results[35], results[42]) == (
        21,
        28,
        29,
        35,
        42,
    )
    assert results[43] == 43  # the woken durable job, run by the new worker
    reports = [results[n] for n in range(4, 8)]
    assert sorted(r["report_id"] for r in reports) == [4, 5, 6, 7]
    assert {r["slot"] for r in reports} == set(range(REPORT_LIMIT))
    seen = [slots for r in reports for slots in r["seen"]]
    assert all(None not in slots and len(set(slots)) == len(slots) for slots in seen), seen
    # Never above the limit, and at the limit at some point: the cap, not chance, held it.
    assert max(len(slots) for slots in seen) == REPORT_LIMIT, seen

    # Keys: the version-2 worker ran 11, 13, 16 and 15; the new worker ran the rest, each
    # alone among its key's executions, customer-1's in (execute_at, id) order.
    assert all(results[n] == "done by version 2" for n in (11, 13, 15, 16))
    for n in (12, 14, 17, 18):
        assert results[n]["customer_id"] == n
        assert results[n]["seen"] == [[n], [n]], results[n]
    started = {n: dt.datetime.fromisoformat(results[n]["started"]) for n in (12, 14, 18)}
    assert sorted(started, key=started.__getitem__) == [12, 14, 18]
