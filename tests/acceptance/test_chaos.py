"""Chaos drain: 4 workers, 10,000 jobs, SIGKILLs every ~2 s, connections cut twice.

The scenario and the accounting live in :mod:`tests.support.chaos` (``bench/chaos.py`` runs
the same thing for longer). What this test expects:

* every job ends ``succeeded`` with its own result, none is missing and none is left queued;
* a job runs more than once only when its worker was SIGKILLed while running it (checked
  against the kill log through the pid each execution recorded), or when the attempt failed
  because ``pg_terminate_backend`` cut the handler's own connection, and that failure is in
  the job's error history under that attempt (the ``chaos`` task allows 10 attempts with a
  short backoff, so such a job retries and succeeds);
* workers survive the backend sweeps (no worker exits on its own) and exit 0 on SIGTERM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chaos import ChaosConfig, run_chaos, summary, verify_chaos

pytestmark = pytest.mark.acceptance


def test_chaos_drain_loses_nothing_and_reruns_only_what_was_killed(
    db_url: str, tmp_path: Path
) -> None:
    config = ChaosConfig(jobs=10_000, workers=4, concurrency=10, kill_every=2.0, terminations=2)
    run = run_chaos(db_url, config, tmp_path, on_progress=print)
    report = verify_chaos(db_url, run)
    print(summary(run, report))

    assert run.drained_at is not None, summary(run, report)
    assert not report.problems, summary(run, report)
    assert report.succeeded == config.jobs
    # The chaos really happened, or the test proves nothing.
    assert len(run.terminations) == config.terminations
    assert all(t.backends >= config.workers for t in run.terminations), run.terminations
    assert len(run.kills) >= 5
    assert report.extra_by_kill > 0, "no SIGKILL landed on a running job"
    assert report.log_counts["database error"] > 0, "no worker noticed a cut connection"
