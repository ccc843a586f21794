"""The dashboard reaches the queue through a Protocol of its own, never by importing Queue."""

from __future__ import annotations

import inspect

import pytest
from sqlalchemy import MetaData

from sqla_queue import Queue
from sqla_queue.queue import TaskLimit

pytestmark = pytest.mark.unit

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from sqla_queue.dashboard.queue_protocol import DashboardQueue, TaskLimitView  # noqa: E402


def _members(protocol: type) -> dict[str, object]:
    return {name: value for name, value in vars(protocol).items() if not name.startswith("_")}


def test_a_queue_has_every_member_the_dashboard_uses() -> None:
    queue = Queue(metadata=MetaData())
    for name, member in _members(DashboardQueue).items():
        assert hasattr(queue, name), name
        if inspect.isfunction(member):
            assert callable(getattr(queue, name)), name


def test_a_task_limit_has_what_the_overview_shows() -> None:
    limit = TaskLimit("resize", declared=3, stored=None)
    for name in _members(TaskLimitView):
        assert hasattr(limit, name), name
