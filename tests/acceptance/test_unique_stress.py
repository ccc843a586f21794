"""Unique jobs under 8 racing OS processes (issue 14, part 1).

Both tests start 8 enqueuer processes (``multiprocessing`` spawn) that connect, warm up
and then wait at one barrier, so that they really enqueue the same keys at the same
moment. They use every kind of bind (``Session``, ``Connection``, ``AsyncSession``,
``AsyncConnection``), single enqueues and ``enqueue_many`` batches, every policy, and
transactions that commit at once, stay open a while first (holding their keys' rows
locked, so the others queue up behind them), or roll back. Each process logs every call
and its answer (see :mod:`tests.support.unique_race`); the test then holds the logs
against the database.

* Burst: nothing runs the jobs, 50 keys in each of two tasks (one namespace per task),
  with scopes ``queued``, ``active`` and ten minutes. Every key ends with exactly one job,
  whose queued execution is pending and which the key's row points at; every committed
  call answered that job's id; a rolled-back call answered it too, or an id that exists
  nowhere (its own job, rolled back with it); no plain call is lost; a
  ``DuplicateJobError`` comes only from a ``raise`` call that met a holder, and names it;
  the job carries the arguments of its creator or, when a ``replace`` call committed, of
  a ``replace`` call.
* Running: two worker processes run the jobs while the 8 processes keep enqueueing 12
  hot keys for several seconds, so keys are released and taken again all the time. The
  invariant "no key ever has two jobs inside its scope's window" (scope ``queued``: two
  pending executions; ``active`` and a duration: two unfinished jobs) is checked twice:
  at every commit that adds a queued job, by a deferred constraint trigger that
  serializes those commits per key with an advisory lock and counts in a fresh snapshot
  (so it misses no interleaving), and by a query the test samples during the run. A key
  with a duration scope is taken again only ``hold`` seconds after its job finished, in
  the database's own clock.
"""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text, update
from sqlalchemy.pool import NullPool

from tests.support.app import ExecutionLog
from tests.support.chaos import catches_sigterm
from tests.support.processes import start_worker
from tests.support.unique_race import (
    BURST_TASKS,
    RUN_HOLD,
    RUN_TASK,
    RaceConfig,
    audit_ddl,
    enqueue_race,
    key_scope,
    load_logs,
    queue,
    uniq_run,
    violations_sql,
)

pytestmark = pytest.mark.acceptance


def run_race(
    db_url: str, config: RaceConfig, log_dir: Path, timeout: float
) -> list[dict[str, Any]]:
    """Run ``config.processes`` enqueuer processes behind one barrier; their logs."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(config.processes)
    paths = [log_dir / f"enqueuer{i}.json" for i in range(config.processes)]
    procs = [
        ctx.Process(target=enqueue_race, args=(db_url, i, config, barrier, str(path)), daemon=True)
        for i, path in enumerate(paths)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    codes = [proc.exitcode for proc in procs]
    assert codes == [0] * config.processes, f"enqueuer exit codes {codes}"
    return load_logs(paths)


def flatten(
    logs: list[dict[str, Any]],
) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """Every (transaction, unit, call) of the logs."""
    return [
        (txn, unit, call)
        for log in logs
        for txn in log["txns"]
        for unit in txn["units"]
        for call in unit["calls"]
    ]


def txn_id(txn: dict[str, Any]) -> tuple[int, int]:
    return txn["process"], txn["number"]


def check_no_errors(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Transactions failed by anything but a DuplicateJobError: none may exist."""
    failed = [txn for log in logs for txn in log["txns"] if txn["error"]]
    assert not failed, "\n".join(t["error"] for t in failed[:3])
    return [txn for log in logs for txn in log["txns"]]


def check_duplicates(logs: list[dict[str, Any]], holder_ok: Any) -> int:
    """Every DuplicateJobError came from a ``raise`` call that met a holder, and named it.

    ``holder_ok(task, key, job_id)`` says whether ``job_id`` may hold the key. Returns how
    many were raised.
    """
    raised = 0
    for log in logs:
        for txn in log["txns"]:
            own: dict[tuple[str, str], set[int]] = defaultdict(set)
            for unit in txn["units"]:
                dup = unit["duplicate"]
                if dup is not None:
                    raised += 1
                    where = f"txn {txn_id(txn)} unit {unit}"
                    same = [
                        c
                        for c in unit["calls"]
                        if (c["task"], c["key"]) == (dup["task"], dup["key"])
                    ]
                    assert any(c["policy"] == "raise" for c in same), where
                    assert all(c["id"] is None for c in unit["calls"]), where
                    if dup["job_id"] is None:
                        # Only a duplicate inside the batch raises without a holder.
                        assert len(same) > 1, where
                    else:
                        key = (dup["task"], dup["key"])
                        assert dup["job_id"] in own[key] or holder_ok(*key, dup["job_id"]), where
                for call in unit["calls"]:
                    if call["key"] is not None and call["id"] is not None:
                        own[(call["task"], call["key"])].add(call["id"])
    return raised


