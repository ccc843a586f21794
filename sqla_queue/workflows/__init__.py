"""Workflows: graphs of jobs enqueued in the caller's transaction and released by the
transaction that finishes each job's parents (see the "Workflows" guide)."""

from sqla_queue.workflows.admin import NodeStatus, WorkflowStatus
from sqla_queue.workflows.advance import Advanced, ReleaseStatements, advance_flow
from sqla_queue.workflows.graph import Expansion, Node, Quorum, Workflow, quorum
from sqla_queue.workflows.results import ParentError, WorkflowHandle
from sqla_queue.workflows.write import WorkflowStatements, WorkflowWriter

__all__ = [
    "Advanced",
    "Expansion",
    "Node",
    "NodeStatus",
    "ParentError",
    "Quorum",
    "ReleaseStatements",
    "Workflow",
    "WorkflowHandle",
    "WorkflowStatements",
    "WorkflowStatus",
    "WorkflowWriter",
    "advance_flow",
    "quorum",
]
