"""A workflow's state from its nodes' shown states (issue 36): a held node with blocked
nodes after it is ``held``; anything queued or running makes it ``running``."""

from __future__ import annotations

import pytest

from sqla_queue.workflows.admin import workflow_state
from sqla_queue.workflows.graph import Expansion, Workflow
from tests.support.workflow_app import wf_sum, wf_value


@pytest.mark.parametrize(
    ("counts", "state"),
    [
        ({"held": 1, "blocked": 3, "failed": 1}, "held"),
        ({"held": 2, "blocked": 1, "succeeded": 4}, "held"),
        ({"held": 1, "blocked": 1, "queued": 1}, "running"),
        ({"blocked": 2, "queued": 1}, "running"),
        ({"queued": 1, "failed": 1}, "running"),
        ({"failed": 1, "cancelled": 2, "succeeded": 1}, "failed"),
        ({"succeeded": 3, "pruned": 1}, "succeeded"),
    ],
)
def test_workflow_state(counts: dict[str, int], state: str) -> None:
    assert workflow_state(False, counts) == state
    assert workflow_state(True, counts) == "cancelled"


def test_expansion_names_still_carry_their_marks() -> None:
    """The names an expansion gives its own nodes are not refused (only '/' is)."""
    graph = Expansion((wf_value.call(1), wf_value.call(2)), then=wf_sum.call()).workflow()
    assert [node.name for node in graph.nodes] == ["wf_value@0", "wf_value@1", "wf_sum@then"]
    wf = Workflow("w")
    assert wf.add(wf_value.call(1), name="pack@0").name == "pack@0"
    assert wf.add(wf_value.call(1), name="résumé #2").name == "résumé #2"
