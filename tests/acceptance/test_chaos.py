"""Chaos drain: 4 workers, 4,000 jobs and a poison mix, SIGKILLs every ~2 s, connections
cut twice.

The scenario and the accounting live in :mod:`tests.support.chaos` (``bench/chaos.py`` runs
the same thing for longer). What this test expects:

* every job ends ``succeeded`` with its own result, none is missing and none is left queued;
* a job runs more than once only when its worker was SIGKILLed while running it (checked
  against the kill log through the pid each execution recorded), or when the attempt failed
  because ``pg_terminate_backend`` cut the handler's own connection, and that failure is in
  the job's error history under that attempt (the ``chaos`` task allows 10 attempts with a
  short backoff, so such a job retries and succeeds);
* workers survive the backend sweeps (no worker exits on its own but the one a handler's
  ``SystemExit`` stopped) and exit 0 on SIGTERM;
* every poison job (issue 12) ends ``failed`` with its reason, and no worker wedges.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from tests.support.app import ExecutionLog, queue, slow_first
from tests.support.chaos import (
    POISONS,
    ChaosConfig,
    catches_sigterm,
    run_chaos,
    summary,
    verify_chaos,
)
from tests.support.processes import start_worker
from tests.support.running import wait_for

pytestmark = pytest.mark.acceptance


def test_chaos_drain_with_a_poison_mix_loses_nothing_and_wedges_no_worker(
    db_url: str, tmp_path: Path
) -> None:
    """4,000 normal jobs under SIGKILLs and backend sweeps, with issue 12's poison mix
    among them: a retry and a reschedule due after the year 9999, a NUL result, a
    5,000-deep result, an async ``SystemExit``, and an execution written by hand for the
    year 20,000.

    Every normal job succeeds (reruns only where a kill or a cut connection explains them),
    every poison job ends failed with its reason, the far-future row stays pending and
    harms nobody, and the only worker that exits on its own is the one the ``SystemExit``
    stopped, gracefully and with the handler's exit code.
    """
    # About 75 s on this 2-core machine; the drain timeout leaves room for a busy day.
    # 4 workers of 6 + 2 + 1 connections (handlers, own pool, LISTEN): 36, plus this
    # process's 2, stay under the processes group's budget of 45 while a killed worker's
    # backends are still going away (concurrency 10 peaked at 55 and failed the budget).
    config = ChaosConfig(
        jobs=4_000,
        workers=4,
        concurrency=6,
        pool_size=2,
        kill_every=2.0,
        terminations=2,
        timeout=240.0,
        poison=True,
    )
    run = run_chaos(db_url, config, tmp_path, on_progress=print)
    report = verify_chaos(db_url, run)
    print(summary(run, report))

    assert run.drained_at is not None, summary(run, report)
    assert not report.problems, summary(run, report)
    assert report.succeeded == config.jobs
    # The chaos really happened, or the test proves nothing.
    assert len(run.terminations) == config.terminations
    assert all(t.backends > 0 for t in run.terminations), run.terminations
    assert len(run.kills) >= 5
    assert report.extra_by_kill > 0, "no SIGKILL landed on a running job"
    # The workers felt the cut connections and carried on.
    assert report.log_counts["database error"] > 0, report.log_counts
    assert report.log_counts["listen reconnect"] > 0, report.log_counts
    # Each poison failed alone; the SystemExit stopped its worker, and only that one.
    assert report.poison_failed == len(POISONS) == len(run.poison_jobs)
    assert report.poison_stops >= 1
    assert len(run.far_future) == 1
    # The poison was refused before any write: no completion had to be isolated.
    assert report.log_counts["isolated acks"] == 0, report.log_counts


def test_a_running_worker_recovers_a_killed_workers_job_within_its_lease(
    db_url: str, SessionLocal: sessionmaker[Session], tmp_path: Path
) -> None:
    """A SIGKILLed worker's job is taken over by a worker that is already running (not only
    by one that starts later and sweeps at start-up), within its task's lost interval plus a
    sweep interval."""
    lease = slow_first.task_options.lost_interval
    assert lease == 1.0
    with SessionLocal.begin() as session:
        job_id = slow_first.enqueue(session, seconds=60)
    args = ["--tasks", "slow_first", "--poll-interval", "0.2"]
    log = tmp_path / "workers.log"
    victim = start_worker(db_url, *args, log_path=log)
    survivor = None
    try:
        wait_for(lambda: _started(SessionLocal, job_id), timeout=60)
        survivor = start_worker(db_url, *args, log_path=log)
        # Past its start-up sweep, which found the victim's job alive.
        wait_for(lambda: catches_sigterm(survivor.pid), timeout=60)
        time.sleep(0.2)
        victim.kill()
        victim.wait()
        killed_at = time.monotonic()
        wait_for(lambda: _status(SessionLocal, job_id) == "succeeded", timeout=30)
        recovery = time.monotonic() - killed_at
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(timeout=30) == 0, log.read_text()
    finally:
        for proc in (victim, survivor):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"recovered {recovery:.1f}s after SIGKILL")
    # The lease, a sweep interval of half of it, and a margin for a busy machine.
    assert recovery < lease * 1.5 + 2.0, recovery


def _started(factory: sessionmaker[Session], job_id: int) -> bool:
    with factory() as session:
        count = session.scalar(
            select(func.count()).select_from(ExecutionLog).where(ExecutionLog.job_id == job_id)
        )
    return bool(count)


def _status(factory: sessionmaker[Session], job_id: int) -> str | None:
    with factory() as session:
        jobs = queue.tables.jobs
        return session.scalar(select(jobs.c.status).where(jobs.c.id == job_id))
