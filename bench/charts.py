"""Charts of the headline ratios, drawn from the JSON that ``python -m bench.run --json`` writes.

    python -m bench.charts bench/results/2026-12-01.json --out docs/images

It writes one SVG per peer, ``perf-vs-pgqueuer.svg`` and ``perf-vs-bare-sql.svg``: for each
headline measure, how many times faster (a bar to the right of 1x) or slower (to the left)
sqla_queue is than that peer, on a logarithmic axis. A measure the JSON lacks (a ``--quick``
run, a subset of ``--scenarios``) is left out. Only the standard library is used, and the
output depends on nothing but the JSON, so the committed images can be checked against
their data (``tests/docs/test_docs_pages.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

__all__ = [
    "Bar",
    "Chart",
    "chart_command",
    "headline_charts",
    "main",
    "render_svg",
    "write_charts",
    "write_drawn",
]

#: The drain cell of the headline: 2 worker processes, batch 10.
HEADLINE_CELL = "W2/b10"
#: A wider cell beside it, where the worker's own CPU matters more.
WIDE_CELL = "W2/b100"

PEERS = {"pgqueuer": "PgQueuer", "bare": "bare SQL"}

# Layout, in SVG user units (pixels at 100 %).
WIDTH = 720
LABEL_RIGHT = 268  # labels end here, right-aligned
PLOT_LEFT = 280
PLOT_RIGHT = 590
VALUE_LEFT = 600
TOP = 44
ROW = 22
BAR = 14
FASTER = "#1f6fb4"
SLOWER = "#d9661a"


@dataclass(frozen=True)
class Bar:
    """One measure: its label and how many times faster sqla_queue is (below 1: slower)."""

    label: str
    speedup: float


@dataclass(frozen=True)
class Chart:
    """The headline measures against one peer, written to ``<name>.svg``."""

    name: str
    title: str
    peer: str
    bars: tuple[Bar, ...]


Results = Mapping[str, Any]
Measure = Callable[[Results, str], float | None]


def _median(entry: Any) -> float | None:
    if isinstance(entry, Mapping) and isinstance(entry.get("median"), int | float):
        return float(entry["median"])
    return None


def _higher_is_better(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine and theirs else None


def _lower_is_better(mine: float | None, theirs: float | None) -> float | None:
    return theirs / mine if mine and theirs else None


def _first_protocol(scenario: Results) -> str:
    protocols = scenario.get("protocols") or ["cold"]
    return str(protocols[0])


def _drain(case: str, system: str, cell: str) -> Measure:
    """A drain's rate over the peer's, as the run stored it (from unrounded medians)."""

    def measure(results: Results, peer: str) -> float | None:
        drain = results.get("drain", {})
        entry = drain.get("summary", {}).get(f"{_first_protocol(drain)}/{case}/{system}/{cell}")
        if not isinstance(entry, Mapping):
            return None
        stored = entry.get(f"vs_{peer}")
        return float(stored) if isinstance(stored, int | float) and stored > 0 else None

    return measure


def _limited_drain(limit: int) -> Measure:
    def measure(results: Results, peer: str) -> float | None:
        entry = results.get("limits", {}).get("summary", {}).get(str(limit), {})
        return _higher_is_better(_median(entry.get("sqla-sync")), _median(entry.get(peer)))

    return measure


def _enqueue(kind: str) -> Measure:
    def measure(results: Results, peer: str) -> float | None:
        summary = results.get("enqueue", {}).get("summary", {})
        return _higher_is_better(
            _median(summary.get(f"{kind}/sqla")), _median(summary.get(f"{kind}/{peer}"))
        )

    return measure


def _one_producer(results: Results, peer: str) -> float | None:
    summary = results.get("enqueue", {}).get("summary", {})
    return _higher_is_better(
        _median(summary.get("single/sqla/P1")), _median(summary.get(f"single/{peer}/P1"))
    )


def _latency(variant: str) -> Measure:
    def measure(results: Results, peer: str) -> float | None:
        summary = results.get("latency", {}).get("summary", {})
        return _lower_is_better(
            summary.get(variant, {}).get("p50"), summary.get(peer, {}).get("p50")
        )

    return measure


def _largest_backlog(results: Results, peer: str) -> tuple[int, float | None]:
    """The claim at the largest backlog the peer was timed on: (pending, speedup)."""
    backlog = results.get("backlog", {})
    protocol = _first_protocol(backlog)
    timed = [
        (int(entry.get("pending", 0)), entry[protocol])
        for entry in backlog.get("summary", {}).values()
        if isinstance(entry, Mapping) and peer in entry.get(protocol, {})
    ]
    if not timed:
        return 0, None
    pending, claims = max(timed, key=lambda pair: pair[0])
    return pending, _lower_is_better(_median(claims.get("sqla")), _median(claims.get(peer)))


def _bars(results: Results, peer: str) -> Iterator[Bar]:
    measures: Sequence[tuple[str, Measure]] = (
        ("Drain, sync worker", _drain("plain", "sqla-sync", HEADLINE_CELL)),
        ("Drain, async worker", _drain("plain", "sqla-async", HEADLINE_CELL)),
        ("Drain after a burst, sync worker", _drain("burst", "sqla-sync", HEADLINE_CELL)),
        ("Drain after a burst, async worker", _drain("burst", "sqla-async", HEADLINE_CELL)),
        ("Drain behind a hot key, sync worker", _drain("hot", "sqla-sync", HEADLINE_CELL)),
        ("Drain behind a hot key, async worker", _drain("hot", "sqla-async", HEADLINE_CELL)),
        ("Drain at batch 100, sync worker", _drain("plain", "sqla-sync", WIDE_CELL)),
        ("Drain at batch 100, async worker", _drain("plain", "sqla-async", WIDE_CELL)),
        ("Drain at concurrency limit 10", _limited_drain(10)),
        ("Drain at concurrency limit 5000", _limited_drain(5000)),
        ("Bulk enqueue", _enqueue("bulk")),
        ("Business transaction + one enqueue", _one_producer),
        ("Latency p50, sync worker", _latency("sqla-notify")),
        ("Latency p50, async worker", _latency("sqla-async-notify")),
    )
    for label, measure in measures:
        speedup = measure(results, peer)
        if speedup is not None:
            yield Bar(label, speedup)
    pending, speedup = _largest_backlog(results, peer)
    if speedup is not None:
        yield Bar(f"One claim at {pending:,} pending", speedup)


def headline_charts(report: Results) -> list[Chart]:
    """One chart per peer from a ``bench.run --json`` report; a peer without figures has none."""
    results = report.get("results", {})
    charts = []
    for peer, name in PEERS.items():
        bars = tuple(_bars(results, peer))
        if bars:
            title = f"sqla_queue against {name}: times faster (right) or slower (left)"
            slug = name.lower().replace(" ", "-")
            charts.append(Chart(f"perf-vs-{slug}", title, name, bars))
    return charts


def format_ratio(speedup: float) -> str:
    """``"1.33x faster"``, ``"2.5x slower"``, ``"648x faster"``: three significant figures at most.

    The runs move by up to 1.5x between repeats, so more digits would claim a precision the
    figures do not have; below 2x two decimals still tell 1.03x from 1.33x.
    """
    times = speedup if speedup >= 1 else 1 / speedup
    digits = 2 if times < 2 else 1 if times < 10 else 0
    shown = f"{times:.{digits}f}"
    return f"{shown}x {'faster' if speedup >= 1 else 'slower'}"


def _axis(bars: Sequence[Bar]) -> tuple[int, int]:
    """Whole decades around every bar and 1x: (lowest exponent, highest exponent)."""
    logs = [math.log10(bar.speedup) for bar in bars]
    return min(-1, math.floor(min(logs))), max(1, math.ceil(max(logs)))


def render_svg(chart: Chart) -> str:
    """The chart as a standalone SVG document (a white card, readable on dark pages too)."""
    low, high = _axis(chart.bars)
    scale = (PLOT_RIGHT - PLOT_LEFT) / (high - low)

    def x_of(speedup: float) -> float:
        return PLOT_LEFT + (math.log10(speedup) - low) * scale

    one = x_of(1.0)
    bottom = TOP + ROW * len(chart.bars)
    height = bottom + 46
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-labelledby="title" '
        'font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f'<title id="title">{escape(chart.title)}</title>',
        f'<rect width="{WIDTH}" height="{height}" rx="6" fill="#ffffff" stroke="#d0d0d0"/>',
        f'<text x="12" y="24" font-size="14" font-weight="bold" fill="#222">'
        f"{escape(chart.title)}</text>",
    ]
    for exponent in range(low, high + 1):
        x = x_of(10.0**exponent)
        colour, width = ("#444", 1.5) if exponent == 0 else ("#ddd", 1)
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{bottom + 2}" '
            f'stroke="{colour}" stroke-width="{width}"/>'
        )
        tick = f"{10.0**exponent:g}x"
        parts.append(
            f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle" fill="#555">{tick}</text>'
        )
    parts.append(
        f'<text x="{one - 8:.1f}" y="{bottom + 34}" text-anchor="end" fill="{SLOWER}">'
        f"&#8592; slower than {escape(chart.peer)}</text>"
    )
    parts.append(
        f'<text x="{one + 8:.1f}" y="{bottom + 34}" fill="{FASTER}">'
        f"faster than {escape(chart.peer)} &#8594;</text>"
    )
    for row, bar in enumerate(chart.bars):
        top = TOP + row * ROW
        end = x_of(bar.speedup)
        left, right = sorted((one, end))
        colour = FASTER if bar.speedup >= 1 else SLOWER
        middle = top + ROW / 2 + 4
        parts.append(
            f'<text x="{LABEL_RIGHT}" y="{middle:.1f}" text-anchor="end" fill="#222">'
            f"{escape(bar.label)}</text>"
        )
        parts.append(
            f'<rect x="{left:.1f}" y="{top + (ROW - BAR) / 2:.1f}" '
            f'width="{max(right - left, 1.5):.1f}" height="{BAR}" fill="{colour}"/>'
        )
        parts.append(
            f'<text x="{VALUE_LEFT}" y="{middle:.1f}" fill="{colour}">'
            f"{format_ratio(bar.speedup)}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write_charts(report_path: Path, out_dir: Path) -> list[Path]:
    """Read a ``bench.run --json`` report and write its charts into ``out_dir``."""
    report = json.loads(report_path.read_text(encoding="utf-8"))
    charts = headline_charts(report)
    if not charts:
        raise ValueError(f"{report_path}: no drain, enqueue, latency or backlog figures to chart")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for chart in charts:
        path = out_dir / f"{chart.name}.svg"
        path.write_text(render_svg(chart), encoding="utf-8")
        written.append(path)
    return written


def write_drawn(
    report_path: Path,
    out_dir: Path,
    draw: Callable[[Mapping[str, Any]], tuple[dict[str, str], list[str]]],
    *,
    what: str,
    log: Callable[[str], object] = print,
) -> list[Path]:
    """Read a JSON report, ``draw`` its SVGs (by file name, with a note for each left out),
    log the notes and write the SVGs into ``out_dir``; ``ValueError`` when the report is
    not an object, or has none of ``what`` to chart."""
    report = json.loads(report_path.read_text(encoding="utf-8"))
    if not isinstance(report, Mapping):
        raise ValueError(f"{report_path}: not a JSON object")
    charts, notes = draw(report)
    for note in notes:
        log(f"{report_path.name}: {note}")
    if not charts:
        raise ValueError(f"{report_path}: no {what} to chart")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, svg in charts.items():
        path = out_dir / name
        path.write_text(svg, encoding="utf-8")
        written.append(path)
    return written


def chart_command(
    argv: list[str] | None,
    *,
    module: str,
    description: str,
    report_help: str,
    write: Callable[[Path, Path], list[Path]],
) -> int:
    """The command line of a chart module: read the report, ``write`` its SVGs into
    ``--out``, print their paths; exit 1 with one line on stderr if that fails."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("report", type=Path, help=report_help)
    parser.add_argument(
        "--out", type=Path, default=Path("docs/images"), help="directory (default docs/images)"
    )
    args = parser.parse_args(argv)
    try:
        written = write(args.report, args.out)
    except (OSError, ValueError) as error:
        print(f"{module}: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line: the report to read and the directory to write the SVGs into."""
    return chart_command(
        argv,
        module="bench.charts",
        description="Draw the headline ratios of a `python -m bench.run --json` report as SVG.",
        report_help="the JSON written by bench.run --json",
        write=write_charts,
    )


if __name__ == "__main__":
    sys.exit(main())
