"""The durable part of a job's context: steps, cursors, waits.

:class:`DurableContext` is mixed into :class:`~sqla_queue.worker.context.JobContext`. Each
method builds its decision as a flow (:mod:`sqla_queue.durable.run`) and runs it through
one of two faces: blocking in a ``def`` handler, awaited in an ``async def`` one (which
must ``await`` the call). Steps and cursors commit ``ctx.session``, with the handler's
writes; a wait runs in ``ctx.session`` too when it holds no transaction, else in a short
session of its own, so that a wait leaves the handler's open transaction as it was.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from sqla_queue.conversation import Flow, Step
from sqla_queue.durable.api import Batch, Cursor, Face, StepBlock
from sqla_queue.durable.checks import check_durable_name, check_seconds, check_step_version
from sqla_queue.durable.compensate import compensation_spec, encode_compensation
from sqla_queue.durable.conditions import RowCondition
from sqla_queue.durable.faces import commit_flow, commit_flow_async, read_flow, read_flow_async
from sqla_queue.durable.run import DurableRun, Satisfied, StoredStep, TimedOut
from sqla_queue.durable.statements import DurableStatements
from sqla_queue.enqueue import TaskDefaults
from sqla_queue.errors import SignalTimeoutError
from sqla_queue.models.tables import QueueTables

__all__ = ["Batch", "DurableContext", "DurableSupport"]

log = logging.getLogger("sqla_queue.worker")


@dataclass(frozen=True)
class DurableSupport:
    """What a context needs of its queue for durable work: the tables, and the tasks'
    defaults (to check and encode a compensation)."""

    tables: QueueTables
    defaults: Callable[[str], TaskDefaults]


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _seconds(value: float | dt.timedelta | None, what: str) -> float | None:
    return check_seconds(value, what)


def _check_name(name: object, what: str) -> str:
    return check_durable_name(name, what)


class DurableContext:
    """Durable execution for a handler: :meth:`step`, :meth:`run_step`, :meth:`cursor`,
    :meth:`sleep`, :meth:`wait_for_signal` and :meth:`wait_until`.

    In an ``async def`` handler, ``await`` each call (and use ``async with`` and ``async
    for``). Every name is the job's own: a step that committed under a name is skipped,
    with its stored result, in every later run of the job.
    """

    job_id: int
    attempt: int
    worker_id: Any
    _session_factory: Callable[[], Any]
    _session: Any
    _durable_support: DurableSupport | None
    _durable_run: DurableRun | None

    @property
    def session(self) -> Any:
        """The handler's session (:class:`~sqla_queue.worker.context.JobContext`'s)."""
        raise NotImplementedError  # pragma: no cover - JobContext defines it

    def _run(self) -> DurableRun:
        if self._durable_run is None:
            if self._durable_support is None:
                raise RuntimeError("durable steps need a worker's context")
            self._durable_run = DurableRun(
                DurableStatements.of(self._durable_support.tables),
                job_id=self.job_id,
                attempt=self.attempt,
                worker_id=self.worker_id,
            )
        return self._durable_run

    def _face(self, awaited: bool) -> Face:
        return _AsyncFace(self) if awaited else _SyncFace(self)

    def _compensation(self, call: Any, result: Any) -> str | None:
        spec = compensation_spec(call, result)
        if spec is None:
            return None
        assert self._durable_support is not None
        return encode_compensation(spec, self.job_id, self._durable_support.defaults)

    # -- steps ---------------------------------------------------------------------------

    def step(self, name: str, *, version: int = 1, compensate: Any = None) -> StepBlock:
        """A block that runs once per job, ever: ``with ctx.step("reserve") as step:``.

        Skip the work when ``step.done`` (a replay; ``step.result`` is the stored value),
        else do it through ``ctx.session`` and set ``step.result`` (JSON-able): both commit
        together when the block ends. ``compensate`` (a task, called with the result, or
        a ``task.call(...)``) undoes the step if the job finally fails or is cancelled.
        ``version``: see the durable jobs guide.
        """
        _check_name(name, "step")
        _check_version(version)
        return StepBlock(
            self._run(),
            self._face,
            name,
            version=version,
            compensate=compensate,
            compensation=self._compensation,
        )

    def run_step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        version: int = 1,
        compensate: Any = None,
        **kwargs: Any,
    ) -> Any:
        """``fn(*args, **kwargs)`` as step ``name``: its return value (JSON-able) commits
        with the writes made through ``ctx.session``; a replay returns the stored value
        without calling ``fn``. In an ``async def`` handler, await it (``fn`` may be
        ``async def`` there)."""
        block = self.step(name, version=version, compensate=compensate)
        if _in_event_loop():
            return self._run_step_async(block, fn, args, kwargs)
        with block:
            if not block.done:
                block.result = fn(*args, **kwargs)
        return block.result

    async def _run_step_async(
        self, block: StepBlock, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> Any:
        async with block:
            if not block.done:
                value = fn(*args, **kwargs)
                block.result = await value if asyncio.iscoroutine(value) else value
        return block.result

    def cursor(self, name: str, *, start: Any = None, version: int = 1) -> Cursor:
        """A loop that resumes where it stopped: ``for batch in ctx.cursor("import", start=0)``.

        Each ``batch.position`` is where the batch starts; ``batch.advance(next)`` moves
        the cursor with the batch's writes (through ``ctx.session``), committed before the
        next batch. A batch that does not advance ends the loop for good.
        """
        _check_name(name, "cursor")
        _check_version(version)
        return Cursor(self._run(), self._face, name, start, version)

    @property
    def steps(self) -> list[StoredStep]:
        """The checkpoints this job has committed so far (read with the first step)."""
        return self._run().committed

    # -- waits ---------------------------------------------------------------------------

    def sleep(self, duration: float | dt.timedelta, *, name: str | None = None) -> Any:
        """Suspend the job for ``duration``, holding no worker and no seat meanwhile.

        The end is recorded when the sleep first begins: a replay sleeps only what is
        left. Unnamed sleeps are named by their order in the handler (``sleep#1``...).
        """
        seconds = _seconds(duration, "the sleep's duration")
        run = self._run()
        step = _check_name(name, "sleep") if name is not None else run.auto_name("sleep")
        if not seconds:
            return _done_now(None) if _in_event_loop() else None
        return self._wait(lambda: run.wait(step, "sleep", timeout=seconds), lambda _: None)

    def wait_for_signal(self, name: str, *, timeout: float | dt.timedelta | None = None) -> Any:
        """The payload of signal ``name`` (``queue.signal(session, job_id, name, ...)``).

        If it was sent already (even before this wait began) it is returned at once;
        otherwise the job is suspended until it comes, holding no worker and no seat.
        Raises :class:`~sqla_queue.errors.SignalTimeoutError` once ``timeout`` has passed
        since the wait first began.
        """
        _check_name(name, "signal")
        seconds = _seconds(timeout, "the timeout")
        run = self._run()
        statements = run.statements
        probe = Step(statements.signal_payload, {"job": self.job_id, "signal": name})

        def found(rows: Any) -> Satisfied | None:
            return Satisfied(rows[0].payload) if rows else None

        waits_for = f"signal:{name}"
        return self._wait(
            lambda: run.wait(
                f"signal:{name}", waits_for, timeout=seconds, probe=probe, found=found
            ),
            self._timed_out(waits_for),
        )

    def wait_until(
        self,
        condition: RowCondition,
        key: Any,
        *,
        timeout: float | dt.timedelta | None = None,
        name: str | None = None,
    ) -> Any:
        """Wait until ``condition`` (``queue.condition(...)``) holds on row ``key``.

        Returns at once if it holds; otherwise the job is suspended until a flush makes it
        true (or :meth:`RowCondition.wake` says so), holding no worker and no seat. Raises
        :class:`~sqla_queue.errors.SignalTimeoutError` after ``timeout``.
        """
        if not isinstance(condition, RowCondition):
            raise TypeError(f"wait_until takes a queue.condition(...), got {condition!r}")
        seconds = _seconds(timeout, "the timeout")
        run = self._run()
        waits_for = condition.waits_for(key)
        step = _check_name(name, "wait") if name is not None else run.auto_name("until")
        return self._wait(
            lambda: condition.wait_flow(run, step, key, timeout=seconds),
            self._timed_out(waits_for),
        )

    def _timed_out(self, waits_for: str) -> Callable[[Any], Any]:
        def raise_it(_: Any) -> Any:
            raise SignalTimeoutError(
                f"job {self.job_id}: the wait for {waits_for} reached its deadline",
                job_id=self.job_id,
                wait=waits_for,
            )

        return raise_it

    def _wait(self, make: Callable[[], Flow[Any]], on_timeout: Callable[[Any], Any]) -> Any:
        run = self._run()

        def flow() -> Flow[Any]:
            yield from run.load()
            return (yield from make())

        def outcome(value: Any) -> Any:
            if isinstance(value, TimedOut):
                return on_timeout(value)
            return value.value if isinstance(value, Satisfied) else value

        if _in_event_loop():
            return self._wait_async(flow, outcome)
        session, own = self._wait_session()
        try:
            return outcome(commit_flow(session, flow()))
        finally:
            if own:
                session.close()

    def _wait_session(self) -> tuple[Any, bool]:
        """The session a wait runs in, and whether it is one of its own (to close).

        The handler's own session when it holds no transaction (nothing of the handler's
        can be committed or rolled back with the wait): the usual case, after a step
        committed, and one connection less per waiting handler. Otherwise a short one.
        """
        current = self._session
        if current is None or not current.in_transaction():
            return self.session, False
        return self._session_factory(), True

    async def _wait_async(
        self, flow: Callable[[], Flow[Any]], outcome: Callable[[Any], Any]
    ) -> Any:
        session, own = self._wait_session()
        if isinstance(session, AsyncSession):
            try:
                return outcome(await commit_flow_async(session, flow()))
            finally:
                if own:
                    await session.close()
        try:
            return outcome(commit_flow(session, flow()))
        finally:
            if own:
                session.close()

    def _suspend_for_version(self, stored: StoredStep, version: int) -> Flow[Any]:
        log.warning(
            "job %s: %s %r was committed by version %s of the code, this is version %s; "
            "the job waits for an operator (sqla-queue durable migrate)",
            self.job_id,
            stored.kind,
            stored.name,
            stored.version,
            version,
        )
        return self._run().suspend_for(f"version:{stored.name}")


async def _done_now(value: Any) -> Any:
    return value


def _check_version(version: object) -> None:
    check_step_version(version)


class _SyncFace:
    """Runs a durable flow blocking, in the context's ``Session``."""

    def __init__(self, context: DurableContext) -> None:
        self._context = context

    def _session(self) -> Any:
        session = self._context.session
        if isinstance(session, AsyncSession):
            raise TypeError(
                "this worker's sessions are AsyncSessions: use `async with ctx.step(...)` "
                "and `async for batch in ctx.cursor(...)` in an async def handler"
            )
        return session

    def read(self, flow: Flow[Any]) -> Any:
        return read_flow(self._session(), flow)

    def commit(self, flow: Flow[Any]) -> Any:
        return commit_flow(self._session(), flow)

    def rollback(self) -> Any:
        self._session().rollback()

    def mismatch(self, stored: StoredStep, version: int) -> Any:
        session = self._context._session_factory()
        try:
            return commit_flow(session, self._context._suspend_for_version(stored, version))
        finally:
            session.close()


class _AsyncFace:
    """Runs a durable flow awaited, in the context's ``AsyncSession`` (or blocking in a
    ``Session``: an ``async def`` handler of a sync worker)."""

    def __init__(self, context: DurableContext) -> None:
        self._context = context

    async def read(self, flow: Flow[Any]) -> Any:
        session = self._context.session
        if isinstance(session, AsyncSession):
            return await read_flow_async(session, flow)
        return read_flow(session, flow)

    async def commit(self, flow: Flow[Any]) -> Any:
        session = self._context.session
        if isinstance(session, AsyncSession):
            return await commit_flow_async(session, flow)
        return commit_flow(session, flow)

    async def rollback(self) -> Any:
        session = self._context.session
        if isinstance(session, AsyncSession):
            await session.rollback()
        else:
            session.rollback()

    async def mismatch(self, stored: StoredStep, version: int) -> Any:
        flow = self._context._suspend_for_version(stored, version)
        return await self._context._wait_async(lambda: flow, lambda value: value)
