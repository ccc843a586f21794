"""The workflow nodes among a worker's outcomes: what their completion must also do.

A flushed batch that holds a workflow node's outcome does more than complete: before its
transaction commits, the expansions of the nodes that asked for one (``ctx.expand``) are
written, then the dependents of every node that ended are released, cancelled or held
(:func:`~sqla_queue.workflows.advance.advance_flow`). Both only for the outcomes the
completion applied: a fenced-off attempt expands nothing and releases nothing. A batch
without nodes is untouched, and costs nothing more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from sqla_queue.conversation import Flow, Step
from sqla_queue.logic.outcomes import Outcome, OutcomeKind
from sqla_queue.models.tables import QueueTables
from sqla_queue.workflows.advance import Advanced, advance_flow, needs_more
from sqla_queue.workflows.graph import Expansion
from sqla_queue.workflows.write import WorkflowWriter, expand_flow

__all__ = ["NodeFlush", "WorkflowNodes", "expansion_of", "node_completion_flow"]


class NodeFlush:
    """What a flush of node outcomes adds: ``steps`` sent right after the completion, and
    :meth:`after`, which reads the completion's rows and theirs (in that order) and says
    what else runs before the commit."""

    def __init__(
        self,
        steps: list[Step],
        after: Callable[[Sequence[Sequence[Any]]], Flow[Any] | None],
    ) -> None:
        self.steps = steps
        self._after = after
        #: Whether :meth:`after` had more to run: a release decided after the claim that
        #: was sent with the completion, which that claim could not see.
        self.followed = False

    def after(self, rows: Sequence[Sequence[Any]]) -> Flow[Any] | None:
        """The flow to run before the commit, if any."""
        flow = self._after(rows)
        self.followed = flow is not None
        return flow


def expansion_of(context: Any) -> Expansion | None:
    """The expansion a handler's context asked for (``ctx.expand``), if any."""
    found = getattr(context, "expansion", None)
    return found if isinstance(found, Expansion) else None


def node_completion_flow(
    writer: WorkflowWriter,
    tables: QueueTables,
    applied: Sequence[int],
    expansions: dict[int, Expansion],
) -> Flow[Advanced]:
    """Write the expansions of ``applied`` nodes, then advance past every one of them."""
    statements = writer.statements_for(tables)
    for job_id in applied:
        expansion = expansions.get(job_id)
        if expansion is not None:
            yield from expand_flow(statements, job_id, expansion, writer.defaults)
    return (yield from advance_flow(statements.release, applied))


class WorkflowNodes:
    """Which buffered outcomes are workflow nodes', and the expansions they asked for."""

    def __init__(self, lock: threading.Lock, tables: QueueTables, writer: Any) -> None:
        self._lock = lock
        self._tables = tables
        self._writer: WorkflowWriter | None = writer
        self._nodes: set[int] = set()
        self._expansions: dict[int, Expansion] = {}
        # The nodes of the flush in flight (one at a time: the run loop's), for restore.
        self._flushing: tuple[list[int], dict[int, Expansion]] = ([], {})

    def note(self, job_id: int, outcome: Outcome, expansion: Expansion | None) -> None:
        """A node's outcome was buffered (the caller holds the lock); an expansion only
        counts with a success."""
        self._nodes.add(job_id)
        if expansion is not None and outcome.kind == OutcomeKind.SUCCEEDED:
            self._expansions[job_id] = expansion

    def follow(self, outcomes: Sequence[Outcome]) -> NodeFlush | None:
        """What the flush of ``outcomes`` adds for the nodes among them; None when there
        are none. The nodes are forgotten: a flush that fails puts them back
        (:meth:`restore`)."""
        with self._lock:
            ids = [o.job_id for o in outcomes if o.job_id in self._nodes]
            if not ids:
                return None
            # Only a success writes its expansion. An outcome that stands in for a refused
            # one (a plain failure, after the database refused the expansion: a name taken
            # in the workflow, say) must not bring the expansion back, or every flush of
            # that failure would be refused in turn and stop the worker.
            succeeded = {o.job_id for o in outcomes if o.kind == OutcomeKind.SUCCEEDED}
            expansions = {
                i: self._expansions.pop(i) for i in ids if i in self._expansions and i in succeeded
            }
            for i in ids:
                self._expansions.pop(i, None)
            self._nodes.difference_update(ids)
        writer = self._writer
        if writer is None:
            raise RuntimeError("a workflow node was claimed by a worker without workflows")
        self._flushing = (ids, expansions)
        statements = writer.statements_for(self._tables)
        if expansions:
            # An expansion is written before the release, and only when the completion
            # applied: the flow reads the completion's rows first.
            def after_expanding(rows: Sequence[Sequence[Any]]) -> Flow[Any] | None:
                done = {row[0] for row in rows[0]}
                applied = [i for i in ids if i in done]
                if not applied:
                    return None
                return node_completion_flow(writer, self._tables, applied, expansions)

            return NodeFlush([], after_expanding)
        # Sent with the completion, in its round trip. Every node outcome of the batch is
        # advanced, fenced or not: the statement only reads jobs that have ended, and a
        # job that ended under another worker had its dependents advanced by it already.
        advance = Step(statements.release.advance, {"ids": sorted(ids)})

        def after_advance(rows: Sequence[Sequence[Any]]) -> Flow[Any] | None:
            first = rows[1]
            if not needs_more(first):
                return None
            return advance_flow(statements.release, ids, first)

        return NodeFlush([advance], after_advance)

    def after_reclaim(self, rows: Sequence[Sequence[Any]]) -> Flow[Any] | None:
        """What a maintenance unit runs after its statements (the reclaim's rows first):
        the release past the workflow nodes that the reclaim cancelled (a lost job someone
        had asked to cancel)."""
        ended = [row.id for row in rows[0] if row.ended_node]
        if not ended or self._writer is None:
            return None
        statements = self._writer.statements_for(self._tables)
        return advance_flow(statements.release, ended)

    def restore(self, outcomes: Sequence[Outcome]) -> None:
        """The flush failed: the nodes among ``outcomes`` are buffered again."""
        ids, expansions = self._flushing
        wanted = {o.job_id for o in outcomes}
        with self._lock:
            self._nodes.update(i for i in ids if i in wanted)
            self._expansions.update({i: e for i, e in expansions.items() if i in wanted})
