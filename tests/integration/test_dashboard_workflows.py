"""The dashboard's workflow pages through Starlette's TestClient, against a real database:
the list, a workflow drawn as an SVG graph (one node per node, filled by state, each
linked to its job), the cap on big graphs, and the link from a node's job page."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

with warnings.catch_warnings():
    # Starlette 1.x suggests another HTTP client for its TestClient; httpx still works.
    warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
    from starlette.testclient import TestClient

from sqla_queue.dashboard.graph import DEFAULT_CAP, depths, draw_workflow
from sqla_queue.dashboard.workflow_views import NODE_PAGE
from sqla_queue.workflows import Workflow, WorkflowHandle
from tests.support.app import noop
from tests.support.workflow_app import queue, wf_fail, wf_gather, wf_value

pytestmark = pytest.mark.integration

#: A drawn node: its state class, name and job id.
NODE = re.compile(r'<g class="node state-(\w+)" data-node="([^"]*)" data-job="(\d+)"')


@pytest.fixture
def client(engine: Engine) -> Iterator[TestClient]:
    """A read-only client of the dashboard, two workflows a page."""
    with TestClient(queue.dashboard(engine, page_size=2), follow_redirects=False) as c:
        yield c


def drain(factory: sessionmaker[Session]) -> None:
    """Run a sync worker until no job is left."""
    queue.worker(factory, concurrency=2).run(burst=True)


def failing(factory: sessionmaker[Session]) -> WorkflowHandle:
    """a and b (fails); c after both (cancelled); d after c; gather after a and b."""
    wf = Workflow("failing", about=None)
    a = wf.add(wf_value.call("a"), name="a")
    b = wf.add(wf_fail.call(), name="b")
    c = wf.add(wf_value.call("c"), after=[a, b], name="c")
    wf.add(wf_value.call("d"), after=c, name="d")
    wf.add(wf_gather.call(), after=[a, b], policy="all_finished", name="gather")
    with factory.begin() as session:
        handle = wf.enqueue(session)
    drain(factory)
    return handle


def _nodes(html: str) -> dict[str, tuple[str, int]]:
    """The drawn nodes: by name, their state class and job id."""
    return {name: (state, int(job)) for state, name, job in NODE.findall(html)}


def test_workflow_page_draws_the_graph(
    client: TestClient, SessionLocal: sessionmaker[Session]
) -> None:
    handle = failing(SessionLocal)
    page = client.get(f"/workflows/{handle.id}")
    assert page.status_code == 200, page.text
    html = page.text
    assert html.count('<svg class="workflow"') == 1
    drawn = _nodes(html)
    assert drawn == {
        "a": ("succeeded", handle.jobs["a"]),
        "b": ("failed", handle.jobs["b"]),
        "c": ("cancelled", handle.jobs["c"]),
        "d": ("cancelled", handle.jobs["d"]),
        "gather": ("succeeded", handle.jobs["gather"]),
    }
    # Each node links to its job's page, and the edges join them: a, b -> c, gather; c -> d.
    for job_id in handle.jobs.values():
        assert f'<a href="/jobs/{job_id}" class="node-link">' in html
    assert html.count('<path class="edge ') == 5
    assert html.count('class="edge from-failed"') == 2
    # Columns by depth: a and b, then c and gather, then d.
    x = {
        name: float(m)
        for name, m in re.findall(
            r'data-node="([^"]+)" data-job="\d+" transform="translate\((\d+)', html
        )
    }
    assert x["a"] == x["b"] < x["c"] == x["gather"] < x["d"]
    # The legend names every state the nodes can show; the header the workflow's own.
    legend = re.search(r'<ul class="legend" id="legend">(.*?)</ul>', html, re.S)
    assert legend is not None
    for word in ("blocked", "held", "queued", "succeeded", "failed", "cancelled", "pruned"):
        assert f'class="swatch state-{word}"' in legend.group(1)
    assert '<dd id="workflow-state">failed</dd>' in html
    assert "graph-capped" not in html
    # The node table: one row per node, with its parents.
    rows = re.findall(r'<tr data-node="([^"]+)">', html)
    assert sorted(rows) == sorted(handle.jobs)
    assert '<td class="text">a, b</td>' in html


def test_the_list_links_each_workflow_and_pages(
    client: TestClient, SessionLocal: sessionmaker[Session]
) -> None:
    failed = failing(SessionLocal)
    with SessionLocal.begin() as session:
        running = queue.chain(wf_value.call(1), wf_value.call(2), name="steps").enqueue(session)
        newest = queue.group([wf_value.call(3)], name="newest").enqueue(session)
    page = client.get("/workflows")
    assert page.status_code == 200, page.text
    # Two a page (page_size=2), newest first.
    assert re.findall(r'<tr data-workflow="(\d+)">', page.text) == [str(newest.id), str(running.id)]
    assert f'href="/workflows/{running.id}"' in page.text
    assert '<span class="state state-running">running</span>' in page.text
    assert '<span class="state state-blocked">1 blocked</span>' in page.text
    older = re.search(r'<a href="([^"]+)" id="older"', page.text)
    assert older is not None
    second = client.get(older.group(1).replace("&amp;", "&"))
    assert re.findall(r'<tr data-workflow="(\d+)">', second.text) == [str(failed.id)]
    assert '<span class="state state-failed">failed</span>' in second.text
    assert '<span class="state state-cancelled">2 cancelled</span>' in second.text
    assert 'id="older"' not in second.text
    assert 'aria-current="page">Workflows</a>' in page.text
    assert client.get("/workflows", params={"before": "x"}).status_code == 400


def test_a_node_job_page_links_its_workflow(
    client: TestClient, SessionLocal: sessionmaker[Session]
) -> None:
    handle = failing(SessionLocal)
    with SessionLocal.begin() as session:
        plain = noop.enqueue(session)
    page = client.get(f"/jobs/{handle.jobs['c']}")
    assert page.status_code == 200
    link = re.search(
        r'<dd id="job-workflow"><a href="([^"]+)">workflow (\d+)</a>, node (\w+)', page.text
    )
    assert link is not None
    assert link.groups() == (f"/workflows/{handle.id}", str(handle.id), "c")
    assert client.get(link.group(1)).status_code == 200
    assert 'id="job-workflow"' not in client.get(f"/jobs/{plain}").text


def test_missing_workflows_are_404(client: TestClient) -> None:
    for path in ("/workflows/424242", "/workflows/abc", "/workflows/0", "/workflows/" + "9" * 30):
        page = client.get(path)
        assert page.status_code == 404, path
        assert "There is no workflow" in page.text


def test_a_big_workflow_is_drawn_capped_and_its_table_paged(
    client: TestClient, SessionLocal: sessionmaker[Session]
) -> None:
    total = DEFAULT_CAP + 20
    wf = queue.chord([wf_value.call(i) for i in range(total - 1)], then=wf_gather.call())
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    page = client.get(f"/workflows/{handle.id}")
    assert page.status_code == 200
    drawn = _nodes(page.text)
    assert len(drawn) == DEFAULT_CAP
    # The shallowest are drawn: the roots, not the callback that waits for them all.
    assert "wf_gather" not in drawn
    assert {state for state, _ in drawn.values()} == {"queued"}
    assert f"first {DEFAULT_CAP} of {total} nodes" in page.text
    rows = re.findall(r'<tr data-node="', page.text)
    assert len(rows) == NODE_PAGE
    assert "page 1 of 2" in page.text
    second = client.get(f"/workflows/{handle.id}", params={"page": "2"})
    assert len(re.findall(r'<tr data-node="', second.text)) == total - NODE_PAGE
    assert '<tr data-node="wf_gather">' in second.text
    assert '<span class="state state-blocked">blocked</span>' in second.text


@dataclass
class _Node:
    name: str
    job_id: int
    parents: list[str] = field(default_factory=list)
    shown_state: str = "queued"
    task: str | None = "t"


def test_depth_is_the_longest_path_from_a_root() -> None:
    nodes = [
        _Node("a", 1),
        _Node("b", 2, ["a"]),
        _Node("c", 3, ["b"]),
        _Node("d", 4, ["a", "c"]),  # a shortcut: still after c
        _Node("e", 5),
    ]
    assert depths(nodes) == {"a": 0, "b": 1, "c": 2, "d": 3, "e": 0}
    graph = draw_workflow(nodes, job_href=lambda i: f"/jobs/{i}", label="x", cap=3)
    assert (graph.drawn, graph.total, graph.capped) == (3, 5, True)
    assert sorted(_nodes(graph.svg)) == ["a", "b", "e"]
    # Names come from users: escaped in the drawing.
    odd = draw_workflow([_Node('<b>"x"</b>', 1)], job_href=lambda i: "/j", label="<l>")
    assert "<b>" not in odd.svg and "&lt;b&gt;" in odd.svg
