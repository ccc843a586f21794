"""Key promotion: the keys (``queue_id``) whose next waiting job may be due to run."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from sqla_queue.statements.keys import KeysParams
from sqla_queue.worker.actions import Step
from sqla_queue.worker.decider.pacing import ClaimPacer

__all__ = ["PARKED_RETRY", "KeyPromotion"]

#: Seconds before a key whose finished execution an enqueue in flight holds is tried again.
PARKED_RETRY = 0.2


class KeyPromotion:
    """The keys owed a promotion, and the two statements that give it.

    A key is owed one when an execution of it finished (its outcome is buffered or was
    committed with its handler) or a cleanup freed it. The promotion rides along with the
    next unit of the run loop. Thread-safe with the decider's ``lock``, except :meth:`add`,
    which runs inside the decider's own locked steps.
    """

    def __init__(self, lock: threading.Lock, clear_done: Any, promote: Any, pacer: ClaimPacer):
        self._lock = lock
        self._clear_done = clear_done
        self._promote = promote
        self._pacer = pacer
        self.owed: set[str] = set()

    def add(self, key: str) -> None:
        """``key`` is owed a promotion (the caller holds the lock)."""
        self.owed.add(key)

    def restore(self, keys: Iterable[str]) -> None:
        """``keys`` are owed a promotion again (their unit failed, or a row was parked)."""
        with self._lock:
            self.owed.update(keys)

    def take_steps(self) -> tuple[list[str], list[Step]]:
        """The keys owed a promotion (no longer owed one until restored), and the
        statements that promote them: none for no key.

        First the ``done`` executions of those keys are deleted where nobody holds them,
        then, as a statement of its own (it must see the waiting jobs that enqueues
        committed meanwhile), each key's next job is made pending where its turn has come.
        """
        with self._lock:
            keys, self.owed = sorted(self.owed), set()
        if not keys:
            return keys, []
        params = KeysParams(keys=keys)
        return keys, [Step(self._clear_done, params), Step(self._promote, params)]

    def cleared(self, results: Sequence[Sequence[Any]], now: float) -> None:
        """The rows of :meth:`take_steps`' statements (none when there were none): keys
        whose ``done`` row an enqueue in flight still holds are tried again soon."""
        if not results:
            return
        parked = {row[0] for row in results[0]}
        if parked:
            self.restore(parked)
            self._pacer.next_poll = min(self._pacer.next_poll, now + PARKED_RETRY)
