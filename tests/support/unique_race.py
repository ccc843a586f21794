"""Unique jobs raced by several OS processes: the tasks, the enqueuer process and its log.

Used by ``tests/acceptance/test_unique_stress.py``. Each enqueuer is a separate process
(``multiprocessing`` spawn), connects and warms up first, then waits at a barrier shared
with the others, so that all of them start enqueueing the same keys in the same instant.
Every call it makes is written to a JSON log: what it asked (task, key, scope, policy, a
tag that also goes into the job's arguments), what it got back (an id, or the
``DuplicateJobError`` with the holder it named), and how its transaction ended
(committed, rolled back on purpose, or failed). The test then holds that log against the
database.

Two modes:

* ``burst``: nothing runs the jobs. Every process walks every (task, key) pair a few times
  (the first pass in the same order in all processes, so they collide key by key), in
  transactions of one to four keys mixing single enqueues (through ``task.options(...)``
  and through ``queue.enqueue`` by name) and ``enqueue_many`` batches (with a duplicate of
  a key inside the batch, and plain calls without a key). Some transactions stay open a
  while before they commit, some roll back.
* ``running``: workers run the jobs while the processes enqueue a few hot keys for a fixed
  time, so keys are released and taken again and again.

Worker processes load this module as ``tests.support.unique_race:queue``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from sqla_queue import DuplicateJobError, JobContext, JobSpec
from tests.support.app import log_interval, queue

__all__ = [
    "BURST_TASKS",
    "POLICIES",
    "RUN_TASK",
    "RaceConfig",
    "audit_ddl",
    "enqueue_race",
    "key_scope",
    "load_logs",
    "queue",
    "uniq_run",
    "violations_sql",
]

#: The tasks of the burst run: the same key strings in two tasks are two keys.
BURST_TASKS = ("uniq_a", "uniq_b")
#: The task the running mode's workers run.
RUN_TASK = "uniq_run"
POLICIES = ("ignore", "raise", "replace")
#: Seconds a key with a duration scope stays held after its job finished, running mode.
RUN_HOLD = 0.3


@queue.task(name="uniq_a")
def uniq_a(tag: str) -> None:
    """Never runs: the burst run only enqueues."""


@queue.task(name="uniq_b")
def uniq_b(tag: str) -> None:
    """Never runs: the burst run only enqueues."""


@queue.task(name=RUN_TASK, pass_context=True)
def uniq_run(ctx: JobContext[Session], tag: str, pause: float = 0.0) -> str:
    """Hold the job running a moment (so its key's window is visible), then log it."""
    started = time.time()
    time.sleep(pause)
    log_interval(ctx.session, ctx, started, key=tag)
    return tag


def key_scope(key: str) -> str | float:
    """The scope every call of ``key`` asks for, from its first letter.

    ``q``: held while queued; ``a``: while queued or running; ``d``: until
    :data:`RUN_HOLD` seconds after it finished; ``f``: ten minutes after it finished.
    """
    scopes: dict[str, str | float] = {"q": "queued", "a": "active", "d": RUN_HOLD, "f": 600.0}
    return scopes[key[0]]


@dataclass(frozen=True)
class RaceConfig:
    """One race: its mode, keys and rhythm (see the module docstring)."""

    mode: str
    keys: tuple[str, ...]
    processes: int = 8
    seed: int = 0
    #: burst: passes over every (task, key) pair.
    passes: int = 2
    #: running: seconds each process keeps enqueueing.
    duration: float = 10.0
    #: Probabilities of a transaction's fate.
    rollback: float = 0.15
    hold: float = 0.25
    #: Seconds a held transaction stays open, at most.
    hold_max: float = 0.3


@dataclass
class Call:
    """One call: what was asked and what came back."""

    task: str
    key: str | None
    policy: str | None
    tag: str
    id: int | None = None


@dataclass
class Unit:
    """One enqueue statement (a single call or an ``enqueue_many`` batch)."""

    kind: str
    calls: list[Call]
    #: The DuplicateJobError it raised: task, key, job_id.
    duplicate: dict[str, Any] | None = None
    started: float = 0.0
    ended: float = 0.0


@dataclass
class Txn:
    """One transaction and how it ended."""

    process: int
    number: int
    fate: str
    units: list[Unit] = field(default_factory=list)
    committed: bool = False
    #: Anything but a DuplicateJobError (a bug).
    error: str | None = None
    holds: float = 0.0


# -- the plan ------------------------------------------------------------------------------


def _spec(call: Call, scope: str | float | None, pause: float) -> JobSpec:
    task = queue.get_task(call.task)
    kwargs: dict[str, Any] = {"tag": call.tag}
    if call.task == RUN_TASK:
        kwargs["pause"] = pause
    if call.key is None:
        return task.call(**kwargs)
    options: dict[str, Any] = {"unique_key": call.key}
    if scope is not None:
        options["unique_scope"] = scope
    if call.policy is not None:
        options["on_duplicate"] = call.policy
    return task.options(**options).call(**kwargs)


@dataclass
class PlannedUnit:
    """A unit to run: its calls with their specs, and how to send them."""

    unit: Unit
    specs: list[JobSpec]
    #: single calls: "options" (task.options(...).enqueue) or "by_name" (queue.enqueue).
    how: str = "batch"
    pause_after: float = 0.0


def _policy(rng: random.Random) -> str | None:
    # None is the default policy, "ignore", left unsaid.
    return rng.choice((*POLICIES, None))


def _scope(rng: random.Random, key: str) -> str | float | None:
    scope = key_scope(key)
    # "active" is the default scope: leave it unsaid half of the time.
    return None if scope == "active" and rng.random() < 0.5 else scope


def _plan_txn(
    rng: random.Random, process: int, number: int, pairs: list[tuple[str, str]], config: RaceConfig
) -> tuple[Txn, list[PlannedUnit]]:
    roll = rng.random()
    fate = (
        "rollback"
        if roll < config.rollback
        else "hold"
        if roll < config.rollback + config.hold
        else "commit"
    )
    txn = Txn(process=process, number=number, fate=fate)
    planned: list[PlannedUnit] = []
    counter = iter(range(10_000))

    def call(task: str, key: str | None) -> Call:
        return Call(
            task,
            key,
            None if key is None else _policy(rng),
            f"p{process}-t{number}-c{next(counter)}",
        )

    def pause() -> float:
        return rng.uniform(0.005, 0.03)

    # Keys in (task, key) order, cut into consecutive groups: every transaction locks its
    # keys in the same global order, so held-open transactions block but never deadlock.
    pairs = sorted(pairs)
    index = 0
    while index < len(pairs):
        size = rng.randint(1, len(pairs) - index)
        group, index = pairs[index : index + size], index + size
        if size == 1 and rng.random() < 0.6:
            task, key = group[0]
            c = call(task, key)
            unit = Unit("single", [c])
            how = rng.choice(("options", "by_name"))
            planned.append(PlannedUnit(unit, [_spec(c, _scope(rng, key), pause())], how))
        else:
            calls = [call(task, key) for task, key in group]
            if rng.random() < 0.3:  # the same key twice in one batch
                task, key = rng.choice(group)
                calls.insert(rng.randrange(len(calls) + 1), call(task, key))
            if config.mode == "burst" and rng.random() < 0.3:  # a plain call among them
                calls.insert(rng.randrange(len(calls) + 1), call(group[0][0], None))
            unit = Unit("batch", calls)
            specs = [
                _spec(c, None if c.key is None else _scope(rng, c.key), pause()) for c in calls
            ]
            planned.append(PlannedUnit(unit, specs))
        if rng.random() < 0.1:  # enqueue the group's last key again, in its own statement
            task, key = group[-1]
            c = call(task, key)
            planned.append(
                PlannedUnit(Unit("single", [c]), [_spec(c, _scope(rng, key), pause())], "options")
            )
        if fate != "commit" and rng.random() < 0.3:  # stay open between two statements
            planned[-1].pause_after = rng.uniform(0.0, config.hold_max / 2)
    if fate == "hold" or (fate == "rollback" and rng.random() < 0.5):
        planned[-1].pause_after += rng.uniform(config.hold_max / 4, config.hold_max)
    txn.units = [p.unit for p in planned]
    return txn, planned


def _burst_plan(config: RaceConfig, process: int) -> Iterator[tuple[Txn, list[PlannedUnit]]]:
    rng = random.Random(f"{config.seed}-{process}")
    pairs = [(task, key) for task in BURST_TASKS for key in config.keys]
    number = 0
    for n in range(config.passes):
        # The first pass walks the pairs in the same order in every process: they collide.
        order = sorted(pairs) if n == 0 else rng.sample(pairs, len(pairs))
        index = 0
        while index < len(order):
            size = rng.randint(1, 4)
            chunk, index = order[index : index + size], index + size
            yield _plan_txn(rng, process, number, chunk, config)
            number += 1


def _running_plan(config: RaceConfig, process: int) -> Iterator[tuple[Txn, list[PlannedUnit]]]:
    rng = random.Random(f"{config.seed}-{process}")
    deadline = time.monotonic() + config.duration
    number = 0
    while time.monotonic() < deadline:
        keys = rng.sample(config.keys, rng.choice((1, 1, 1, 2)))
        yield _plan_txn(rng, process, number, [(RUN_TASK, k) for k in keys], config)
        number += 1
        time.sleep(rng.uniform(0.0, 0.02))


# -- running it ----------------------------------------------------------------------------


def _record_duplicate(unit: Unit, exc: DuplicateJobError) -> None:
    unit.duplicate = {"task": exc.task, "key": exc.key, "job_id": exc.job_id}


def _run_sync(
    engine: Engine,
    bind_kind: str,
    plan: Iterator[tuple[Txn, list[PlannedUnit]]],
    done: Callable[[Txn], None],
) -> None:
    for txn, planned in plan:
        with _sync_bind(engine, bind_kind) as (bind, commit, rollback):
            try:
                for p in planned:
                    p.unit.started = time.time()
                    try:
                        if p.unit.kind == "batch":
                            ids = queue.enqueue_many(bind, p.specs)
                        else:
                            ids = [_enqueue_one(bind, p)]
                        for c, job_id in zip(p.unit.calls, ids, strict=True):
                            c.id = job_id
                    except DuplicateJobError as exc:
                        _record_duplicate(p.unit, exc)
                    p.unit.ended = time.time()
                    if p.pause_after:
                        txn.holds += p.pause_after
                        time.sleep(p.pause_after)
                if txn.fate == "rollback":
                    rollback()
                else:
                    commit()
                    txn.committed = True
            except Exception:
                txn.error = traceback.format_exc()
                with contextlib.suppress(Exception):  # the error is recorded above
                    rollback()
        done(txn)


def _enqueue_one(bind: Any, p: PlannedUnit) -> Any:
    spec = p.specs[0]
    if p.how == "by_name":
        o = spec.options
        options: dict[str, Any] = {
            k: v
            for k, v in (
                ("unique_key", o.unique_key),
                ("unique_scope", o.unique_scope),
                ("on_duplicate", o.on_duplicate),
            )
            if v is not None
        }
        return queue.enqueue(bind, spec.task, spec.kwargs, **options)
    return queue.enqueue_spec(bind, spec)


@contextmanager
def _sync_bind(
    engine: Engine, kind: str
) -> Iterator[tuple[Any, Callable[[], None], Callable[[], None]]]:
    if kind == "connection":
        with engine.connect() as conn:
            trans = conn.begin()
            yield conn, trans.commit, trans.rollback
    else:
        with Session(engine) as session:
            session.begin()
            yield session, session.commit, session.rollback


async def _run_async(
    url: str,
    bind_kind: str,
    plan: Iterator[tuple[Txn, list[PlannedUnit]]],
    done: Callable[[Txn], None],
    ready: Callable[[], None],
) -> None:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:  # connect and import everything before the barrier
            await conn.execute(text("SELECT 1"))
        await asyncio.to_thread(ready)
        for txn, planned in plan:
            if bind_kind == "async_connection":
                conn = await engine.connect()
                bind: Any = conn
                trans = await conn.begin()
                commit, rollback, close = trans.commit, trans.rollback, conn.close
            else:
                session = AsyncSession(engine)
                bind = session
                await session.begin()
                commit, rollback, close = session.commit, session.rollback, session.close
            try:
                for p in planned:
                    p.unit.started = time.time()
                    try:
                        if p.unit.kind == "batch":
                            ids = await queue.enqueue_many(bind, p.specs)
                        else:
                            ids = [await _enqueue_one(bind, p)]
                        for c, job_id in zip(p.unit.calls, ids, strict=True):
                            c.id = job_id
                    except DuplicateJobError as exc:
                        _record_duplicate(p.unit, exc)
                    p.unit.ended = time.time()
                    if p.pause_after:
                        txn.holds += p.pause_after
                        await asyncio.sleep(p.pause_after)
                if txn.fate == "rollback":
                    await rollback()
                else:
                    await commit()
                    txn.committed = True
            except Exception:
                txn.error = traceback.format_exc()
                with contextlib.suppress(Exception):  # the error is recorded above
                    await rollback()
            finally:
                await close()
            done(txn)
    finally:
        await engine.dispose()


#: How each process reaches the database: every kind of bind the API takes.
BIND_KINDS = (
    "session",
    "connection",
    "async_session",
    "session",
    "async_connection",
    "connection",
    "session",
    "async_session",
)


def enqueue_race(url: str, process: int, config: RaceConfig, barrier: Any, log_path: str) -> None:
    """One enqueuer process: warm up, wait at ``barrier``, run the plan, write the log.

    The async URL is the same psycopg URL (psycopg serves both faces).
    """
    kind = BIND_KINDS[process % len(BIND_KINDS)]
    txns: list[Txn] = []
    started: list[float] = []

    def ready() -> None:
        barrier.wait(timeout=120)
        started.append(time.time())

    def plan() -> Iterator[tuple[Txn, list[PlannedUnit]]]:
        gen = _burst_plan if config.mode == "burst" else _running_plan
        return gen(config, process)

    if kind.startswith("async"):
        asyncio.run(_run_async(url, kind, plan(), txns.append, ready))
    else:
        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            ready()
            _run_sync(engine, kind, plan(), txns.append)
        finally:
            engine.dispose()
    Path(log_path).write_text(
        json.dumps(
            {
                "process": process,
                "bind": kind,
                "started": started[0],
                "txns": [asdict(t) for t in txns],
            }
        )
    )


def load_logs(paths: list[Path]) -> list[dict[str, Any]]:
    """The enqueuer logs, one dict per process."""
    return [json.loads(p.read_text()) for p in sorted(paths)]


# -- database-side audit (running mode) ----------------------------------------------------


def audit_ddl() -> list[str]:
    """A deferred constraint trigger that checks the unique-key invariant at every commit.

    It fires, at commit, for each execution row of :data:`RUN_TASK` that a transaction
    inserted or moved back to ``pending``/``waiting``. It takes a transaction-level
    advisory lock on the job's key, then counts the key's jobs in a fresh snapshot
    (PL/pgSQL statements of a volatile function each take a new snapshot under READ
    COMMITTED). Commits that add a queued job of one key are therefore checked one after
    another, each seeing every earlier one (a lock is released only after its
    transaction's commit is visible): a commit that leaves a key with two jobs inside its
    scope's window is caught, whatever the timing, and written to ``unique_audit`` (in the
    same transaction, so it survives). Scope ``queued`` (keys ``q-*``): at most one
    pending or waiting execution; every other scope: at most one unfinished job (one
    execution row, whatever its state).
    """
    jobs = queue.tables.jobs.fullname
    ex = queue.tables.executions.fullname
    return [
        "CREATE TABLE unique_audit "
        "(key text, jobs bigint[], at timestamptz DEFAULT clock_timestamp())",
        f"""
        CREATE FUNCTION unique_audit_check() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            k text;
            ids bigint[];
        BEGIN
            SELECT j.unique_key INTO k FROM {jobs} j WHERE j.id = NEW.id AND j.task = '{RUN_TASK}';
            IF k IS NULL THEN
                RETURN NULL;
            END IF;
            PERFORM pg_advisory_xact_lock(hashtext('{RUN_TASK}:' || k));
            SELECT array_agg(j.id ORDER BY j.id) INTO ids
            FROM {jobs} j JOIN {ex} e ON e.id = j.id
            WHERE j.task = '{RUN_TASK}' AND j.unique_key = k
              AND (k NOT LIKE 'q-%' OR e.state IN ('pending', 'waiting'));
            IF cardinality(ids) > 1 THEN
                INSERT INTO unique_audit (key, jobs) VALUES (k, ids);
            END IF;
            RETURN NULL;
        END $$
        """,
        f"""
        CREATE CONSTRAINT TRIGGER unique_audit_insert AFTER INSERT ON {ex}
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
        EXECUTE FUNCTION unique_audit_check()
        """,
        f"""
        CREATE CONSTRAINT TRIGGER unique_audit_requeue AFTER UPDATE OF state ON {ex}
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
        WHEN (NEW.state IN ('pending', 'waiting') AND OLD.state NOT IN ('pending', 'waiting'))
        EXECUTE FUNCTION unique_audit_check()
        """,
    ]


def violations_sql() -> Any:
    """One snapshot's keys with two jobs in their scope's window (the sampled audit)."""
    jobs = queue.tables.jobs.fullname
    ex = queue.tables.executions.fullname
    return text(
        f"SELECT j.unique_key, array_agg(j.id ORDER BY j.id) FROM {jobs} j "
        f"JOIN {ex} e ON e.id = j.id WHERE j.task = '{RUN_TASK}' "
        "AND (j.unique_key NOT LIKE 'q-%' OR e.state IN ('pending', 'waiting')) "
        "GROUP BY j.unique_key HAVING count(*) > 1"
    )
