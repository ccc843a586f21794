"""Issue 36, section 2 (and the workflow items of section 5): workflows at their edges,
on a real PostgreSQL.

- a held node with blocked nodes after it reads ``held`` everywhere (status, listing,
  CLI, dashboard), not ``running``;
- a node name that an expansion would generate is refused when the workflow is built, and
  an expansion the database refuses fails its job, never the worker;
- bad names (a lone surrogate) and an empty workflow get clear errors and write nothing.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.workflows import Workflow
from sqla_queue.workflows.listing import list_workflows
from tests.support.workflow_app import queue, wf_fail, wf_gather, wf_split, wf_sum, wf_tx, wf_value

pytestmark = pytest.mark.integration

TARGET = "tests.support.workflow_app:queue"
JOBS = queue.tables.jobs
NODES = queue.tables.workflow_nodes


def drain(factory: sessionmaker[Session], **settings: Any) -> None:
    """Run a sync worker until no job is left (it raises if the worker stops)."""
    queue.worker(factory, concurrency=2, **settings).run(burst=True)


def job_of(engine: Engine, job_id: int) -> Any:
    with engine.connect() as connection:
        return connection.execute(
            select(JOBS.c.status, JOBS.c.result, JOBS.c.errors).where(JOBS.c.id == job_id)
        ).one()


def count_rows(engine: Engine) -> tuple[int, int, int]:
    """How many jobs, workflows and nodes the queue holds."""
    with engine.connect() as connection:
        return (
            int(connection.execute(select(func.count()).select_from(JOBS)).scalar_one()),
            int(
                connection.execute(
                    select(func.count()).select_from(queue.tables.workflows)
                ).scalar_one()
            ),
            int(connection.execute(select(func.count()).select_from(NODES)).scalar_one()),
        )


# -- a held node followed by blocked ones --------------------------------------------------


def held_with_followers() -> Workflow:
    """first fails; then (hold) after it; two more blocked after then; a side branch."""
    wf = Workflow("held-chain")
    first = wf.add(wf_fail.call(), name="first")
    held = wf.add(wf_sum.call(), after=first, on_parent_failure="hold", name="then")
    after = wf.add(wf_sum.call(), after=held, name="after")
    wf.add(wf_sum.call(), after=[after, first], policy="all_finished", name="last")
    wf.add(wf_value.call("side"), name="side")
    return wf


def test_held_node_with_blocked_followers_reads_held_everywhere(
    db_url: str,
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with SessionLocal.begin() as session:
        handle = held_with_followers().enqueue(session)
    drain(SessionLocal)
    status = queue.workflow_status(engine, handle.id)
    assert {n.name: n.shown_state for n in status.nodes} == {
        "first": "failed",
        "then": "held",
        "after": "blocked",
        "last": "blocked",
        "side": "succeeded",
    }
    assert status.state == "held"
    assert status.as_dict()["state"] == "held"

    with engine.connect() as connection:
        (summary,) = list_workflows(connection, queue.tables)
    assert summary.state == "held"

    from sqla_queue.cli.main import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["workflows", TARGET, "--url", db_url]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[1].split()[:3] == [str(handle.id), "held-chain", "held"]
    assert main(["workflows", TARGET, "--url", db_url, str(handle.id)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.split()[:4] == ["workflow", str(handle.id), "held-chain", "held"]

    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
        from starlette.testclient import TestClient
    with TestClient(queue.dashboard(engine)) as client:
        page = client.get(f"/workflows/{handle.id}").text
        assert re.search(r'<dd id="workflow-state">held</dd>', page)
        assert "running" not in re.findall(r'id="workflow-state">(\w+)<', page)

    # The operator requeues the failed parent (now fixed): the workflow runs again.
    with SessionLocal.begin() as session:
        session.execute(
            update(JOBS)
            .where(JOBS.c.id == handle.jobs["first"])
            .values(task="wf_value", payload={"args": [1], "kwargs": {}})
        )
        assert queue.requeue(session, [handle.jobs["first"]]) == [handle.jobs["first"]]
    assert queue.workflow_status(engine, handle.id).state == "running"
    drain(SessionLocal)
    assert queue.workflow_status(engine, handle.id).state == "succeeded"


def test_held_node_beside_a_running_branch_reads_running(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = held_with_followers()
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    drain(SessionLocal)
    # Another root of the same workflow still queued: something can still run.
    with engine.begin() as connection:
        connection.execute(
            update(JOBS).where(JOBS.c.id == handle.jobs["side"]).values(status="queued")
        )
    assert queue.workflow_status(engine, handle.id).state == "running"


# -- node names that an expansion generates ------------------------------------------------


@pytest.mark.parametrize("name", ["plan/pack@0", "plan/pack@then", "/", "a/b"])
def test_a_name_like_an_expansions_is_refused_when_built(
    engine: Engine, SessionLocal: sessionmaker[Session], name: str
) -> None:
    wf = Workflow("fulfil")
    wf.add(wf_split.call(2), name="plan")
    with pytest.raises(ValueError, match=re.escape(repr(name))) as caught:
        wf.add(wf_value.call(1), name=name)
    assert "expansion" in str(caught.value)
    # The workflow as it stands (the refused node left out) is written whole.
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    assert list(handle.jobs) == ["plan"]


def test_an_expansion_the_database_refuses_fails_its_job_not_the_worker(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """A workflow written before names were checked (forced here by an UPDATE) holds a node
    named as the expansion's first node: the expanding job fails, naming why, its
    dependents are ruled out, and the worker goes on with every other job."""
    wf = Workflow("legacy")
    plan = wf.add(wf_split.call(2), name="plan")
    squatter = wf.add(wf_value.call("squat"), name="squatter")
    wf.add(wf_sum.call(), after=plan, name="after")
    wf.add(wf_value.call("next"), after=squatter, name="next")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
        others = [wf_value.enqueue(session, i) for i in range(5)]
        session.execute(
            update(NODES)
            .where(NODES.c.job_id == handle.jobs["squatter"])
            .values(name="plan/wf_value@0")
        )
    drain(SessionLocal)  # raised WorkerStoppedError before
    plan_job = job_of(engine, handle.jobs["plan"])
    assert plan_job.status == "failed"
    assert "workflow_nodes_name_uq" in plan_job.errors[-1]["message"]
    assert job_of(engine, handle.jobs["after"]).status == "cancelled"
    assert job_of(engine, handle.jobs["squatter"]).status == "succeeded"
    assert job_of(engine, handle.jobs["next"]).status == "succeeded"
    assert [job_of(engine, i).status for i in others] == ["succeeded"] * 5
    # Nothing of the refused expansion was written.
    with engine.connect() as connection:
        names = connection.execute(
            select(NODES.c.name).where(NODES.c.workflow_id == handle.id)
        ).scalars()
        assert sorted(names) == ["after", "next", "plan", "plan/wf_value@0"]
    # A second worker finds nothing left to do, and stops normally.
    drain(SessionLocal)


def test_a_transactional_expansion_the_database_refuses_fails_its_job(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = Workflow("legacy-tx")
    tx = wf.add(wf_tx.options(max_attempts=1).call("x", parts=2), name="tx")
    squatter = wf.add(wf_value.call("squat"), name="squatter")
    wf.add(wf_sum.call(), after=tx, name="after")
    wf.add(wf_value.call("next"), after=squatter, name="next")
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
        session.execute(
            update(NODES)
            .where(NODES.c.job_id == handle.jobs["squatter"])
            .values(name="tx/wf_sum@then")
        )
    drain(SessionLocal)
    assert job_of(engine, handle.jobs["tx"]).status == "failed"
    assert job_of(engine, handle.jobs["after"]).status == "cancelled"
    assert job_of(engine, handle.jobs["next"]).status == "succeeded"


# -- bad names and empty workflows: a clear error, nothing written -------------------------


@pytest.mark.parametrize("bad", ["\ud800", "ok\udfffok", "a\x00b"])
def test_unstorable_names_are_refused_before_anything_is_sent(
    engine: Engine, SessionLocal: sessionmaker[Session], bad: str
) -> None:
    with SessionLocal.begin() as session:
        kept = wf_value.enqueue(session, "kept")
        with pytest.raises(ValueError, match="node's name"):
            Workflow("w").add(wf_value.call(1), name=bad)
        with pytest.raises(ValueError, match="workflow's name"):
            Workflow(bad)
        with pytest.raises(ValueError, match="workflow's name"):
            queue.chain(wf_value.call(1), name=bad)
        # The caller's transaction is untouched: it goes on and commits.
        session.execute(text("SELECT 1"))
    assert job_of(engine, kept).status == "queued"
    assert count_rows(engine) == (1, 0, 0)


def test_an_empty_workflow_says_what_to_do(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    with SessionLocal.begin() as session:
        for enqueue in (
            lambda wf: wf.enqueue(session),
            lambda wf: queue.enqueue_workflow(session, wf),
        ):
            with pytest.raises(ValueError) as caught:
                enqueue(Workflow("nothing"))
            message = str(caught.value)
            assert "'nothing' has no nodes" in message
            assert "workflow.add(" in message
            assert "name one queue" not in message
    assert count_rows(engine) == (0, 0, 0)


# -- shapes nest ---------------------------------------------------------------------------


def test_step_then_chord_then_step_runs_in_order(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    """The issue's shape: a step, a fan-out with its callback, then a step."""
    wf = queue.chain(
        wf_value.call(1),
        queue.chord([wf_value.call(i) for i in range(3)], then=wf_sum.call()),
        wf_gather.call(),
        name="shop",
    )
    assert [n.name for n in wf.nodes] == [
        "wf_value",
        "wf_value#2",
        "wf_value#3",
        "wf_value#4",
        "wf_sum",
        "wf_gather",
    ]
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    status = queue.workflow_status(engine, handle.id)
    assert status.node("wf_value#2").parents == ["wf_value"]
    assert status.node("wf_sum").parents == ["wf_value#2", "wf_value#3", "wf_value#4"]
    assert status.node("wf_gather").parents == ["wf_sum"]
    drain(SessionLocal)
    assert job_of(engine, handle.jobs["wf_sum"]).result == 0 + 1 + 2
    assert job_of(engine, handle.jobs["wf_gather"]).result == {"wf_sum": 3}
    assert queue.workflow_status(engine, handle.id).state == "succeeded"


