"""The worker's decisions, driven with a hand-made plan, a fake clock and fake rows.

No database, no threads, no ``Queue`` and no real clock: the core sees only what it is given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import math
import random
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import MetaData

from sqla_queue import Reschedule, Retry, RetryPolicy
from sqla_queue.logic.outcomes import Outcome, OutcomeKind
from sqla_queue.models import build_tables
from sqla_queue.worker.actions import Claim, Flush, Maintain, Stop, Wait
from sqla_queue.worker.decider import Decider
from sqla_queue.worker.handlers import HandlerRunner, RunningJob
from sqla_queue.worker.plan import TaskRuntime, WorkerPlan
from sqla_queue.worker.settings import WorkerSettings
from tests.support.units import LOCKED, run_unit

pytestmark = pytest.mark.unit

#: The fake wall clock every core here reads.
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def _handler(x: int = 0) -> int:
    return x


@pytest.fixture
def queue() -> WorkerPlan:
    """Two tasks: ``a`` retries once after 5 s; ``b`` has its own 4 s lease."""
    tasks = {
        "a": TaskRuntime(
            name="a",
            handler=_handler,
            is_async=False,
            pass_context=False,
            max_attempts=2,
            retry=RetryPolicy(min_delay=5, max_delay=5, jitter=0),
            lease=20.0,
            max_reclaims=2,
        ),
        "b": TaskRuntime(
            name="b",
            handler=_handler,
            is_async=False,
            pass_context=False,
            max_attempts=1,
            retry=RetryPolicy(),
            lease=4.0,
            max_reclaims=2,
        ),
    }
    return WorkerPlan(
        tables=build_tables(MetaData()),
        notify=True,
        default_lease=20.0,
        tasks=tasks,
    )


def row(job_id: int, task: str = "a", attempt: int = 1, reclaims: int = 0, **kw: Any) -> Any:
    fields = {
        "next_due": None,
        "id": job_id,
        "attempt": attempt,
        "reclaims": reclaims,
        "queue_id": None,
        "task": task,
        "payload": {"args": [], "kwargs": {}},
        "max_attempts": 2,
    }
    fields.update(kw)
    return SimpleNamespace(**fields)


def empty(next_due: dt.datetime | None = None) -> Any:
    return SimpleNamespace(next_due=next_due, id=None)


def core_for(plan: WorkerPlan, *, burst: bool = False, **settings: Any) -> Decider:
    tasks = settings.pop("tasks", None)
    if tasks is not None:
        plan = WorkerPlan(
            tables=plan.tables,
            notify=plan.notify,
            default_lease=plan.default_lease,
            tasks={name: plan.tasks[name] for name in tasks},
        )
    return Decider(
        plan, WorkerSettings(**settings), burst=burst, clock=lambda: T0, rng=random.Random(7)
    )


def returned(core: Decider, running: RunningJob, value: Any) -> Outcome:
    return _runner(core).outcome_of_return(running, value)


def raised(core: Decider, running: RunningJob, exc: BaseException) -> Outcome:
    return _runner(core).outcome_of_error(running, exc)


def _runner(core: Decider) -> HandlerRunner:
    return HandlerRunner(worker_id=core.worker_id, clock=core.clock, record=core.record)


def test_first_actions_are_reclaim_then_a_full_claim(queue: WorkerPlan) -> None:
    core = core_for(queue, concurrency=8, batch_size=5)
    assert core.next_action(0.0) == Maintain()
    assert core.next_action(0.0) == Claim(5)


def test_intervals_derive_from_the_shortest_lease(queue: WorkerPlan) -> None:
    core = core_for(queue)
    assert core.heartbeat_interval == 1.0  # task b's 4 s lease / 4
    # Half the shortest lease (task b's 4 s): a lost job of b waits at most 2 s for a sweep.
    assert core.reclaim_interval == 2.0
    assert core.claim_params(3)["lease_map"] == '{"b": 4.0}'


def test_partial_claim_sleeps_until_next_due_or_poll_interval(queue: WorkerPlan) -> None:
    # Task a only: its 20 s lease puts the next sweep at 5 s, out of this test's way.
    core = core_for(queue, concurrency=4, poll_interval=2.0, tasks=["a"])
    core.next_action(0.0)  # maintenance
    soon = T0 + dt.timedelta(seconds=0.5)
    core.accept_claim([empty(soon)], 4, 0.0, lambda job: None)
    action = core.next_action(0.0)
    assert isinstance(action, Wait)
    assert action == Wait(0.5)  # read on the core's clock, not the real one
    core.accept_claim([empty(None)], 4, 1.0, lambda job: None)
    action = core.next_action(1.0)
    assert action == Wait(2.0)


def test_full_batch_polls_again_at_once_and_capacity_bounds_claims(queue: WorkerPlan) -> None:
    core = core_for(queue, concurrency=3, batch_size=2)
    core.next_action(0.0)
    running = core.accept_claim([row(1), row(2)], 2, 0.0, lambda job: None)
    assert len(running) == 2
    assert core.next_action(0.0) == Claim(1)
    core.accept_claim([row(3)], 1, 0.0, lambda job: None)
    # Full: nothing to do until a handler reports back.
    assert isinstance(core.next_action(0.0), Wait)
    core.record(running[0], returned(core, running[0], 7))
    # Two handlers still run: the ack waits a moment for company...
    assert core.next_action(0.0) == Wait(0.005)
    # ...then goes. The batch was full, so more is likely waiting: ack and claim together.
    assert core.next_action(0.005) == Flush(claim=1)
    outcomes, params = core.take_outcomes()
    assert [o.kind for o in outcomes] == [OutcomeKind.SUCCEEDED]
    assert '"result":7' in params["outcomes"]


def test_acks_gather_until_a_batch_or_the_delay(queue: WorkerPlan) -> None:
    core = core_for(queue, concurrency=3, batch_size=3, ack_delay=0.01)
    core.next_action(0.0)
    a, b, c = core.accept_claim([row(1), row(2), row(3)], 3, 0.0, lambda j: None)
    core.record(a, returned(core, a, None))
    assert core.next_action(1.0) == Wait(pytest.approx(0.01))
    core.record(b, returned(core, b, None))
    assert core.next_action(1.004) == Wait(pytest.approx(0.006))
    core.record(c, returned(core, c, None))
    # Nothing runs any more: ack now, and claim in the same transaction.
    assert core.next_action(1.005) == Flush(claim=3)
    outcomes, _ = core.take_outcomes()
    assert [o.job_id for o in outcomes] == [1, 2, 3]


def test_ack_alone_when_the_queue_looked_empty(queue: WorkerPlan) -> None:
    core = core_for(queue, concurrency=3, poll_interval=1.0)
    core.next_action(0.0)
    (job,) = core.accept_claim([row(1)], 3, 0.0, lambda j: None)
    core.record(job, returned(core, job, None))
    # The last claim came back short: no point claiming again before the poll interval.
    assert core.next_action(0.1) == Flush()


def test_failure_retries_with_policy_then_fails(queue: WorkerPlan) -> None:
    core = core_for(queue)
    core.next_action(0.0)
    first, last = core.accept_claim(
        [row(1, attempt=1), row(2, attempt=2)], 10, 0.0, lambda job: None
    )
    retry = raised(core, first, ValueError("x"))
    final = raised(core, last, ValueError("x"))
    assert (retry.kind, retry.delay) == (OutcomeKind.RETRY, 5)
    assert final.kind is OutcomeKind.FAILED


def test_poison_and_malformed_rows_fail_without_running(queue: WorkerPlan) -> None:
    core = core_for(queue)
    core.next_action(0.0)
    runnable = core.accept_claim(
        [row(1, reclaims=3), row(2, payload=["not", "an", "object"]), row(3)],
        10,
        0.0,
        lambda job: None,
    )
    assert [r.job.id for r in runnable] == [3]
    outcomes, _ = core.take_outcomes()
    assert {o.job_id: o.kind for o in outcomes} == {
        1: OutcomeKind.FAILED,
        2: OutcomeKind.FAILED,
    }
    assert "lost 3 times" in outcomes[0].error["message"]  # type: ignore[index]
    assert "malformed payload" in outcomes[1].error["message"]  # type: ignore[index]


def test_burst_stops_only_after_an_empty_claim_with_nothing_running(queue: WorkerPlan) -> None:
    core = core_for(queue, concurrency=2, burst=True)
    core.next_action(0.0)
    (job,) = core.accept_claim([row(1)], 2, 0.0, lambda j: None)
    assert core.next_action(0.0) == Claim(1)
    core.accept_claim([empty()], 1, 0.0, lambda j: None)
    assert isinstance(core.next_action(0.0), Wait)  # job 1 still runs
    core.record(job, returned(core, job, None))
    assert core.next_action(0.0) == Flush()
    outcomes, _ = core.take_outcomes()
    core.completed(outcomes, [1])
    # Finishing work may have made more eligible: one more claim before stopping.
    assert core.next_action(0.0) == Claim(2)
    core.accept_claim([empty()], 2, 0.0, lambda j: None)
    assert core.next_action(0.0) == Stop()


def test_shutdown_waits_then_releases_unfinished_jobs(queue: WorkerPlan) -> None:
    core = core_for(queue, shutdown_timeout=10.0)
    core.next_action(0.0)
    done, stuck = core.accept_claim([row(1), row(2, attempt=1)], 10, 0.0, lambda j: None)
    core.request_stop(100.0)
    assert core.stop_flag.is_set()
    assert core.next_action(101.0) == Wait(9.0)  # no claims while stopping
    core.record(done, returned(core, done, None))
    assert core.next_action(102.0) == Flush()
    core.completed(*_applied(core))
    assert core.next_action(111.0) == Flush()  # timeout: release what still runs
    outcomes, _ = core.take_outcomes()
    assert [(o.job_id, o.kind) for o in outcomes] == [(2, OutcomeKind.RELEASE)]
    core.completed(outcomes, [2])
    # A handler that finishes after its release is ignored: the database has it back.
    core.record(stuck, returned(core, stuck, None))
    assert core.next_action(112.0) == Stop()


def _applied(core: Decider) -> tuple[list[Any], list[int]]:
    outcomes, _ = core.take_outcomes()
    return outcomes, [o.job_id for o in outcomes]


def test_fenced_outcomes_are_counted_not_applied(queue: WorkerPlan) -> None:
    core = core_for(queue)
    core.next_action(0.0)
    a, b = core.accept_claim([row(1), row(2)], 10, 0.0, lambda j: None)
    core.record(a, returned(core, a, None))
    core.record(b, returned(core, b, None))
    outcomes, _ = core.take_outcomes()
    core.completed(outcomes, [1])
    assert (core.stats["succeeded"], core.stats["fenced"]) == (1, 1)


def test_failed_flush_keeps_outcomes_for_the_next_try(queue: WorkerPlan) -> None:
    core = core_for(queue)
    core.next_action(0.0)
    (a,) = core.accept_claim([row(1)], 10, 0.0, lambda j: None)
    core.record(a, returned(core, a, None))
    outcomes, _ = core.take_outcomes()
    core.flush_failed(outcomes)
    assert core.database_error(Flush(), RuntimeError("down"), 0.0) == pytest.approx(0.1)
    assert core.database_error(Flush(), RuntimeError("down"), 0.0) == pytest.approx(0.2)
    assert core.next_action(0.0) == Flush()
    assert core.held() == ([1], [1])


def test_seat_offsets_come_from_the_injected_generator(queue: WorkerPlan) -> None:
    first = [core_for(queue).claim_params(5)["seat_offset"] for _ in range(2)]
    assert first[0] == first[1] == random.Random(7).randrange(1 << 30)


def test_a_refused_row_is_stamped_by_the_core_clock(queue: WorkerPlan) -> None:
    core = core_for(queue)
    core.next_action(0.0)
    assert core.accept_claim([row(1, task="gone")], 10, 0.0, lambda j: None) == []
    (outcome,) = core.take_outcomes()[0]
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.error is not None and outcome.error["at"] == T0.isoformat()
    assert "no handler for task 'gone'" in outcome.error["message"]


def test_a_handler_runs_with_arguments_decoded_at_claim_time(queue: WorkerPlan) -> None:
    core = core_for(queue)
    core.next_action(0.0)
    (job,) = core.accept_claim(
        [row(1, payload={"args": [], "kwargs": {"x": 41}})], 10, 0.0, lambda j: None
    )
    assert (job.args, job.kwargs) == ([], {"x": 41})
    _runner(core).run_sync(job)  # records its outcome in the core, once
    outcomes, params = core.take_outcomes()
    assert [(o.job_id, o.kind, o.result) for o in outcomes] == [(1, OutcomeKind.SUCCEEDED, 41)]
    assert params["outcomes"] == "[" + outcomes[0].encoded + "]"


# -- issue 12: poison outcomes, errors retrying cannot fix, stops asked for by handlers -----


class FakeDatabaseError(Exception):
    """A driver error as the core sees it: only its SQLSTATE (read by attribute)."""

    def __init__(self, sqlstate: str, message: str = "boom") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _finished(core: Decider, ids: list[int]) -> list[RunningJob]:
    core.next_action(0.0)
    running = core.accept_claim([row(i) for i in ids], 10, 0.0, lambda j: None)
    for job in running:
        core.record(job, returned(core, job, job.job.id))
    return running


def test_a_refused_completion_is_written_one_by_one_and_its_culprit_fails_alone(
    queue: WorkerPlan,
) -> None:
    core = core_for(queue)
    _finished(core, [1, 2, 3])
    action = core.next_action(0.0)
    assert isinstance(action, Flush)
    outcomes, _ = core.take_outcomes()
    assert len(outcomes) == 3
    core.flush_failed(outcomes)
    # A data error (22P05: a NUL in jsonb): no backoff, no claim, one outcome at a time.
    assert core.database_error(action, FakeDatabaseError("22P05"), 0.0) == 0.0
    assert core.next_action(0.0) == Flush()
    (first,), _ = core.take_outcomes()
    assert first.job_id == 1
    core.flush_failed([first])
    core.database_error(Flush(), FakeDatabaseError("22P05", "unsupported escape"), 0.0)
    # Job 1 is the culprit: it fails alone, with the database's reason.
    (stand_in,), params = core.take_outcomes()
    assert (stand_in.job_id, stand_in.kind) == (1, OutcomeKind.FAILED)
    assert stand_in.error is not None
    assert "unsupported escape (SQLSTATE 22P05)" in stand_in.error["message"]
    assert '"result"' in params["outcomes"]
    core.completed([stand_in], [1])
    for expected in (2, 3):
        assert core.next_action(0.0) == Flush()
        (outcome,), _ = core.take_outcomes()
        assert outcome.kind is OutcomeKind.SUCCEEDED and outcome.job_id == expected
        core.completed([outcome], [expected])
    # Isolation over: back to claiming at the next poll.
    assert core.next_action(1.0) == Claim(10)
    assert core.fatal is None


def test_a_stand_in_the_database_refuses_too_stops_the_worker(queue: WorkerPlan) -> None:
    core = core_for(queue)
    _finished(core, [1])
    for _ in range(2):
        outcomes, _ = core.take_outcomes()
        core.flush_failed(outcomes)
        core.database_error(Flush(), FakeDatabaseError("23514"), 0.0)
    assert core.fatal is not None and core.stopping
    assert "refused even a plain failure of job 1" in str(core.fatal)
    # The stop writes what it can once more; a further error ends it at once.
    assert core.next_action(0.0) == Flush()
    outcomes, _ = core.take_outcomes()
    core.flush_failed(outcomes)
    core.database_error(Flush(), FakeDatabaseError("23514"), 0.0)
    assert core.next_action(0.0) == Stop()
    assert core.stopped_by is core.fatal


@pytest.mark.parametrize(
    ("sqlstate", "words"),
    [
        ("42501", "lacks a privilege"),
        ("42P01", "alembic upgrade head"),
        ("22008", "retrying cannot fix"),
        # A driver's prepared statement lost behind PgBouncer in transaction mode.
        ("26000", "prepare_threshold"),
        ("42P05", "max_prepared_statements"),
    ],
)
def test_an_error_retrying_cannot_fix_stops_the_worker_with_the_fix(
    queue: WorkerPlan, sqlstate: str, words: str
) -> None:
    core = core_for(queue, burst=True)
    action = core.next_action(0.0)
    assert action == Maintain()
    error = FakeDatabaseError(sqlstate, f"permission denied for table {queue.tables.limits.name}")
    assert core.database_error(action, error, 0.0) == 0.0
    assert core.fatal is not None
    assert words in str(core.fatal)
    assert f"SQLSTATE {sqlstate}" in str(core.fatal)
    assert core.next_action(0.0) == Stop()  # nothing held: stop at once, no retry loop


def test_a_transient_error_still_backs_off(queue: WorkerPlan) -> None:
    core = core_for(queue)
    action = core.next_action(0.0)
    assert core.database_error(action, FakeDatabaseError("57P01"), 0.0) == pytest.approx(0.1)
    assert core.fatal is None and not core.stopping


def test_a_heartbeat_without_privilege_stops_the_worker(queue: WorkerPlan) -> None:
    core = core_for(queue)
    core.heartbeat_failed(FakeDatabaseError("08006"), 0.0)
    assert not core.stopping
    core.heartbeat_failed(FakeDatabaseError("42501"), 0.0)
    assert core.stopping and "heartbeat" in str(core.fatal)


def test_a_stop_whose_flush_keeps_failing_ends_after_the_timeout(queue: WorkerPlan) -> None:
    core = core_for(queue, shutdown_timeout=1.0)
    _finished(core, [1])
    core.request_stop(0.0)
    now = 0.0
    for now in (0.5, 2.0, 3.0, 4.0):
        action = core.next_action(now)
        if action == Stop():
            break
        assert action == Flush()
        outcomes, _ = core.take_outcomes()
        core.flush_failed(outcomes)
        core.database_error(action, FakeDatabaseError("08006"), now)
    assert core.next_action(now) == Stop()


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
def test_a_handler_that_asks_the_process_to_stop_is_recorded_then_stops_it(
    queue: WorkerPlan, exc: BaseException
) -> None:
    def handler() -> None:
        raise exc

    plan = WorkerPlan(
        tables=queue.tables,
        notify=True,
        default_lease=20.0,
        tasks={"a": dataclasses.replace(queue.tasks["a"], handler=handler)},
    )
    core = core_for(plan)
    core.next_action(0.0)
    (job,) = core.accept_claim([row(1)], 10, 0.0, lambda j: None)
    stops: list[BaseException] = []
    runner = HandlerRunner(
        worker_id=core.worker_id, clock=core.clock, record=core.record, stop=stops.append
    )
    runner.run_sync(job)  # never raises
    assert stops == [exc]
    core.handler_raised(exc, 0.0)
    (outcome,), _ = core.take_outcomes()
    assert outcome.kind is OutcomeKind.RETRY  # a failed attempt: max_attempts is 2
    assert outcome.error is not None and outcome.error["type"].endswith(type(exc).__name__)
    assert core.stopping and core.stopped_by is exc


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"t": "a\x00b"}, "contains a NUL character"),
        ("lone \ud800", "contains a lone surrogate"),
        (Reschedule(in_=1e12), "latest due time"),
    ],
)
def test_a_result_that_cannot_be_stored_is_a_failed_attempt(
    queue: WorkerPlan, value: Any, reason: str
) -> None:
    core = core_for(queue)
    core.next_action(0.0)
    first, last = core.accept_claim([row(1), row(2, attempt=2)], 10, 0.0, lambda j: None)
    retried, failed = returned(core, first, value), returned(core, last, value)
    # The retry policy and max_attempts (2) apply, as to any failure.
    assert (retried.kind, retried.delay) == (OutcomeKind.RETRY, 5)
    assert failed.kind is OutcomeKind.FAILED
    assert failed.error is not None and reason in failed.error["message"]
    assert failed.error["type"] == "sqla_queue.logic.outcomes.InvalidOutcomeError"
    failed.encoded  # noqa: B018 - encodes, and PostgreSQL can store it


def test_a_non_json_result_is_kept_as_its_sanitized_repr(queue: WorkerPlan) -> None:
    class Odd:
        def __repr__(self) -> str:
            return "<odd \x00>"

    core = core_for(queue)
    core.next_action(0.0)
    (job,) = core.accept_claim([row(1)], 10, 0.0, lambda j: None)
    outcome = returned(core, job, Odd())
    assert (outcome.kind, outcome.result) == (OutcomeKind.SUCCEEDED, {"repr": "<odd \ufffd>"})


def test_a_retry_far_in_the_future_is_refused_and_traced_to_the_handler(
    queue: WorkerPlan,
) -> None:
    core = core_for(queue)
    core.next_action(0.0)
    (job,) = core.accept_claim([row(1)], 10, 0.0, lambda j: None)
    try:
        raise Retry("later", after=1e12)
    except Retry as exc:
        outcome = raised(core, job, exc)
    assert (outcome.kind, outcome.delay) == (OutcomeKind.RETRY, 5)  # the policy's delay
    assert outcome.error is not None
    assert "1e+12 s" in outcome.error["message"]
    assert "raise Retry" in outcome.error["traceback"]


def test_a_row_that_cannot_be_prepared_fails_instead_of_lingering(queue: WorkerPlan) -> None:
    core = core_for(queue)
    core.next_action(0.0)

    def broken_context(job: Any) -> Any:
        raise RuntimeError("no context")

    assert core.accept_claim([row(1)], 10, 0.0, broken_context) == []
    (outcome,), _ = core.take_outcomes()
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.error is not None and outcome.error["message"] == "no context"


def test_intervals_derived_from_a_tiny_lease_do_not_spin(queue: WorkerPlan) -> None:
    tiny = dataclasses.replace(queue.tasks["a"], lease=0.001)
    plan = WorkerPlan(tables=queue.tables, notify=True, default_lease=20.0, tasks={"a": tiny})
    core = core_for(plan)
    assert core.heartbeat_interval >= 0.01
    assert core.reclaim_interval >= 0.01


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"lease": math.nan}, "lost_interval"),
        ({"lease": 0}, "lost_interval"),
        ({"max_reclaims": -1}, "max_reclaims"),
        ({"max_attempts": True}, "max_attempts"),
        ({"declared_limit": 0}, "concurrency_limit"),
        ({"retry": None}, "retry"),
    ],
)
def test_task_runtimes_are_validated(queue: WorkerPlan, change: dict[str, Any], named: str) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        dataclasses.replace(queue.tasks["a"], **change)
    assert named in str(info.value)
    assert "task 'a'" in str(info.value)


# -- issue 26: idle workers idle; burst and rate windows; operators' limit changes ----------


def control(task: str, *, paused: bool = False, rate: tuple[int, float] | None = None) -> Any:
    """A row of the controls the maintenance reads."""
    rate_max, rate_seconds = rate if rate is not None else (None, None)
    return SimpleNamespace(
        task=task,
        paused=paused,
        rated=rate is not None and not paused,
        rate_max=rate_max,
        rate_seconds=rate_seconds,
    )


def rated_row(job_id: int | None, task: str, *, allowance: int, free_at: dt.datetime | None) -> Any:
    """A row of a rated claim: a claimed job (or none), and what the claim saw of the window."""
    return (
        row(job_id, task, rate_allowance=allowance, rate_free_at=free_at)
        if job_id
        else (
            SimpleNamespace(next_due=None, id=None, rate_allowance=allowance, rate_free_at=free_at)
        )
    )


def backlog(due: bool) -> list[Any]:
    """The rows of the rate backlog probe a burst run's rated claim ends with."""
    return [SimpleNamespace(due=due)]


