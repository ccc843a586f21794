"""What a durable handler holds: a step's block, a cursor and its batches.

Each object keeps its decisions in flows of :class:`~sqla_queue.durable.run.DurableRun`
and hands them to a :class:`Face`, the thin part that runs them in a session (blocking,
or awaited). The same block serves ``with`` in a ``def`` handler and ``async with`` in an
``async def`` one; a cursor iterates with ``for`` or ``async for``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Any, Protocol

from sqla_queue.conversation import Flow
from sqla_queue.durable.run import DurableRun, StoredStep
from sqla_queue.models.tables import StepKind

__all__ = ["Batch", "Cursor", "Face", "StepBlock", "step_mismatch"]

_UNSET: Any = object()


class Face(Protocol):
    """Runs a durable flow in the handler's session: :meth:`read` without a commit,
    :meth:`commit` with one (rolled back if it fails), :meth:`rollback` of the step's
    writes, and :meth:`mismatch` when a stored step's version differs (it suspends)."""

    def read(self, flow: Flow[Any]) -> Any: ...

    def commit(self, flow: Flow[Any]) -> Any: ...

    def rollback(self) -> Any: ...

    def mismatch(self, stored: StoredStep, version: int) -> Any: ...


def step_mismatch(stored: StoredStep | None, kind: str, version: int) -> bool:
    """Whether ``stored`` was committed by another version (or kind) of the code."""
    if stored is None:
        return False
    if stored.kind != kind:
        raise ValueError(
            f"checkpoint {stored.name!r} is a {stored.kind} in the database, used here as a "
            f"{kind}: give the {kind} another name"
        )
    return stored.version != version


class StepBlock:
    """``with ctx.step(name) as step:`` — run once per job, ever.

    Inside, :attr:`done` says whether the step committed before (a replay: skip its work;
    :attr:`result` is the stored value). Otherwise do the work through ``ctx.session``
    and set :attr:`result`: on leaving the block without an error, the result and the
    session's writes commit together, in one transaction. An error rolls them back and
    goes on up.
    """

    def __init__(
        self,
        run: DurableRun,
        face_for: Callable[[bool], Face],
        name: str,
        *,
        version: int,
        compensate: Any,
        compensation: Callable[[Any, Any], str | None],
    ) -> None:
        self._run = run
        self._face_for = face_for
        self.name = name
        self.version = version
        # compensation(call, result): the stored enqueue row of the call that undoes it.
        self._compensation = compensation
        self._compensate = compensate
        #: Whether the step committed in an earlier run of the job.
        self.done = False
        #: The step's result: the stored one when :attr:`done`, else what you set.
        self.result: Any = None

    def compensate_with(self, call: Any) -> None:
        """Undo this step with ``call`` (``refund.call(charge_id)``) if the job finally
        fails or is cancelled; overrides the block's ``compensate=``."""
        self._compensate = call

    def _mismatched(self) -> StoredStep | None:
        """The stored step, when another version of the code committed it (after the
        job's checkpoints were read)."""
        stored = self._run.stored(self.name)
        return stored if step_mismatch(stored, StepKind.STEP, self.version) else None

    def _replayed(self) -> StepBlock:
        """Take the stored result, if the step committed before."""
        stored = self._run.stored(self.name)
        if stored is not None:
            self.done = True
            self.result = stored.result
        return self

    def _exit_flow(self) -> Flow[None]:
        return self._run.checkpoint(
            self.name,
            self.result,
            version=self.version,
            compensate=self._compensation(self._compensate, self.result),
        )

    def __enter__(self) -> StepBlock:
        self._run.begin(self.name, StepKind.STEP)
        face = self._face_for(False)
        face.read(self._run.load())
        if (stored := self._mismatched()) is not None:
            face.mismatch(stored, self.version)
        self._run.open_step(self.name)
        return self._replayed()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        face = self._face_for(False)
        ran = False
        try:
            if exc is not None:
                face.rollback()
            elif not self.done:
                face.commit(self._exit_flow())
                ran = True
            else:
                ran = True
        finally:
            self._run.close_step(self.name, ran=ran)

    async def __aenter__(self) -> StepBlock:
        self._run.begin(self.name, StepKind.STEP)
        face = self._face_for(True)
        await face.read(self._run.load())
        if (stored := self._mismatched()) is not None:
            await face.mismatch(stored, self.version)
        self._run.open_step(self.name)
        return self._replayed()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        face = self._face_for(True)
        ran = False
        try:
            if exc is not None:
                await face.rollback()
            elif not self.done:
                await face.commit(self._exit_flow())
                ran = True
            else:
                ran = True
        finally:
            self._run.close_step(self.name, ran=ran)