def test_shapes_nest_every_way(engine: Engine, SessionLocal: sessionmaker[Session]) -> None:
    # A group of chains: each chain keeps its order; a chord's callback waits for each
    # chain's last step; a chord's callback may itself be a chain.
    fan = queue.chord(
        [
            queue.chain(wf_value.call(1), wf_sum.call(), name="a"),
            queue.chain(wf_value.call(2), wf_sum.call(), name="b"),
            wf_value.call(10),
        ],
        then=queue.chain(wf_sum.call(), wf_gather.call()),
    )
    names = {n.name: n.index for n in fan.nodes}
    assert len(names) == 7
    whole = queue.chain(queue.chain(wf_value.call(0)), fan, queue.group([wf_gather.call()]))
    assert len(whole) == 9
    assert [n.name for n in whole.nodes] == [
        "wf_value",
        "wf_value#2",
        "wf_sum",
        "wf_value#3",
        "wf_sum#2",
        "wf_value#4",
        "wf_sum#3",
        "wf_gather",
        "wf_gather#2",
    ]
    assert [n.name for n in whole.last_nodes] == ["wf_gather#2"]
    with SessionLocal.begin() as session:
        handle = whole.enqueue(session)
    drain(SessionLocal)
    status = queue.workflow_status(engine, handle.id)
    assert status.state == "succeeded"
    # The chord's callback (the inner chain's first step) summed its three parents.
    callback = next(n for n in status.nodes if len(n.parents) == 3)
    assert job_of(engine, callback.job_id).result == 1 + 2 + 10
    assert job_of(engine, handle.jobs["wf_gather#2"]).result == {"wf_gather": {"wf_sum#3": 13}}


