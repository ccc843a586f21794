"""The queue's workflow methods: the shapes (chain, group, chord), enqueue, status, cancel.

A mixin of :class:`~sqla_queue.Queue`, kept apart so the queue stays a thin façade: each
method builds a :class:`~sqla_queue.workflows.Workflow` or hands the call on to
:mod:`sqla_queue.workflows`.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from typing import Any, overload

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.enqueue import Enqueuer
from sqla_queue.models.tables import ParentFailure, ParentPolicy, QueueTables
from sqla_queue.spec import JobSpec
from sqla_queue.workflows import admin as workflow_admin
from sqla_queue.workflows.admin import WorkflowStatus
from sqla_queue.workflows.graph import Node, Policy, Workflow
from sqla_queue.workflows.write import WorkflowHandle

__all__ = ["WorkflowMethods"]

Bind = Session | Connection | AsyncSession | AsyncConnection
#: What status and cancel open a connection of their own from (as ``queue.cancel``).
SyncSource = Engine | Connection | Session | sessionmaker[Session]
AsyncSource = AsyncEngine | AsyncConnection | AsyncSession | async_sessionmaker[AsyncSession]


class WorkflowMethods:
    """Workflows of this queue (see the "Workflows" guide)."""

    tables: QueueTables
    notify: bool
    _enqueuer: Enqueuer

    def workflow(
        self, name: str = "workflow", *, about: object = None, unique: bool = False
    ) -> Workflow:
        """An empty :class:`~sqla_queue.workflows.Workflow` to add nodes to."""
        return Workflow(name, about=about, unique=unique)

    @overload
    def enqueue_workflow(
        self, session: Session | Connection, workflow: Workflow
    ) -> WorkflowHandle: ...

    @overload
    def enqueue_workflow(
        self, session: AsyncSession | AsyncConnection, workflow: Workflow
    ) -> Coroutine[Any, Any, WorkflowHandle]: ...

    def enqueue_workflow(
        self, session: Bind, workflow: Workflow
    ) -> WorkflowHandle | Coroutine[Any, Any, WorkflowHandle]:
        """Write ``workflow`` in ``session``'s transaction; its handle (a coroutine of it
        for an async bind). Nodes may be specs built by name (``JobSpec("task", ...)``)."""
        written: WorkflowHandle | Coroutine[Any, Any, WorkflowHandle]
        written = self._enqueuer.workflows.enqueue(session, workflow)
        return written

    def chain(
        self, *calls: JobSpec | Workflow, name: str = "chain", about: object = None
    ) -> Workflow:
        """A workflow that runs ``calls`` one after the other, each once the one before it
        succeeded (a failure cancels the rest).

        A call may be a whole shape (``queue.group(...)``, ``queue.chord(...)``, another
        chain, any :class:`~sqla_queue.workflows.Workflow`): it runs after the part before
        it has ended, and the next part waits for all of its last nodes. So "a step, a
        fan-out with a callback, a step" is
        ``queue.chain(step.call(), queue.chord([...], then=cb.call()), last.call())``.
        """
        if not calls:
            raise ValueError("a chain needs at least one call")
        workflow = Workflow(name, about=about)
        previous: list[Node] | None = None
        for call in calls:
            previous = workflow.include(call, after=previous)
        return workflow

    def group(
        self,
        calls: Iterable[JobSpec | Workflow],
        *,
        name: str = "group",
        about: object = None,
    ) -> Workflow:
        """A workflow of ``calls`` that run side by side, none waiting for another (a call
        may be a whole shape, such as a chain: its steps keep their order)."""
        workflow = Workflow(name, about=about)
        for call in calls:
            workflow.include(call)
        if not len(workflow):
            raise ValueError("a group needs at least one call")
        return workflow

    def chord(
        self,
        calls: Iterable[JobSpec | Workflow],
        *,
        then: JobSpec | Workflow,
        policy: Policy = ParentPolicy.ALL_SUCCEEDED,
        on_parent_failure: str = ParentFailure.CANCEL,
        name: str = "chord",
        about: object = None,
    ) -> Workflow:
        """A workflow of ``calls`` side by side, then ``then`` once they ended as ``policy``
        asks; ``then`` reads their results in ``ctx.parent_results``.

        A call may be a whole shape (a chain, say): ``then`` waits for its last nodes.
        ``then`` may be a shape too; its first nodes wait for the calls, under ``policy``.
        """
        workflow = self.group(calls, name=name, about=about)
        sinks = workflow.last_nodes
        if isinstance(then, Workflow):
            if policy != ParentPolicy.ALL_SUCCEEDED or on_parent_failure != ParentFailure.CANCEL:
                raise ValueError(
                    "chord(then=<a workflow>) takes the default policy and "
                    "on_parent_failure: build it with wf.add(callback, after=parts, "
                    "policy=...), then wf.include(rest, after=...)"
                )
            workflow.include(then, after=sinks)
        else:
            workflow.add(then, after=sinks, policy=policy, on_parent_failure=on_parent_failure)
        return workflow

    @overload
    def workflow_status(self, source: SyncSource, workflow_id: int) -> WorkflowStatus: ...

    @overload
    def workflow_status(
        self, source: AsyncSource, workflow_id: int
    ) -> Coroutine[Any, Any, WorkflowStatus]: ...

    def workflow_status(
        self, source: SyncSource | AsyncSource, workflow_id: int
    ) -> WorkflowStatus | Coroutine[Any, Any, WorkflowStatus]:
        """The :class:`~sqla_queue.workflows.WorkflowStatus` of ``workflow_id`` (a coroutine
        of it for an async ``source``), or :class:`~sqla_queue.errors.WorkflowNotFoundError`."""
        status: WorkflowStatus | Coroutine[Any, Any, WorkflowStatus]
        status = workflow_admin.workflow_status(source, self.tables, workflow_id)
        return status

    @overload
    def cancel_workflow(self, source: SyncSource, workflow_id: int) -> dict[str, int]: ...

    @overload
    def cancel_workflow(
        self, source: AsyncSource, workflow_id: int
    ) -> Coroutine[Any, Any, dict[str, int]]: ...

    def cancel_workflow(
        self, source: SyncSource | AsyncSource, workflow_id: int
    ) -> dict[str, int] | Coroutine[Any, Any, dict[str, int]]:
        """Cancel ``workflow_id``: its nodes that have not run are cancelled, its queued
        jobs too, and its running ones are asked to stop. ``{"cancelled": n, "requested":
        m}`` (a coroutine of it for an async ``source``). See
        :func:`sqla_queue.workflows.admin.cancel_workflow`."""
        done: dict[str, int] | Coroutine[Any, Any, dict[str, int]]
        done = workflow_admin.cancel_workflow(source, self.tables, workflow_id, notify=self.notify)
        return done
