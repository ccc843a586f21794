"""Preparing enqueued rows without I/O: validated and serialized in the caller's process.

The rows are then written by one statement per chunk on the caller's connection (see
:mod:`sqla_queue._binds`), so a bad argument fails before anything reaches the database.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqla_queue._identifiers import validate_task_name
from sqla_queue.core.payload import dump_json, make_payload
from sqla_queue.task import EnqueueOptions, JobSpec

__all__ = ["CHUNK_SIZE", "TaskDefaults", "prepare_rows"]

#: Rows per statement in a bulk enqueue: large enough to amortize the round trip, small
#: enough that one JSON parameter stays a few megabytes.
CHUNK_SIZE = 5_000


class TaskDefaults:
    """The per-task values a job row falls back to when the call does not set them."""

    __slots__ = ("max_attempts", "priority")

    def __init__(self, priority: int, max_attempts: int) -> None:
        self.priority = priority
        self.max_attempts = max_attempts


def _row(spec: JobSpec, defaults: TaskDefaults, seq: int) -> dict[str, Any]:
    opts: EnqueueOptions = spec.options
    return {
        "task": spec.task,
        "payload": make_payload(spec.args, spec.kwargs),
        "priority": defaults.priority if opts.priority is None else opts.priority,
        "queue_id": opts.queue_id,
        "max_attempts": defaults.max_attempts if opts.max_attempts is None else opts.max_attempts,
        "run_at": opts.run_at.isoformat() if opts.run_at else None,
        "delay": opts.delay,
        "seq": seq,
    }


def prepare_rows(
    specs: Iterable[JobSpec], defaults_for: Any, chunk_size: int = CHUNK_SIZE
) -> list[str]:
    """Validate and serialize ``specs`` into JSON chunks for the enqueue statement.

    ``defaults_for(name)`` returns the :class:`TaskDefaults` of a task, raising
    :class:`~sqla_queue.UnknownTaskError` for a name the queue does not know. Every spec is
    checked before any chunk is returned, so a bad one means nothing is written.
    """
    chunks: list[str] = []
    batch: list[dict[str, Any]] = []
    for seq, spec in enumerate(specs):
        validate_task_name(spec.task)
        batch.append(_row(spec, defaults_for(spec.task), seq))
        if len(batch) >= chunk_size:
            chunks.append(_dump_chunk(batch))
            batch = []
    if batch:
        chunks.append(_dump_chunk(batch))
    return chunks


def _dump_chunk(rows: list[dict[str, Any]]) -> str:
    try:
        return json.dumps(rows, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        # Slow path, only on failure: find the row to blame by name.
        for row in rows:
            dump_json(row["payload"], task=row["task"])
        raise
