"""The parts of the worker's decider, each on its own: no database, no threads, no real clock.

:mod:`tests.unit.test_worker_core` drives the composed :class:`Decider`; here each part is
held to its one job with a fake wall clock, a seeded generator and hand-made rows.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import socket
import threading
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import MetaData

from sqla_queue import RetryPolicy, WorkerStoppedError
from sqla_queue.logic.outcomes import ClaimedJob, Outcome, OutcomeKind
from sqla_queue.models import build_tables
from sqla_queue.worker.actions import Claim, Flush, Maintain, Step
from sqla_queue.worker.decider.acks import OutcomeBuffer, tally
from sqla_queue.worker.decider.decider import intervals
from sqla_queue.worker.decider.intake import Intake
from sqla_queue.worker.decider.keys import PARKED_RETRY, KeyPromotion
from sqla_queue.worker.decider.liveness import Liveness
from sqla_queue.worker.decider.maintenance import (
    CLEANUP_BATCH,
    SWEEP_KEYS,
    WAKE_BATCH,
    Maintenance,
)
from sqla_queue.worker.decider.pacing import ClaimPacer, poll_wait
from sqla_queue.worker.decider.prebuilt import WorkerStatements
from sqla_queue.worker.decider.rates import RateSchedule
from sqla_queue.worker.decider.recovery import MAX_ERROR_BACKOFF, STOP_FLUSH_TRIES, Recovery
from sqla_queue.worker.decider.running import RunningJobs
from sqla_queue.worker.decider.shutdown import Shutdown
from sqla_queue.worker.handlers import RunningJob
from sqla_queue.worker.plan import TaskRuntime, WorkerPlan
from sqla_queue.worker.settings import WorkerSettings

pytestmark = pytest.mark.unit

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
TABLES = build_tables(MetaData())
WORKER = uuid.UUID(int=7)


def clock() -> dt.datetime:
    return T0


def _runtime(name: str, *, lease: float = 20.0, limit: int | None = None) -> TaskRuntime:
    return TaskRuntime(
        name=name,
        handler=lambda: None,
        is_async=False,
        pass_context=False,
        max_attempts=2,
        retry=RetryPolicy(),
        lease=lease,
        max_reclaims=2,
        declared_limit=limit,
    )


def plan(**tasks: TaskRuntime) -> WorkerPlan:
    tasks = tasks or {"a": _runtime("a"), "b": _runtime("b", lease=4.0)}
    return WorkerPlan(tables=TABLES, notify=True, default_lease=20.0, tasks=tasks)


def job(job_id: int, *, task: str = "a", queue_id: str | None = None, **kw: Any) -> ClaimedJob:
    fields: dict[str, Any] = {
        "id": job_id,
        "task": task,
        "attempt": 1,
        "max_attempts": 2,
        "reclaims": 0,
        "queue_id": queue_id,
        "payload": {"args": [job_id], "kwargs": {}},
    }
    fields.update(kw)
    return ClaimedJob(**fields)


class FakeContext:
    """Records what the worker told a handler."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def notify_shutdown(self) -> None:
        self.told.append("shutdown")

    def notify_lost(self) -> None:
        self.told.append("lost")

    def notify_cancel(self) -> None:
        self.told.append("cancel")


def running(job_id: int, *, context: Any = None, **kw: Any) -> RunningJob:
    return RunningJob(job(job_id, **kw), _runtime("a"), [], {}, context)


def done(job_id: int, kind: OutcomeKind = OutcomeKind.SUCCEEDED) -> Outcome:
    return Outcome(job_id, 1, kind)


# -- WorkerStatements, intervals ---------------------------------------------------------------


def test_statements_are_built_once_and_chosen_by_limit() -> None:
    built = WorkerStatements.build(TABLES, generic_plans=True)
    assert built.claim(limited=False) is built.claim_plain
    assert built.claim(limited=True) is built.claim_limited
    assert built.rated_claim(limited=False) is built.claim_rated
    assert built.rated_claim(limited=True) is built.claim_rated_limited
    assert "plan_cache_mode" in str(built.guard)
    assert "plan_cache_mode" not in str(WorkerStatements.build(TABLES, generic_plans=False).guard)


