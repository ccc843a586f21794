"""Enqueueing unique jobs: which calls take a key, which meet a holder, and what then.

The database decides who holds a key (see :mod:`sqla_queue.statements.unique`); this
module only plans around its answer, without I/O. :func:`unique_enqueue_flow` is one
:data:`~sqla_queue.conversation.Flow` for both faces:

1. duplicates inside the call are settled first, by the later call's ``on_duplicate``;
2. every key is locked (taken if free) in one statement;
3. a held key is settled by its call's ``on_duplicate``: ``raise`` raises before anything is
   written, ``ignore`` answers the holder's id, ``replace`` answers it too after giving a
   still-queued holder the call's arguments and due time;
4. the calls that took their key (and the plain calls of the batch) are written by the
   ordinary enqueue statement, and each key taken is bound to its new job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqla_queue.conversation import Flow
from sqla_queue.errors import DuplicateJobError
from sqla_queue.logic.payload import check_storable, encode_json, make_payload
from sqla_queue.models.tables import QueueTables, UniqueScope
from sqla_queue.spec import EnqueueOptions, JobSpec
from sqla_queue.statements.enqueue import EnqueueParams
from sqla_queue.statements.unique import (
    BindKeysParams,
    ReplaceParams,
    TakeKeysParams,
    bind_keys_statement,
    replace_statement,
    take_keys_statement,
)

__all__ = ["UniqueStatements", "stored_scope", "unique_enqueue_flow"]


def stored_scope(options: EnqueueOptions) -> tuple[str, float | None]:
    """``(scope, hold_seconds)`` as ``unique_keys`` stores the call's ``unique_scope``."""
    scope = options.unique_scope
    if scope is None:
        return UniqueScope.ACTIVE, None
    if isinstance(scope, str):
        return scope, None
    return UniqueScope.FINISHED, float(scope)


@dataclass(frozen=True)
class UniqueStatements:
    """The three statements of a unique enqueue, built once per queue."""

    take: Any
    bind: Any
    replace: Any

    @classmethod
    def build(cls, tables: QueueTables) -> UniqueStatements:
        """Build them for ``tables``."""
        return cls(
            take_keys_statement(tables), bind_keys_statement(tables), replace_statement(tables)
        )


def _duplicate(spec: JobSpec, holder: int | None) -> DuplicateJobError:
    key = spec.options.unique_key or ""
    where = f"job {holder}" if holder is not None else "an earlier call of this batch"
    return DuplicateJobError(
        f"task {spec.task!r}: unique key {key!r} is held by {where}; nothing was enqueued "
        "(on_duplicate='raise')",
        task=spec.task,
        key=key,
        job_id=holder,
    )


def _replacement(spec: JobSpec, job_id: int) -> dict[str, Any]:
    payload = make_payload(spec.args, spec.kwargs, task=spec.task)
    check_storable(payload, task=spec.task)
    opts = spec.options
    return {
        "id": job_id,
        "payload": payload,
        "run_at": opts.run_at.isoformat() if opts.run_at else None,
        "delay": opts.delay,
    }


def unique_enqueue_flow(
    specs: Sequence[JobSpec],
    *,
    statements: UniqueStatements,
    enqueue: Any,
    prepare: Callable[[Sequence[JobSpec]], list[str]],
) -> Flow[list[int]]:
    """Enqueue ``specs`` (some with a ``unique_key``); the job id of each, in order.

    ``enqueue`` is the ordinary enqueue statement and ``prepare`` turns specs into its
    ``rows`` chunks (validating them): the calls that write a job go through exactly the
    path a plain call takes. A call whose key is held answers the holder's id.
    """
    for spec in specs:
        spec.options.check_combination()
    answers: list[int | None] = [None] * len(specs)
    # 1. One representative call per key; a later call of the same key settles against it.
    first: dict[tuple[str, str], int] = {}
    follows: dict[int, int] = {}
    chosen = list(specs)
    for index, spec in enumerate(specs):
        key = spec.options.unique_key
        if key is None:
            continue
        seen = first.get((spec.task, key))
        if seen is None:
            first[(spec.task, key)] = index
            continue
        policy = spec.options.on_duplicate or "ignore"
        if policy == "raise":
            raise _duplicate(spec, None)
        if policy == "replace":
            # The batch's last word on the key's arguments wins, as it would one by one.
            # But the first call meets an outside holder first: its "raise" still raises
            # (one by one, it would have raised before the replace ran), and the key
            # keeps the scope the first call takes it with.
            rep = chosen[seen]
            merged = dataclasses.replace(
                rep.options.merged(spec.options),
                on_duplicate="raise" if rep.options.on_duplicate == "raise" else "replace",
                unique_scope=rep.options.unique_scope,
            )
            chosen[seen] = JobSpec(rep.task, spec.args, spec.kwargs, merged)
        follows[index] = seen
    reps = sorted(first.items())
    # 2. Lock every key (in key order) and learn who holds it.
    take: TakeKeysParams = {
        "keys": encode_json(
            [{"task": task, "key": key, "seq": seq} for seq, ((task, key), _) in enumerate(reps)]
        )
    }
    rows = yield statements.take, take
    holders = {int(row[0]): row[1] for row in rows}
    # 3. Settle the held keys; raise before anything is written.
    replacements: list[dict[str, Any]] = []
    won: list[int] = []
    for seq, (_, index) in enumerate(reps):
        holder = holders.get(seq)
        if holder is None:
            won.append(index)
            continue
        spec = chosen[index]
        policy = spec.options.on_duplicate or "ignore"
        if policy == "raise":
            raise _duplicate(spec, int(holder))
        answers[index] = int(holder)
        if policy == "replace":
            replacements.append(_replacement(spec, int(holder)))
    # 4. Write the calls that took a key, and the plain ones, as any enqueue does.
    writing = sorted([i for i, s in enumerate(chosen) if s.options.unique_key is None] + won)
    if writing:
        ids: list[int] = []
        for chunk in prepare([chosen[i] for i in writing]):
            params: EnqueueParams = {"rows": chunk}
            ids.extend(int(row[0]) for row in (yield enqueue, params))
        for index, job_id in zip(writing, ids, strict=True):
            answers[index] = job_id
    if won:
        bind: BindKeysParams = {"keys": encode_json([_binding(chosen[i], answers[i]) for i in won])}
        yield statements.bind, bind
    if replacements:
        replace: ReplaceParams = {"rows": encode_json(replacements)}
        yield statements.replace, replace
    for index, leader in follows.items():
        answers[index] = answers[leader]
    return [int(answer) for answer in answers if answer is not None]


def _binding(spec: JobSpec, job_id: int | None) -> dict[str, Any]:
    scope, hold = stored_scope(spec.options)
    return {
        "task": spec.task,
        "key": spec.options.unique_key,
        "job_id": job_id,
        "scope": scope,
        "hold_seconds": hold,
    }
