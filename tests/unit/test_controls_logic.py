"""How the worker core treats paused and rate-limited tasks, with a fake clock and rows.

No database: the controls the maintenance reads, and the rows a rated claim returns, are
handed to the core directly.
"""

from __future__ import annotations

import datetime as dt
import random
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import MetaData

from sqla_queue import RetryPolicy
from sqla_queue.models import build_tables
from sqla_queue.worker.actions import Claim, Maintain, Stop, Wait
from sqla_queue.worker.decider import Decider
from sqla_queue.worker.plan import TaskRuntime, WorkerPlan
from sqla_queue.worker.settings import WorkerSettings
from tests.support.units import LOCKED, run_unit

pytestmark = pytest.mark.unit

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def _handler() -> None:
    return None


def plan(*names: str) -> WorkerPlan:
    runtimes = {
        name: TaskRuntime(
            name=name,
            handler=_handler,
            is_async=False,
            pass_context=False,
            max_attempts=1,
            retry=RetryPolicy(),
            lease=20.0,
            max_reclaims=2,
        )
        for name in names
    }
    return WorkerPlan(
        tables=build_tables(MetaData()), notify=True, default_lease=20.0, tasks=runtimes
    )


def core_for(*names: str, burst: bool = False, **settings: Any) -> Decider:
    return Decider(
        plan(*names),
        WorkerSettings(**settings),
        burst=burst,
        clock=lambda: T0,
        rng=random.Random(1),
    )


def control(task: str, *, paused: bool = False, rated: bool = False) -> Any:
    return SimpleNamespace(task=task, paused=paused, rated=rated)


def rated_row(job_id: int | None, *, allowance: int, free_at: dt.datetime | None) -> Any:
    return SimpleNamespace(
        next_due=None,
        id=job_id,
        attempt=1,
        reclaims=0,
        queue_id=None,
        task="r",
        payload={"args": [], "kwargs": {}},
        max_attempts=1,
        rate_allowance=allowance,
        rate_free_at=free_at,
    )


def no_context(job: Any) -> None:
    return None


def test_paused_and_rated_tasks_leave_the_plain_claim() -> None:
    core = core_for("a", "p", "r", concurrency=4)
    assert core.next_action(0.0) == Maintain()
    core.controls_read([control("p", paused=True), control("r", rated=True)])
    assert core.claim_params(4)["tasks"] == ["a"]
    assert core.paused == {"p"} and core.rated == {"r"}
    # The rated task is claimed first, on its own; then the plain claim.
    assert core.next_action(0.0) == Claim(4, rated="r")
    run_unit(
        core.prepare(Claim(4, rated="r"), 0.0, no_context),
        [[], LOCKED, [rated_row(None, allowance=10, free_at=None)]],
    )
    assert core.next_action(0.0) == Claim(4)


def test_resuming_puts_the_task_back_and_polls_at_once() -> None:
    core = core_for("a", "p", concurrency=2)
    core.next_action(0.0)
    core.controls_read([control("p", paused=True)])
    core.accept_claim([SimpleNamespace(next_due=None, id=None)], 2, 0.0, no_context)
    assert isinstance(core.next_action(0.1), Wait)
    core.controls_read([])
    assert core.claim_params(2)["tasks"] == ["a", "p"]
    assert core.next_action(0.1) == Claim(2)


def test_a_paused_rated_task_is_not_claimed_at_all() -> None:
    core = core_for("a", "r", concurrency=2)
    core.next_action(0.0)
    core.controls_read([control("r", paused=True, rated=True)])
    assert core.rated == set() and core.claim_params(2)["tasks"] == ["a"]


def test_a_full_window_waits_until_its_oldest_start_leaves() -> None:
    core = core_for("r", concurrency=10, poll_interval=5.0)
    core.next_action(0.0)
    core.controls_read([control("r", rated=True)])
    assert core.next_action(0.0) == Claim(10, rated="r")
    free_at = T0 + dt.timedelta(seconds=0.75)
    rows = [rated_row(i, allowance=3, free_at=free_at) for i in (1, 2, 3)]
    jobs = run_unit(core.prepare(Claim(10, rated="r"), 0.0, no_context), [[], LOCKED, rows])
    assert len(jobs) == 3
    # Seven seats are free, but the window is full until free_at.
    action = core.next_action(0.0)
    assert isinstance(action, Wait) and action.seconds == pytest.approx(0.75)
    assert core.next_action(0.75) == Claim(7, rated="r")


def test_a_notification_brings_an_idle_rated_task_forward_but_not_a_full_window() -> None:
    core = core_for("r", concurrency=2, poll_interval=5.0)
    core.next_action(0.0)
    core.controls_read([control("r", rated=True)])
    run_unit(
        core.prepare(Claim(2, rated="r"), 0.0, no_context),
        [[], LOCKED, [rated_row(None, allowance=5, free_at=None)]],
    )
    assert isinstance(core.next_action(0.1), Wait)
    core.notified()
    assert core.next_action(0.1) == Claim(2, rated="r")
    full_until = T0 + dt.timedelta(seconds=2)
    run_unit(
        core.prepare(Claim(2, rated="r"), 0.1, no_context),
        [[], LOCKED, [rated_row(None, allowance=0, free_at=full_until)]],
    )
    core.notified()
    action = core.next_action(0.2)
    assert isinstance(action, Wait) and action.seconds == pytest.approx(1.9)


def test_a_burst_run_stops_only_once_the_rated_claims_come_back_empty() -> None:
    core = core_for("r", burst=True, concurrency=2)
    core.next_action(0.0)
    core.controls_read([control("r", rated=True)])
    assert core.next_action(0.0) == Claim(2, rated="r")
    run_unit(
        core.prepare(Claim(2, rated="r"), 0.0, no_context),
        [[], LOCKED, [rated_row(None, allowance=0, free_at=T0 + dt.timedelta(seconds=1))]],
    )
    # A full window is not an empty queue: wait for it.
    assert isinstance(core.next_action(0.5), Wait)
    assert core.next_action(1.0) == Claim(2, rated="r")
    run_unit(
        core.prepare(Claim(2, rated="r"), 1.0, no_context),
        [[], LOCKED, [rated_row(None, allowance=2, free_at=None)]],
    )
    assert core.next_action(1.0) == Stop()


def test_a_removed_rate_limit_returns_the_task_to_the_plain_claim() -> None:
    core = core_for("r", concurrency=2)
    core.next_action(0.0)
    core.controls_read([control("r", rated=True)])
    assert core.claim_params(2)["tasks"] == []
    core.controls_read([])
    assert core.rated == set() and core.claim_params(2)["tasks"] == ["r"]
    assert core.next_action(0.0) == Claim(2)