def test_intervals_come_from_settings_or_the_shortest_lease() -> None:
    assert intervals(plan(), WorkerSettings()) == (1.0, 2.0)  # b's 4 s lease
    assert intervals(plan(), WorkerSettings(heartbeat_interval=3, reclaim_interval=9)) == (3, 9)
    long = plan(a=_runtime("a", lease=600.0))
    assert intervals(long, WorkerSettings()) == (5.0, 5.0)  # the queue's 20 s lease; capped


# -- ClaimPacer ----------------------------------------------------------------------------------


def pacer(*, burst: bool = False, seed: int = 3, **settings: Any) -> ClaimPacer:
    settings.setdefault("poll_interval", 2.0)
    return ClaimPacer(plan(), WorkerSettings(**settings), WORKER, random.Random(seed), burst=burst)


def test_poll_wait_reads_the_clock_only_for_a_due_time() -> None:
    def no_clock() -> dt.datetime:
        raise AssertionError("read")

    assert poll_wait(2.0, None, no_clock) == 2.0
    assert poll_wait(2.0, T0 + dt.timedelta(seconds=0.5), clock) == 0.5
    assert poll_wait(2.0, T0 + dt.timedelta(seconds=9), clock) == 2.0
    assert poll_wait(2.0, T0 - dt.timedelta(seconds=1), clock) == 0.0


def test_pacer_params_take_the_seat_offset_from_the_generator() -> None:
    first, second = pacer().params(4), pacer().params(5)
    assert first["seat_offset"] == second["seat_offset"] == random.Random(3).randrange(1 << 30)
    assert (first["batch"], second["batch"]) == (4, 5)
    assert first["tasks"] == ["a", "b"] and first["worker"] == WORKER
    assert first["lease_map"] == '{"b": 4.0}' and first["limit_map"] == "{}"


def test_pacer_sizes_claims_by_free_seats_and_batch() -> None:
    paced = pacer(concurrency=10, batch_size=4)
    assert (paced.size(2), paced.size(9)) == (2, 4)
    assert paced.due(0.0)
    paced.set_tasks([])
    assert not paced.due(0.0) and paced.idle


def test_pacer_times_the_next_claim_from_the_last() -> None:
    paced = pacer()
    paced.claimed(4, 4, None, 10.0, clock)  # full: more is likely waiting
    assert (paced.next_poll, paced.last_empty) == (10.0, False)
    paced.claimed(0, 4, T0 + dt.timedelta(seconds=0.25), 10.0, clock)
    assert (paced.next_poll, paced.last_empty) == (10.25, True)
    paced.claimed(1, 4, None, 10.0, clock)
    assert paced.next_poll == 12.0
    bursting = pacer(burst=True)
    bursting.claimed(1, 4, None, 10.0, clock)
    assert bursting.next_poll == 10.0
    paced.reopen()
    assert (paced.next_poll, paced.last_empty) == (0.0, False)


def test_pacer_set_tasks_polls_again_only_on_a_change() -> None:
    paced = pacer()
    paced.next_poll, paced.last_empty = 5.0, True
    paced.set_tasks(["a", "b"])
    assert (paced.next_poll, paced.last_empty) == (5.0, True)
    paced.set_tasks(["a"])
    assert (paced.tasks, paced.next_poll, paced.last_empty) == (["a"], 0.0, False)


def test_pacer_limits_come_from_code_or_storage() -> None:
    paced = pacer()
    assert not paced.limited and not paced.is_limited("a")
    paced.limits_read([SimpleNamespace(task="a")])
    assert paced.limited and paced.is_limited("a") and not paced.is_limited("b")
    paced.limits_read([])
    assert not paced.limited
    declared = ClaimPacer(
        plan(a=_runtime("a", limit=2)), WorkerSettings(), WORKER, random.Random(), burst=False
    )
    assert declared.limited and declared.is_limited("a")
    declared.limits_read([])
    assert declared.limited


# -- RateSchedule -------------------------------------------------------------------------------


def rates(*tasks: str, burst: bool = False) -> RateSchedule:
    schedule = RateSchedule(1.0, clock, burst=burst)
    schedule.update(set(tasks), dict.fromkeys(tasks, (5, 60)))
    return schedule


