"""Answering a worker unit's statements in a unit test, as a face would run them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqla_queue.worker.actions import Work

__all__ = ["LOCKED", "run_unit"]

#: What a lock statement that got its row returns (a rated claim's control row).
LOCKED: list[Any] = [("locked",)]


def run_unit(work: Work, results: Sequence[Sequence[Any]]) -> list[Any]:
    """Answer ``work``'s statements with ``results`` in order: its steps' (the guard's
    first), then those of the flow its ``follow`` makes of them, if any; then hand the
    steps' rows to ``done`` and return what it returns. Fails the test if the flow asks
    for more statements than ``results`` answers."""
    count = len(work.steps)
    head, rest = list(results[:count]), list(results[count:])
    flow = work.follow(head) if work.follow is not None else None
    if flow is not None:
        answers = iter(rest)
        try:
            flow.send(None)
            while True:
                flow.send(next(answers))
        except StopIteration:
            pass
    return work.done(head)