def limited_plan(plan: WorkerPlan) -> WorkerPlan:
    """``plan`` with a concurrency limit declared on task ``b``."""
    tasks = dict(plan.tasks)
    tasks["b"] = dataclasses.replace(tasks["b"], declared_limit=1)
    return dataclasses.replace(plan, tasks=tasks)


def fill_windows(core: Decider, tasks: list[str], now: float, free_in: float) -> None:
    """Claim each rated task once, the claim finding its window full for ``free_in`` s."""
    free_at = T0 + dt.timedelta(seconds=free_in)
    for task in tasks:
        action = core.next_action(now)
        assert action == Claim(action.size, rated=task) if isinstance(action, Claim) else False
        run_unit(
            core.prepare(action, now, lambda j: None),
            [[], LOCKED, [rated_row(None, task, allowance=0, free_at=free_at)]],
        )


IDLE_CASES = {
    "all paused": ([control("a", paused=True), control("b", paused=True)], []),
    "all rated, windows full": (
        [control("a", rate=(1, 3600.0)), control("b", rate=(1, 3600.0))],
        ["a", "b"],
    ),
    "paused and rated full": (
        [control("a", paused=True), control("b", rate=(1, 3600.0))],
        ["b"],
    ),
    "one rated full, one plain": ([control("a", rate=(1, 3600.0))], ["a"]),
    "nothing controlled": ([], []),
}