def test_a_failure_inside_a_nested_shape_rules_out_what_follows(
    engine: Engine, SessionLocal: sessionmaker[Session]
) -> None:
    wf = queue.chain(
        queue.chord([wf_value.call(1), wf_fail.call()], then=wf_sum.call()),
        wf_value.call("never"),
    )
    with SessionLocal.begin() as session:
        handle = wf.enqueue(session)
    drain(SessionLocal)
    assert job_of(engine, handle.jobs["wf_sum"]).status == "cancelled"
    assert job_of(engine, handle.jobs["wf_value#2"]).status == "cancelled"
    assert queue.workflow_status(engine, handle.id).state == "failed"


def test_include_refuses_what_is_not_a_shape() -> None:
    wf = Workflow("w")
    with pytest.raises(TypeError, match="include"):
        wf.add(queue.chain(wf_value.call(1)))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a call, such as"):
        wf.include("wf_value")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="itself"):
        wf.include(wf)
    with pytest.raises(ValueError, match="has no nodes"):
        wf.include(Workflow("empty"))
    with pytest.raises(ValueError, match="default policy"):
        queue.chord([wf_value.call(1)], then=queue.chain(wf_sum.call()), policy="all_finished")
    assert len(wf) == 0


# -- a held node's job reads "held", and says how to resume it -----------------------------


