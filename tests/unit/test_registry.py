"""The task registry (sqla_queue.registry): names, defaults and limits. No database."""

from __future__ import annotations

import pytest
from sqlalchemy import MetaData

from sqla_queue.enqueue import Enqueuer, TaskDefaults
from sqla_queue.errors import InvalidIdentifierError, TaskAlreadyRegisteredError, UnknownTaskError
from sqla_queue.logic.backoff import RetryPolicy
from sqla_queue.models import build_tables
from sqla_queue.registry import KnownTasks, QueueDefaults, TaskLimit, TaskRegistry

pytestmark = pytest.mark.unit


def registry() -> TaskRegistry:
    return TaskRegistry.build(
        build_tables(MetaData()), True, QueueDefaults(2, RetryPolicy(), 30.0, 3)
    )


def test_known_tasks_prefer_a_registered_name_and_check_the_rest() -> None:
    known = KnownTasks()
    known.declare("t", TaskDefaults(9, 1))
    known.register("t", TaskDefaults(3, 1))
    assert known.lookup("t").priority == 3
    assert known.names() == ["t"]
    with pytest.raises(UnknownTaskError, match="known tasks"):
        known.lookup("other")
    with pytest.raises(InvalidIdentifierError):
        known.lookup("")


def test_registration_fills_the_queue_defaults_and_feeds_the_enqueuer() -> None:
    reg = registry()
    handle = reg.task_decorator(pass_context=False, options={"name": "t", "concurrency_limit": 4})(
        lambda: None
    )
    assert isinstance(reg.enqueuer, Enqueuer) and handle.enqueuer is reg.enqueuer
    assert handle.task_options.max_attempts == 2 and handle.task_options.max_reclaims == 3
    assert reg.enqueuer.defaults("t").max_attempts == 2
    assert reg.declared_limits() == {"t": 4}
    assert reg.limits({"gone": 1}) == {
        "gone": TaskLimit("gone", None, 1),
        "t": TaskLimit("t", 4, None),
    }


def test_a_name_is_either_a_task_or_a_daemon() -> None:
    reg = registry()
    reg.task_decorator(pass_context=False, options={"name": "x"})(lambda: None)
    with pytest.raises(TaskAlreadyRegisteredError, match="name of a task"):
        reg.daemon_decorator("x", 1, None, None)(lambda ctx: None)
    with pytest.raises(TaskAlreadyRegisteredError, match="already registered"):
        reg.task_decorator(pass_context=False, options={"name": "x"})(lambda: None)


def test_an_undo_accepts_a_name_only_stored() -> None:
    reg = registry()
    reg.check_known("resume", "gone", stored=lambda: ["gone"])
    with pytest.raises(UnknownTaskError, match="cannot pause"):
        reg.check_known("pause", "gone")