def window(*, allowance: int, free_in: float) -> Any:
    return SimpleNamespace(
        rate_allowance=allowance, rate_free_at=T0 + dt.timedelta(seconds=free_in)
    )


def test_rated_task_waiting_longest_is_due_first() -> None:
    schedule = rates("x", "y")
    assert schedule.due(0.0) == "x"  # both due at 0: by name
    schedule.claiming("x", 0.0)
    assert schedule.due(0.0) == "y"
    schedule.claiming("y", 0.5)
    assert schedule.due(1.0) == "x" and schedule.times() == [1.0, 1.5]


def test_a_full_window_is_waited_for() -> None:
    schedule = rates("x")
    schedule.claimed("x", [window(allowance=2, free_in=3.0)], 2, 10, None, 5.0)
    assert schedule.times() == [8.0] and schedule.due(7.9) is None and schedule.due(8.0) == "x"
    schedule.poll_all()  # a notification does not open a full window
    assert schedule.times() == [8.0]
    assert not schedule.idle()


def test_a_short_rated_claim_polls_later_and_counts_as_empty() -> None:
    schedule = rates("x")
    schedule.claimed("x", [], 0, 10, T0 + dt.timedelta(seconds=0.5), 5.0)
    assert schedule.times() == [5.5] and schedule.idle()
    schedule.reopen()
    assert schedule.times() == [0.0] and not schedule.idle()


def test_a_burst_run_does_not_wait_for_a_window_that_holds_nothing_back() -> None:
    schedule = rates("x", burst=True)
    schedule.claimed("x", [window(allowance=1, free_in=3.0)], 1, 10, None, 5.0, False)
    assert schedule.times() == [5.0] and schedule.idle()


def test_a_new_stored_limit_ends_the_wait_and_a_dropped_task_is_forgotten() -> None:
    schedule = rates("x", "y")
    schedule.claimed("x", [window(allowance=1, free_in=30.0)], 1, 10, None, 0.0)
    schedule.update({"x", "y"}, {"x": (5, 60), "y": (5, 60)})
    assert schedule.times()[0] == 30.0
    schedule.update({"x"}, {"x": (9, 60)})
    assert schedule.tasks == {"x"} and schedule.times() == [0.0]


# -- KeyPromotion -------------------------------------------------------------------------------


def test_keys_are_taken_sorted_once_and_restored() -> None:
    paced = pacer()
    keys = KeyPromotion(threading.Lock(), "CLEAR", "PROMOTE", paced)
    assert keys.take_steps() == ([], [])
    keys.add("k2")
    keys.restore(["k1", "k2"])
    taken, steps = keys.take_steps()
    assert taken == ["k1", "k2"] and not keys.owed
    assert steps == [
        Step("CLEAR", {"keys": ["k1", "k2"]}),
        Step("PROMOTE", {"keys": ["k1", "k2"]}),
    ]


def test_a_parked_key_is_tried_again_soon() -> None:
    paced = pacer()
    keys = KeyPromotion(threading.Lock(), "CLEAR", "PROMOTE", paced)
    paced.next_poll = 9.0
    keys.cleared([], 1.0)
    keys.cleared([[], [(5,)]], 1.0)
    assert not keys.owed and paced.next_poll == 9.0
    keys.cleared([[("k1",)], []], 1.0)
    assert keys.owed == {"k1"} and paced.next_poll == 1.0 + PARKED_RETRY
    keys.cleared([[("k1",)], []], 5.0)
    assert paced.next_poll == 1.0 + PARKED_RETRY  # only ever sooner


# -- OutcomeBuffer, tally -----------------------------------------------------------------------


def test_acks_wait_from_the_first_outcome_seen() -> None:
    buffer = OutcomeBuffer(ack_delay=0.01, batch=3)
    buffer.add(done(1))
    assert buffer.ack_wait(1.0, running=2) == pytest.approx(0.01)
    assert buffer.ack_wait(1.004, running=2) == pytest.approx(0.006)
    assert buffer.ack_wait(1.004, running=0) == 0.0  # nothing else will join
    buffer.add(done(2))
    buffer.add(done(3))
    assert buffer.ack_wait(1.005, running=2) == 0.0  # a batch's worth
    assert [o.job_id for o in buffer.take()] == [1, 2, 3] and len(buffer) == 0
    buffer.add(done(4))
    assert buffer.ack_wait(2.0, running=1) == pytest.approx(0.01)  # the delay starts anew


