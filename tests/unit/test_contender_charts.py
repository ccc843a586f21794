"""The contender charts drawn from a small hand-made benchmark report (no database)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from bench.contender_charts import (
    contender_charts,
    cpu_bars,
    drain_bars,
    main,
    shape_rows,
    sustained_groups,
)

pytestmark = pytest.mark.unit


def _drain_cell(median: float, low: float, high: float, cpu: float, server: float) -> Any:
    return {"median": median, "min": low, "max": high, "cpu_us_per_job": cpu} | (
        {"server_us_per_job": server} if server >= 0 else {}
    )


def _sustained_entry(system: str, rate: float, achieved: float, p50: float, p99: float) -> Any:
    return {
        "system": system,
        "rate": rate,
        "achieved_rate": achieved,
        "latency_ms": {"p50": p50, "p90": p99, "p99": p99, "max": p99},
        "problems": [],
        "skipped": "",
    }


def _report() -> dict[str, Any]:
    """A run of three drains, two backlog shapes and one sustained rate, in JSON's own types."""
    cell = "W2/b10"
    report = {
        "results": {
            "drain": {
                "protocols": ["cold"],
                "summary": {
                    f"cold/plain/sqla-sync/{cell}": _drain_cell(7100, 6800, 7300, 104, 97),
                    f"cold/plain/pgqueuer/{cell}": _drain_cell(6700, 6000, 7250, 97, 132),
                    f"cold/plain/sqla-async-prefetch/{cell}": _drain_cell(
                        11900, 11600, 12400, 87, 66
                    ),
                    # No server CPU: on the drain chart, not on the CPU chart.
                    f"cold/plain/bare/{cell}": _drain_cell(4400, 4100, 4550, 42, -1),
                    # Another cell: on no chart.
                    "cold/plain/sqla-sync/W2/b100": _drain_cell(99999, 1, 99999, 1, 1),
                    f"cold/burst/sqla-sync/{cell}": {"median": 6500.0, "vs_plain": 0.915},
                    f"cold/hot/sqla-sync/{cell}": {"median": 5000.0, "vs_plain": 0.704},
                    f"cold/burst/pgqueuer/{cell}": {"median": 9000.0, "vs_plain": 1.34},
                    # json.dumps writes a missing ratio as NaN: "not run", not a bar.
                    f"cold/hot/pgqueuer/{cell}": {"median": 1.0, "vs_plain": math.nan},
                },
            },
            "sustained": {
                "summary": {
                    "sqla-sync/1000": _sustained_entry("sqla-sync", 1000.0, 342.2, 9.93, 45.1),
                    "pgqueuer/1000": _sustained_entry("pgqueuer", 1000.0, 791.8, -0.5, 13.6),
                }
            },
        }
    }
    return dict(json.loads(json.dumps(report)))


def test_drain_is_sorted_fastest_first_with_labels_and_range() -> None:
    """Every system of the plain W2/b10 cell, fastest first, with its whisker's ends."""
    bars = drain_bars(_report())
    assert [(b.label, b.median, b.low, b.high) for b in bars] == [
        ("sqla_queue async, prefetch", 11900, 11600, 12400),
        ("sqla_queue sync", 7100, 6800, 7300),
        ("PgQueuer", 6700, 6000, 7250),
        ("bare SQL", 4400, 4100, 4550),
    ]


def test_cpu_is_worker_plus_server_lowest_first() -> None:
    """A system without server CPU is left out; the total orders the bars."""
    assert [(b.system, b.worker_us, b.server_us) for b in cpu_bars(_report())] == [
        ("sqla-async-prefetch", 87, 66),
        ("sqla-sync", 104, 97),
        ("pgqueuer", 97, 132),
    ]


def test_sustained_rows_carry_the_offered_rate() -> None:
    """One group per target rate, sqla_queue first, with the rate the producers reached."""
    (group,) = sustained_groups(_report())
    assert group.rate == 1000.0
    assert [(r.label, r.offered, r.p50, r.p99) for r in group.rows] == [
        ("sqla_queue sync", 342.2, 9.93, 45.1),
        ("PgQueuer", 791.8, -0.5, 13.6),
    ]


def test_shapes_keep_a_case_that_did_not_run_as_none() -> None:
    """Burst and hot as fractions of plain; a NaN ratio is a case not run."""
    assert [(r.label, r.burst, r.hot) for r in shape_rows(_report())] == [
        ("sqla_queue sync", 0.915, 0.704),
        ("PgQueuer", 1.34, None),
    ]


def _texts(svg: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def test_the_svgs_show_the_values_in_order() -> None:
    """The figures appear as text, in the charts' order, and each SVG is well-formed XML."""
    from xml.etree import ElementTree

    charts, notes = contender_charts(_report())
    assert notes == []
    assert sorted(charts) == [
        "perf-cpu.svg",
        "perf-drain.svg",
        "perf-shapes.svg",
        "perf-sustained.svg",
    ]
    for svg in charts.values():
        ElementTree.fromstring(svg)
    drain = _texts(charts["perf-drain.svg"])
    assert [t for t in drain if t.endswith("/s")] == ["11,900/s", "7,100/s", "6,700/s", "4,400/s"]
    assert "min 6,000, max 7,250" in charts["perf-drain.svg"]
    assert [t for t in _texts(charts["perf-cpu.svg"]) if re.fullmatch(r"\d+ \+ \d+ µs", t)] == [
        "87 + 66 µs",
        "104 + 97 µs",
        "97 + 132 µs",
    ]
    sustained = _texts(charts["perf-sustained.svg"])
    assert "target 1,000 jobs/s" in sustained
    assert [t for t in sustained if re.fullmatch(r"[\d,]+/s", t)] == ["342/s", "792/s"]
    # A p50 at or below zero (clocks of two processes) reads as below the axis, escaped.
    assert "9.9 / 45" in sustained and "&lt;0.1 / 14" in sustained
    shapes = _texts(charts["perf-shapes.svg"])
    assert [t for t in shapes if re.fullmatch(r"\d\.\d\dx|not run", t)] == [
        "0.92x",
        "0.70x",
        "1.34x",
        "not run",
    ]


def test_missing_figures_leave_a_chart_out_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A drain-only report draws two charts and says which two it left out, exit status 0."""
    report = _report()
    del report["results"]["sustained"]
    summary = report["results"]["drain"]["summary"]
    for key in [k for k in summary if not k.startswith("cold/plain/")]:
        del summary[key]
    path = tmp_path / "drain.json"
    path.write_text(json.dumps(report))
    assert main([str(path), "--out", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "perf-cpu.svg",
        "perf-drain.svg",
    ]
    out = capsys.readouterr().out
    assert "perf-sustained.svg left out" in out and "perf-shapes.svg left out" in out


def test_a_standalone_sustained_report_draws_its_chart(tmp_path: Path) -> None:
    """``bench.sustained --json`` keeps its figures under ``result``."""
    path = tmp_path / "sustained.json"
    path.write_text(json.dumps({"result": _report()["results"]["sustained"]}))
    assert main([str(path), "--out", str(tmp_path / "out")]) == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["perf-sustained.svg"]


def test_a_report_with_nothing_to_draw_is_an_error(tmp_path: Path) -> None:
    """Nothing to chart at all is exit status 1, and no directory is made."""
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"results": {"enqueue": {}}}))
    assert main([str(path), "--out", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()


def test_the_drawing_is_deterministic() -> None:
    """The same report draws the same bytes: the committed images can be checked."""
    assert contender_charts(_report()) == contender_charts(_report())
