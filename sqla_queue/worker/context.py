"""The context a handler can ask for with ``@queue.task(pass_context=True)``."""

from __future__ import annotations

import asyncio
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sqla_queue.durable.context import DurableContext, DurableSupport
from sqla_queue.spec import JobSpec
from sqla_queue.statements.workflows import parent_results_statement
from sqla_queue.workflows.graph import Expansion, dump_node_rows, node_rows
from sqla_queue.workflows.results import parent_results_of
from sqla_queue.workflows.write import WorkflowWriter

__all__ = ["JobContext"]

S = TypeVar("S")


class JobContext(DurableContext, Generic[S]):
    """What a running handler may know about its job and its worker.

    ``session`` opens a session from the worker's own factory on first use (a ``Session``
    in a sync worker, an ``AsyncSession`` in an async worker) and closes it after the
    handler returns; commit what you want to keep. ``read_session`` does the same from
    the worker's ``read_session_factory``, a read replica's (see :attr:`read_session`).
    Jobs run at least once: a handler whose worker dies mid-job runs again elsewhere, so
    make side effects idempotent.
    """

    def __init__(
        self,
        *,
        job_id: int,
        task: str,
        attempt: int,
        max_attempts: int,
        queue_id: str | None,
        worker_id: uuid.UUID,
        session_factory: Callable[[], S],
        stop_flag: threading.Event,
        read_session_factory: Callable[[], S] | None = None,
        workflows: WorkflowWriter | None = None,
        durable: DurableSupport | None = None,
    ) -> None:
        self.job_id = job_id
        self.task = task
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.queue_id = queue_id
        self.worker_id = worker_id
        self._session_factory = session_factory
        self._session: S | None = None
        self._read_session_factory = read_session_factory
        self._read_session: S | None = None
        self._stop_flag = stop_flag
        self._shutdown_event: asyncio.Event | None = None
        self._cancel_flag = threading.Event()
        self._cancel_event: asyncio.Event | None = None
        #: Set when a heartbeat found that this execution was reclaimed by another worker.
        self.lost = False
        # A transactional task's session is watched for the database errors its handler
        # may catch (see _watch_errors); None for the others.
        self._errors: _ErrorWatch | None = None
        self._watch_errors = False
        # The queue's workflows when this job is a workflow's node, else None.
        self._workflows = workflows
        self._parent_results: dict[str, Any] | None = None
        self._expansion: Expansion | None = None
        # Durable steps and waits (see DurableContext): the queue's tables, and this
        # attempt's record of them once the handler uses one.
        self._durable_support = durable
        self._durable_run = None

    # -- workflows ---------------------------------------------------------------------

    @property
    def in_workflow(self) -> bool:
        """Whether this job is a node of a workflow."""
        return self._workflows is not None

    def _writer(self, what: str) -> WorkflowWriter:
        if self._workflows is None:
            raise RuntimeError(
                f"{what} is for a workflow's nodes; job {self.job_id} ({self.task}) is not one "
                "(enqueue it in a Workflow, or queue.chain(...) it)"
            )
        return self._workflows

    @property
    def parent_results(self) -> dict[str, Any]:
        """``{parent's node name: its result}``, in the order the parents were added.

        A parent that failed or was cancelled appears as a
        :class:`~sqla_queue.workflows.ParentError` (only a node whose policy lets it run
        then sees one). Read once, through :attr:`session`; an ``AsyncSession`` reads with
        ``await ctx.fetch_parent_results()`` instead.
        """
        if self._parent_results is None:
            writer = self._writer("ctx.parent_results")
            session = self.session
            if not isinstance(session, Session):
                raise RuntimeError(
                    "ctx.parent_results reads through a sync session; with an AsyncSession, "
                    "use: results = await ctx.fetch_parent_results()"
                )
            statement = parent_results_statement(writer.tables)
            rows = session.execute(statement, {"job_id": self.job_id}).all()
            self._parent_results = parent_results_of(rows)
        return self._parent_results

    async def fetch_parent_results(self) -> dict[str, Any]:
        """:attr:`parent_results`, read through an ``AsyncSession`` (or a sync one)."""
        if self._parent_results is None:
            writer = self._writer("ctx.fetch_parent_results()")
            session: Any = self.session
            statement = parent_results_statement(writer.tables)
            params = {"job_id": self.job_id}
            if isinstance(session, AsyncSession):
                rows = (await session.execute(statement, params)).all()
            else:
                rows = session.execute(statement, params).all()
            self._parent_results = parent_results_of(rows)
        return self._parent_results

    def expand(self, calls: Iterable[JobSpec], *, then: JobSpec | None = None) -> None:
        """Add ``calls`` to this job's workflow, to run after it, and ``then`` after them.

        The new nodes are written with this job's completion, in its transaction: if the
        job does not succeed, or its completion is fenced off (its execution was reclaimed),
        none of them exist. This job's own dependents then wait for ``then`` (or, without
        it, for every call). Every call is checked here; a bad one raises now. Once per
        attempt.
        """
        writer = self._writer("ctx.expand")
        if self._expansion is not None:
            raise RuntimeError("ctx.expand may be called once per attempt")
        expansion = Expansion(tuple(calls), then)
        if not expansion.calls and then is None:
            raise ValueError("ctx.expand needs at least one call, or then=")
        # Checked now, so that a bad call fails this attempt, not its completion.
        dump_node_rows(node_rows(expansion.workflow(), writer.defaults))
        self._expansion = expansion

    @property
    def expansion(self) -> Expansion | None:
        """What :meth:`expand` asked for in this attempt, if anything."""
        return self._expansion

    @property
    def session(self) -> S:
        """A session from the worker's factory, opened on first use."""
        if self._session is None:
            self._session = self._session_factory()
            if self._watch_errors:
                self._errors = _ErrorWatch.of(self._session)
        return self._session

    @property
    def read_session(self) -> S:
        """A session from the worker's ``read_session_factory``, opened on first use.

        For reads a replica may serve: it lags the primary a little, so a row the job's own
        transaction (or its enqueuer's, just before) wrote may not be there yet; read those
        through :attr:`session`. It is closed after the handler returns, like
        :attr:`session`, and the worker never uses it for the job's own bookkeeping (claim,
        heartbeats, completion), which stays on the primary.

        Raises:
            RuntimeError: if the worker was built without ``read_session_factory``. There
                is no silent fallback to the primary: a handler that asks for the replica
                is not served by the primary unknowingly. Pass the primary's factory as
                ``read_session_factory`` too to read it on purpose.
        """
        if self._read_session is None:
            if self._read_session_factory is None:
                raise RuntimeError(
                    "ctx.read_session needs a read replica: build the worker with "
                    "read_session_factory=... (queue.worker(SessionLocal, "
                    "read_session_factory=ReplicaSession), or sqla-queue worker --read-url)"
                )
            self._read_session = self._read_session_factory()
        return self._read_session

    @property
    def shutdown_requested(self) -> bool:
        """True once the worker was asked to stop: finish up or return early."""
        return self._stop_flag.is_set()

    @property
    def shutdown_event(self) -> asyncio.Event:
        """An event set at shutdown, for ``async def`` handlers to await alongside work.

        Only valid inside the event loop that runs the handler.
        """
        if self._shutdown_event is None:
            self._shutdown_event = asyncio.Event()
            if self._stop_flag.is_set():
                self._shutdown_event.set()
        return self._shutdown_event

    @property
    def cancel_requested(self) -> bool:
        """True once someone cancelled this job (``queue.cancel``) while it ran.

        The request arrives with the worker's next heartbeat. Stop early and return (or
        raise): the job then ends ``cancelled``. A handler that ignores it is not stopped,
        but once the request has reached it (this flag is set) the job ends ``cancelled``
        whatever it returns; only a success that came before the request reached the
        worker ends ``succeeded``.
        """
        return self._cancel_flag.is_set()

    @property
    def cancel_event(self) -> asyncio.Event:
        """An event set when the job is cancelled, for ``async def`` handlers to await.

        (An ``async def`` handler's task is also cancelled, so it sees ``CancelledError``
        at its next ``await``; this event is for code that shields itself from that.)
        Only valid inside the event loop that runs the handler.
        """
        if self._cancel_event is None:
            self._cancel_event = asyncio.Event()
            if self._cancel_flag.is_set():
                self._cancel_event.set()
        return self._cancel_event

    def notify_cancel(self) -> None:
        """Tell the handler that its job was cancelled. Called by the worker, any thread."""
        self._cancel_flag.set()
        _set_in_owner_loop(self._cancel_event)

    def notify_shutdown(self) -> None:
        """Tell the handler that its worker is stopping. Called by the worker, any thread.

        Sets :attr:`shutdown_event` (in the handler's own loop) if the handler made one;
        :attr:`shutdown_requested` already reads the worker's flag.
        """
        _set_in_owner_loop(self._shutdown_event)

    def notify_lost(self) -> None:
        """Tell the handler that another worker reclaimed its job. Called by the worker.

        Sets :attr:`lost`: the handler's outcome will be discarded (the newer attempt wins),
        so a long handler may stop early.
        """
        self.lost = True

    def _arm_error_watch(self) -> None:
        """Watch the session this context opens for database errors (a transactional
        task's: its completion runs in that session's transaction, see
        :meth:`_caught_error`)."""
        self._watch_errors = True

    def _caught_error(self) -> BaseException | None:
        """The first database error of the session's current transaction, if any.

        Set once the handler's statement failed, even if the handler caught the error:
        PostgreSQL then refuses every later statement of that transaction.
        """
        return self._errors.first if self._errors is not None else None

    def _take_session(self) -> S | None:
        session, self._session = self._session, None
        return session

    def _take_sessions(self) -> list[S]:
        """The sessions the handler opened (``session``, then ``read_session``), to close."""
        opened = [self._take_session()]
        read, self._read_session = self._read_session, None
        opened.append(read)
        return [session for session in opened if session is not None]