class Batch:
    """One pass of a cursor's loop, from :attr:`position`.

    Call :meth:`advance` with the position the next batch starts from: the cursor moves
    there in one transaction with this batch's writes, before the next batch. A batch
    that does not advance ends the loop (the cursor is then finished: a replay skips it).
    """

    def __init__(self, position: Any) -> None:
        #: Where this batch starts.
        self.position = position
        self._next: Any = _UNSET

    def advance(self, position: Any) -> None:
        """Move the cursor to ``position`` (JSON-able) with this batch's writes."""
        self._next = position

    @property
    def advanced(self) -> bool:
        """Whether :meth:`advance` was called."""
        return self._next is not _UNSET


class Cursor:
    """``for batch in ctx.cursor("import", start=0):`` — a long loop that resumes.

    The stored position is a JSON value; the loop starts from it (or from ``start`` on
    the first run) and commits each batch's :meth:`Batch.advance` with the batch's writes
    through ``ctx.session``. ``async for`` in an ``async def`` handler.
    """

    def __init__(
        self, run: DurableRun, face_for: Callable[[bool], Face], name: str, start: Any, version: int
    ) -> None:
        self._run = run
        self._face_for = face_for
        self.name = name
        self.start = start
        self.version = version

    def _first(self) -> Batch | None:
        stored = self._run.stored(self.name)
        if stored is None:
            return Batch(self.start)
        state = stored.result or {}
        return None if state.get("finished") else Batch(state.get("position"))

    def _after(self, batch: Batch) -> tuple[Flow[None], Batch | None]:
        expected: dict[str, Any] | None = self._state(batch.position, finished=False)
        if self._run.stored(self.name) is None:
            expected = None  # nothing stored: the first move inserts
        if batch.advanced:
            state = self._state(batch._next, finished=False)
            return self._move(state, expected), Batch(batch._next)
        return self._move(self._state(batch.position, finished=True), expected), None

    def _move(self, state: dict[str, Any], expected: Any) -> Flow[None]:
        return self._run.advance(self.name, state, expected, version=self.version)

    @staticmethod
    def _state(position: Any, *, finished: bool) -> dict[str, Any]:
        return {"position": position, "finished": finished}

    def _mismatched(self) -> StoredStep | None:
        stored = self._run.stored(self.name)
        return stored if step_mismatch(stored, StepKind.CURSOR, self.version) else None

    def __iter__(self) -> Iterator[Batch]:
        return _CursorIterator(self, self._face_for(False))

    def __aiter__(self) -> AsyncIterator[Batch]:
        return _CursorIterator(self, self._face_for(True))


class _CursorIterator:
    """One loop over a :class:`Cursor`, blocking (``for``) or awaited (``async for``).

    A class rather than a generator: a loop left with ``break`` (or an error) drops it at
    once, so the run sees that no batch is open any more (an async generator would stay
    alive until the event loop closes it).
    """

    def __init__(self, cursor: Cursor, face: Face) -> None:
        self._cursor = cursor
        self._face = face
        self._batch: Batch | None = None
        self._started = False

    def _start(self) -> None:
        self._cursor._run.begin(self._cursor.name, StepKind.CURSOR)
        self._cursor._run.start_cursor(self._cursor.name)

    def _hand_out(self, batch: Batch | None) -> Batch:
        self._batch = batch
        if batch is None:
            raise StopIteration
        self._cursor._run.open_batch(self._cursor.name, self)
        return batch

    def __iter__(self) -> _CursorIterator:
        return self

    def __next__(self) -> Batch:
        cursor, face = self._cursor, self._face
        if not self._started:
            self._start()
            self._started = True
            face.read(cursor._run.load())
            if (stored := cursor._mismatched()) is not None:
                face.mismatch(stored, cursor.version)
            return self._hand_out(cursor._first())
        if self._batch is None:
            raise StopIteration
        cursor._run.close_batch()
        flow, following = cursor._after(self._batch)
        self._batch = None
        face.commit(flow)
        return self._hand_out(following)

    def __aiter__(self) -> _CursorIterator:
        return self

    async def __anext__(self) -> Batch:
        cursor, face = self._cursor, self._face
        try:
            if not self._started:
                self._start()
                self._started = True
                await face.read(cursor._run.load())
                if (stored := cursor._mismatched()) is not None:
                    await face.mismatch(stored, cursor.version)
                return self._hand_out(cursor._first())
            if self._batch is None:
                raise StopIteration
            cursor._run.close_batch()
            flow, following = cursor._after(self._batch)
            self._batch = None
            await face.commit(flow)
            return self._hand_out(following)
        except StopIteration:
            raise StopAsyncIteration from None