@pytest.mark.parametrize("limited", [False, True], ids=["unlimited", "b limited"])
@pytest.mark.parametrize("seats", ["seats free", "no seat free"])
@pytest.mark.parametrize("case", sorted(IDLE_CASES))
def test_an_idle_worker_idles_whatever_its_tasks_are(
    queue: WorkerPlan, case: str, seats: str, limited: bool
) -> None:
    """Every combination of paused, rated (window full), limited and empty claims waits
    (no error) and keeps its maintenance, which would bring a resumed task back."""
    controls, full = IDLE_CASES[case]
    plan = limited_plan(queue) if limited else queue
    core = Decider(
        plan,
        WorkerSettings(concurrency=1, poll_interval=2.0, reclaim_interval=5.0),
        clock=lambda: T0,
        rng=random.Random(7),
    )
    assert core.next_action(0.0) == Maintain()
    core.controls_read(controls)
    fill_windows(core, full, 0.0, free_in=3600.0)
    if seats == "no seat free":
        action = core.next_action(0.0)
        if core.claim_params(1)["tasks"]:
            assert action == Claim(1)
            task = core.claim_params(1)["tasks"][0]
            assert len(core.accept_claim([row(1, task)], 1, 0.0, lambda j: None)) == 1
        else:
            assert isinstance(action, Wait)
    elif core.claim_params(1)["tasks"]:
        assert core.next_action(0.0) == Claim(1)
        core.accept_claim([empty()], 1, 0.0, lambda j: None)
    for now in (0.0, 1.0, 1.9):  # before the next poll (2 s) and maintenance (5 s)
        action = core.next_action(now)
        assert isinstance(action, Wait), (now, action)
        assert 0.0 < action.seconds <= 2.0
    assert core.next_action(5.0) == Maintain()


