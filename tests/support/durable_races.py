"""Durable tasks and staged attempts for the race tests of issue 30
(tests/integration/test_durable_races.py).

A race test holds one transaction open at a precise point while another runs into it.
Two ways to get there:

- a real worker runs a task of this module that pauses at a :class:`Hold` the test opens
  (inside a step, or in the step's commit, after its checkpoint statement ran);
- a :class:`StagedAttempt` plays the attempt of a worker that claimed the job (or lost it),
  sending the same flows as ``ctx.step`` and ``ctx.wait_*`` (``sqla_queue.durable.run``) on
  a connection the test holds open, one transaction at a time.

Every step writes one ``StepWrite`` row, whose primary key catches a step whose writes
would commit twice.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from sqlalchemy import Connection, event, insert, text
from sqlalchemy.orm import Session

from sqla_queue import JobContext
from sqla_queue.conversation import Flow, Step, drive
from sqla_queue.durable.conditions import RowCondition
from sqla_queue.durable.run import DurableRun, Satisfied, Suspension, TimedOut
from sqla_queue.durable.statements import DurableStatements
from sqla_queue.errors import StepNotCommittedError
from tests.support.app import StepWrite
from tests.support.durable_app import dj_refund, queue

__all__ = [
    "HOLD_TIMEOUT",
    "Hold",
    "StagedAttempt",
    "backend_pid",
    "dr_cancel_race",
    "dr_relay",
    "dr_wait_held",
    "hold",
    "pid_of",
    "queue",
    "reset_holds",
]

#: How long a held handler waits at most for its test (which then fails): never a hang.
HOLD_TIMEOUT = 15.0


class Hold:
    """Where a paused handler and its test meet: ``entered`` by the handler (with the
    server pid of the connection it holds open), ``opened`` by the test."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        #: The backend pid of the handler's open transaction, when it has one.
        self.pid: int | None = None
        #: ``(step, reason)`` of each StepNotCommittedError the handler saw.
        self.refused: list[tuple[str, str]] = []

    def pause(self, pid: int | None = None) -> None:
        """Say where the handler is and wait for the test to open the hold."""
        self.pid = pid
        self.entered.set()
        if not self.opened.wait(HOLD_TIMEOUT):
            raise RuntimeError("the test never opened the hold")

    def reached(self) -> None:
        """Wait (in the test) until the handler is at the hold; fail after the bound."""
        assert self.entered.wait(HOLD_TIMEOUT), "the handler never reached its hold"

    def open(self) -> None:
        """Let the handler go on."""
        self.opened.set()


_HOLDS: dict[str, Hold] = {}
_HOLDS_LOCK = threading.Lock()


def hold(name: str) -> Hold:
    """The hold called ``name`` (made on first use, shared by the test and the handler)."""
    with _HOLDS_LOCK:
        return _HOLDS.setdefault(name, Hold())


def reset_holds() -> None:
    """Open every hold (so no handler stays parked) and forget them all."""
    with _HOLDS_LOCK:
        holds = list(_HOLDS.values())
        _HOLDS.clear()
    for each in holds:
        each.open()


def backend_pid(session: Session) -> int:
    """The server pid of ``session``'s connection (in its open transaction)."""
    return int(session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def _write(session: Session, job_id: int, step: str, value: Any = None) -> None:
    session.add(StepWrite(job_id=job_id, step=step, value=None if value is None else str(value)))


@queue.task(name="dr_wait_held", pass_context=True, max_attempts=1)
def dr_wait_held(ctx: JobContext[Session], hold_name: str) -> Any:
    """Pause at ``hold_name``, then wait for signal ``approved``; its payload."""
    hold(hold_name).pause()
    return ctx.wait_for_signal("approved")


@queue.task(name="dr_cancel_race", pass_context=True, max_attempts=1)
def dr_cancel_race(ctx: JobContext[Session], hold_name: str, at: str) -> str:
    """Two compensated steps; the first one pauses at ``hold_name``.

    ``at="commit"``: in its commit, after its checkpoint statement ran (it holds the
    execution ``FOR SHARE``). ``at="writes"``: after its writes, before its checkpoint.
    Between the steps the handler pauses at ``<hold_name>:between``, so that the test
    decides when the second step's checkpoint runs.
    """
    here = hold(hold_name)
    try:
        with ctx.step("first", compensate=dj_refund) as step:
            if not step.done:
                _write(ctx.session, ctx.job_id, "first")
                step.result = "first"
                ctx.session.flush()
                pid = backend_pid(ctx.session)
                if at == "commit":
                    event.listen(ctx.session, "before_commit", lambda _: here.pause(pid), once=True)
                else:
                    here.pause(pid)
        hold(f"{hold_name}:between").pause()
        with ctx.step("second", compensate=dj_refund) as step:
            if not step.done:
                _write(ctx.session, ctx.job_id, "second")
                step.result = "second"
    except StepNotCommittedError as exc:
        here.refused.append((exc.step, exc.reason))
        raise
    return "finished"


@queue.task(name="dr_relay", pass_context=True, max_attempts=3)
def dr_relay(ctx: JobContext[Session]) -> Any:
    """Step ``before``, a wait for signal ``go``, step ``after``; the signal's payload."""
    ctx.run_step("before", lambda: _write(ctx.session, ctx.job_id, "before"))
    payload = ctx.wait_for_signal("go")
    ctx.run_step("after", lambda: _write(ctx.session, ctx.job_id, "after"))
    return payload


class StagedAttempt:
    """The attempt of a worker ``worker_id`` that holds job ``job_id`` (staged with
    ``pretend_claimed``): the flows its handler would send, run on a connection the test
    holds, in the transaction the test began (nothing here commits)."""

    def __init__(self, job_id: int, *, worker_id: uuid.UUID, attempt: int = 1) -> None:
        self.job_id = job_id
        self.run = DurableRun(
            DurableStatements.of(queue.tables), job_id=job_id, attempt=attempt, worker_id=worker_id
        )

    def step(self, connection: Connection, name: str) -> None:
        """Step ``name`` as ``ctx.run_step`` commits it: its write, then its checkpoint."""
        connection.execute(insert(StepWrite).values(job_id=self.job_id, step=name, value=None))

        def flow() -> Flow[None]:
            yield from self.run.load()
            yield from self.run.checkpoint(name, None, version=1, compensate=None)

        drive(connection, flow())

    def wait_for_signal(
        self, connection: Connection, name: str
    ) -> Satisfied | TimedOut | Suspension:
        """The statements of ``ctx.wait_for_signal(name)``, without the commit."""
        statements = self.run.statements
        probe = Step(statements.signal_payload, {"job": self.job_id, "signal": name})

        def found(rows: Any) -> Satisfied | None:
            return Satisfied(rows[0].payload) if rows else None

        def flow() -> Flow[Satisfied | TimedOut | Suspension]:
            yield from self.run.load()
            return (
                yield from self.run.wait(
                    f"signal:{name}", f"signal:{name}", timeout=None, probe=probe, found=found
                )
            )

        return drive(connection, flow())

    def wait_until(
        self, connection: Connection, condition: RowCondition, key: Any
    ) -> Satisfied | TimedOut | Suspension:
        """The statements of the first ``ctx.wait_until(condition, key)`` of a handler,
        without the commit."""

        def flow() -> Flow[Satisfied | TimedOut | Suspension]:
            yield from self.run.load()
            name = self.run.auto_name("until")
            return (yield from condition.wait_flow(self.run, name, key, timeout=None))

        return drive(connection, flow())


def pid_of(connection: Connection) -> int:
    """The server pid of ``connection``."""
    return int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())
