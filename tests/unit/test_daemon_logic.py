"""Daemons without a database: spec validation, restart backoff, context, statement shapes."""

from __future__ import annotations

import asyncio
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql

from sqla_queue import InvalidIdentifierError, Queue, TaskAlreadyRegisteredError
from sqla_queue.daemons import MIN_RESTART_DELAY, DaemonBackoff, DaemonContext, DaemonSpec
from sqla_queue.models import build_tables
from sqla_queue.statements import daemons as statements

pytestmark = pytest.mark.unit

SNAPSHOTS = Path(__file__).parent / "snapshots"
DIALECT = postgresql.psycopg.dialect()


def compiled(stmt: Any) -> str:
    return str(stmt.compile(dialect=DIALECT))


def loop(ctx: DaemonContext) -> None:
    ctx.wait(0)


async def async_loop(ctx: DaemonContext) -> None:
    await ctx.async_wait(0)


# -- DaemonSpec -------------------------------------------------------------------------------


def test_spec_defaults_and_async_detection() -> None:
    spec = DaemonSpec("poller", loop)
    assert (spec.instances, spec.lost_interval, spec.is_async) == (1, None, False)
    assert spec.lease(30.0) == 30.0
    assert DaemonSpec("a", async_loop, lost_interval=5).lease(30.0) == 5.0
    assert DaemonSpec("a", async_loop).is_async is True


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"instances": 0}, ValueError, "instances must be from 1 to 1000, got 0"),
        ({"instances": 1001}, ValueError, "instances must be from 1 to 1000"),
        ({"instances": 2.0}, TypeError, "instances must be a whole number"),
        ({"instances": True}, TypeError, "instances must be a whole number"),
        ({"lost_interval": 0}, ValueError, "lost_interval must be positive"),
        ({"lost_interval": 0.5}, ValueError, "lost_interval must be at least 1.0 s"),
        ({"lost_interval": float("nan")}, ValueError, "lost_interval must be a finite"),
        ({"lost_interval": "10"}, TypeError, "lost_interval must be a number of seconds"),
        ({"backoff": 3}, TypeError, "backoff must be a DaemonBackoff"),
    ],
)
def test_spec_rejects_bad_settings(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        DaemonSpec("poller", loop, **kwargs)


def test_spec_rejects_bad_names_and_functions() -> None:
    with pytest.raises(InvalidIdentifierError, match="invalid task name"):
        DaemonSpec("no spaces", loop)
    with pytest.raises(TypeError, match="is not callable"):
        DaemonSpec("poller", 42)  # type: ignore[arg-type]


# -- backoff ----------------------------------------------------------------------------------


def test_backoff_doubles_from_one_second_up_to_the_cap() -> None:
    policy = DaemonBackoff()
    assert [policy.delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert policy.delay(10_000) == 60.0  # no overflow


def test_backoff_count_starts_again_after_a_long_run() -> None:
    policy = DaemonBackoff(reset_after=30.0)
    assert policy.crashes_after(3, ran_for=0.5) == 4
    assert policy.crashes_after(3, ran_for=30.0) == 1
    assert policy.crashes_after(0, ran_for=0.0) == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"min_delay": 0}, ValueError, "min_delay must be at least 0.1 s"),
        ({"min_delay": 0.099}, ValueError, "min_delay must be at least 0.1 s"),
        ({"min_delay": -1}, ValueError, "min_delay must be non-negative"),
        ({"min_delay": float("nan")}, ValueError, "min_delay must be a finite number"),
        ({"min_delay": 10**400}, ValueError, "min_delay must be a finite number"),
        ({"min_delay": 5, "max_delay": 1}, ValueError, "max_delay (1.0) must be at least"),
        ({"max_delay": 0}, ValueError, "max_delay (0.0) must be at least min_delay (1.0)"),
        ({"max_delay": float("inf")}, ValueError, "max_delay must be a finite number"),
        ({"max_delay": 10 * 365 * 86_400}, ValueError, "max_delay must be at most"),
        ({"factor": 0.5}, ValueError, "factor must be at least 1"),
        ({"factor": 0}, ValueError, "factor must be at least 1"),
        ({"factor": -2}, ValueError, "factor must be at least 1"),
        ({"factor": float("nan")}, ValueError, "factor must be finite"),
        ({"factor": float("inf")}, ValueError, "factor must be finite"),
        ({"factor": 10**400}, ValueError, "factor must be finite"),
        ({"factor": "2"}, TypeError, "factor must be a number"),
        ({"factor": True}, TypeError, "factor must be a number"),
        ({"min_delay": "1"}, TypeError, "min_delay must be a number of seconds"),
        ({"reset_after": -1}, ValueError, "reset_after must be non-negative"),
        ({"reset_after": float("-inf")}, ValueError, "reset_after must be a finite number"),
    ],
)
def test_backoff_validation(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        DaemonBackoff(**kwargs)


def test_backoff_floor_is_the_fastest_policy_allowed() -> None:
    # A daemon that crashes at once: never more than ten restarts (and writes) a second.
    fastest = DaemonBackoff(min_delay=MIN_RESTART_DELAY, max_delay=MIN_RESTART_DELAY, factor=1)
    assert MIN_RESTART_DELAY == 0.1
    assert {fastest.delay(n) for n in range(1, 100)} == {0.1}
    assert DaemonBackoff(min_delay=1, max_delay=2, factor=3, reset_after=0) == DaemonBackoff(
        min_delay=1.0, max_delay=2.0, factor=3.0, reset_after=0.0
    )
    assert isinstance(DaemonBackoff(min_delay=1).min_delay, float)


# -- registration -----------------------------------------------------------------------------


def test_queue_daemon_registers_and_refuses_clashes() -> None:
    queue = Queue(metadata=MetaData())

    @queue.task(name="work")
    def work() -> None: ...

    returned = queue.daemon(name="poller", instances=3, lost_interval=10)(loop)
    assert returned is loop
    spec = queue.daemons["poller"]
    assert (spec.instances, spec.lost_interval, spec.function) == (3, 10.0, loop)
    assert queue.worker_plan().daemons == (spec,)

    with pytest.raises(TaskAlreadyRegisteredError, match="daemon 'poller' is already registered"):
        queue.daemon(name="poller")(async_loop)
    with pytest.raises(TaskAlreadyRegisteredError, match="'work' is already the name of a task"):
        queue.daemon(name="work")(loop)
    with pytest.raises(ValueError, match="instances must be from 1"):
        queue.daemon(name="other", instances=0)(loop)
    with pytest.raises(InvalidIdentifierError):
        queue.daemon(name="")
    assert list(queue.daemons) == ["poller"]


def test_queue_daemon_bare_uses_the_qualified_name() -> None:
    queue = Queue(metadata=MetaData())
    queue.daemon(loop)
    assert list(queue.daemons) == [f"{__name__}.loop"]


# -- context ----------------------------------------------------------------------------------


def test_sync_context_event_is_the_stop_flag() -> None:
    ctx = DaemonContext(
        name="d",
        instance=0,
        worker_id=__import__("uuid").uuid4(),
        session_factory=object,
        is_async=False,
    )
    assert ctx.shutdown_requested is False
    assert isinstance(ctx.shutdown_event, threading.Event)
    assert ctx.wait(0.01) is False
    threading.Timer(0.05, ctx.request_stop).start()
    assert ctx.wait(5) is True
    assert ctx.shutdown_requested and ctx.shutdown_event.is_set()


def test_async_context_event_is_set_from_another_thread() -> None:
    ctx = DaemonContext(
        name="d",
        instance=0,
        worker_id=__import__("uuid").uuid4(),
        session_factory=object,
        is_async=True,
    )

    async def main() -> tuple[bool, bool]:
        first = await ctx.async_wait(0.01)
        threading.Timer(0.05, ctx.request_stop).start()
        await asyncio.wait_for(ctx.shutdown_event.wait(), timeout=5)
        return first, await ctx.async_wait(5)

    assert asyncio.run(main()) == (False, True)


def test_async_context_event_made_after_the_request_is_set() -> None:
    ctx = DaemonContext(
        name="d",
        instance=0,
        worker_id=__import__("uuid").uuid4(),
        session_factory=object,
        is_async=True,
    )
    ctx.request_stop()

    async def main() -> bool:
        return bool(ctx.shutdown_event.is_set())

    assert asyncio.run(main()) is True


# -- statements -------------------------------------------------------------------------------

BUILDERS = {
    "daemon_ensure": statements.ensure_daemons_statement,
    "daemon_acquire": statements.acquire_daemons_statement,
    "daemon_renew": statements.renew_daemons_statement,
    "daemon_release": statements.release_daemons_statement,
    "daemon_crash": statements.daemon_crash_statement,
    "daemon_status": statements.daemon_status_statement,
}
PARAMS: dict[str, Any] = {
    "daemon_ensure": statements.EnsureDaemonsParams,
    "daemon_acquire": statements.AcquireDaemonsParams,
    "daemon_renew": statements.RenewDaemonsParams,
    "daemon_release": statements.ReleaseDaemonsParams,
    "daemon_crash": statements.DaemonCrashParams,
    "daemon_status": None,
}


@pytest.fixture
def tables() -> Any:
    return build_tables(MetaData(), schema="app", prefix="q_")


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_daemon_statement_matches_snapshot(tables: Any, name: str) -> None:
    """Regenerate with SQLA_QUEUE_UPDATE_SNAPSHOTS=1 after checking the change is intended."""
    sql = compiled(BUILDERS[name](tables)) + "\n"
    path = SNAPSHOTS / f"{name}.sql"
    if os.environ.get("SQLA_QUEUE_UPDATE_SNAPSHOTS") == "1":
        path.write_text(sql)
    assert sql == path.read_text()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_daemon_statement_params_match_their_typeddict(tables: Any, name: str) -> None:
    binds = set(BUILDERS[name](tables).compile(dialect=DIALECT).binds)
    declared = set(PARAMS[name].__annotations__) if PARAMS[name] is not None else set()
    # The one literal bound by SQLAlchemy itself is none of ours: every bind is declared.
    assert binds == declared


def test_acquire_takes_only_free_rows_without_waiting(tables: Any) -> None:
    sql = " ".join(compiled(statements.acquire_daemons_statement(tables)).split())
    assert "FOR UPDATE OF q_daemons SKIP LOCKED" in sql
    assert (
        "(app.q_daemons.worker_id IS NULL OR app.q_daemons.lease_until IS NULL "
        "OR app.q_daemons.lease_until < now())"
    ) in sql
    assert "app.q_daemons.instance < wanted.count" in sql
    assert "NOT IN (SELECT unnest(%(busy_names)s::TEXT[])" in sql


def test_renew_is_fenced_by_worker_and_unexpired_lease(tables: Any) -> None:
    sql = " ".join(compiled(statements.renew_daemons_statement(tables)).split())
    assert "app.q_daemons.worker_id = %(worker)s::UUID" in sql
    assert "app.q_daemons.lease_until >= now()" in sql
    assert sql.endswith("RETURNING app.q_daemons.name, app.q_daemons.instance")
    release = " ".join(compiled(statements.release_daemons_statement(tables)).split())
    assert "SET worker_id=NULL, lease_until=NULL" in release
    assert "WHERE app.q_daemons.worker_id = %(worker)s::UUID" in release