def test_a_worker_whose_tasks_are_all_paused_idles_then_claims_once_resumed(
    queue: WorkerPlan,
) -> None:
    core = core_for(queue, concurrency=4, poll_interval=1.0, reclaim_interval=5.0)
    assert core.next_action(0.0) == Maintain()
    core.controls_read([control("a", paused=True), control("b", paused=True)])
    action = core.next_action(0.0)
    assert action == Wait(1.0)  # the poll interval caps it; the maintenance comes at 5 s
    assert core.next_action(5.0) == Maintain()
    core.controls_read([control("a", paused=True)])
    assert core.next_action(5.0) == Claim(4)
    assert core.claim_params(4)["tasks"] == ["b"]


def test_a_burst_run_does_not_wait_for_a_full_window_that_holds_back_nothing(
    queue: WorkerPlan,
) -> None:
    """The claim that filled the week-long window took the task's last due job: the run
    ends once that job is done, instead of sleeping out the week."""
    core = core_for(queue, tasks=["a"], burst=True, concurrency=4)
    assert core.next_action(0.0) == Maintain()
    core.controls_read([control("a", rate=(2, 7 * 86400.0))])
    action = core.next_action(0.0)
    assert action == Claim(4, rated="a")
    work = core.prepare(action, 0.0, lambda j: None)
    # The guard, the lock; under it, the claim, then the probe of what is left due.
    assert len(work.steps) == 2
    free_at = T0 + dt.timedelta(days=7)
    rows = [rated_row(i, "a", allowance=2, free_at=free_at) for i in (1, 2)]
    jobs = run_unit(work, [[], LOCKED, rows, backlog(False)])
    for job in jobs:
        core.record(job, returned(core, job, None))
    assert core.next_action(0.0) == Flush()
    core.completed(*_applied(core))
    # Finishing may have made more due: one more look (the probe says nothing), then stop.
    action = core.next_action(0.0)
    assert action == Claim(4, rated="a")
    run_unit(
        core.prepare(action, 0.0, lambda j: None),
        [[], LOCKED, [rated_row(None, "a", allowance=0, free_at=free_at)], backlog(False)],
    )
    assert core.next_action(0.0) == Stop()