def check_rolled_back_ids(calls: list[Any], existing: set[int]) -> int:
    """An id no committed job has may only be answered within one transaction (its own job,
    rolled back with it): a holder another transaction saw must have been committed.
    Returns how many such ids there are."""
    owners: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for txn, _, call in calls:
        if call["id"] is not None and call["id"] not in existing:
            assert not txn["committed"], f"committed call {call} answered a missing job"
            owners[call["id"]].add(txn_id(txn))
    shared = {i: o for i, o in owners.items() if len(o) > 1}
    assert not shared, f"uncommitted ids answered to several transactions: {shared}"
    return len(owners)


def test_eight_processes_enqueueing_the_same_keys_make_exactly_one_job_per_key(
    db_url: str, tmp_path: Path
) -> None:
    keys = tuple(f"{'qaf'[i % 3]}-{i:02d}" for i in range(50))
    config = RaceConfig(
        mode="burst", keys=keys, seed=14, passes=2, rollback=0.15, hold=0.25, hold_max=0.3
    )
    began = time.monotonic()
    logs = run_race(db_url, config, tmp_path, timeout=150)
    race_seconds = time.monotonic() - began
    txns = check_no_errors(logs)
    calls = flatten(logs)

    jobs_t, ex_t, keys_t = queue.tables.jobs, queue.tables.executions, queue.tables.unique_keys
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            jobs = conn.execute(
                select(
                    jobs_t.c.id,
                    jobs_t.c.task,
                    jobs_t.c.unique_key,
                    jobs_t.c.status,
                    jobs_t.c.payload["kwargs"]["tag"].astext.label("tag"),
                    ex_t.c.state,
                )
                .join(ex_t, ex_t.c.id == jobs_t.c.id, isouter=True)
                .where(jobs_t.c.task.in_(BURST_TASKS))
            ).all()
            key_rows = {
                (r.task, r.key): r
                for r in conn.execute(select(keys_t).where(keys_t.c.task.in_(BURST_TASKS)))
            }
    finally:
        engine.dispose()

    # Every job is queued and pending: nothing ran.
    assert {(j.status, j.state) for j in jobs} == {("queued", "pending")}
    keyed: dict[tuple[str, str], list[Any]] = defaultdict(list)
    plain = {j.id: j for j in jobs if j.unique_key is None}
    for j in jobs:
        if j.unique_key is not None:
            keyed[(j.task, j.unique_key)].append(j)
    doubled = {k: [j.id for j in v] for k, v in keyed.items() if len(v) > 1}
    assert not doubled, f"keys with more than one job: {doubled}"
    final = {k: v[0].id for k, v in keyed.items()}
    existing = {j.id for j in jobs}

    # A key has a job exactly when a committed call got an answer for it.
    answered = {
        (c["task"], c["key"])
        for t, _, c in calls
        if t["committed"] and c["key"] and c["id"] is not None
    }
    assert set(final) == answered
    assert len(final) > 0.9 * len(BURST_TASKS) * len(keys)

    # The key rows point at their job, with the scope the calls asked for.
    for (task, key), job_id in final.items():
        row = key_rows[(task, key)]
        scope = key_scope(key)
        stored = ("finished", scope) if isinstance(scope, float) else (scope, None)
        assert (row.job_id, row.scope, row.hold_seconds) == (job_id, *stored), (task, key, row)

    # Every committed call answered the key's one job (or, plain, its own job); nothing lost.
    committed_plain = [c for t, _, c in calls if t["committed"] and c["key"] is None and c["id"]]
    for txn, _, call in calls:
        if call["id"] is None:
            continue
        if call["key"] is not None:
            if txn["committed"]:
                assert call["id"] == final[(call["task"], call["key"])], call
            else:
                assert (
                    call["id"] == final.get((call["task"], call["key"]))
                    or call["id"] not in existing
                ), call
        elif txn["committed"]:
            assert plain[call["id"]].tag == call["tag"], call
        else:
            assert call["id"] not in existing, call
    assert sorted(c["id"] for c in committed_plain) == sorted(plain)
    rolled_back_creators = check_rolled_back_ids(calls, existing)

    raised = check_duplicates(logs, lambda task, key, job_id: final.get((task, key)) == job_id)

    # Whose arguments each job carries: its creator's, or a committed replace call's.
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for txn, _, call in calls:
        if txn["committed"] and call["key"] is not None and call["id"] is not None:
            by_key[(call["task"], call["key"])].append(call)
    replaced = 0
    for pair in final:
        tag = keyed[pair][0].tag
        answered_calls = by_key[pair]
        assert tag in {c["tag"] for c in answered_calls}, (pair, tag)
        replacers = {c["tag"] for c in answered_calls if c["policy"] == "replace"}
        if replacers:
            assert tag in replacers, (pair, tag, replacers)
            replaced += 1
        # A raise call that got an answer took the key: at most one per key.
        assert sum(1 for c in answered_calls if c["policy"] == "raise") <= 1, pair

    # The race was real: everyone started together, transactions stayed open and others
    # waited for them, some rolled back their own new job, raise met holders.
    starts = [log["started"] for log in logs]
    waited = [u["ended"] - u["started"] for log in logs for t in log["txns"] for u in t["units"]]
    summary = (
        f"{len(txns)} transactions ({sum(t['committed'] for t in txns)} committed, "
        f"{sum(1 for t in txns if t['holds'])} held open), {len(calls)} calls, "
        f"{len(final)} keys, {len(plain)} plain jobs, {raised} DuplicateJobError, "
        f"{rolled_back_creators} rolled-back own jobs, {replaced} keys replaced, "
        f"statements slower than 50 ms: {sum(w > 0.05 for w in waited)}, "
        f"start spread {max(starts) - min(starts):.3f}s, race {race_seconds:.1f}s, "
        f"binds {sorted(Counter(log['bind'] for log in logs).items())}"
    )
    print(summary)
    assert max(starts) - min(starts) < 1.0, summary
    assert raised > 0 and rolled_back_creators > 0 and replaced > 0, summary
    assert sum(w > 0.05 for w in waited) > 10, summary
    assert committed_plain, summary