def test_a_failed_flush_goes_back_to_the_head_and_is_isolated_one_by_one() -> None:
    buffer = OutcomeBuffer(ack_delay=0.0, batch=10)
    first = [done(1), done(2)]
    buffer.add(done(3))
    buffer.put_back(first)
    assert [o.job_id for o in buffer.outcomes] == [1, 2, 3]
    assert buffer.take_failed() == first and buffer.take_failed() == []
    buffer.isolate(2)
    assert buffer.is_head(buffer.outcomes[0]) and not buffer.is_head(first[1])
    assert [o.job_id for o in buffer.take()] == [1]
    buffer.isolated(1)
    assert [o.job_id for o in buffer.take()] == [2]
    buffer.isolated(1)
    assert buffer.isolating == 0 and [o.job_id for o in buffer.take()] == [3]


def test_tally_counts_each_kind_and_the_fenced() -> None:
    stats = dict.fromkeys(("succeeded", "failed", "retried", "fenced", "cancelled"), 0)
    outcomes = [
        done(1),
        done(2, OutcomeKind.FAILED),
        done(3, OutcomeKind.RETRY),
        done(4, OutcomeKind.CANCELLED),
        done(5),
        done(6, OutcomeKind.RELEASE),
    ]
    tally(stats, outcomes, {1, 2, 3, 4, 6})
    assert stats == {"succeeded": 1, "failed": 1, "retried": 1, "fenced": 1, "cancelled": 1}


# -- RunningJobs, Liveness ----------------------------------------------------------------------


def test_running_jobs_forget_a_finished_or_released_handler_once() -> None:
    jobs = RunningJobs()
    one, two = running(1, context=FakeContext()), running(2)
    jobs.add(one)
    jobs.add(two)
    assert jobs.count() == 2 and jobs.pairs() == [(1, 1), (2, 1)] and len(jobs.contexts()) == 1
    assert jobs.remove(one) and not jobs.remove(one)
    assert jobs.release_all() == [two] and two.released
    assert not jobs.remove(two) and jobs.count() == 0 and jobs.job_ids() == set()


def liveness() -> tuple[Liveness, RunningJobs, OutcomeBuffer]:
    jobs, buffer = RunningJobs(), OutcomeBuffer(ack_delay=0.0, batch=10)
    return Liveness(threading.Lock(), jobs, buffer, WORKER), jobs, buffer


def test_the_heartbeat_covers_running_and_unacked_executions() -> None:
    live, jobs, buffer = liveness()
    assert live.heartbeat_params() is None
    jobs.add(running(1))
    buffer.add(done(2))
    assert live.held() == ([1, 2], [1, 1])
    params = live.heartbeat_params()
    assert params is not None
    assert (params["worker"], params["ids"], params["attempts"]) == (WORKER, [1, 2], [1, 1])
    # What the first beat inserts into the worker's row, which keeps the worker alive.
    assert params["pid"] == os.getpid() and params["hostname"] == socket.gethostname()


def test_a_heartbeat_tells_lost_and_cancelled_handlers_once() -> None:
    live, jobs, _ = liveness()
    lost_ctx, cancel_ctx = FakeContext(), FakeContext()
    jobs.add(running(1, context=lost_ctx))
    jobs.add(running(2, context=cancel_ctx))
    # 3 was acked meanwhile: gone from the table, but not lost.
    live.heartbeat_done([1, 2, 3], [(2, True)])
    live.heartbeat_done([2], [(2, True)])
    assert lost_ctx.told == ["lost"] and cancel_ctx.told == ["cancel"]


# -- Intake -------------------------------------------------------------------------------------


def test_intake_decodes_once_and_refuses_rows_that_must_not_run() -> None:
    intake = Intake(plan(), WORKER, clock)
    ready = intake.accept(job(1), lambda claimed: None)
    assert isinstance(ready, RunningJob) and (ready.args, ready.kwargs) == ([1], {})
    refused = {
        "malformed": intake.accept(job(2, payload=["x"]), lambda claimed: None),
        "unknown": intake.accept(job(3, task="gone"), lambda claimed: None),
        "orphan": intake.accept(job(4, payload=None), lambda claimed: None),
        "lost": intake.accept(job(5, reclaims=3), lambda claimed: None),
        "context": intake.accept(job(6), lambda claimed: 1 / 0),
    }
    for why, outcome in refused.items():
        assert isinstance(outcome, Outcome) and outcome.kind is OutcomeKind.FAILED, why
        assert outcome.error is not None and outcome.error["at"] == T0.isoformat(), why


