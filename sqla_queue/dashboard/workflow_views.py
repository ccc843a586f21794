"""The dashboard's workflow pages: the recent workflows, and one workflow drawn as a graph.

Both read in one short transaction, as every page does (see :mod:`.views`): the list
through :func:`~sqla_queue.workflows.listing.list_workflows` (the workflows' primary key,
newest first, a page at a time), a workflow through
:func:`~sqla_queue.workflows.listing.read_workflow` (its row, nodes and edges). The graph
is laid out and drawn on the server (:mod:`.graph`); the node table below it is paged.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy.engine import Connection
from starlette.requests import Request
from starlette.responses import Response

from sqla_queue.checks import INT8_MAX as BIGINT_MAX
from sqla_queue.dashboard import params
from sqla_queue.dashboard.graph import DEFAULT_CAP, draw_workflow
from sqla_queue.dashboard.params import RequestRefused
from sqla_queue.dashboard.views import Views
from sqla_queue.errors import WorkflowNotFoundError
from sqla_queue.workflows.admin import WorkflowStatus
from sqla_queue.workflows.listing import (
    SHOWN_STATES,
    WorkflowSummary,
    list_workflows,
    read_workflow,
)

__all__ = ["NODE_PAGE", "WorkflowPages"]

#: Nodes per page of a workflow's node table.
NODE_PAGE = 200


class WorkflowPages:
    """The workflow endpoints of one dashboard, on the :class:`~.views.Views` they share
    its queue, database, settings and page rendering with."""

    def __init__(self, views: Views, *, cap: int = DEFAULT_CAP) -> None:
        self.views = views
        #: The most nodes a workflow's page draws.
        self.cap = cap

    async def workflows(self, request: Request) -> Response:
        """The recent workflows, newest first, a page at a time (keyset on the id)."""
        views = self.views
        access = await views.access(request)
        before = params.optional_whole_number(
            request.query_params, "before", low=1, high=BIGINT_MAX
        )
        tables, size = views.queue.tables, views.config.page_size

        def read(connection: Connection) -> list[WorkflowSummary]:
            rows: list[WorkflowSummary] = list_workflows(
                connection, tables, limit=size + 1, before=before
            )
            return rows

        rows = await views.db.read(read)
        shown = rows[:size]
        context: dict[str, Any] = {
            "page_title": "Workflows",
            "nav": "workflows",
            "rows": shown,
            "states": SHOWN_STATES,
            "first_page": before is None,
            "next_before": shown[-1].id if len(rows) > size and shown else None,
        }
        return views.render(request, "workflows.html", context, access)

    async def workflow(self, request: Request) -> Response:
        """One workflow: its facts, its graph (at most :attr:`cap` nodes), a legend, and
        its nodes in a table of :data:`NODE_PAGE` rows a page."""
        views = self.views
        access = await views.access(request)
        workflow_id = params.workflow_id(request.path_params["workflow_id"])
        page = params.optional_whole_number(request.query_params, "page", low=1, high=BIGINT_MAX)
        tables = views.queue.tables

        def read(connection: Connection) -> WorkflowStatus:
            status: WorkflowStatus = read_workflow(connection, tables, workflow_id)
            return status

        try:
            status = await views.db.read(read)
        except WorkflowNotFoundError:
            raise RequestRefused(404, f"There is no workflow {workflow_id}.") from None
        pages = max(1, -(-len(status.nodes) // NODE_PAGE))
        number = min(page or 1, pages)
        counts = Counter(node.shown_state for node in status.nodes)

        def job_href(job_id: int) -> str:
            return request.url_for("job", job_id=job_id).path

        graph = draw_workflow(
            status.nodes,
            job_href=job_href,
            label=f"workflow {status.id} ({status.name}): {len(status.nodes)} nodes",
            cap=self.cap,
        )
        context: dict[str, Any] = {
            "page_title": f"Workflow {status.id}",
            "nav": "workflows",
            "wf": status,
            "graph": graph,
            "legend": [(s, counts[s]) for s in SHOWN_STATES],
            "nodes": status.nodes[(number - 1) * NODE_PAGE : number * NODE_PAGE],
            "node_page": number,
            "node_pages": pages,
        }
        return views.render(request, "workflow.html", context, access)