def test_a_burst_run_waits_for_a_full_window_while_due_jobs_are_left_behind_it(
    queue: WorkerPlan,
) -> None:
    """Due jobs behind a full window are still due: the run waits for the window (jobs
    not yet due it leaves, as for any task)."""
    core = core_for(queue, tasks=["a"], burst=True, concurrency=4)
    core.next_action(0.0)
    core.controls_read([control("a", rate=(1, 2.0))])
    free_at = T0 + dt.timedelta(seconds=2)
    run_unit(
        core.prepare(Claim(4, rated="a"), 0.0, lambda j: None),
        [[], LOCKED, [rated_row(None, "a", allowance=0, free_at=free_at)], backlog(True)],
    )
    action = core.next_action(1.5)
    assert isinstance(action, Wait) and action.seconds == pytest.approx(0.5)
    assert core.next_action(2.0) == Claim(4, rated="a")
    run_unit(
        core.prepare(Claim(4, rated="a"), 2.0, lambda j: None),
        [[], LOCKED, [rated_row(None, "a", allowance=1, free_at=None)], backlog(False)],
    )
    assert core.next_action(2.0) == Stop()


def test_a_long_running_worker_claims_rated_tasks_without_the_burst_probe(
    queue: WorkerPlan,
) -> None:
    core = core_for(queue, tasks=["a"], concurrency=4)
    core.next_action(0.0)
    core.controls_read([control("a", rate=(1, 2.0))])
    work = core.prepare(Claim(4, rated="a"), 0.0, lambda j: None)
    assert len(work.steps) == 2  # the guard, the lock; then, under the lock, the claim
    assert work.follow is not None
    flow = work.follow([[], LOCKED])
    assert flow is not None
    next(flow)  # the claim
    with pytest.raises(StopIteration):
        flow.send([])  # and no backlog probe after it
    # A control row another transaction holds: no claim at all, and the unit ends.
    assert work.follow([[], []]) is None


