"""The I/O-free logic of issue 14, driven by hand: no database, no threads, fake clocks.

* :func:`sqla_queue.unique.unique_enqueue_flow` is sent fake rows for each statement it
  yields, so every branch (free key, held key, each ``on_duplicate``, duplicates inside a
  batch) is walked step by step;
* :func:`sqla_queue.lifecycle.result_flow` runs against a fake clock;
* :meth:`Decider.deliver_cancels` and :class:`HandlerRunner` turn a cancel request into
  the handler's flag, event and task cancellation, and into the attempt's outcome.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import threading
import uuid
from collections.abc import Generator
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncSession

from sqla_queue import (
    DuplicateJobError,
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    ResultTimeoutError,
    RetryPolicy,
)
from sqla_queue.conversation import Wait
from sqla_queue.lifecycle import LISTEN_POLL, POLL_MAX, result_flow
from sqla_queue.logic.outcomes import Outcome, OutcomeKind
from sqla_queue.models import build_tables
from sqla_queue.spec import EnqueueOptions, JobSpec
from sqla_queue.statements.lifecycle import await_statement, job_outcome_statement
from sqla_queue.unique import UniqueStatements, stored_scope, unique_enqueue_flow
from sqla_queue.worker.context import JobContext
from sqla_queue.worker.decider import Decider
from sqla_queue.worker.handlers import HandlerRunner, RunningJob
from sqla_queue.worker.plan import TaskRuntime, WorkerPlan
from sqla_queue.worker.sessions import InTransaction
from sqla_queue.worker.settings import WorkerSettings

pytestmark = pytest.mark.unit

TABLES = build_tables(MetaData())
STATEMENTS = UniqueStatements("TAKE", "BIND", "REPLACE")
ENQUEUE = "ENQUEUE"


# -- unique_enqueue_flow ------------------------------------------------------------------


def spec(key: str | None, value: Any = None, task: str = "t", **options: Any) -> JobSpec:
    return JobSpec(task, (), {"value": value}, EnqueueOptions(unique_key=key, **options))


def prepare(specs: Any) -> list[str]:
    """One chunk per call, with what the enqueue statement would get (task and value)."""
    return [json.dumps([[s.task, s.kwargs["value"]] for s in specs])]


class FlowDriver:
    """Steps through a unique enqueue flow, recording each statement and its parameters."""

    def __init__(self, specs: list[JobSpec]) -> None:
        self.flow: Generator[Any, Any, list[int]] = unique_enqueue_flow(
            specs, statements=STATEMENTS, enqueue=ENQUEUE, prepare=prepare
        )
        self.steps: list[tuple[Any, Any]] = []
        self.result: list[int] | None = None
        self._pending: Any = next(self.flow)
        self.steps.append(self._pending)

    @property
    def current(self) -> tuple[Any, Any]:
        return self._pending

    def send(self, rows: list[Any]) -> None:
        try:
            self._pending = self.flow.send(rows)
        except StopIteration as done:
            self.result = done.value
            self._pending = None
        else:
            self.steps.append(self._pending)


def keys_asked(step: tuple[Any, Any]) -> list[tuple[str, str, int]]:
    statement, params = step
    assert statement == "TAKE"
    return [(k["task"], k["key"], k["seq"]) for k in json.loads(params["keys"])]


def test_free_keys_are_taken_written_and_bound_in_input_order() -> None:
    driver = FlowDriver(
        [
            spec("b", 1),
            spec(None, 2),
            spec("a", 3, unique_scope="queued"),
            spec("c", 4, unique_scope=90.0),
        ]
    )
    # Keys are locked in (task, key) order, whatever the call order: no deadlock between
    # two batches with overlapping keys.
    assert keys_asked(driver.current) == [("t", "a", 0), ("t", "b", 1), ("t", "c", 2)]
    driver.send([(0, None), (1, None), (2, None)])
    statement, params = driver.current
    assert statement == ENQUEUE
    # Every call is written, plain and unique alike, in input order.
    assert json.loads(params["rows"]) == [["t", 1], ["t", 2], ["t", 3], ["t", 4]]
    driver.send([(10,), (11,), (12,), (13,)])
    statement, params = driver.current
    assert statement == "BIND"
    bound = {
        b["key"]: (b["job_id"], b["scope"], b["hold_seconds"]) for b in json.loads(params["keys"])
    }
    assert bound == {
        "b": (10, "active", None),
        "a": (12, "queued", None),
        "c": (13, "finished", 90.0),
    }
    driver.send([])
    assert driver.result == [10, 11, 12, 13]


def test_held_keys_answer_the_holder_and_write_nothing_for_them() -> None:
    driver = FlowDriver([spec("a", 1), spec("b", 2)])
    driver.send([(0, 77), (1, 88)])  # both held
    assert driver.result == [77, 88]
    assert [s[0] for s in driver.steps] == ["TAKE"]  # no write, no bind


def test_raise_on_a_held_key_raises_before_anything_is_written() -> None:
    driver = FlowDriver([spec("free", 1), spec("held", 2, on_duplicate="raise")])
    with pytest.raises(DuplicateJobError) as caught:
        driver.send([(0, None), (1, 55)])
    assert (caught.value.task, caught.value.key, caught.value.job_id) == ("t", "held", 55)
    assert [s[0] for s in driver.steps] == ["TAKE"]


def test_replace_rewrites_a_holder_with_the_calls_arguments_and_due_time() -> None:
    at = dt.datetime(2031, 5, 6, tzinfo=dt.UTC)
    driver = FlowDriver(
        [
            spec("a", "new a", on_duplicate="replace", run_at=at),
            spec("b", "new b", on_duplicate="replace"),
            spec("c", "new c", on_duplicate="replace", delay=30),
        ]
    )
    driver.send([(0, 5), (1, None), (2, 7)])
    assert driver.current[0] == ENQUEUE
    assert json.loads(driver.current[1]["rows"]) == [["t", "new b"]]
    driver.send([(20,)])
    assert driver.current[0] == "BIND"
    driver.send([])
    statement, params = driver.current
    assert statement == "REPLACE"
    replaced = {r["id"]: r for r in json.loads(params["rows"])}
    assert replaced[5]["payload"] == {"args": [], "kwargs": {"value": "new a"}}
    assert (replaced[5]["run_at"], replaced[5]["delay"]) == (at.isoformat(), None)
    assert (replaced[7]["run_at"], replaced[7]["delay"]) == (None, 30.0)
    driver.send([(5,), (7,)])
    assert driver.result == [5, 20, 7]


def test_duplicates_inside_a_batch_follow_the_later_calls_policy() -> None:
    driver = FlowDriver(
        [
            spec("k", "first"),
            spec("k", "second", on_duplicate="replace"),
            spec("k", "third"),  # ignore: the batch's word so far stands
            spec("k", "other task", task="u"),
        ]
    )
    assert keys_asked(driver.current) == [("t", "k", 0), ("u", "k", 1)]
    driver.send([(0, None), (1, None)])
    assert json.loads(driver.current[1]["rows"]) == [["t", "second"], ["u", "other task"]]
    driver.send([(30,), (31,)])
    driver.send([])
    assert driver.result == [30, 30, 30, 31]


def test_a_raise_inside_a_batch_stops_before_the_first_statement() -> None:
    flow = unique_enqueue_flow(
        [spec("k"), spec("k", on_duplicate="raise")],
        statements=STATEMENTS,
        enqueue=ENQUEUE,
        prepare=prepare,
    )
    with pytest.raises(DuplicateJobError) as caught:
        next(flow)
    assert caught.value.job_id is None


def test_a_replace_inside_a_batch_then_held_replaces_the_holder_with_the_last_word() -> None:
    driver = FlowDriver([spec("k", "one"), spec("k", "two", on_duplicate="replace")])
    driver.send([(0, 9)])
    statement, params = driver.current
    assert statement == "REPLACE"
    [row] = json.loads(params["rows"])
    assert (row["id"], row["payload"]["kwargs"]["value"]) == (9, "two")
    driver.send([(9,)])
    assert driver.result == [9, 9]


def test_options_without_a_key_are_refused() -> None:
    with pytest.raises(ValueError, match="need a unique_key"):
        next(
            unique_enqueue_flow(
                [spec(None, on_duplicate="raise")],
                statements=STATEMENTS,
                enqueue=ENQUEUE,
                prepare=prepare,
            )
        )


def test_stored_scope() -> None:
    assert stored_scope(EnqueueOptions(unique_key="k")) == ("active", None)
    assert stored_scope(EnqueueOptions(unique_key="k", unique_scope="queued")) == ("queued", None)
    assert stored_scope(EnqueueOptions(unique_key="k", unique_scope=dt.timedelta(minutes=10))) == (
        "finished",
        600.0,
    )


# -- result_flow --------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def job(status: str, state: str | None = None, **kw: Any) -> Any:
    fields = {"id": 1, "status": status, "result": None, "errors": [], "state": state}
    fields.update(kw)
    return SimpleNamespace(**fields)


def start_flow(
    timeout: float | None, listening: bool, clock: FakeClock
) -> Generator[Any, Any, Any]:
    flow = result_flow(TABLES, 1, timeout=timeout, listening=listening, clock=clock)
    statement, params = next(flow)
    assert str(statement) == str(await_statement(TABLES))
    assert params == {"job_id": 1}
    statement, _ = flow.send([])
    assert str(statement) == str(job_outcome_statement(TABLES))
    return flow


def test_a_listening_wait_reads_after_each_wake_and_polls_every_five_seconds() -> None:
    clock = FakeClock()
    flow = start_flow(None, listening=True, clock=clock)
    assert flow.send([job("queued", "pending")]) == Wait(LISTEN_POLL)
    flow.send(True)  # a notification: read again
    assert flow.send([job("queued", "running")]) == Wait(LISTEN_POLL)
    flow.send(False)
    with pytest.raises(StopIteration) as done:
        flow.send([job("succeeded", result={"ok": 1})])
    assert done.value.value == {"ok": 1}


def test_without_listen_the_polls_back_off_to_a_second() -> None:
    clock = FakeClock()
    flow = start_flow(None, listening=False, clock=clock)
    waits = []
    for _ in range(8):
        step = flow.send([job("queued", "pending")])
        waits.append(step.seconds)
        flow.send(False)
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, POLL_MAX, POLL_MAX, POLL_MAX]


def test_the_last_wait_is_cut_to_the_timeout_then_it_times_out() -> None:
    clock = FakeClock()
    flow = start_flow(7.0, listening=True, clock=clock)
    assert flow.send([job("queued", "pending")]) == Wait(5.0)
    clock.now += 5.0
    flow.send(False)
    assert flow.send([job("queued", "running")]) == Wait(2.0)
    clock.now += 2.0
    flow.send(False)
    with pytest.raises(ResultTimeoutError, match="within 7 s; it is still running") as caught:
        flow.send([job("queued", "running")])
    assert caught.value.job_id == 1


def test_a_zero_timeout_reads_once() -> None:
    flow = start_flow(0.0, listening=True, clock=FakeClock())
    with pytest.raises(ResultTimeoutError, match="still queued"):
        flow.send([job("queued", "pending")])
    flow = start_flow(0.0, listening=True, clock=FakeClock())
    with pytest.raises(StopIteration):
        flow.send([job("succeeded", result=3)])


def test_each_ending_of_a_job() -> None:
    errors = [
        {"type": "builtins.KeyError", "message": "first"},
        {"type": "builtins.ValueError", "message": "last", "traceback": "tb"},
    ]
    flow = start_flow(1.0, listening=False, clock=FakeClock())
    with pytest.raises(JobFailedError, match=r"builtins\.ValueError: last") as failed:
        flow.send([job("failed", errors=errors)])
    assert (failed.value.error, failed.value.errors) == (errors[-1], errors)
    flow = start_flow(1.0, listening=False, clock=FakeClock())
    with pytest.raises(JobFailedError, match="no error recorded"):
        flow.send([job("failed", errors=None)])
    flow = start_flow(1.0, listening=False, clock=FakeClock())
    with pytest.raises(JobCancelledError):
        flow.send([job("cancelled")])
    flow = start_flow(1.0, listening=False, clock=FakeClock())
    with pytest.raises(JobNotFoundError):
        flow.send([])
    flow = start_flow(1.0, listening=False, clock=FakeClock())
    with pytest.raises(StopIteration) as done:
        flow.send([job("succeeded", result=None)])
    assert done.value.value is None


# -- cancel requests in the worker --------------------------------------------------------

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def _plan(handler: Any, *, is_async: bool = False, transactional: bool = False) -> WorkerPlan:
    task = TaskRuntime(
        name="a",
        handler=handler,
        is_async=is_async,
        pass_context=True,
        max_attempts=3,
        retry=RetryPolicy(min_delay=1, max_delay=1, jitter=0),
        lease=20.0,
        max_reclaims=2,
        transactional=transactional,
    )
    return WorkerPlan(tables=TABLES, notify=True, default_lease=20.0, tasks={"a": task})


def _core(plan: WorkerPlan) -> Decider:
    return Decider(plan, WorkerSettings(), clock=lambda: T0, rng=random.Random(7))


def _row(job_id: int) -> Any:
    return SimpleNamespace(
        next_due=None,
        id=job_id,
        attempt=1,
        reclaims=0,
        queue_id=None,
        task="a",
        payload={"args": [], "kwargs": {}},
        max_attempts=3,
    )


def _context_factory(core: Decider, session_factory: Any = lambda: None) -> Any:
    def make(claimed: Any) -> JobContext[Any]:
        return JobContext(
            job_id=claimed.id,
            task=claimed.task,
            attempt=claimed.attempt,
            max_attempts=claimed.max_attempts,
            queue_id=claimed.queue_id,
            worker_id=core.worker_id,
            session_factory=session_factory,
            stop_flag=core.stop_flag,
        )

    return make


def _claim(core: Decider, ids: list[int], session_factory: Any = lambda: None) -> list[RunningJob]:
    core.next_action(0.0)
    return core.accept_claim(
        [_row(i) for i in ids], 10, 0.0, _context_factory(core, session_factory)
    )


def _runner(core: Decider, **kw: Any) -> HandlerRunner:
    return HandlerRunner(worker_id=core.worker_id, clock=core.clock, record=core.record, **kw)


def test_heartbeat_rows_deliver_cancels_once_and_only_to_running_jobs() -> None:
    core = _core(_plan(lambda ctx: None))
    first, second, released = _claim(core, [1, 2, 3])
    released.released = True
    seen: list[int] = []
    for running in (first, second, released):
        running.context.notify_cancel = (  # type: ignore[method-assign, union-attr]
            lambda job=running.job.id: seen.append(job)
        )
    # (id, cancel_requested) per execution still held; 9 is not ours (any more).
    core.heartbeat_done([1, 2, 3], [(1, True), (2, False), (3, True), (9, True)])
    assert seen == [1]
    assert (first.cancel_requested, second.cancel_requested) == (True, False)
    core.deliver_cancels([1, 2])
    assert seen == [1, 2]
    core.deliver_cancels([1, 2])  # once each
    assert seen == [1, 2]
    assert not released.cancel_requested


def test_a_heartbeat_that_misses_a_job_marks_it_lost_not_cancelled() -> None:
    core = _core(_plan(lambda ctx: None))
    (running,) = _claim(core, [1])
    core.heartbeat_done([1], [])
    assert running.context is not None and running.context.lost
    assert not running.context.cancel_requested


@pytest.mark.parametrize(
    ("behaviour", "kind", "has_error"),
    [
        ("return", OutcomeKind.CANCELLED, False),
        ("raise", OutcomeKind.CANCELLED, True),
    ],
)
def test_a_sync_handler_told_of_a_cancel_ends_cancelled_whatever_it_does(
    behaviour: str, kind: OutcomeKind, has_error: bool
) -> None:
    def handler(ctx: JobContext[Any]) -> str:
        core.deliver_cancels([ctx.job_id])  # the request arrives while it runs
        assert ctx.cancel_requested
        if behaviour == "raise":
            raise RuntimeError("stopping")
        return "partial"

    core = _core(_plan(handler))
    (running,) = _claim(core, [1])
    _runner(core).run_sync(running)
    (outcome,), _ = core.take_outcomes()
    assert outcome.kind is kind
    assert outcome.result is None
    assert (outcome.error is not None) is has_error
    core.completed([outcome], [1])
    assert core.stats["cancelled"] == 1
    assert core.stats["retried"] == 0


def test_a_sync_handler_never_told_keeps_its_outcome() -> None:
    core = _core(_plan(lambda ctx: "done"))
    (running,) = _claim(core, [1])
    _runner(core).run_sync(running)
    (outcome,), _ = core.take_outcomes()
    assert (outcome.kind, outcome.result) == (OutcomeKind.SUCCEEDED, "done")


async def test_an_async_handlers_task_is_cancelled_from_another_thread() -> None:
    entered = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def handler(ctx: JobContext[Any]) -> str:
        loop.call_soon_threadsafe(entered.set)
        await asyncio.sleep(30)
        return "never"

    core = _core(_plan(handler, is_async=True))
    (running,) = _claim(core, [1])
    task = asyncio.ensure_future(_runner(core).run_async(running))
    await entered.wait()
    thread = threading.Thread(target=core.deliver_cancels, args=([1],))
    thread.start()
    thread.join()
    await asyncio.wait_for(task, 5)
    (outcome,), _ = core.take_outcomes()
    assert outcome.kind is OutcomeKind.CANCELLED
    assert outcome.error is not None and outcome.error["type"].endswith("CancelledError")


async def test_an_async_handler_can_await_the_cancel_event_instead() -> None:
    async def handler(ctx: JobContext[Any]) -> str:
        try:
            await asyncio.shield(ctx.cancel_event.wait())
        except asyncio.CancelledError:
            await ctx.cancel_event.wait()
        return "cleaned up"

    core = _core(_plan(handler, is_async=True))
    (running,) = _claim(core, [1])
    task = asyncio.ensure_future(_runner(core).run_async(running))
    await asyncio.sleep(0)
    core.deliver_cancels([1])
    await asyncio.wait_for(task, 5)
    (outcome,), _ = core.take_outcomes()
    assert outcome.kind is OutcomeKind.CANCELLED
    assert outcome.error is None


async def test_a_cancel_before_an_async_handler_starts_stops_it_at_once() -> None:
    calls: list[int] = []

    async def handler(ctx: JobContext[Any]) -> None:
        calls.append(1)

    core = _core(_plan(handler, is_async=True))
    (running,) = _claim(core, [1])
    core.deliver_cancels([1])
    await _runner(core).run_async(running)
    (outcome,), _ = core.take_outcomes()
    assert (outcome.kind, calls) == (OutcomeKind.CANCELLED, [])


async def test_a_cancelled_error_of_the_handlers_own_is_a_failed_attempt() -> None:
    async def handler(ctx: JobContext[Any]) -> None:
        raise asyncio.CancelledError

    core = _core(_plan(handler, is_async=True))
    (running,) = _claim(core, [1])
    await _runner(core).run_async(running)
    (outcome,), _ = core.take_outcomes()
    assert outcome.kind is OutcomeKind.RETRY


class FakeAsyncSession(AsyncSession):
    """An AsyncSession stand-in whose awaits are where a cancel request can land."""

    def __init__(self, on_await: Any = None, rows: list[Any] | None = None) -> None:  # no engine
        self.on_await = on_await
        self.rows = rows or []
        self.calls: list[str] = []

    async def _suspend(self, name: str) -> None:
        self.calls.append(name)
        if self.on_await is not None and name in self.on_await[0]:
            self.on_await[1]()
        for _ in range(3):
            await asyncio.sleep(0)

    async def execute(self, statement: Any, params: Any = None) -> Any:
        await self._suspend("execute")
        return SimpleNamespace(all=lambda: self.rows)

    async def commit(self) -> None:
        await self._suspend("commit")

    async def rollback(self) -> None:
        await self._suspend("rollback")

    async def close(self) -> None:
        await self._suspend("close")


def cancel(holder: list[RunningJob]) -> None:
    """Deliver the cancel request of the job in ``holder`` (filled once it is claimed)."""
    holder[0].request_cancel()


async def test_a_cancel_landing_while_the_handlers_session_closes_loses_nothing() -> None:
    """The handler returned; its job's cancel request arrives while the runner closes the
    handler's session. The outcome must still be recorded (a request after the handler
    returned changes nothing), else the job stays held by this worker for good."""
    sessions: list[FakeAsyncSession] = []
    holder: list[RunningJob] = []

    def session_factory() -> FakeAsyncSession:
        session = FakeAsyncSession(on_await=({"close"}, lambda: cancel(holder)))
        sessions.append(session)
        return session

    async def handler(ctx: JobContext[Any]) -> str:
        ctx.session  # noqa: B018 (opens it)
        return "done"

    core = _core(_plan(handler, is_async=True))
    (running,) = _claim(core, [1], session_factory)
    holder.append(running)
    await asyncio.wait_for(_runner(core).run_async(running), 5)
    assert sessions[0].calls == ["close"]
    outcomes, _ = core.take_outcomes()
    assert [(o.job_id, o.kind) for o in outcomes] == [(1, OutcomeKind.SUCCEEDED)]
    assert core.held() == ([], [])


async def test_a_cancel_landing_while_a_transactional_completion_runs_loses_nothing() -> None:
    holder: list[RunningJob] = []
    settled: list[tuple[int, OutcomeKind, bool]] = []
    session = FakeAsyncSession(on_await=({"execute"}, lambda: cancel(holder)), rows=[(1,)])

    async def handler(ctx: JobContext[Any]) -> str:
        ctx.session  # noqa: B018 (opens it)
        return "done"

    core = _core(_plan(handler, is_async=True, transactional=True))
    (running,) = _claim(core, [1], lambda: session)
    holder.append(running)
    runner = _runner(
        core,
        transaction=InTransaction("GUARD", "COMPLETE", core.worker_id),
        settle=lambda r, o, applied: settled.append((r.job.id, o.kind, applied)),
    )
    await asyncio.wait_for(runner.run_async(running), 5)
    assert "commit" in session.calls
    assert settled == [(1, OutcomeKind.SUCCEEDED, True)]


def test_in_transaction_commits_only_what_a_handler_returned() -> None:
    step = InTransaction("GUARD", "COMPLETE", uuid.UUID(int=1))
    outcome = Outcome(1, 1, OutcomeKind.SUCCEEDED, result=2)
    (guard, _), (complete, params) = step.steps(outcome)
    assert (guard, complete) == ("GUARD", "COMPLETE")
    assert json.loads(params["outcomes"])[0]["result"] == 2
    assert InTransaction.applied([(1,)], 1) and not InTransaction.applied([], 1)
    assert set(InTransaction.KINDS) == {OutcomeKind.SUCCEEDED, OutcomeKind.RESCHEDULE}


def test_run_stats_count_cancelled() -> None:
    core = _core(_plan(lambda ctx: None))
    core.completed([Outcome(1, 1, OutcomeKind.CANCELLED)], [1])
    assert core.stats["cancelled"] == 1
