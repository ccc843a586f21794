"""Write workflows on the caller's bind: a new one, or an expansion of a running one.

:class:`WorkflowWriter` holds the statements of one queue (and of each tenant schema a
connection's ``schema_translate_map`` moves it to). Each write is a conversation
(:mod:`sqla_queue.conversation`) run in the caller's transaction by
:func:`~sqla_queue.conversation.run_flow`, so a workflow is written whole or not at all,
sync or async.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import cached_property
from typing import Any

from sqla_queue._binds import AnyBind, on_connection, tables_for
from sqla_queue.conversation import Flow, Step, run_flow
from sqla_queue.enqueue import TaskDefaults
from sqla_queue.models.tables import QueueTables
from sqla_queue.statements.workflows import (
    hand_over_statement,
    live_workflow_statement,
    node_statement,
    unique_workflow_key,
    workflow_lock_statement,
    write_nodes_statement,
)
from sqla_queue.workflows.advance import ReleaseStatements
from sqla_queue.workflows.graph import (
    Expansion,
    Workflow,
    dump_node_rows,
    empty_message,
    node_rows,
)
from sqla_queue.workflows.results import WorkflowHandle

__all__ = ["WorkflowHandle", "WorkflowStatements", "WorkflowWriter"]


class WorkflowStatements:
    """The statements of workflows for one queue's tables, each built on first use."""

    def __init__(self, tables: QueueTables, *, notify: bool) -> None:
        self.tables = tables
        self.notify = notify
        self.release = ReleaseStatements(tables, notify=notify)

    @cached_property
    def write_new(self) -> Any:
        """:func:`~sqla_queue.statements.workflows.write_nodes_statement` for a new one."""
        return write_nodes_statement(self.tables, new=True, notify=self.notify)

    @cached_property
    def write_into(self) -> Any:
        """:func:`~sqla_queue.statements.workflows.write_nodes_statement` into one."""
        return write_nodes_statement(self.tables, new=False, notify=self.notify)

    @cached_property
    def hand_over(self) -> Any:
        """:func:`~sqla_queue.statements.workflows.hand_over_statement`."""
        return hand_over_statement(self.tables)

    @cached_property
    def node(self) -> Any:
        """:func:`~sqla_queue.statements.workflows.node_statement`."""
        return node_statement(self.tables)

    @cached_property
    def lock(self) -> Any:
        """:func:`~sqla_queue.statements.workflows.workflow_lock_statement`."""
        return workflow_lock_statement()

    @cached_property
    def live(self) -> Any:
        """:func:`~sqla_queue.statements.workflows.live_workflow_statement`."""
        return live_workflow_statement(self.tables)


class WorkflowWriter:
    """Writes the workflows of one queue through the caller's Session or Connection."""

    def __init__(
        self, tables: QueueTables, *, notify: bool, defaults: Callable[[str], TaskDefaults]
    ) -> None:
        self.tables = tables
        self.notify = notify
        self.defaults = defaults
        self._statements: dict[QueueTables, WorkflowStatements] = {}

    def statements_for(self, tables: QueueTables) -> WorkflowStatements:
        """The statements for ``tables`` (the queue's, or a tenant's translation of them)."""
        found = self._statements.get(tables)
        if found is None:
            found = self._statements.setdefault(
                tables, WorkflowStatements(tables, notify=self.notify)
            )
        return found

    def enqueue(
        self, session: AnyBind, workflow: Workflow
    ) -> WorkflowHandle | Coroutine[Any, Any, WorkflowHandle]:
        """Write ``workflow`` in ``session``'s transaction; its handle (or a coroutine).

        Every call is checked before anything is written.
        """
        if not isinstance(workflow, Workflow):
            raise TypeError(f"a Workflow was expected, got {workflow!r}")
        if len(workflow) == 0:
            raise ValueError(empty_message(workflow.name))
        rows = dump_node_rows(node_rows(workflow, self.defaults))

        def write(connection: Any) -> Any:
            # A tenant's connection (schema_translate_map) gets its schema's statements.
            statements = self.statements_for(tables_for(self.tables, connection))
            return run_flow(connection, enqueue_flow(statements, workflow, rows))

        return on_connection(session, write)


def enqueue_flow(statements: WorkflowStatements, workflow: Workflow, rows: str) -> Flow[Any]:
    """Write ``workflow`` (its nodes' JSON ``rows``); its :class:`WorkflowHandle`."""
    about_table, about_key = workflow.about if workflow.about else (None, None)
    if workflow.unique:
        key = unique_workflow_key(statements.tables, workflow.name, about_table, about_key)
        yield Step(statements.lock, {"key": key})
        found = yield Step(
            statements.live,
            {"name": workflow.name, "about_table": about_table, "about_key": about_key},
        )
        if found:
            return WorkflowHandle(found[0][0], workflow.name, {}, existing=True)
    written = yield Step(
        statements.write_new,
        {
            "nodes": rows,
            "name": workflow.name,
            "about_table": about_table,
            "about_key": about_key,
        },
    )
    names = [node.name for node in workflow.nodes]
    jobs = {names[row.seq]: row.job_id for row in written}
    return WorkflowHandle(written[0].workflow_id, workflow.name, jobs)


def expand_flow(
    statements: WorkflowStatements,
    job_id: int,
    expansion: Expansion,
    defaults: Callable[[str], TaskDefaults],
) -> Flow[list[int]]:
    """Write ``expansion`` into the workflow of the job ``job_id``, after that job; its
    dependents then wait for the expansion's last nodes. Returns the new job ids (none
    when the workflow was cancelled meanwhile). Run after the job's completion applied,
    in its transaction: a fenced-off completion writes no expansion."""
    found = yield Step(statements.node, {"job_id": job_id})
    if not found:
        return []
    workflow_id, node_name = found[0]
    graph = expansion.workflow()
    rows = node_rows(graph, defaults, after_jobs=[job_id], prefix=f"{node_name}/")
    written = yield Step(
        statements.write_into,
        {"nodes": dump_node_rows(rows), "wf": workflow_id},
    )
    ids = [row.job_id for row in written]
    if not ids:
        return []
    sinks = [ids[-1]] if expansion.then is not None else ids
    yield Step(statements.hand_over, {"expander": job_id, "sinks": sinks, "fresh": ids})
    return ids
