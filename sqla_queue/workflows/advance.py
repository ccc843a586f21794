"""Advance workflows past jobs that just ended, in the transaction that ended them.

:func:`advance_flow` is the one conversation behind every release: the worker's
completion (sync or async, transactional or not), a cancel, a cancelled workflow. It runs
the three statements of :mod:`sqla_queue.statements.release` until nothing more is
decided: a node cancelled because a parent failed ends too, and its own dependents are
advanced in turn, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sqla_queue.conversation import Flow, Step
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.release import (
    AdvanceParams,
    Verdict,
    advance_statement,
    decide_statement,
    lock_nodes_statement,
)

__all__ = ["Advanced", "ReleaseStatements", "advance_flow", "needs_more"]


class ReleaseStatements:
    """The release statements of one queue's tables, built once."""

    def __init__(self, tables: QueueTables, *, notify: bool) -> None:
        self.tables = tables
        self.notify = notify

    @cached_property
    def advance(self) -> Any:
        """:func:`~sqla_queue.statements.release.advance_statement`."""
        return advance_statement(self.tables, notify=self.notify)

    @cached_property
    def lock(self) -> Any:
        """:func:`~sqla_queue.statements.release.lock_nodes_statement`."""
        return lock_nodes_statement(self.tables)

    @cached_property
    def decide(self) -> Any:
        """:func:`~sqla_queue.statements.release.decide_statement`."""
        return decide_statement(self.tables, notify=self.notify)


@dataclass
class Advanced:
    """What an advance did: the nodes it released and the jobs it cancelled."""

    released: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)


def advance_flow(
    statements: ReleaseStatements,
    ended: Iterable[int],
    first: Sequence[Any] | None = None,
) -> Flow[Advanced]:
    """Release, cancel or hold the dependents of the jobs ``ended``, and so on down.

    ``ended`` are jobs that reached a final state in the caller's transaction (ids of jobs
    that did not, or whose dependents were advanced already, change nothing). Each round
    writes the outcomes and decides the nodes with one parent (one statement); nodes with
    several parents that this transaction may be the last to finish are locked, then
    decided from a fresh snapshot (two more). The nodes it cancels are the next round's
    ended jobs. ``first`` are the rows of the first round's advance statement when the
    caller sent it already (the worker sends it with the completion, in one round trip).
    """
    done = Advanced()
    ids = sorted(set(ended))
    rows = first
    while ids:
        if rows is None:
            rows = yield Step(statements.advance, AdvanceParams(ids=ids))
        candidates = sorted({row[1] for row in rows if row[0] == Verdict.CANDIDATE})
        cancelled = _collect(rows, done)
        if candidates:
            yield Step(statements.lock, AdvanceParams(ids=candidates))
            decided = yield Step(statements.decide, AdvanceParams(ids=candidates))
            cancelled += _collect(decided, done)
        ids = sorted(set(cancelled))
        rows = None
    return done


def needs_more(rows: Sequence[Any]) -> bool:
    """Whether an advance statement's ``rows`` leave work for :func:`advance_flow`: nodes
    to lock and decide, or cancelled nodes whose dependents come next."""
    return any(row[0] in (Verdict.CANDIDATE, Verdict.CANCELLED) for row in rows)


def _collect(rows: Iterable[Any], done: Advanced) -> list[int]:
    cancelled: list[int] = []
    for verdict, job_id in rows:
        if verdict == Verdict.RELEASED and job_id is not None:
            done.released.append(job_id)
        elif verdict == Verdict.CANCELLED:
            cancelled.append(job_id)
    done.cancelled += cancelled
    return cancelled
