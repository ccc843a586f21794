"""Prefetch in the worker's decisions: claims ahead of need, starts by priority, hands back.

Driven like tests/unit/test_worker_core.py: a hand-made plan, a fake clock, fake rows.
"""

from __future__ import annotations

from typing import Any

import pytest

from sqla_queue.logic.outcomes import OutcomeKind
from sqla_queue.worker.actions import Claim, Flush, Start, Stop
from sqla_queue.worker.decider import Decider
from sqla_queue.worker.plan import WorkerPlan
from sqla_queue.worker.settings import WorkerSettings
from tests.unit.test_worker_core import core_for, queue, returned, row

pytestmark = pytest.mark.unit

__all__ = ["queue"]  # the fixture, imported for its use here


def _claim(core: Decider, rows: list[Any], size: int) -> list[int]:
    return [r.job.id for r in core.accept_claim(rows, size, 0.0, lambda job: None)]


def test_prefetch_claims_beyond_the_seats_and_holds_the_rest(queue: WorkerPlan) -> None:
    core = core_for(queue, concurrency=2, prefetch=3)
    core.next_action(0.0)  # the first maintenance
    assert core.next_action(0.0) == Claim(5)
    started = _claim(core, [row(i) for i in range(1, 6)], 5)
    assert started == [1, 2]  # two seats; three held for later
    assert core.jobs.count() == 5  # all five are held: heartbeats and cancels see them
    assert core.jobs.waiting() == 3


def test_without_prefetch_a_claim_never_exceeds_the_free_seats(queue: WorkerPlan) -> None:
    core = core_for(queue, concurrency=2)
    core.next_action(0.0)
    assert core.next_action(0.0) == Claim(2)
    assert _claim(core, [row(1), row(2)], 2) == [1, 2]
    assert core.jobs.waiting() == 0


def test_a_finished_handler_frees_a_seat_for_the_most_urgent_held_job(
    queue: WorkerPlan,
) -> None:
    core = core_for(queue, concurrency=1, prefetch=3)
    core.next_action(0.0)
    rows = [row(1, priority=0), row(2, priority=0), row(3, priority=9), row(4, priority=5)]
    started = core.accept_claim(rows, 4, 0.0, lambda job: None)
    # The claim's most urgent job starts first, whatever order the rows came back in.
    assert [r.job.id for r in started] == [3]
    core.record(started[0], returned(core, started[0], None))
    action = core.next_action(0.0)
    assert isinstance(action, Start)
    assert [r.job.id for r in action.jobs] == [4]
    # Equal priorities keep the order of the claim.
    core.record(action.jobs[0], returned(core, action.jobs[0], None))
    action = core.next_action(0.0)
    assert isinstance(action, Start)
    assert [r.job.id for r in action.jobs] == [1]


def test_a_later_claim_of_a_more_urgent_job_overtakes_held_ones(queue: WorkerPlan) -> None:
    core = core_for(queue, concurrency=1, prefetch=2)
    core.next_action(0.0)
    first = core.accept_claim([row(1), row(2)], 3, 0.0, lambda job: None)
    assert [r.job.id for r in first] == [1]
    # One more fits in the prefetch: an urgent job enqueued since is claimed now.
    assert core.accept_claim([row(3, priority=7)], 1, 0.0, lambda job: None) == []
    core.record(first[0], returned(core, first[0], None))
    action = core.next_action(0.0)
    assert isinstance(action, Start)
    assert [r.job.id for r in action.jobs] == [3]


def test_a_stop_hands_the_held_jobs_back_and_waits_for_running_ones(
    queue: WorkerPlan,
) -> None:
    core = core_for(queue, concurrency=1, prefetch=2, shutdown_timeout=10.0)
    core.next_action(0.0)
    running = core.accept_claim([row(1), row(2), row(3)], 3, 0.0, lambda job: None)
    core.request_stop(0.0)
    action = core.next_action(0.0)
    assert action == Flush()
    outcomes, _ = core.take_outcomes()
    assert sorted((o.job_id, o.kind) for o in outcomes) == [
        (2, OutcomeKind.RELEASE),
        (3, OutcomeKind.RELEASE),
    ]
    assert core.jobs.count() == 1  # the running one finishes within the timeout
    core.completed(outcomes, [o.job_id for o in outcomes])
    core.record(running[0], returned(core, running[0], None))
    assert core.next_action(0.0) == Flush()
    outcomes, _ = core.take_outcomes()
    core.completed(outcomes, [1])
    assert core.next_action(0.0) == Stop()


def test_a_worker_serving_a_limited_task_does_not_prefetch(queue: WorkerPlan) -> None:
    core = core_for(queue, concurrency=2, prefetch=8)
    core.pacer.limited = True  # as when a declared or stored limit is read
    core.next_action(0.0)
    assert core.next_action(0.0) == Claim(2)


def test_prefetch_is_checked_like_every_setting() -> None:
    with pytest.raises(ValueError, match="prefetch"):
        WorkerSettings(prefetch=-1)
    with pytest.raises(TypeError, match="prefetch"):
        WorkerSettings(prefetch=True)
    assert WorkerSettings(concurrency=4, prefetch=6).claim_batch == 10
    assert WorkerSettings(concurrency=4, prefetch=6, batch_size=5).claim_batch == 5


