"""What the worker's decider asks a face to do next, and the I/O of one action.

The decider (:mod:`sqla_queue.worker.decider`) decides; a face (:mod:`.sync`, :mod:`.aio`)
performs. These values are the whole vocabulary between them: an :data:`Action` says what
to do, a :class:`Work` holds the statements that do it, each a
:class:`~sqla_queue.conversation.Step`.

It is the vocabulary of :mod:`sqla_queue.conversation` at a coarser grain. A flow is a
conversation that reads each statement's rows before it asks for the next, so one driver
can run any flow; the worker's loop is a run of decisions instead, each taken on a fresh
look at the clock, the buffered outcomes and the handlers' threads
(:meth:`~sqla_queue.worker.decider.Decider.next_action`). Its statements are the same
:class:`~sqla_queue.conversation.Step` values, and its decision to idle is the same
:class:`~sqla_queue.conversation.Wait` a flow yields: wait up to ``seconds``, less if the
face is woken (an enqueue's notification, a handler's outcome, a stop). The faces are the
worker's own drivers, because a unit of :class:`Work` is a batch sent together (one round
trip where the driver pipelines), then handed to the decider whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqla_queue.conversation import Flow, Step, Wait

if TYPE_CHECKING:
    from sqla_queue.worker.handlers import RunningJob

# Step and Wait are defined by the conversation and are part of this vocabulary too.
__all__ = [
    "Action",
    "Claim",
    "Flush",
    "Maintain",
    "Start",
    "Step",
    "Stop",
    "Wait",
    "Work",
    "atomic_unit",
    "claims",
]


@dataclass(frozen=True)
class Flush:
    """Write the buffered outcomes (one completion statement).

    With ``claim`` > 0, claim up to that many executions in the same transaction, after the
    completion: one commit (one WAL flush) for both, and the claim already sees the seats
    and queue heads that the completion freed.
    """

    claim: int = 0


@dataclass(frozen=True)
class Claim:
    """Claim up to ``size`` executions (one claim statement).

    With ``rated``, claim only that rate-limited task, under its control row's lock (two
    statements: the lock, then the rated claim).
    """

    size: int
    rated: str | None = None


@dataclass(frozen=True)
class Maintain:
    """Periodic upkeep: reclaim lost executions, re-read the stored limits, pauses and
    rate limits, sweep keys."""


@dataclass(frozen=True)
class Stop:
    """Leave the run loop."""


@dataclass(frozen=True)
class Start:
    """Start handlers of prefetched jobs, which seats freed for (no I/O)."""

    jobs: Sequence[RunningJob]


Action = Flush | Claim | Maintain | Wait | Stop | Start


@dataclass(frozen=True)
class Work:
    """The I/O of one action, for a face to run: statements, then the decider takes over.

    A face executes ``steps`` in order (inside one transaction when ``atomic``), runs the
    flow that ``follow`` makes of their rows, if any, in the same transaction, hands the
    rows of every step to ``done`` and dispatches the executions it returns. If anything
    fails it calls ``failed`` and lets the error propagate. Every unit the decider prepares is
    atomic and opens with the planner guard (see :mod:`sqla_queue.statements.planner`).
    """

    steps: list[Step]
    atomic: bool
    done: Callable[[list[Sequence[Any]]], list[RunningJob]]
    failed: Callable[[], None]
    #: Read the steps' rows and say what else the transaction does before it commits (a
    #: flow, or None): a flush of workflow nodes releases their dependents. A unit with a
    #: ``follow`` sends its COMMIT after it.
    follow: Callable[[list[Sequence[Any]]], Flow[Any] | None] | None = None


def claims(action: Action) -> bool:
    """Whether ``action`` runs a claim (alone or after a flush)."""
    return isinstance(action, Claim) or (isinstance(action, Flush) and action.claim > 0)


def atomic_unit(
    guard: Any,
    steps: list[Step],
    done: Callable[[list[Sequence[Any]]], list[RunningJob]],
    failed: Callable[[], None],
    after: Callable[[Sequence[Sequence[Any]]], Flow[Any] | None] | None = None,
) -> Work:
    """One transaction: the planner ``guard``, then ``steps``. ``done`` sees their rows
    only, and so does ``after`` (if given), before the commit."""
    follow = None
    if after is not None:
        then = after
        follow = lambda results: then(results[1:])  # noqa: E731
    return Work(
        [Step(guard, {}), *steps],
        True,
        lambda results: done(results[1:]),
        failed,
        follow,
    )
