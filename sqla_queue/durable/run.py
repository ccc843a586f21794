"""The I/O-free core of one attempt of a durable job: what it committed, and what its
next checkpoint or wait sends.

A :class:`DurableRun` knows the job's committed checkpoints (read once, on first use) and
builds each durable operation as a :data:`~sqla_queue.conversation.Flow`: the context's
two faces (:mod:`sqla_queue.durable.faces`) run it in a session and commit. A wait's flow
ends with what the wait found, or with a :class:`Suspension` that its face commits before
it raises :class:`JobSuspended` through the handler.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from sqla_queue.conversation import Flow, Step
from sqla_queue.durable.statements import DurableStatements
from sqla_queue.errors import StepNotCommittedError
from sqla_queue.logic.payload import dump_json
from sqla_queue.models.tables import StepKind
from sqla_queue.statements.durable import FenceParams, deadline_of

__all__ = [
    "SENDER_RECHECK",
    "DurableRun",
    "Heard",
    "JobSuspended",
    "Satisfied",
    "StoredStep",
    "Suspension",
    "TimedOut",
    "refusal_reason",
]

#: Seconds after which a job that began to wait while a signal's sender was in flight
#: runs again and asks again (the sender's transaction may not have committed).
SENDER_RECHECK = 1.0


@dataclass(frozen=True)
class StoredStep:
    """One committed checkpoint of the job, as the database holds it."""

    name: str
    kind: str
    version: int
    result: Any
    #: For a wait: whether its deadline has passed (by the database's clock).
    elapsed: bool | None


@dataclass(frozen=True)
class Suspension:
    """A wait's decision: the job is suspended until ``until`` (``None``: no deadline)
    or until what it ``waits_for`` comes."""

    waits_for: str
    until: dt.datetime | None


@dataclass(frozen=True)
class Satisfied:
    """A wait's decision: what it waited for has come, with ``value``."""

    value: Any


@dataclass(frozen=True)
class TimedOut:
    """A wait's decision: its deadline passed first."""

    waits_for: str


#: What a wait's probe says beyond whether it holds: the ``wait`` value to suspend on, and
#: in how many seconds to look again (``None``: when woken, or at the deadline).
Heard = tuple[str, float | None]


class JobSuspended(BaseException):
    """Raised through a durable handler once its job is suspended (committed).

    Not an error: the worker gives the job's seat back and records nothing; the job runs
    again from the start when it wakes, its committed steps replayed. A ``BaseException``
    so that a handler's ``except Exception`` does not swallow it.
    """

    def __init__(self, suspension: Suspension) -> None:
        super().__init__(f"suspended until {suspension.until}: waits for {suspension.waits_for}")
        self.suspension = suspension


def refusal_reason(row: Any | None, attempt: int, worker_id: uuid.UUID) -> str:
    """Why a fenced checkpoint of this attempt found nothing to write, from its
    execution's row as it is now (``None``: the job has no execution any more)."""
    if row is None:
        return "lost"
    if row.state != "running" or row.attempt != attempt or row.worker_id != worker_id:
        return "lost"
    if row.cancel_requested:
        return "cancelled"
    return "committed"


_REASONS = {
    "lost": "its execution was reclaimed by another worker, which runs the job now",
    "cancelled": "the job was cancelled",
    "committed": "another attempt committed this step first",
}


