"""The workflow charts drawn from a small hand-made workflow report (no database)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from bench.workflow_charts import (
    drain_pairs,
    latency_groups,
    main,
    workflow_charts,
    workflow_systems,
    write_rows,
)

pytestmark = pytest.mark.unit


def _report() -> dict[str, Any]:
    """sqla_queue, two peers that ran and one skipped, in JSON's own types."""
    report = {
        "fanout_write_s": 0.406,
        "fanout_plain_s": 0.076,
        "plain_rate": 8627.0,
        "chord_rate": 5330.0,
        "fan_in_ms": [1.5, 1.7],
        "fan_in_p50_ms": 1.64,
        "fan_in_p99_ms": 2.49,
        "chain_hop_p50_ms": 1.26,
        "chain_hop_p99_ms": 2.74,
        "peers": {
            "pgboss": {
                "fanout_write_s": 0.348,
                "plain_write_s": 0.152,
                "plain_rate": 7597.0,
                "chord_rate": 3980.0,
                "fan_in_p50_ms": 1000.9,
                "fan_in_p99_ms": 1002.3,
                # No chain: in the fan-in group only.
            },
            "chancy": {
                # No plain write: "not run" on the fan-out chart.
                "fanout_write_s": 1.794,
                "plain_rate": 2417.0,
                "chord_rate": 678.0,
                "fan_in_p50_ms": 12.0,
                "chain_hop_p50_ms": 11.2,
                # json.dumps writes a missing figure as NaN: not recorded.
                "chain_hop_p99_ms": math.nan,
            },
            "other": {"skipped": "not installed"},
        },
    }
    return dict(json.loads(json.dumps(report)))


def test_systems_are_ours_then_the_peers_that_ran() -> None:
    """sqla_queue first, the peers in stored order with their labels, a skipped one left out."""
    assert [(s.system, s.label) for s in workflow_systems(_report())] == [
        ("sqla_queue", "sqla_queue"),
        ("pgboss", "pg-boss 12 flow"),
        ("chancy", "Chancy workflows"),
    ]


def test_latency_groups_keep_the_systems_with_a_p50() -> None:
    """Fan-in and chain hop, each with the systems that measured it; a NaN p99 stays NaN."""
    (fan_in, fan_rows), (chain, chain_rows) = latency_groups(_report())
    assert "fan-in" in fan_in and "chain" in chain
    assert [(r.system, r.p50) for r in fan_rows] == [
        ("sqla_queue", 1.64),
        ("pgboss", 1000.9),
        ("chancy", 12.0),
    ]
    assert [r.p99 for r in fan_rows[:2]] == [2.49, 1002.3]
    assert math.isnan(fan_rows[2].p99)
    assert [r.system for r in chain_rows] == ["sqla_queue", "chancy"]
    assert math.isnan(chain_rows[1].p99)


def test_drain_pairs_carry_the_chord_fraction() -> None:
    """Plain and chord rates of every system, the chord's fraction of plain computed."""
    pairs = drain_pairs(_report())
    assert [(p.system, p.plain, p.chord) for p in pairs] == [
        ("sqla_queue", 8627.0, 5330.0),
        ("pgboss", 7597.0, 3980.0),
        ("chancy", 2417.0, 678.0),
    ]
    assert [round(p.ratio, 2) for p in pairs] == [0.62, 0.52, 0.28]


def test_write_rows_read_each_systems_plain_write_key() -> None:
    """sqla_queue's plain write is ``fanout_plain_s``, the peers' ``plain_write_s``."""
    assert [(r.system, r.chord, r.plain) for r in write_rows(_report())] == [
        ("sqla_queue", 0.406, 0.076),
        ("pgboss", 0.348, 0.152),
        ("chancy", 1.794, None),
    ]


def _texts(svg: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def test_the_svgs_show_the_values_in_order() -> None:
    """The figures appear as text in the charts' order, and each SVG is well-formed XML."""
    charts, notes = workflow_charts(_report())
    assert notes == []
    assert sorted(charts) == [
        "workflows-drain.svg",
        "workflows-fanout.svg",
        "workflows-latency.svg",
    ]
    for svg in charts.values():
        ElementTree.fromstring(svg)
    latency = _texts(charts["workflows-latency.svg"])
    assert [t for t in latency if " / " in t and "ms" not in t] == [
        "1.6 / 2.5",
        "1,001 / 1,002",
        "12 / -",
        "1.3 / 2.7",
        "11 / -",
    ]
    # The log axis reaches the decade above pg-boss's second.
    assert "1k" in latency and "10k" in latency
    drain = _texts(charts["workflows-drain.svg"])
    assert [t for t in drain if t.endswith(("/s", "x")) and t[0].isdigit()] == [
        "8,627/s",
        "5,330/s, 0.62x",
        "7,597/s",
        "3,980/s, 0.52x",
        "2,417/s",
        "678/s, 0.28x",
    ]
    fanout = _texts(charts["workflows-fanout.svg"])
    assert [t for t in fanout if re.fullmatch(r"[\d.]+ s|not run", t)] == [
        "0.406 s",
        "0.076 s",
        "0.348 s",
        "0.152 s",
        "1.794 s",
        "not run",
    ]


def test_a_chord_fraction_below_the_aim_is_marked() -> None:
    """A chord drain under 0.8x of plain is written in the warning colour, one above is not."""
    report = _report()
    report["chord_rate"] = 8000.0
    svg = workflow_charts(report)[0]["workflows-drain.svg"]
    marked = {t: f for f, t in re.findall(r'fill="([^"]+)">([^<]*, [\d.]+x)</text>', svg)}
    assert marked["8,000/s, 0.93x"] != marked["678/s, 0.28x"]
    assert marked["3,980/s, 0.52x"] == marked["678/s, 0.28x"]


def test_a_report_without_peers_draws_ours_alone(tmp_path: Path) -> None:
    """``--no-peers`` writes no ``peers``: three charts of sqla_queue alone."""
    report = _report()
    del report["peers"]
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(report))
    assert main([str(path), "--out", str(tmp_path / "out")]) == 0
    assert len(list((tmp_path / "out").iterdir())) == 3
    assert [s.system for s in workflow_systems(report)] == ["sqla_queue"]


def test_missing_figures_leave_a_chart_out_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report with latencies only draws one chart and says which two it left out."""
    report = {"fan_in_p50_ms": 1.6, "fan_in_p99_ms": 2.5}
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(report))
    assert main([str(path), "--out", str(tmp_path / "out")]) == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["workflows-latency.svg"]
    out = capsys.readouterr().out
    assert "workflows-drain.svg left out" in out and "workflows-fanout.svg left out" in out


def test_a_report_with_nothing_to_draw_is_an_error(tmp_path: Path) -> None:
    """Nothing to chart is exit status 1, and no directory is made; so is a JSON list."""
    contents: list[Any] = [{"peers": {}}, [1, 2]]
    for content in contents:
        path = tmp_path / "wf.json"
        path.write_text(json.dumps(content))
        assert main([str(path), "--out", str(tmp_path / "out")]) == 1
        assert not (tmp_path / "out").exists()


def test_the_drawing_is_deterministic() -> None:
    """The same report draws the same bytes: the committed images can be checked."""
    assert workflow_charts(_report()) == workflow_charts(_report())
