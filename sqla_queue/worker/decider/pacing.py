"""The plain claim: which tasks it takes, how many jobs, with which parameters, and when."""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from sqla_queue.statements.claim import LimitedClaimParams
from sqla_queue.worker.plan import WorkerPlan
from sqla_queue.worker.settings import WorkerSettings

__all__ = ["ClaimPacer", "poll_wait"]

log = logging.getLogger("sqla_queue.worker")


def poll_wait(
    poll_interval: float, next_due: dt.datetime | None, clock: Callable[[], dt.datetime]
) -> float:
    """Seconds to the next claim after one that came back short.

    The poll interval, or less when the claim saw a job that falls due sooner
    (``next_due``, read on the wall ``clock``, which is only read then).
    """
    if next_due is None:
        return poll_interval
    return min(poll_interval, max(0.0, (next_due - clock()).total_seconds()))


class ClaimPacer:
    """When the plain claim (every served task that is neither paused nor rated) runs next,
    and with which parameters.

    Not thread-safe by itself: the decider calls it from its run loop, and the few writes
    that come from other threads (a notification, a finished handler) only pull
    :attr:`next_poll` forward.
    """

    def __init__(
        self,
        plan: WorkerPlan,
        settings: WorkerSettings,
        worker_id: uuid.UUID,
        rng: random.Random,
        *,
        burst: bool,
    ) -> None:
        self._poll_interval = settings.poll_interval
        self._batch = settings.claim_batch
        self._rng = rng
        self._burst = burst
        self.declared_limits = plan.declared_limits
        # Until the stored limits are read, assume a limit can apply whenever one is
        # declared; the first maintenance step settles it before the first claim.
        self.limited = bool(self.declared_limits)
        self.stored_limits: set[str] = set()
        # Only leases that differ from the queue's travel in the map; the SQL falls back.
        leases = {name: t.lease for name, t in plan.tasks.items() if t.lease != plan.default_lease}
        self._params = LimitedClaimParams(
            tasks=plan.task_names,
            batch=0,
            worker=worker_id,
            lease=plan.default_lease,
            lease_map=json.dumps(leases),
            limit_map=json.dumps(self.declared_limits),
            seat_offset=0,
        )
        #: When the plain claim is due next (on the monotonic clock of ``next_action``).
        self.next_poll = 0.0
        #: The last plain claim found nothing (a burst run may stop on it).
        self.last_empty = False
        # Pulls so far, and as the claim in flight began: see pull() and claimed().
        self._pulls = 0
        self._pulls_at_claim = 0

    @property
    def tasks(self) -> list[str]:
        """The tasks the plain claim takes."""
        return self._params["tasks"]

    def set_tasks(self, tasks: list[str]) -> None:
        """Claim ``tasks`` from now on; a task back in the claim may have work waiting."""
        if tasks != self._params["tasks"]:
            self._params["tasks"] = tasks
            self.next_poll = 0.0
            self.last_empty = False

    def pull(self) -> None:
        """Claim at once: a job may have become claimable (an enqueue's notification, a
        finished job that frees a key or a seat). Any thread may call it.

        A pull that lands while a claim is in flight is not lost when that claim comes
        back short: its snapshot may predate the job that the pull announced, so the
        next claim still runs at once (see :meth:`claimed`). Two threads that pull at the
        same instant may count one pull between them; a pull still changes the count.
        """
        self._pulls += 1
        self.next_poll = 0.0

    def due(self, now: float) -> bool:
        """Whether the plain claim should run at ``now`` (given a free seat)."""
        return now >= self.next_poll and bool(self._params["tasks"])

    def size(self, free: int) -> int:
        """How many jobs to claim with ``free`` seats: at most a batch."""
        return min(free, self._batch)

    @property
    def idle(self) -> bool:
        """The plain claim has nothing to do: it found nothing last time, or has no task."""
        return self.last_empty or not self._params["tasks"]

    def is_limited(self, task: str) -> bool:
        """Whether ``task`` has a concurrency limit, declared or stored."""
        return task in self.declared_limits or task in self.stored_limits

    def params(self, size: int) -> LimitedClaimParams:
        """Parameters of the claim statement for a batch of ``size``.

        The plain claim reads a subset of them; the limited one reads them all. The seat
        offset comes from the injected generator, a fresh one per claim.
        """
        self._pulls_at_claim = self._pulls
        params = self._params.copy()
        params["batch"] = size
        params["seat_offset"] = self._rng.randrange(1 << 30)
        return params

    def claimed(
        self,
        claimed: int,
        size: int,
        next_due: dt.datetime | None,
        now: float,
        clock: Callable[[], dt.datetime],
    ) -> None:
        """Time the next plain claim from what this one returned."""
        pulled = self._pulls != self._pulls_at_claim
        self.last_empty = claimed == 0 and not pulled
        if claimed >= size or pulled or (self._burst and claimed > 0):
            # A full batch means more is likely waiting; so does a pull made while this
            # claim ran. A burst run must see one empty claim before it may stop.
            self.next_poll = now
        else:
            self.next_poll = now + poll_wait(self._poll_interval, next_due, clock)

    def reopen(self) -> None:
        """Work may have become claimable (handed back, or a key freed): claim at once."""
        self.next_poll = 0.0
        self.last_empty = False

    def limits_read(self, rows: Sequence[Any]) -> None:
        """Stored limits were read: claim with slots while any of our tasks has a limit."""
        self.stored_limits = {row.task for row in rows}
        limited = bool(self.declared_limits) or bool(rows)
        if limited != self.limited:
            log.info(
                "concurrency limits %s for this worker's tasks",
                "apply" if limited else "no longer apply",
            )
        self.limited = limited