class DurableRun:
    """One attempt of a durable job: its fence, its committed checkpoints, its flows.

    Not thread-safe: it belongs to the handler's thread or task.
    """

    def __init__(
        self,
        statements: DurableStatements,
        *,
        job_id: int,
        attempt: int,
        worker_id: uuid.UUID,
    ) -> None:
        self.statements = statements
        self.job_id = job_id
        self.attempt = attempt
        self.worker_id = worker_id
        self._stored: dict[str, StoredStep] | None = None
        self._counts: dict[str, int] = {}
        # The step whose block is open, and the cursor iterator whose batch runs now (a
        # weak reference: a loop left with ``break`` drops its iterator at once).
        self._open_step: str | None = None
        self._open_batch: Callable[[], Any] | None = None
        self._open_cursor: str | None = None
        # The steps and cursors that ran in this run of the handler, by name.
        self._used: dict[str, str] = {}

    @property
    def fence(self) -> FenceParams:
        """The parameters that name this attempt's execution."""
        return {"job": self.job_id, "held_attempt": self.attempt, "worker": self.worker_id}

    @property
    def loaded(self) -> bool:
        """Whether the committed checkpoints were read."""
        return self._stored is not None

    def load(self) -> Flow[None]:
        """Read the job's committed checkpoints (once per attempt)."""
        if self._stored is not None:
            return
        rows = yield Step(self.statements.steps, {"job": self.job_id})
        self._stored = {
            row.name: StoredStep(row.name, row.kind, row.version, row.result, row.elapsed)
            for row in rows
        }

    def stored(self, name: str) -> StoredStep | None:
        """The committed checkpoint ``name``, if any (after :meth:`load`)."""
        if self._stored is None:
            raise RuntimeError("the job's checkpoints were not read yet")
        return self._stored.get(name)

    @property
    def committed(self) -> list[StoredStep]:
        """Every committed checkpoint, in commit order (after :meth:`load`)."""
        return list(self._stored.values()) if self._stored is not None else []

    def auto_name(self, prefix: str) -> str:
        """The next name of an unnamed wait of this kind: ``sleep#1``, ``sleep#2``...

        Counted in call order within the attempt, so a replay names them alike, as long
        as the handler calls them in the same order.
        """
        count = self._counts.get(prefix, 0) + 1
        self._counts[prefix] = count
        return f"{prefix}#{count}"

    def _inside(self) -> str | None:
        """What is open now: ``step 'x'``, ``cursor 'y'`` (a batch runs), or ``None``."""
        if self._open_step is not None:
            return f"step {self._open_step!r}"
        if self._open_batch is not None and self._open_batch() is not None:
            return f"a batch of cursor {self._open_cursor!r}"
        return None

    def begin(self, name: str, kind: str) -> None:
        """Check that a step or cursor ``name`` may begin now, before anything is sent.

        Refused (:class:`RuntimeError`) inside another step's block or a cursor's batch:
        the inner one would commit the outer one's writes early, and a retry would write
        them again. Refused (:class:`ValueError`) when a step or cursor of this name ran
        already in this run: it would return the first one's result instead of running.
        """
        inside = self._inside()
        if inside is not None:
            raise RuntimeError(
                f"job {self.job_id}: {kind} {name!r} begins inside {inside}: steps and "
                "cursors do not nest (the inner one would commit the outer one's writes "
                "early, and a retry would write them again); make it a step of its own "
                "after the block, or do its work inside the outer one"
            )
        used = self._used.get(name)
        if used is not None:
            raise ValueError(
                f"job {self.job_id}: {kind} {name!r} runs twice in one run (a {used} of "
                f"that name ran already): it would return the first one's result without "
                f"running; give each its own name (in a loop, put the item in it: "
                f'f"{name}:{{item}}")'
            )

    def open_step(self, name: str) -> None:
        """Step ``name``'s block is entered (after :meth:`begin`)."""
        self._open_step = name

    def close_step(self, name: str, *, ran: bool) -> None:
        """Step ``name``'s block is left; ``ran``: it committed or was replayed (its name
        is then used for this run)."""
        self._open_step = None
        if ran:
            self._used[name] = StepKind.STEP

    def start_cursor(self, name: str) -> None:
        """Cursor ``name``'s loop begins (after :meth:`begin`): its name is used."""
        self._used[name] = StepKind.CURSOR

    def open_batch(self, name: str, iterator: Any) -> None:
        """Cursor ``name``'s ``iterator`` hands out a batch."""
        self._open_cursor = name
        self._open_batch = weakref.ref(iterator)

    def close_batch(self) -> None:
        """The current batch of a cursor ended."""
        self._open_batch = None
        self._open_cursor = None

    def _remember(self, name: str, kind: str, version: int, result: Any) -> None:
        if self._stored is not None:
            self._stored[name] = StoredStep(name, kind, version, result, False)

    def checkpoint(
        self, name: str, result: Any, *, version: int, compensate: str | None
    ) -> Flow[None]:
        """Write step ``name``'s ``result`` (JSON-able) and its compensation's enqueue row
        (JSON text). Raises :class:`StepNotCommittedError` if the fence refuses it."""
        params = {
            **self.fence,
            "step": name,
            "step_kind": StepKind.STEP,
            "step_version": version,
            "step_result": self._dump(result, f"step {name!r}"),
            "step_compensate": compensate,
        }
        rows = yield Step(self.statements.checkpoint, params)
        if not rows:
            yield from self.refused(name)
        self._remember(name, StepKind.STEP, version, result)

    def advance(self, name: str, position: Any, expected: Any, *, version: int) -> Flow[None]:
        """Move cursor ``name`` from ``expected`` to ``position`` (both JSON-able)."""
        params = {
            **self.fence,
            "step": name,
            "step_kind": StepKind.CURSOR,
            "step_version": version,
            "step_result": self._dump(position, f"cursor {name!r}"),
            "expected": json.dumps(expected),
        }
        rows = yield Step(self.statements.advance_cursor, params)
        if not rows:
            yield from self.refused(name)
        self._remember(name, StepKind.CURSOR, version, position)

    def _dump(self, value: Any, what: str) -> str:
        """``value`` as the JSON text a checkpoint stores, or a
        :class:`~sqla_queue.errors.PayloadNotSerializableError` naming what cannot be
        stored, raised before anything is sent (the step's writes are rolled back)."""
        return dump_json(
            value, task="", what="its result", doing=f"commit {what} of job {self.job_id}"
        )

    def refused(self, name: str) -> Flow[NoReturn]:
        """Read why a fenced statement wrote nothing, and raise it."""
        rows = yield Step(self.statements.execution_state, {"job": self.job_id})
        reason = refusal_reason(rows[0] if rows else None, self.attempt, self.worker_id)
        raise StepNotCommittedError(
            f"job {self.job_id}: step {name!r} was not committed: {_REASONS[reason]}; "
            "its writes were rolled back",
            job_id=self.job_id,
            step=name,
            reason=reason,
        )

    def wait(
        self,
        name: str,
        waits_for: str,
        *,
        timeout: float | None,
        probe: Step | None = None,
        found: Callable[[Sequence[Any]], Satisfied | None] | None = None,
        heard: Callable[[Sequence[Any]], Heard] | None = None,
    ) -> Flow[Satisfied | TimedOut | Suspension]:
        """Wait ``name`` for ``waits_for``: lock the execution, ``probe`` (if given) for
        what it waits for (``found`` reads the probe's rows), and suspend the job unless
        it came or the wait's deadline (``timeout`` seconds after the wait first began)
        passed. ``heard`` reads more of the probe's rows: the ``wait`` value to suspend
        on (a row's key as the database writes it), and whether to look again soon (an
        application transaction held the row, so the probe could not read it)."""
        stored = self.stored(name)
        decided = stored.result if stored is not None and isinstance(stored.result, dict) else {}
        # Decided in an earlier run: a replay takes the same branch, whatever came since.
        if decided.get("met"):
            return Satisfied(decided.get("value"))
        # A timeout is its attempt's: a retry after an attempt that timed out (and failed)
        # waits again, with a fresh deadline. A replay within the attempt (after a later
        # wait of the handler) takes the timed-out branch again.
        restart = bool(decided.get("timed_out")) and decided.get("attempt", self.attempt) < (
            self.attempt
        )
        if decided.get("timed_out") and not restart:
            return TimedOut(waits_for)
        if probe is None and stored is not None and stored.elapsed:
            return TimedOut(waits_for)  # a sleep that is over: nothing to lock
        locked = yield Step(self.statements.lock_execution, self.fence)
        if not locked or locked[0].cancel_requested:
            # A cancelled job does not begin to wait: the attempt ends, and its
            # completion ends the job cancelled.
            yield from self.refused(name)
        row_recheck: float | None = None
        if probe is not None and found is not None:
            rows = yield probe
            satisfied = found(rows)
            if satisfied is not None:
                yield from self._decide(name, {"met": True, "value": satisfied.value})
                return satisfied
            if heard is not None:
                waits_for, row_recheck = heard(rows)
        if stored is None or restart:
            params = {
                **self.fence,
                "step": name,
                "step_kind": StepKind.WAIT,
                "step_version": 1,
                "timeout": timeout,
            }
            record = self.statements.restart_wait if restart else self.statements.record_wait
            if not (yield Step(record, params)):
                yield from self.refused(name)
        elif stored.elapsed:
            if probe is not None:  # a sleep's end needs no record: it is one already
                yield from self._decide(name, {"timed_out": True, "attempt": self.attempt})
            return TimedOut(waits_for)
        # A signal's sender holds the job's signal lock until it commits: what it sends
        # may not be visible to the probe yet. Waiting for its commit could take as long
        # as the sender likes, so the job asks again a moment later instead.
        recheck = None if locked[0].no_sender else SENDER_RECHECK
        if row_recheck is not None:
            recheck = row_recheck if recheck is None else min(recheck, row_recheck)
        suspended = yield Step(
            self.statements.suspend,
            {**self.fence, "waits_for": waits_for, "step": name, "recheck": recheck},
        )
        if not suspended:
            yield from self.refused(name)
        until = suspended[0].execute_at
        return Suspension(waits_for, deadline_of(until))

    def _decide(self, name: str, decision: dict[str, Any]) -> Flow[None]:
        """Record how wait ``name`` ended (met, with what; or timed out), in the wait's
        transaction: a replay then goes the same way without asking again, even if the
        row that met a condition changed since, or a signal came after the deadline."""
        params = {
            **self.fence,
            "step": name,
            "step_kind": StepKind.WAIT,
            "step_version": 1,
            "step_result": json.dumps(decision),
        }
        if not (yield Step(self.statements.record_met, params)):
            yield from self.refused(name)
        self._remember(name, StepKind.WAIT, 1, decision)

    def suspend_for(self, waits_for: str) -> Flow[Suspension]:
        """Suspend the job with no deadline until an operator wakes it: a step whose
        stored version the code no longer has (``queue.migrate_steps`` wakes it)."""
        locked = yield Step(self.statements.lock_execution, self.fence)
        if not locked:
            yield from self.refused(waits_for)
        suspended = yield Step(
            self.statements.suspend, {**self.fence, "waits_for": waits_for, "step": None}
        )
        if not suspended:
            yield from self.refused(waits_for)
        return Suspension(waits_for, None)