def test_intake_reads_a_claim_row() -> None:
    row = SimpleNamespace(
        id=9, task="a", attempt=3, max_attempts=None, reclaims=1, queue_id="k", payload={}
    )
    claimed = Intake.job_of(row)
    assert (claimed.id, claimed.max_attempts, claimed.queue_id, claimed.execute_at) == (
        9,
        3,  # an orphan fails at this attempt
        "k",
        None,
    )


# -- Maintenance --------------------------------------------------------------------------------


def maintenance() -> tuple[Maintenance, ClaimPacer, RateSchedule, KeyPromotion]:
    built = WorkerStatements.build(TABLES, generic_plans=True)
    paced, schedule = pacer(), RateSchedule(1.0, clock, burst=False)
    keys = KeyPromotion(threading.Lock(), built.clear_done, built.promote, paced)
    part = Maintenance(built, plan(), (), 2.0, pacer=paced, rates=schedule, keys=keys)
    return part, paced, schedule, keys


def test_maintenance_is_due_every_interval() -> None:
    part, *_ = maintenance()
    assert part.due(0.0) and not part.due(1.9) and part.next_at == 2.0 and part.due(2.0)


def test_maintenance_runs_its_statements_in_order() -> None:
    part, paced, _, _ = maintenance()
    built = WorkerStatements.build(TABLES, generic_plans=True)
    steps = part.steps([4, 5])
    assert [type(step.statement) for step, _ in steps] == [
        type(s) for s in (built.reclaim, built.limits, built.controls, built.cleanup)
    ] + [type(built.orphan_sweep), type(built.durable.wake_due)]
    assert steps[0][0].params == {"held": [4, 5], "worker": None}
    assert steps[1][0].params == {"tasks": ["a", "b"]} and steps[1][1] == paced.limits_read
    assert steps[3][0].params == {"limit": CLEANUP_BATCH}
    assert steps[4][0].params == {"after": "", "limit": SWEEP_KEYS}
    assert steps[5][0].params == {"limit": WAKE_BATCH}
    part.swept([SimpleNamespace(last_key="k9", promoted=0)])
    assert part.steps([])[4][0].params["after"] == "k9"


def test_controls_split_the_claims_into_plain_and_rated() -> None:
    part, paced, schedule, _ = maintenance()
    paced.next_poll = 9.0
    part.controls_read(
        [
            SimpleNamespace(task="a", paused=True, rated=False),
            SimpleNamespace(task="b", paused=False, rated=True, rate_max=3, rate_seconds=10),
        ]
    )
    assert part.paused == {"a"} and schedule.tasks == {"b"} and paced.tasks == []
    part.controls_read([])
    assert part.paused == set() and schedule.tasks == set() and paced.tasks == ["a", "b"]
    assert paced.next_poll == 0.0


def test_what_maintenance_freed_is_claimed_at_once() -> None:
    part, paced, _, keys = maintenance()
    paced.next_poll = 9.0
    part.cleaned_up([(None,)])
    assert paced.next_poll == 9.0
    part.cleaned_up([("k1",), ("k2",)])
    assert keys.owed == {"k1", "k2"} and paced.next_poll == 0.0
    paced.next_poll = 9.0
    part.swept([SimpleNamespace(last_key=None, promoted=2)])
    assert paced.next_poll == 0.0
    paced.next_poll = 9.0
    part.reclaimed([SimpleNamespace(id=1, task="a", ended_node=False)])
    assert paced.next_poll == 0.0


# -- Shutdown, Recovery -------------------------------------------------------------------------


def shutdown() -> tuple[Shutdown, RunningJobs, threading.Event, list[str]]:
    jobs, flag, woken = RunningJobs(), threading.Event(), []
    part = Shutdown(threading.Lock(), jobs, 10.0, flag, lambda: woken.append("wake"))
    return part, jobs, flag, woken


