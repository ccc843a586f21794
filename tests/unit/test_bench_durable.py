"""The durable benchmark's pure parts: rates, latencies, the verdict, options, the tables."""

from __future__ import annotations

import math

import pytest

from bench import durable_peers
from bench.durable import (
    QUICK,
    DurableConfig,
    config_of,
    cost_verdict,
    parse_args,
    signal_latencies,
    span_rate,
    steps_per_second,
    tables_of,
)


def test_steps_per_second_is_steps_over_each_jobs_own_span() -> None:
    jobs = [{"began": 10.0, "ended": 10.05}, {"began": 20.0, "ended": 20.1}]
    assert steps_per_second(jobs, 10) == pytest.approx([200.0, 100.0])
    with pytest.raises(ValueError, match="ended before it began"):
        steps_per_second([{"began": 2.0, "ended": 2.0}], 10)


def test_span_rate_runs_from_the_first_start_to_the_last_end() -> None:
    jobs = [
        {"began": 1.0, "ended": 1.5},
        {"began": 1.2, "ended": 3.0},
        {"began": 2.0, "ended": 2.1},
    ]
    assert span_rate(jobs) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="no job"):
        span_rate([])


def test_signal_latency_counts_from_the_commit_mark() -> None:
    starts = {"7": 5.012, "8": 6.003}
    marks = {"8": 6.0, "7": 5.0, "9": 1.0}
    assert signal_latencies(starts, marks) == pytest.approx([12.0, 3.0])
    with pytest.raises(ValueError, match="no commit mark"):
        signal_latencies({"10": 1.0}, marks)


@pytest.mark.parametrize(
    ("claim", "drain", "verdict"),
    [
        (1.05, 0.97, "met"),
        (0.70, 1.10, "met"),
        (1.10, 1.00, "NOT met"),
        (1.00, 0.90, "NOT met"),
        (math.nan, 1.0, "not measured"),
    ],
)
def test_cost_verdict_bounds_both_changes_by_ten_percent(
    claim: float, drain: float, verdict: str
) -> None:
    assert cost_verdict(claim, drain) == verdict


def test_options_make_the_config() -> None:
    assert config_of(parse_args([])) == DurableConfig()
    quick = config_of(parse_args(["--quick", "--round-trips", "20", "--no-peers"]))
    assert quick.round_trips == 20 and quick.jobs == QUICK.jobs and not quick.peers
    assert config_of(parse_args(["--no-install", "--suspended", "1000"])) == DurableConfig(
        suspended=1000, install=False
    )


def test_marks_ddl_names_the_signal_table_and_its_receiver() -> None:
    ddl = durable_peers.marks_ddl("dbos.notifications", "destination_uuid")
    assert "AFTER INSERT ON dbos.notifications" in ddl
    assert "NEW.destination_uuid::text" in ddl and "DEFERRABLE INITIALLY DEFERRED" in ddl


def test_missing_dbos_is_a_reason_when_install_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(durable_peers.DbosUnavailable, match="not installed"):
        durable_peers.ensure_dbos(install=False)


def _figures(dbos: dict[str, object]) -> dict[str, object]:
    return {
        "median_one_job_steps_per_s": 400.0,
        "drain_jobs_per_s": 120.0,
        "signal_ms": [2.0, 3.0, 40.0],
        "signal_from_call_ms": [4.0, 5.0, 6.0],
        "suspended_cost": {
            "none_claim_ms": 0.5,
            "suspended_claim_ms": 0.52,
            "claim_ratio": 1.04,
            "none_rate": 3000.0,
            "suspended_rate": 2400.0,
            "drain_ratio": 0.8,
            "verdict": "NOT met",
        },
        "dbos": dbos,
    }


def test_tables_show_dbos_beside_sqla_queue_with_ratios() -> None:
    dbos = {
        "version": "3.4.0",
        "median_one_job_steps_per_s": 100.0,
        "drain_jobs_per_s": 60.0,
        "signal_ms": [6.0, 9.0, 80.0],
        "signal_from_call_ms": [10.0],
    }
    side, claims = tables_of(_figures(dbos), DurableConfig())
    assert side.headers == ["shape", "sqla_queue", "DBOS 3.4.0", "sqla_queue vs DBOS"]
    assert [r[1:] for r in side.rows] == [
        ["400", "100", "4.00x"],
        ["120", "60", "2.00x"],
        ["3.0", "9.0", "3.00x"],
        ["40.0", "80.0", "2.00x"],
        ["5.0", "10.0", "2.00x"],
    ]
    rows = {r[0].split(",")[0]: r[1:] for r in claims.rows}
    assert rows["claim"] == ["0.50", "0.52", "1.04x", "< 1.10x", "met"]
    assert rows["drain of 5"] == ["3,000", "2,400", "0.80x", "> 0.90x", "NOT met"]
    assert "overall: NOT met" in claims.render()


def test_a_skipped_dbos_is_said_and_sqla_queue_still_shown() -> None:
    side, _ = tables_of(_figures({"skipped": "pip install failed: no network"}), DurableConfig())
    assert side.rows[0][1:] == ["400", "skipped", "-"]
    assert "DBOS: skipped: pip install failed: no network" in side.render()
