"""What the worker core asks a face to do next, and the I/O of one action.

The core (:mod:`sqla_queue.worker.core`) decides; a face (:mod:`.sync`, :mod:`.aio`)
performs. These values are the whole vocabulary between them: an :data:`Action` says what
to do, a :class:`Work` holds the statements that do it, each a :class:`Step`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from sqla_queue.worker.handlers import RunningJob

__all__ = ["Action", "Claim", "Flush", "Maintain", "Step", "Stop", "Wait", "Work", "claims"]


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
class Wait:
    """Sleep until woken or ``timeout`` seconds pass."""

    timeout: float


@dataclass(frozen=True)
class Stop:
    """Leave the run loop."""


Action = Flush | Claim | Maintain | Wait | Stop


class Step(NamedTuple):
    """One statement and its parameters (the typed record of its builder's module).

    A tuple, so a face unpacks it as ``statement, params`` like any pair.
    """

    statement: Any
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Work:
    """The I/O of one action, for a face to run: statements, then the core takes over.

    A face executes ``steps`` in order (inside one transaction when ``atomic``), hands the
    rows of every step to ``done`` and dispatches the executions it returns. If anything
    fails it calls ``failed`` and lets the error propagate. Every unit the core prepares is
    atomic and opens with the planner guard (see :mod:`sqla_queue.statements.planner`).
    """

    steps: list[Step]
    atomic: bool
    done: Callable[[list[Sequence[Any]]], list[RunningJob]]
    failed: Callable[[], None]


def claims(action: Action) -> bool:
    """Whether ``action`` runs a claim (alone or after a flush)."""
    return isinstance(action, Claim) or (isinstance(action, Flush) and action.claim > 0)