def test_a_held_nodes_job_reads_held_and_says_how_to_resume(
    db_url: str,
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqla_queue.cli.main import main
    from sqla_queue.listing import list_jobs

    with SessionLocal.begin() as session:
        handle = held_with_followers().enqueue(session)
    drain(SessionLocal)
    first, held, after = handle.jobs["first"], handle.jobs["then"], handle.jobs["after"]
    with engine.connect() as connection:
        states = {row.id: row.state for row in list_jobs(connection, queue.tables, limit=50)}
        assert (states[first], states[held], states[after]) == ("failed", "held", "blocked")
        # No execution is left at all: "queued" still finds the jobs that wait.
        waiting = list_jobs(connection, queue.tables, states=["queued"], limit=50)
        assert sorted(row.id for row in waiting) == sorted([held, after, handle.jobs["last"]])
        only_held = list_jobs(connection, queue.tables, states=["held"], limit=50)
        assert [row.id for row in only_held] == [held]

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["job", TARGET, "--url", db_url, str(held)]) == 0
    out = capsys.readouterr().out
    assert out.split()[:4] == ["job", str(held), "wf_sum", "held"]
    assert "queued" not in out
    assert f"requeue job {first} to resume it (sqla-queue requeue {TARGET} {first}" in out
    assert main(["job", TARGET, "--url", db_url, "--json", str(held)]) == 0
    shown = capsys.readouterr().out
    assert '"state": "held"' in shown and f"sqla-queue requeue {TARGET} {first}" in shown
    assert main(["jobs", TARGET, "--url", db_url, "--status", "queued"]) == 0
    listed = capsys.readouterr().out
    assert re.search(rf"^\s*{held}\s.*\bheld\b", listed, re.M)
    assert re.search(rf"^\s*{after}\s.*\bblocked\b", listed, re.M)
    # A blocked node's job has nothing to resume.
    assert main(["job", TARGET, "--url", db_url, str(after)]) == 0
    assert "requeue" not in capsys.readouterr().out

    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx.*deprecated")
        from starlette.testclient import TestClient
    with TestClient(queue.dashboard(engine)) as client:
        page = client.get(f"/jobs/{held}").text
        assert re.search(r"<h1>Job \d+ <small>wf_sum</small> <span[^>]*state-held", page)
        note = re.search(r'<p id="job-held">(.*?)</p>', page, re.S)
        assert note is not None
        assert f'href="/jobs/{first}"' in note.group(1)
        assert f"sqla-queue requeue APP {first}" in note.group(1)
        assert 'id="job-held"' not in client.get(f"/jobs/{after}").text
        listing = client.get("/jobs", params={"state": "held"}).text
        assert f'href="/jobs/{held}"' in listing