def test_keys_released_and_retaken_under_running_workers_never_hold_two_jobs(
    db_url: str, tmp_path: Path
) -> None:
    keys = tuple(f"{scope}-{i}" for scope in "qad" for i in range(4))
    config = RaceConfig(
        mode="running", keys=keys, seed=41, duration=8.0, rollback=0.1, hold=0.15, hold_max=0.15
    )
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.begin() as conn:
        for statement in audit_ddl():
            conn.execute(text(statement))

    args = ["--tasks", RUN_TASK, "--concurrency", "4", "--poll-interval", "0.2"]
    workers = [
        start_worker(
            db_url,
            *args,
            log_path=tmp_path / f"worker{i}.log",
            target="tests.support.unique_race:queue",
        )
        for i in range(2)
    ]
    samples: list[int] = []
    seen: list[tuple[str, list[int]]] = []
    stop = threading.Event()

    def sample() -> None:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            while not stop.is_set():
                seen.extend((k, ids) for k, ids in conn.execute(violations_sql()))
                samples.append(1)
                time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    ex_t = queue.tables.executions
    try:
        deadline = time.monotonic() + 60
        while not all(catches_sigterm(w.pid) for w in workers):
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.05)
        sampler.start()
        logs = run_race(db_url, config, tmp_path, timeout=120)
        deadline = time.monotonic() + 60
        while True:
            with engine.connect() as conn:
                left = conn.scalar(
                    select(func.count()).select_from(ex_t).where(ex_t.c.task == RUN_TASK)
                )
            if not left:
                break
            assert time.monotonic() < deadline, f"{left} jobs left"
            time.sleep(0.1)
    finally:
        stop.set()
        if sampler.is_alive():
            sampler.join(10)
        for w in workers:
            if w.poll() is None:
                w.terminate()
        codes = [w.wait(timeout=60) for w in workers]
    assert codes == [0, 0], "\n".join(p.read_text() for p in tmp_path.glob("worker*.log"))

    jobs_t = queue.tables.jobs
    try:
        with engine.connect() as conn:
            audit = conn.execute(text("SELECT key, jobs FROM unique_audit")).all()
            jobs = conn.execute(
                select(
                    jobs_t.c.id,
                    jobs_t.c.unique_key,
                    jobs_t.c.status,
                    jobs_t.c.payload["kwargs"]["tag"].astext.label("tag"),
                    func.extract("epoch", jobs_t.c.created_at).label("created"),
                    func.extract("epoch", jobs_t.c.finished_at).label("finished"),
                ).where(jobs_t.c.task == RUN_TASK)
            ).all()
            runs = Counter(conn.scalars(select(ExecutionLog.job_id)))
        # The audit is live: two queued jobs of one key, written past the library (plain
        # jobs given the key by hand), are caught by the trigger and by the query.
        with engine.begin() as conn:
            planted = queue.enqueue_many(conn, [uniq_run.call(tag="x"), uniq_run.call(tag="y")])
            conn.execute(update(jobs_t).where(jobs_t.c.id.in_(planted)).values(unique_key="q-0"))
        with engine.connect() as conn:
            caught = conn.execute(text("SELECT key, jobs FROM unique_audit")).all()
            sampled = conn.execute(violations_sql()).all()
    finally:
        engine.dispose()
    assert [tuple(r) for r in caught] == [("q-0", sorted(planted))] * 2, caught
    assert [tuple(r) for r in sampled] == [("q-0", sorted(planted))], sampled

    assert not audit, f"the trigger saw keys with two jobs in their window: {audit[:10]}"
    assert not seen, f"the sampled query saw keys with two jobs in their window: {seen[:10]}"
    txns = check_no_errors(logs)
    calls = flatten(logs)
    by_id = {j.id: j for j in jobs}
    existing = set(by_id)
    assert {j.status for j in jobs} == {"succeeded"}
    assert runs == Counter(existing), "a job ran twice or not at all"

    # Every committed call answered a job of its key; every job was answered to a
    # committed call, and carries the arguments of one.
    answered: dict[int, set[str]] = defaultdict(set)
    for txn, _, call in calls:
        if call["id"] is None:
            continue
        job = by_id.get(call["id"])
        if txn["committed"]:
            assert job is not None and job.unique_key == call["key"], call
            answered[call["id"]].add(call["tag"])
        else:
            assert job is None or job.unique_key == call["key"], call
    assert set(answered) == existing
    assert all(by_id[i].tag in tags for i, tags in answered.items())
    rolled_back_creators = check_rolled_back_ids(calls, existing)
    raised = check_duplicates(
        logs, lambda task, key, job_id: job_id in by_id and by_id[job_id].unique_key == key
    )

    per_key: dict[str, list[Any]] = defaultdict(list)
    for j in jobs:
        per_key[j.unique_key].append(j)
    # A duration key is taken again only once its job finished ``hold`` seconds ago (the
    # statement compares with now(), which is also the new job's created_at).
    for key in keys:
        history = sorted(per_key[key], key=lambda j: float(j.created))
        if key.startswith("d"):
            for before, after in itertools.pairwise(history):
                assert float(after.created) >= float(before.finished) + RUN_HOLD - 1e-6, (
                    key,
                    before,
                    after,
                )
    # Keys really were released and taken again; a queued-scope key even while its job ran.
    retaken = {key: len(per_key[key]) for key in keys}
    overlaps = sum(
        1
        for key in keys
        if key.startswith("q")
        for before, after in zip(
            sorted(per_key[key], key=lambda j: float(j.created)),
            sorted(per_key[key], key=lambda j: float(j.created))[1:],
            strict=False,
        )
        if float(after.created) < float(before.finished)
    )
    summary = (
        f"{len(txns)} transactions ({sum(t['committed'] for t in txns)} committed), "
        f"{len(calls)} calls, {len(jobs)} jobs, jobs per key {retaken}, {raised} "
        f"DuplicateJobError, {rolled_back_creators} rolled-back own jobs, {len(samples)} samples, "
        f"queued-scope keys retaken while their job ran: {overlaps}"
    )
    print(summary)
    assert all(n >= 3 for n in retaken.values()), summary
    assert overlaps > 0, summary
    assert raised > 0 and rolled_back_creators > 0, summary
    assert len(samples) > 20, summary
