"""The sustained-load benchmark's pacing and backlog arithmetic (no database)."""

from __future__ import annotations

import time

import pytest

from bench.sustained import SustainedRun, backlog_summary, no_growth, targets
from bench.worker import Pacer


def test_pacer_schedule_does_not_drift_after_a_late_transaction() -> None:
    pacer = Pacer(rate=100.0, seconds=10.0, phase=0.0)
    pacer.start = time.monotonic() - 0.5  # half a second late: 50 transactions overdue
    taken = [pacer.take() for _ in range(60)]
    assert all(t is not None for t in taken)
    pauses = [t[1] for t in taken if t is not None]
    # The overdue ones run back to back; the 51st onwards wait for their own due times,
    # which stay on the original grid instead of sliding by the delay.
    assert pauses[:50] == [0.0] * 50
    assert 0.0 < pauses[55] <= 0.06
    assert [t[0] for t in taken if t is not None] == list(range(60))


def test_pacer_stops_at_the_end_of_its_window() -> None:
    pacer = Pacer(rate=1000.0, seconds=0.01, phase=0.0)
    assert pacer.count == 10
    pacer.end = time.monotonic() - 1
    assert pacer.take() is None


def test_backlog_growth_and_steady_state() -> None:
    steady = [(t / 2, 3 + (t % 2)) for t in range(21)]
    growing = [(t / 2, 100 * t) for t in range(21)]
    flat, grown = backlog_summary(steady, 10.0), backlog_summary(growing, 10.0)
    assert flat["slope"] == pytest.approx(0.0, abs=0.5)
    assert no_growth(flat, 1000.0)
    assert grown["slope"] == pytest.approx(200.0)
    assert (grown["start"], grown["middle"], grown["end"], grown["max"]) == (0, 1000, 2000, 2000)
    assert not no_growth(grown, 1000.0)


def test_a_target_is_not_measured_when_the_producers_fell_short() -> None:
    def run(offered: float) -> SustainedRun:
        return SustainedRun(
            "sqla-sync", 1000.0, 1, offered=offered, latency_ms={"p99": 10.0}, backlog={}
        )

    (short,) = targets([run(300.0)])
    (full,) = targets([run(990.0)])
    assert short["met"] is None
    assert full["met"] is True