def test_a_limit_changed_while_the_window_is_full_applies_at_the_next_maintenance(
    queue: WorkerPlan,
) -> None:
    """An operator raises 1/hour to 100/hour: the worker stops waiting out the old hour at
    its next maintenance and claims under the new limit at once."""
    core = core_for(queue, tasks=["a"], concurrency=4, poll_interval=1.0, reclaim_interval=5.0)
    assert core.next_action(0.0) == Maintain()
    core.controls_read([control("a", rate=(1, 3600.0))])
    fill_windows(core, ["a"], 0.0, free_in=3600.0)
    for now in (1.0, 4.0):
        assert isinstance(core.next_action(now), Wait)
    assert core.next_action(5.0) == Maintain()
    core.controls_read([control("a", rate=(1, 3600.0))])  # unchanged: still waits
    assert isinstance(core.next_action(5.0), Wait)
    assert core.next_action(10.0) == Maintain()
    core.controls_read([control("a", rate=(100, 3600.0))])
    assert core.next_action(10.0) == Claim(4, rated="a")


def test_a_changed_period_also_ends_the_wait(queue: WorkerPlan) -> None:
    core = core_for(queue, tasks=["a"], concurrency=4, reclaim_interval=5.0)
    core.next_action(0.0)
    core.controls_read([control("a", rate=(1, 3600.0))])
    fill_windows(core, ["a"], 0.0, free_in=3600.0)
    assert core.next_action(5.0) == Maintain()
    core.controls_read([control("a", rate=(1, 1.0))])
    assert core.next_action(5.0) == Claim(4, rated="a")