def _set_in_owner_loop(event: asyncio.Event | None) -> None:
    """Set ``event`` from any thread: through its loop when another thread runs that loop."""
    if event is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    # The event belongs to the handler's loop; set it from that loop's thread.
    owner: Any = getattr(event, "_loop", None)
    if owner is not None and owner is not loop:
        owner.call_soon_threadsafe(event.set)
    else:
        event.set()


class _ErrorWatch:
    """The first database error of a session's current transaction.

    SQLAlchemy reports statement errors only per engine (``handle_error``), so one listener
    per dialect looks up the watch of the failing connection; the session's ``after_begin``
    registers each connection it begins on, and starts its record afresh.
    """

    _by_connection: weakref.WeakKeyDictionary[Any, _ErrorWatch] = weakref.WeakKeyDictionary()
    _dialects: weakref.WeakSet[Any] = weakref.WeakSet()
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.first: BaseException | None = None

    @classmethod
    def of(cls, session: Any) -> _ErrorWatch:
        """A watch on ``session`` (a ``Session`` or an ``AsyncSession``)."""
        watch = cls()
        sync = getattr(session, "sync_session", session)
        if isinstance(sync, Session):  # another factory's sessions are not watched
            event.listen(sync, "after_begin", watch._began)
        return watch

    def _began(self, session: Any, transaction: Any, connection: Any) -> None:
        self.first = None
        engine = connection.engine
        with self._lock:
            self._by_connection[connection] = self
            if engine.dialect not in self._dialects:
                self._dialects.add(engine.dialect)
                event.listen(engine, "handle_error", _ErrorWatch._failed)

    @classmethod
    def _failed(cls, context: ExceptionContext) -> None:
        if context.connection is None:  # a failed connect: no transaction to abort
            return
        with cls._lock:
            watch = cls._by_connection.get(context.connection)
        if watch is not None and watch.first is None:
            watch.first = context.sqlalchemy_exception or context.original_exception
