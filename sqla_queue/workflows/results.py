"""What workflows give back: a written workflow's handle, and a node's parents' results."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqla_queue.models.tables import JobStatus

__all__ = ["ParentError", "WorkflowHandle", "parent_results_of"]


@dataclass(frozen=True)
class ParentError:
    """A parent that did not succeed, as its dependent sees it in ``ctx.parent_results``.

    Only a node whose policy lets it run after a failure sees one (``all_finished``, or
    ``quorum(n)`` once ``n`` others succeeded). ``status`` is ``"failed"`` or
    ``"cancelled"``; ``error`` is the parent's last error entry (``error``, ``message``,
    ``at``, ...), or None for a job cancelled before it ever ran.
    """

    status: str
    error: dict[str, Any] | None

    def __repr__(self) -> str:
        """The status and the error's type and message: never the whole traceback, which
        would follow a dependent's ``ctx.parent_results`` into every log line."""
        if not self.error:
            return f"ParentError({self.status!r})"
        kind = self.error.get("type", "error")
        message = str(self.error.get("message", ""))
        if len(message) > 200:
            message = message[:200] + "…"
        return f"ParentError({self.status!r}, {kind}: {message})"


def parent_results_of(rows: Iterable[Any]) -> dict[str, Any]:
    """``{parent's node name: its result, or a ParentError}`` from ``(name, outcome,
    result)`` rows, in the order given. A parent that has not ended is left out."""
    results: dict[str, Any] = {}
    for name, outcome, result in rows:
        if outcome == JobStatus.SUCCEEDED:
            results[name] = result
        elif outcome is not None:
            results[name] = ParentError(outcome, result if isinstance(result, dict) else None)
    return results


@dataclass(frozen=True)
class WorkflowHandle:
    """A written workflow: its id, and its nodes' job ids by node name.

    ``existing`` is True when a unique workflow found a live one of its name about its
    row and wrote nothing: the handle is that workflow's, and ``jobs`` is empty.
    """

    id: int
    name: str
    jobs: dict[str, int]
    existing: bool = False