class _Ends:
    """An observer that keeps the kind of every attempt end it hears."""

    def __init__(self) -> None:
        self.kinds: list[OutcomeKind] = []

    def job_started(self, job: Any, queue_wait: float | None) -> None:
        pass

    def job_finished(
        self, job: Any, kind: OutcomeKind, duration: float, error: BaseException | None
    ) -> None:
        self.kinds.append(kind)

    def jobs_lost(self, tasks: Any) -> None:
        pass


def test_an_async_run_closed_before_it_ends_records_no_failed_attempt(
    queue: WorkerPlan,
) -> None:
    """A stopped loop's pending handler, closed when its task is collected: no outcome
    and no failure for the observers, only the hand-back (its job was released)."""

    async def forever() -> None:
        await asyncio.sleep(3600)

    runtime = dataclasses.replace(queue.tasks["a"], handler=forever, is_async=True)
    core = core_for(queue)
    (running,) = core.accept_claim([row(1)], 1, 0.0, lambda j: None)
    running = RunningJob(running.job, runtime, [], {}, None)
    recorded: list[Outcome] = []
    ends = _Ends()
    runner = HandlerRunner(
        worker_id=core.worker_id,
        clock=core.clock,
        record=lambda r, o: recorded.append(o),
        observer=ends,
    )
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(runner.run_async(running))
        loop.run_until_complete(asyncio.sleep(0.01))  # the handler now awaits
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        task.get_coro().close()  # what collecting the abandoned task does
    finally:
        loop.close()
    assert recorded == []
    assert ends.kinds == [OutcomeKind.RELEASE]
