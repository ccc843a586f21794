"""Durable stress (issue 30): a few hundred durable jobs drained by 4 worker processes
while one is SIGKILLed every 2 s and every client backend is terminated now and then.

The scenario lives in :mod:`tests.support.durable_stress`, the accounting in
:mod:`tests.support.durable_stress_check`. Seed: ``$SQLA_QUEUE_DS_SEED`` (random;
printed, and in every failure message). What the test expects, from the database after
the drain and from samples taken while it ran:

* every job succeeded with the result its plan implies, and no execution is left (none
  lost, none suspended for ever);
* every step's write committed exactly once: its ``StepWrite`` row (primary key
  ``(job_id, step)``) is there with the step's value, ``job_steps`` holds exactly the
  planned steps and waits, and no attempt failed on a duplicate key;
* every signal woke its waiter exactly once: the job returned, and its last step wrote,
  the first send's payload; a second send stored nothing and woke nobody; every run past
  the wait beyond one is explained by a SIGKILL or a recorded failed attempt;
* no sample saw a suspended execution hold a worker, a heartbeat or a seat, nor more
  executions of the limited task running (or holding a seat) than its limit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from tests.support.durable_stress import LIMIT, StressConfig, create_tables, run_stress
from tests.support.durable_stress_check import summary, verify_stress

# Started worker processes measure progress against deadlines: one such test at a time
# (tests/conftest.py's "processes" group). 4 workers of 4 + 2 + 1 connections (handlers,
# own pool, LISTEN) and a wait's own session each, plus this process's 2.
pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.xdist_group("processes"),
    pytest.mark.connection_budget(45),
]


def test_durable_jobs_commit_each_step_once_and_wake_once_under_kills_and_cut_connections(
    db_url: str, tmp_path: Path
) -> None:
    """Steps, sleeps, signals and a concurrency-limited task under SIGKILLs and
    terminated backends: each step's writes commit once, each signal wakes once, and no
    sleeping job holds a seat or is lost."""
    config = StressConfig.from_env()
    engine = create_engine(db_url, poolclass=NullPool)
    create_tables(engine)
    engine.dispose()
    print(f"seed {config.seed}: replay with SQLA_QUEUE_DS_SEED={config.seed}")
    run = run_stress(db_url, config, tmp_path, on_progress=print)
    report = verify_stress(db_url, run)
    text = summary(run, report)
    print(text)

    assert run.drained_at is not None, text
    assert not report.problems, text
    assert report.succeeded == len(run.jobs), text
    # The chaos really happened, and the mix was there, or the test proves nothing.
    assert len(run.kills) >= 5, text
    assert len(run.terminations) >= 2 and sum(n for _, n in run.terminations) > 0, text
    assert report.log_counts["reclaim sweeps"] > 0, text
    assert report.woke > 0 and report.before_wait > 0 and report.repeats > 0, text
    assert run.sample.max_suspended > 0, text
    # More limited jobs slept at once than it has seats: had they kept theirs, the others
    # could not have run (and the holding check above would have caught it first).
    assert run.sample.max_limited_suspended > LIMIT, text
    assert run.sample.max_limited_running >= 1, text
