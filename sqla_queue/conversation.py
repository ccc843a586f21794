"""A conversation with the database, written once without I/O, and its two drivers.

A :data:`Flow` is a generator that says what to run and reads what came back; it never
touches a connection, a clock's sleep or an event loop. It yields one step at a time:

* a statement, as a :class:`Step` (or any ``(statement, params)`` pair), and is sent
  the statement's rows (``()`` for a statement without rows, such as ``SET LOCAL``);
* a :class:`Wait`, and is sent ``()`` once the wait is over;
* a :class:`DriverStep`, which talks to the driver itself (a ``COPY``), and is sent what
  it returns.

It ends by returning its value, or by raising. If a statement fails, its error is thrown
into the flow at the ``yield`` that asked for it: a flow that expects an error (a row
moved to another partition meanwhile) catches it there and goes on; any other flow lets
it through to its caller, unchanged.

Two drivers run every flow: :func:`drive` on a ``Connection``, blocking, and
:func:`drive_async` on an ``AsyncConnection``, awaiting, so the event loop keeps serving
other tasks meanwhile. Both run the steps in order, in whatever transaction the
connection is in; neither begins or commits anything. How a wait is spent is the
caller's choice (``wait=``): a plain sleep by default, or a listen for a notification
that may end it early (``queue.result``, :mod:`sqla_queue.lifecycle`). :func:`run_flow`
hands a flow to one of them for the library's calls on a caller's bind (see
:mod:`sqla_queue._binds`): it joins the caller's transaction, and on an AUTOCOMMIT
connection runs the flow in one of its own. :func:`before_first` composes flows (a
bounded enqueue's count runs just before the first write of the flow it wraps).

The worker's run loop (:mod:`sqla_queue.worker.actions`) speaks the same vocabulary at a
coarser grain: its decision to idle is a :class:`Wait`, and the statements of each unit
of work are :class:`Step` values. Its faces drive them themselves, because a unit is a
batch of statements sent in one round trip, not a conversation that reads as it goes.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

from sqla_queue._binds import AnyBind, one_async_transaction, one_transaction

__all__ = [
    "DriverStep",
    "Flow",
    "Step",
    "Wait",
    "before_first",
    "drive",
    "drive_async",
    "run_flow",
]

T = TypeVar("T")


class Step(NamedTuple):
    """One statement and its parameters (the typed record of its builder's module).

    A tuple, so it unpacks as ``statement, params`` like any pair, and a flow may yield a
    plain pair instead.
    """

    statement: Executable
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Wait:
    """Pause up to ``seconds`` before the next step; less if the driver is woken sooner.

    What may wake it is the driver's affair: a notification for the job awaited, the
    worker's wake-up event, or nothing at all (then it sleeps the whole time). The
    conversation is sent ``()`` after it, woken or not, and reads again what it needs.
    A caller's transaction stays open across the pause, with every lock it holds.
    """

    seconds: float


class DriverStep(ABC):
    """A step that needs the driver's own API (a ``COPY ... FROM STDIN``, say).

    It holds its I/O in two thin methods, one per face; the flow that yields it stays
    free of I/O. An error it raises is thrown into the flow like a statement's.
    """

    @abstractmethod
    def run(self, connection: Connection) -> Sequence[Any]:
        """Do the step on ``connection``; what the flow is sent back."""

    @abstractmethod
    async def run_async(self, connection: AsyncConnection) -> Sequence[Any]:
        """:meth:`run` on an ``AsyncConnection``."""


#: A conversation written once for both I/O styles: it yields statements (a :class:`Step`
#: or any ``(statement, params)`` pair; it is sent their rows), :class:`Wait` steps (it
#: is sent ``()``) and :class:`DriverStep` values, until it returns its value.
#: :func:`drive` and :func:`drive_async` run it.
Flow = Generator[tuple[Executable, Mapping[str, Any]] | Wait | DriverStep, Sequence[Any], T]

#: What a flow is sent next: nothing (it has not started), a statement's rows, or the
#: statement's error, to be thrown into it.
_Reply = Sequence[Any] | Exception | None


@dataclass(frozen=True)
class _Returned(Generic[T]):
    """The flow has ended with ``value``."""

    value: T


def _resume(
    flow: Flow[T], reply: _Reply
) -> tuple[Executable, Mapping[str, Any]] | Wait | DriverStep | _Returned[T]:
    """``flow``'s next step after ``reply``, or its value once it returns."""
    try:
        if reply is None:
            return next(flow)
        if isinstance(reply, Exception):
            return flow.throw(reply)
        return flow.send(reply)
    except StopIteration as done:
        value: T = done.value
        return _Returned(value)


def drive(
    connection: Connection, flow: Flow[T], *, wait: Callable[[float], object] = time.sleep
) -> T:
    """Run ``flow`` on ``connection``, blocking; its value.

    Each :class:`Wait` is spent in ``wait(seconds)`` (a sleep by default). Nothing is
    begun or committed here: the statements run in the connection's transaction, or each
    on its own in AUTOCOMMIT.
    """
    reply: _Reply = None
    while not isinstance(step := _resume(flow, reply), _Returned):
        if isinstance(step, Wait):
            wait(step.seconds)
            reply = ()
            continue
        try:
            if isinstance(step, DriverStep):
                reply = step.run(connection)
                continue
            statement, params = step
            result = connection.execute(statement, dict(params))
            # A statement without rows (DDL, SET LOCAL) is sent back no rows.
            reply = result.all() if result.returns_rows else ()
        except Exception as exc:
            reply = exc
    return step.value


async def drive_async(
    connection: AsyncConnection,
    flow: Flow[T],
    *,
    wait: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """:func:`drive` for an ``AsyncConnection``: each statement and each wait is awaited."""
    reply: _Reply = None
    while not isinstance(step := _resume(flow, reply), _Returned):
        if isinstance(step, Wait):
            await wait(step.seconds)
            reply = ()
            continue
        try:
            if isinstance(step, DriverStep):
                reply = await step.run_async(connection)
                continue
            statement, params = step
            result = await connection.execute(statement, dict(params))
            reply = result.all() if result.returns_rows else ()
        except Exception as exc:
            reply = exc
    return step.value


def run_flow(bind: AnyBind, flow: Flow[T]) -> T | Coroutine[Any, Any, T]:
    """Run ``flow``'s statements on ``bind``, in its transaction; its value (or a coroutine).

    ``bind`` is what the caller holds: a ``Session`` or ``Connection``, or their async
    twins. On an AUTOCOMMIT connection the statements share a transaction of their own
    (see :func:`~sqla_queue._binds.one_transaction`): a flow is written whole or not at all.
    """
    if isinstance(bind, AsyncSession | AsyncConnection):
        return _run_flow_async(bind, flow)
    connection = bind.connection() if isinstance(bind, Session) else bind
    with one_transaction(connection):
        return drive(connection, flow)


async def _run_flow_async(bind: AsyncSession | AsyncConnection, flow: Flow[T]) -> T:
    connection = await bind.connection() if isinstance(bind, AsyncSession) else bind
    async with one_async_transaction(connection):
        return await drive_async(connection, flow)


def before_first(
    inner: Flow[T], statement: Executable, prelude: Callable[[], Flow[object]]
) -> Flow[T]:
    """``inner``, with the steps of ``prelude()`` run just before its first ``statement``.

    ``statement`` is matched by identity. ``prelude`` is called only then, so it sees
    whatever ``inner`` has learnt by that point; if ``inner`` never runs ``statement``,
    the prelude never runs. A statement's error reaches ``inner`` as it would unwrapped.
    """
    started = False
    reply: _Reply = None
    while not isinstance(step := _resume(inner, reply), _Returned):
        if not started and isinstance(step, tuple) and step[0] is statement:
            started = True
            yield from prelude()
        try:
            reply = yield step
        except Exception as exc:
            reply = exc
    return step.value
