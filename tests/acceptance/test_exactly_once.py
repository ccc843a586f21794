"""Exactly-once database effects under SIGKILLs, SIGSTOPs and backend terminations
(issue 14, part 4).

2,000 jobs of two ``transactional=True`` tasks (a ``def`` one for two sync worker
processes, an ``async def`` one for an async worker process) each write two effects
through ``ctx.session``: ``UPDATE exo_counter SET n = n + 1`` and a row in
``exo_effects``; the worker commits the job's completion in that transaction. Meanwhile
the chaos loop of :mod:`tests.support.exactly_once` SIGKILLs workers (and starts new
ones), SIGSTOPs one now and then for longer than the 1 s lease (its jobs are reclaimed;
when it resumes, its handlers try to complete executions that are no longer theirs), and
ends every backend of the database with ``pg_terminate_backend``.

What must hold at the end, read from the database:

* every job ``succeeded``, and the counter equals the number of jobs, exactly;
* each job has exactly one effect row (there is no unique key to stop a second one: the
  queue's fence is the only guard), written by the attempt the job records as its last,
  which is also the attempt the handler returned as the job's result;
* the chaos happened: workers were killed and stopped, sweeps ended backends, the
  reclaim sweep handed lost executions back (a trigger logs each one), and stale
  completions were fenced off and rolled back (the workers log each one);
* no worker exited on its own once started, and every survivor exits 0 on SIGTERM. (A
  worker whose very first connection a sweep cuts while it is being set up exits 1 with
  "cannot connect", as at any start-up without a database; those are counted apart.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.pool import NullPool

from tests.support.exactly_once import (
    ASYNC_TASK,
    SYNC_TASK,
    ExactlyOnceConfig,
    ddl,
    queue,
    run_exactly_once,
)

pytestmark = pytest.mark.acceptance


@pytest.fixture
def admin_engine(db_url: str) -> Iterator[Engine]:
    engine = create_engine(db_url, poolclass=NullPool)
    with engine.begin() as conn:
        for statement in ddl():
            conn.execute(text(statement))
    yield engine
    engine.dispose()


def test_transactional_handlers_count_every_job_exactly_once_under_fire(
    admin_engine: Engine, db_url: str, tmp_path: Path
) -> None:
    config = ExactlyOnceConfig()
    run = run_exactly_once(admin_engine, db_url, config, tmp_path, say=print)
    total = config.sync_jobs + config.async_jobs

    jobs_t = queue.tables.jobs
    with admin_engine.connect() as conn:
        jobs = {
            row.id: row
            for row in conn.execute(
                select(
                    jobs_t.c.id,
                    jobs_t.c.task,
                    jobs_t.c.status,
                    jobs_t.c.attempts,
                    jobs_t.c.result,
                    jobs_t.c.errors,
                ).where(jobs_t.c.task.in_((SYNC_TASK, ASYNC_TASK)))
            )
        }
        counter = conn.scalar(text("SELECT n FROM exo_counter WHERE id = 1"))
        effects = conn.execute(text("SELECT job_id, attempt, task FROM exo_effects")).all()
        reclaims = conn.execute(
            text("SELECT count(*), count(DISTINCT job_id) FROM exo_reclaims")
        ).one()

    per_job = Counter(job_id for job_id, _, _ in effects)
    errors = Counter(e.get("type") for job in jobs.values() for e in job.errors or [])
    fenced = run.log_count("result discarded")
    summary = (
        f"drain {run.drain_seconds}s, {run.kills} SIGKILLs, {run.stops} SIGSTOPs, "
        f"backend sweeps {run.sweeps}, {reclaims[0]} reclaims of {reclaims[1]} jobs, "
        f"{fenced} fenced completions, counter {counter}, {len(effects)} effects, "
        f"attempts > 1: {sum(j.attempts > 1 for j in jobs.values())}, "
        f"recorded errors {dict(errors)}, unexpected exits {run.unexpected_exits}, "
        f"workers whose first connection a sweep cut {run.startup_casualties}"
    )
    print(summary)

    assert run.drain_seconds is not None, summary
    assert sorted(jobs) == sorted(run.job_ids), summary
    statuses = Counter(job.status for job in jobs.values())
    assert statuses == {"succeeded": total}, (statuses, summary)
    # Exactly once: the counter, and one effect per job, from the attempt that won.
    assert counter == total, summary
    doubled = {job_id: n for job_id, n in per_job.items() if n != 1}
    assert not doubled, f"jobs with more than one effect: {list(doubled.items())[:10]}"
    assert set(per_job) == set(jobs), summary
    for job_id, attempt, task in effects:
        job = jobs[job_id]
        assert (attempt, task) == (job.attempts, job.task), (job_id, attempt, job)
        assert job.result == attempt, (job_id, attempt, job.result)
    # The chaos really happened, or this proves nothing.
    assert run.kills >= 3, summary
    assert run.stops >= 1, summary
    # A sweep that lands while every worker is restarting finds nobody: count the others.
    assert sum(n > 0 for n in run.sweeps) >= 2, summary
    assert reclaims[0] > 0, summary
    assert fenced > 0, summary
    assert run.unexpected_exits == 0, f"{summary}\n{run.unexpected_logs()}"
    assert run.stop_codes and all(code == 0 for code in run.stop_codes), (
        f"{run.stop_codes} {summary}\n{run.unexpected_logs()}"
    )
