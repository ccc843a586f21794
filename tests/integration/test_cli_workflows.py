"""``sqla-queue workflows`` against a real database: the list, one workflow, ``--json``,
paging, a missing id; each workflow's state as ``WorkflowStatus.state`` derives it."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from sqla_queue.cli.main import main
from sqla_queue.workflows import Workflow
from sqla_queue.workflows.listing import list_workflows
from tests.support.workflow_app import queue, wf_fail, wf_gather, wf_value

pytestmark = pytest.mark.integration
TARGET = "tests.support.workflow_app:queue"


def drain(factory: sessionmaker[Session]) -> None:
    """Run a sync worker until no job is left."""
    queue.worker(factory, concurrency=2).run(burst=True)


def failing() -> Workflow:
    """a and b (fails) side by side; c needs both to succeed; gather takes what ended."""
    wf = Workflow("failing")
    a = wf.add(wf_value.call("a"), name="a")
    b = wf.add(wf_fail.call(), name="b")
    wf.add(wf_value.call("c"), after=[a, b], name="c")
    wf.add(wf_gather.call(), after=[a, b], policy="all_finished", name="gather")
    return wf


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command; its exit status, stdout and stderr."""
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_list_and_show_a_failed_and_a_succeeded_workflow(
    db_url: str,
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich sizes its tables to the terminal
    with SessionLocal.begin() as session:
        failed = failing().enqueue(session)
        chain = queue.chain(wf_value.call(1), wf_value.call(2), name="two-steps").enqueue(session)
    drain(SessionLocal)

    status, out, err = run(capsys, "workflows", TARGET, "--url", db_url)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["id", "name", "state", "nodes", "by", "state", "about", "created"]
    # Newest first: the chain was enqueued second.
    assert lines[1].split()[:4] == [str(chain.id), "two-steps", "succeeded", "2"]
    assert "2 succeeded" in lines[1]
    assert lines[2].split()[:4] == [str(failed.id), "failing", "failed", "4"]
    assert "2 succeeded, 1 failed, 1 cancelled" in lines[2]

    status, out, _ = run(capsys, "workflows", TARGET, "--url", db_url, str(failed.id))
    assert status == 0
    header, columns, *rows = out.splitlines()
    assert header.split()[:4] == ["workflow", str(failed.id), "failing", "failed"]
    assert "4 node(s)" in header
    assert columns.split() == ["node", "job", "task", "state", "attempts", "parents"]
    by_node = {row.split()[0]: row.split() for row in rows}
    assert by_node["a"][1:5] == [str(failed.jobs["a"]), "wf_value", "succeeded", "1"]
    assert by_node["b"][1:5] == [str(failed.jobs["b"]), "wf_fail", "failed", "1"]
    # c never ran: cancelled, no attempt made, after both parents.
    assert by_node["c"][1:] == [str(failed.jobs["c"]), "wf_value", "cancelled", "0", "a,", "b"]
    assert by_node["gather"][3] == "succeeded"


def test_json_matches_the_status_and_the_listing(
    db_url: str,
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SessionLocal.begin() as session:
        failed = failing().enqueue(session)
    drain(SessionLocal)

    status, out, _ = run(capsys, "workflows", TARGET, "--url", db_url, str(failed.id), "--json")
    assert status == 0
    shown = json.loads(out)
    assert shown == queue.workflow_status(engine, failed.id).as_dict()
    assert shown["state"] == "failed"
    assert {n["name"]: n["state"] for n in shown["nodes"]} == {
        "a": "succeeded",
        "b": "failed",
        "c": "cancelled",
        "gather": "succeeded",
    }

    status, out, _ = run(capsys, "workflows", TARGET, "--url", db_url, "--json")
    assert status == 0
    (summary,) = json.loads(out)
    assert summary["id"] == failed.id and summary["name"] == "failing"
    assert summary["state"] == "failed" and summary["nodes"] == 4
    assert summary["counts"] == {"succeeded": 2, "failed": 1, "cancelled": 1}
    assert summary["about"] is None and summary["cancelled_at"] is None
    assert dt.datetime.fromisoformat(summary["created_at"]).tzinfo is not None


def _states(engine: Engine) -> dict[int, str]:
    with engine.connect() as connection:
        return {s.id: s.state for s in list_workflows(connection, queue.tables, limit=100)}


def test_every_state_agrees_with_the_status(
    db_url: str,
    engine: Engine,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
) -> None:
    held = Workflow("held")
    bad = held.add(wf_fail.call(), name="bad")
    held.add(wf_value.call(), after=bad, on_parent_failure="hold", name="waits")
    with SessionLocal.begin() as session:
        ids = {
            "failed": failing().enqueue(session).id,
            "held": held.enqueue(session).id,
            "succeeded": queue.chain(wf_value.call(1), wf_value.call(2)).enqueue(session).id,
        }
    drain(SessionLocal)
    with SessionLocal.begin() as session:
        ids["cancelled"] = queue.chain(wf_value.call(1), wf_value.call(2)).enqueue(session).id
        ids["running"] = queue.chain(wf_value.call(1), wf_value.call(2)).enqueue(session).id
    queue.cancel_workflow(engine, ids["cancelled"])
    listed = _states(engine)
    for expected, workflow_id in ids.items():
        assert listed[workflow_id] == expected
        assert queue.workflow_status(engine, workflow_id).state == expected

    status, out, _ = run(capsys, "workflows", TARGET, "--url", db_url, "--json", "--limit", "100")
    assert status == 0
    counts = {entry["id"]: entry["counts"] for entry in json.loads(out)}
    assert counts[ids["held"]] == {"held": 1, "failed": 1}
    assert counts[ids["running"]] == {"blocked": 1, "queued": 1}
    assert counts[ids["cancelled"]] == {"cancelled": 2}

    # Finished jobs leave the history; the nodes of a workflow with a job left stay, shown
    # as pruned, and a workflow none of whose jobs is left goes with its last one.
    with engine.begin() as connection:
        assert queue.prune(connection, older_than=dt.timedelta(0)) > 0
    status, out, _ = run(capsys, "workflows", TARGET, "--url", db_url, "--json", "--limit", "100")
    after = {entry["id"]: entry for entry in json.loads(out)}
    assert ids["succeeded"] not in after
    assert after[ids["failed"]]["counts"] == {"failed": 1, "pruned": 3}
    for workflow_id, entry in after.items():
        assert entry["state"] == queue.workflow_status(engine, workflow_id).state


def test_limit_and_before_page_newest_first(
    db_url: str,
    SessionLocal: sessionmaker[Session],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SessionLocal.begin() as session:
        made = [queue.group([wf_value.call(i)], name=f"g{i}").enqueue(session).id for i in range(5)]

    def page(*options: str) -> list[Any]:
        status, out, err = run(capsys, "workflows", TARGET, "--url", db_url, "--json", *options)
        assert status == 0, err
        return [entry["id"] for entry in json.loads(out)]

    newest = list(reversed(made))
    assert page() == newest
    assert page("--limit", "2") == newest[:2]
    assert page("--limit", "2", "--before", str(newest[1])) == newest[2:4]
    assert page("--before", str(made[0])) == []
    status, out, _ = run(capsys, "workflows", TARGET, "--url", db_url, "--before", str(made[0]))
    assert status == 0 and out == "no workflows\n"


def test_missing_id_and_bad_options(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "workflows", TARGET, "--url", db_url, "424242")
    assert status == 6
    assert out == "" and err == "sqla-queue: no workflow 424242 in this queue\n"
    status, out, err = run(capsys, "workflows", TARGET, "--url", db_url, "424242", "--json")
    assert status == 6 and "no workflow 424242" in err

    for argv in (["0"], ["abc"], ["--limit", "0"], ["--before", "-1"]):
        status, _, err = run(capsys, "workflows", TARGET, "--url", db_url, *argv)
        assert status == 2, argv
        assert err.startswith("sqla-queue: ") and "Traceback" not in err
    status, out, _ = run(capsys, "workflows", "--help")
    assert status == 0 and "6  no workflow has this id" in out