def test_a_notification_during_a_short_claim_is_not_lost(queue: WorkerPlan) -> None:
    # The claim's snapshot may predate the job the notification announced: the next
    # claim must run at once, not a poll interval later.
    core = core_for(queue, concurrency=4, poll_interval=5.0, tasks=["a"])
    core.next_action(0.0)  # maintenance
    assert core.next_action(0.0) == Claim(4)
    core.claim_params(4)  # the claim is prepared and sent...
    core.notified()  # ...an enqueue commits and notifies meanwhile...
    core.accept_claim([row(1)], 4, 0.0, lambda job: None)  # ...and it comes back short
    assert core.next_action(0.0) == Claim(3)
    # Without a notification in flight, a short claim waits for the poll.
    core.claim_params(3)
    core.accept_claim([row(2)], 3, 0.0, lambda job: None)
    assert not isinstance(core.next_action(0.0), Claim)


def test_a_finished_handler_takes_the_next_held_job_in_its_own_thread(
    queue: WorkerPlan,
) -> None:
    core = core_for(queue, concurrency=1, prefetch=2)
    core.next_action(0.0)
    first = core.accept_claim([row(1), row(2), row(3)], 3, 0.0, lambda job: None)[0]
    # The seat is still taken: nothing follows on before the handler's outcome is in.
    assert core.follow_on(first) is None
    core.record(first, returned(core, first, None))
    second = core.follow_on(first)
    assert second is not None and second.job.id == 2
    assert core.jobs.waiting() == 1
    # The run loop sees the seat taken again: no Start of its own.
    assert not isinstance(core.next_action(0.0), Start)
    core.record(second, returned(core, second, None))
    core.request_stop(0.0)
    assert core.follow_on(second) is None  # a stopping worker starts nothing more


def test_held_jobs_go_back_after_a_second_without_a_seat(queue: WorkerPlan) -> None:
    # Every seat is busy with a long job: the prefetched ones, which hold their keys'
    # heads, go back to the queue, and none is prefetched again for a while.
    core = core_for(queue, concurrency=1, prefetch=2)
    core.next_action(0.0)
    rows = [row(1), row(2, queue_id="k2"), row(3, queue_id="k3")]
    core.accept_claim(rows, 3, 0.0, lambda job: None)
    claimed_at = core.jobs.get(2).claimed_at  # type: ignore[union-attr]
    core.next_action(claimed_at + 0.5)  # still within the hold
    assert core.jobs.waiting() == 2 and not core.buffer
    later = claimed_at + 1.5
    core.next_action(later)  # buffered for the next ack (which waits for the ack delay)
    outcomes, _ = core.take_outcomes()
    assert sorted((o.job_id, o.kind) for o in outcomes) == [
        (2, OutcomeKind.RELEASE),
        (3, OutcomeKind.RELEASE),
    ]
    assert core.prefetch.capacity(later) == 1  # no prefetch right after a hand-back
    assert core.prefetch.capacity(later + 1.5) == 3


def test_held_jobs_of_a_task_paused_since_their_claim_go_back(queue: WorkerPlan) -> None:
    core = core_for(queue, concurrency=1, prefetch=2)
    core.next_action(0.0)
    core.accept_claim([row(1), row(2, task="b"), row(3)], 3, 0.0, lambda job: None)
    core.maintenance.paused = {"b"}  # as the maintenance reads an operator's pause
    core.next_action(0.0)
    outcomes, _ = core.take_outcomes()
    assert [(o.job_id, o.kind) for o in outcomes] == [(2, OutcomeKind.RELEASE)]
    assert core.jobs.waiting() == 1


def test_a_held_job_cancelled_before_its_seat_frees_never_runs(queue: WorkerPlan) -> None:
    import dataclasses

    from sqla_queue.worker.handlers import HandlerRunner

    calls: list[int] = []
    tasks = {
        "a": dataclasses.replace(queue.tasks["a"], handler=lambda x=0: calls.append(x)),
    }
    plan = WorkerPlan(
        tables=queue.tables, notify=True, default_lease=queue.default_lease, tasks=tasks
    )
    core = Decider(plan, WorkerSettings(concurrency=1, prefetch=1))
    core.next_action(0.0)
    first = core.accept_claim([row(1), row(2)], 2, 0.0, lambda job: None)[0]
    held = core.jobs.get(2)
    assert held is not None
    held.request_cancel()  # an operator's cancel, delivered by the heartbeat
    runner = HandlerRunner(worker_id=core.worker_id, clock=core.clock, record=core.record)
    runner.run_sync(first)
    follower = core.follow_on(first)
    assert follower is held
    runner.run_sync(follower)
    assert calls == [0]  # the first job ran; the cancelled one did not
    outcomes, _ = core.take_outcomes()
    assert [(o.job_id, o.kind) for o in outcomes] == [
        (1, OutcomeKind.SUCCEEDED),
        (2, OutcomeKind.CANCELLED),
    ]