def test_a_stop_starts_the_timeout_once_and_tells_the_handlers() -> None:
    part, jobs, flag, woken = shutdown()
    context = FakeContext()
    jobs.add(running(1, context=context))
    part.request(100.0)
    part.request(105.0)
    assert part.stopping and part.deadline == 110.0 and flag.is_set()
    assert context.told == ["shutdown"] and woken == ["wake", "wake"]


def test_the_first_reason_to_stop_is_kept() -> None:
    part, *_ = shutdown()
    first, second = WorkerStoppedError("one"), WorkerStoppedError("two")
    part.fail(first, 0.0)
    assert part.fatal is first and not part.give_up
    part.fail(second, 0.0)
    assert part.fatal is first and part.give_up  # a second failure ends the stop at once
    interrupt = KeyboardInterrupt()
    part.handler_raised(interrupt, 0.0)
    part.handler_raised(SystemExit(), 0.0)
    assert part.stopped_by is interrupt


class FakeDatabaseError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"SQLSTATE {sqlstate}")
        self.sqlstate = sqlstate


def recovery() -> tuple[Recovery, OutcomeBuffer, ClaimPacer, Shutdown]:
    lock, buffer, paced = threading.Lock(), OutcomeBuffer(0.0, 10), pacer()
    part = Shutdown(lock, RunningJobs(), 10.0, threading.Event(), lambda: None)
    found = Recovery(TABLES, WORKER, clock, lock=lock, buffer=buffer, pacer=paced, shutdown=part)
    return found, buffer, paced, part


def test_transient_errors_back_off_exponentially_up_to_a_cap() -> None:
    found, _, paced, _ = recovery()
    delays = [found.database_error(Claim(1), RuntimeError("down"), 5.0) for _ in range(9)]
    assert delays[:4] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert delays[-1] == MAX_ERROR_BACKOFF and paced.next_poll == 5.0 + MAX_ERROR_BACKOFF
    found.reset()
    assert found.database_error(Maintain(), RuntimeError("down"), 0.0) == pytest.approx(0.1)


def test_a_lost_race_retries_the_claim_at_once() -> None:
    found, _, paced, _ = recovery()
    (index,) = [ix.name for ix in TABLES.executions.indexes if ix.unique][:1]
    race = FakeDatabaseError("23505")
    race.orig = SimpleNamespace(diag=SimpleNamespace(constraint_name=index))  # type: ignore[attr-defined]
    paced.next_poll = 9.0
    assert found.database_error(Claim(2), race, 3.0) == 0.0 and paced.next_poll == 3.0


def test_a_refused_batch_is_isolated_and_its_culprit_replaced() -> None:
    found, buffer, _, part = recovery()
    buffer.put_back([done(1), done(2)])
    assert found.database_error(Flush(), FakeDatabaseError("22P05"), 0.0) == 0.0
    assert buffer.isolating == 2 and not part.stopping
    (alone,) = buffer.take()
    buffer.put_back([alone])
    found.database_error(Flush(), FakeDatabaseError("22P05"), 0.0)
    head = buffer.outcomes[0]
    assert head.job_id == 1 and head.kind is OutcomeKind.FAILED and head.extra.get("stand_in")
    # Even the plain failure refused: the worker stops.
    buffer.put_back([buffer.take()[0]])
    found.database_error(Flush(), FakeDatabaseError("22P05"), 0.0)
    assert part.stopping and part.fatal is not None


def test_errors_retrying_cannot_fix_stop_the_worker() -> None:
    found, _, _, part = recovery()
    found.heartbeat_failed(RuntimeError("blip"), 0.0)
    assert not part.stopping
    found.heartbeat_failed(FakeDatabaseError("42501"), 0.0)
    assert part.stopping and "heartbeat" in str(part.fatal)


def test_a_stopping_worker_gives_up_after_some_failed_flushes() -> None:
    found, _, _, part = recovery()
    part.request(0.0)
    for _ in range(STOP_FLUSH_TRIES - 1):
        assert found.database_error(Flush(), RuntimeError("down"), 20.0) > 0
    assert not part.give_up
    assert found.database_error(Flush(), RuntimeError("down"), 20.0) == 0.0 and part.give_up
