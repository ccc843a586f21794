"""A workflow's graph as inline SVG, laid out on the server: no script, no external asset.

The layout is layered: a node's column is its depth, the longest path from a root to it,
so every edge points right; within a column, nodes are ordered by the mean row of their
parents (one barycentre pass, which untangles chains, fans and chords), then by job id.
Each node is a box filled with its state's colour (the stylesheet's ``state-*`` classes,
which the badges use too) and a link to its job's page. A graph of more than ``cap``
nodes draws the ``cap`` shallowest: a drawn node's parents are all drawn, since each is
shallower than it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from markupsafe import Markup, escape

__all__ = ["DEFAULT_CAP", "DrawnGraph", "GraphNode", "depths", "draw_workflow"]

#: The most nodes a page draws; the node table lists them all.
DEFAULT_CAP = 300

_NODE_W, _NODE_H = 176, 40
_COL_GAP, _ROW_GAP = 56, 14
_MARGIN = 12
_NAME_CHARS = 24


class GraphNode(Protocol):
    """What the drawing reads of a node (a :class:`~sqla_queue.workflows.NodeStatus`)."""

    @property
    def name(self) -> str:
        """The node's name, unique in its workflow."""
        ...

    @property
    def job_id(self) -> int:
        """Its job's id."""
        ...

    @property
    def shown_state(self) -> str:
        """Its state in one word (blocked, held, queued, succeeded, ...)."""
        ...

    @property
    def task(self) -> str | None:
        """Its job's task (None once the job was pruned)."""
        ...

    @property
    def parents(self) -> list[str]:
        """Its parents' names."""
        ...


@dataclass(frozen=True)
class DrawnGraph:
    """The SVG of a workflow and how much of it is drawn."""

    svg: Markup
    #: Nodes drawn, and nodes in the workflow.
    drawn: int
    total: int

    @property
    def capped(self) -> bool:
        """Whether some nodes were left out of the drawing."""
        return self.drawn < self.total


def depths(nodes: Sequence[GraphNode]) -> dict[str, int]:
    """Each node's depth by name: 0 for a root, else one more than its deepest parent.

    Parents that are not among ``nodes`` are ignored. A graph is acyclic by construction;
    should a cycle ever be read, its nodes go one column right of everything else rather
    than loop.
    """
    names = {n.name for n in nodes}
    parents = {n.name: [p for p in n.parents if p in names] for n in nodes}
    children: dict[str, list[str]] = {n.name: [] for n in nodes}
    for name, ups in parents.items():
        for parent in ups:
            children[parent].append(name)
    waiting = {name: len(ups) for name, ups in parents.items()}
    depth = {name: 0 for name, left in waiting.items() if left == 0}
    ready = list(depth)
    while ready:
        name = ready.pop()
        for child in children[name]:
            depth[child] = max(depth.get(child, 0), depth[name] + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    beyond = max(depth.values(), default=-1) + 1
    return {n.name: depth.get(n.name, beyond) for n in nodes}


def _columns(nodes: Sequence[GraphNode], depth: dict[str, int]) -> list[list[GraphNode]]:
    """The nodes in columns by depth, each column ordered by its parents' mean row."""
    columns: list[list[GraphNode]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for node in nodes:
        columns[depth[node.name]].append(node)
    row: dict[str, int] = {}
    for column in columns:

        def key(node: GraphNode) -> tuple[float, int]:
            placed = [row[p] for p in node.parents if p in row]
            return (sum(placed) / len(placed) if placed else -1.0, node.job_id)

        column.sort(key=key)
        row.update({node.name: i for i, node in enumerate(column)})
    return columns


def _short(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _css_word(state: str) -> str:
    """A state as a class name: only letters and underscores (a state is a fixed word, but
    the class attribute is written from data)."""
    return "".join(c for c in state if c.isalpha() or c == "_") or "unknown"


def _node_svg(node: GraphNode, x: float, y: float, href: str) -> str:
    state = _css_word(node.shown_state)
    tip = f"{node.name} · job {node.job_id} · {node.task or 'pruned'} · {node.shown_state}"
    return (
        f'<a href="{escape(href)}" class="node-link">'
        f'<g class="node state-{state}" data-node="{escape(node.name)}" '
        f'data-job="{node.job_id}" transform="translate({x:.0f},{y:.0f})">'
        f"<title>{escape(tip)}</title>"
        f'<rect width="{_NODE_W}" height="{_NODE_H}" rx="6"/>'
        f'<text class="name" x="8" y="16">{escape(_short(node.name, _NAME_CHARS))}</text>'
        f'<text class="meta" x="8" y="31">#{node.job_id} · {escape(node.shown_state)}</text>'
        "</g></a>"
    )


def _edge_svg(start: tuple[float, float], end: tuple[float, float], parent_state: str) -> str:
    (x1, y1), (x2, y2) = start, end
    bend = (x2 - x1) / 2
    return (
        f'<path class="edge from-{_css_word(parent_state)}" marker-end="url(#wf-arrow)" '
        f'd="M{x1:.0f},{y1:.0f} C{x1 + bend:.0f},{y1:.0f} {x2 - bend:.0f},{y2:.0f} '
        f'{x2 - 3:.0f},{y2:.0f}"/>'
    )


def draw_workflow(
    nodes: Sequence[GraphNode],
    *,
    job_href: Callable[[int], str],
    label: str,
    cap: int = DEFAULT_CAP,
) -> DrawnGraph:
    """The graph of ``nodes`` as an SVG element of class ``workflow``, at its natural size.

    ``job_href(job_id)`` is the link of a node's job page; ``label`` names the drawing
    for assistive technology. At most ``cap`` nodes are drawn (the shallowest, by depth
    then job id), with the edges between them.
    """
    depth = depths(nodes)
    drawn = sorted(nodes, key=lambda n: (depth[n.name], n.job_id))[:cap]
    columns = _columns(drawn, depth)
    tallest = max((len(c) for c in columns), default=0)
    pitch = _NODE_H + _ROW_GAP
    width = 2 * _MARGIN + len(columns) * _NODE_W + max(len(columns) - 1, 0) * _COL_GAP
    height = 2 * _MARGIN + tallest * pitch - (_ROW_GAP if tallest else 0)
    place: dict[str, tuple[float, float]] = {}
    for index, column in enumerate(columns):
        # Each column centred on the tallest: a chord's callback sits level with its fan.
        top = _MARGIN + (tallest - len(column)) * pitch / 2
        for row, node in enumerate(column):
            place[node.name] = (_MARGIN + index * (_NODE_W + _COL_GAP), top + row * pitch)
    state = {n.name: n.shown_state for n in drawn}
    edges = [
        _edge_svg(
            (place[parent][0] + _NODE_W, place[parent][1] + _NODE_H / 2),
            (place[node.name][0], place[node.name][1] + _NODE_H / 2),
            state[parent],
        )
        for node in drawn
        for parent in node.parents
        if parent in place
    ]
    boxes = [_node_svg(n, *place[n.name], job_href(n.job_id)) for n in drawn]
    svg = (
        f'<svg class="workflow" id="workflow-graph" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" '
        'xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(label)}</title>"
        '<defs><marker id="wf-arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" '
        'markerHeight="7" orient="auto"><path class="arrow" d="M0,0 L8,4 L0,8 z"/></marker>'
        "</defs>"
        f'<g class="edges">{"".join(edges)}</g><g class="nodes">{"".join(boxes)}</g></svg>'
    )
    return DrawnGraph(svg=Markup(svg), drawn=len(drawn), total=len(nodes))
