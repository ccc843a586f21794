"""The outcome buffer: outcomes wait here for their ack, and are isolated when refused."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from sqla_queue.logic.outcomes import Outcome, OutcomeKind

__all__ = ["OutcomeBuffer", "tally"]

log = logging.getLogger("sqla_queue.worker")


class OutcomeBuffer:
    """Outcomes of finished attempts, waiting to be written in one completion statement.

    Not thread-safe: the decider holds its lock around every call.
    """

    def __init__(self, ack_delay: float, batch: int) -> None:
        self._ack_delay = ack_delay
        self._batch = batch
        self.outcomes: list[Outcome] = []
        # When the run loop first saw buffered outcomes (the ack delay runs from there).
        self._seen_at: float | None = None
        #: Outcomes at the head of the buffer to write one per statement: a completion of
        #: theirs failed with a data error, and one of them is at fault.
        self.isolating = 0
        #: The outcomes of the last completion that failed, until the error is handled.
        self.last_flush: list[Outcome] = []

    def __len__(self) -> int:
        return len(self.outcomes)

    def add(self, outcome: Outcome) -> None:
        """Buffer ``outcome`` for the next ack."""
        self.outcomes.append(outcome)

    def ack_wait(self, now: float, running: int) -> float:
        """How long to hold buffered outcomes so that more join the same ack.

        Handlers of one batch tend to finish together; acking each as it comes would cost
        a statement (and a commit) per job. Outcomes wait at most ``ack_delay`` seconds,
        and not at all once nothing else runs or a batch's worth has gathered.
        """
        if self._seen_at is None:
            self._seen_at = now
        if running == 0 or len(self.outcomes) >= self._batch:
            return 0.0
        return max(0.0, self._seen_at + self._ack_delay - now)

    def take(self) -> list[Outcome]:
        """Remove the outcomes of the next completion: all, or while isolating, the first."""
        if self.isolating:
            outcomes, self.outcomes = self.outcomes[:1], self.outcomes[1:]
        else:
            outcomes, self.outcomes = self.outcomes, []
        self._seen_at = None
        return outcomes

    def put_back(self, outcomes: list[Outcome]) -> None:
        """The completion of ``outcomes`` failed: keep them at the head for the next try."""
        self.outcomes[:0] = outcomes
        self.last_flush = list(outcomes)

    def take_failed(self) -> list[Outcome]:
        """The outcomes of the completion that failed; forgotten from here on."""
        failed, self.last_flush = self.last_flush, []
        return failed

    def isolate(self, count: int) -> None:
        """Write the first ``count`` outcomes one per statement."""
        self.isolating = max(self.isolating, count)

    def isolated(self, count: int) -> None:
        """``count`` outcomes were written on their own."""
        self.isolating = max(0, self.isolating - count)

    def is_head(self, outcome: Outcome) -> bool:
        """Whether ``outcome`` is the next to be written."""
        return bool(self.outcomes) and self.outcomes[0] is outcome

    def pairs(self) -> list[tuple[int, int]]:
        """``(job id, attempt)`` of every buffered outcome."""
        return [(o.job_id, o.attempt) for o in self.outcomes]

    def job_ids(self) -> set[int]:
        """The jobs of the buffered outcomes."""
        return {o.job_id for o in self.outcomes}


def tally(stats: dict[str, int], outcomes: Iterable[Outcome], done: set[int]) -> None:
    """Count written ``outcomes`` in ``stats``; those not in ``done`` were fenced off."""
    for outcome in outcomes:
        if outcome.job_id not in done:
            stats["fenced"] += 1
            log.warning(
                "job %s attempt %s: result discarded, the job was reclaimed by another "
                "worker meanwhile (its newer attempt wins)",
                outcome.job_id,
                outcome.attempt,
                extra={"job_id": outcome.job_id, "attempt": outcome.attempt},
            )
        elif outcome.kind is OutcomeKind.SUCCEEDED:
            stats["succeeded"] += 1
        elif outcome.kind is OutcomeKind.FAILED:
            stats["failed"] += 1
        elif outcome.kind is OutcomeKind.RETRY:
            stats["retried"] += 1
        elif outcome.kind is OutcomeKind.CANCELLED:
            stats["cancelled"] += 1
        elif outcome.kind is OutcomeKind.SUSPENDED:
            stats["suspended"] = stats.get("suspended", 0) + 1
