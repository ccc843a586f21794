"""The Node peers' bookkeeping in the drain benchmark (no database, no Node)."""

from __future__ import annotations

import pytest

from bench.node_peers import counted_seconds, worker_command


def _report(starts: list[tuple[int, float]]) -> dict[str, object]:
    return {"keys": [n for n, _ in starts], "starts": [list(s) for s in starts]}


def test_counted_seconds_is_the_nth_counted_start_across_processes() -> None:
    # Hot jobs (negative n) are not counted, whatever their start times.
    one = _report([(0, 10.5), (-1, 10.1), (2, 11.0)])
    two = _report([(1, 10.7), (-2, 10.2), (3, 12.0)])
    assert counted_seconds([one, two], 3, m0=10.0) == pytest.approx(1.0)
    assert counted_seconds([one, two], 1, m0=10.0) == pytest.approx(0.5)


def test_counted_seconds_refuses_a_job_run_twice() -> None:
    with pytest.raises(RuntimeError, match="more than once"):
        counted_seconds([_report([(0, 1.0)]), _report([(0, 1.5)])], 1, m0=0.0)


def test_counted_seconds_refuses_too_few_counted_jobs() -> None:
    with pytest.raises(RuntimeError, match="saw 1 counted jobs, not 2"):
        counted_seconds([_report([(0, 1.0), (-1, 1.1)])], 2, m0=0.0)


def test_worker_command_refuses_a_python_system() -> None:
    with pytest.raises(ValueError, match="not a Node system"):
        worker_command("drain", "sqla-sync", "postgresql://x", 10, "bench.noop")
