"""The performance page's contender charts, drawn from a benchmark's JSON.

    python -m bench.contender_charts bench/results/2026-12-04.json --out docs/images

It writes four SVGs:

* ``perf-drain.svg``: the plain drain (cold protocol, 2 workers, batch 10) of every system,
  jobs/s median with a min-max whisker, fastest first;
* ``perf-cpu.svg``: the same cell's CPU per job, worker and PostgreSQL server stacked,
  lowest first;
* ``perf-sustained.svg``: latency (commit to handler start) under sustained load, p50 and p99
  per system at each target rate, with the rate the producers reached on each row;
* ``perf-shapes.svg``: the burst and hot-key drains as a fraction of the same system's plain
  drain, against the aim of 0.85.

The report is what ``python -m bench.run --json`` writes (``results.drain``,
``results.sustained``) or what ``python -m bench.sustained --json`` writes (``result``). A
chart whose figures the report lacks is left out with a note on stdout. Only the standard
library draws, and the output depends on nothing but the JSON, so the committed images can
be checked against their data (``tests/docs/test_contender_charts_images.py``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from bench.charts import FASTER, SLOWER, WIDTH, chart_command, write_drawn
from bench.drain import LABELS
from bench.sustained import SYSTEMS as SUSTAINED_SYSTEMS

__all__ = [
    "CpuBar",
    "DrainBar",
    "ShapeRow",
    "SustainedGroup",
    "SustainedRow",
    "contender_charts",
    "cpu_bars",
    "drain_bars",
    "main",
    "shape_rows",
    "sustained_groups",
    "write_contender_charts",
]

#: The drain cell the charts show: cold protocol, 2 worker processes, batch 10.
CELL = "W2/b10"
PROTOCOL = "cold"
#: The burst and hot-key drains should keep this fraction of the plain drain's rate.
SHAPE_AIM = 0.85

# Layout, in SVG user units; the card's width and colours are bench/charts.py's.
LABEL_RIGHT = 290
PLOT_LEFT = 302
PLOT_RIGHT = 590
VALUE_LEFT = 600
#: The sustained chart's labels end earlier: the rate each row reached has a column.
SYSTEM_RIGHT = 226
TOP = 44
ROW = 22
BAR = 14
PEER = "#9a9a9a"
SERVER = "#9cc3e6"
P99 = "#9cc3e6"
HOT = "#2a9d8f"
GRID = "#ddd"
INK = "#222"
MUTED = "#555"


@dataclass(frozen=True)
class DrainBar:
    """One system's plain drain: jobs/s median and the range of its repeats."""

    system: str
    label: str
    median: float
    low: float
    high: float


@dataclass(frozen=True)
class CpuBar:
    """One system's CPU per job in the drain: the worker processes' and the server's."""

    system: str
    label: str
    worker_us: float
    server_us: float

    @property
    def total_us(self) -> float:
        """Worker and server CPU together."""
        return self.worker_us + self.server_us


@dataclass(frozen=True)
class SustainedRow:
    """One system at one target rate: the rate reached and the latency percentiles (ms)."""

    system: str
    label: str
    offered: float
    p50: float
    p99: float
    skipped: str = ""
    problems: bool = False


@dataclass(frozen=True)
class SustainedGroup:
    """The systems run at one target rate."""

    rate: float
    rows: tuple[SustainedRow, ...]


@dataclass(frozen=True)
class ShapeRow:
    """One system's burst and hot-key drains over its plain drain (None: not run)."""

    system: str
    label: str
    burst: float | None
    hot: float | None


def _number(value: Any) -> float | None:
    """A finite number from the JSON (which writes a missing ratio as NaN), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _results(report: Mapping[str, Any]) -> Mapping[str, Any]:
    """The scenarios of either report format, keyed by scenario name."""
    if isinstance(report.get("results"), Mapping):
        return dict(report["results"])
    standalone = report.get("result")
    if isinstance(standalone, Mapping):
        return {"sustained": standalone}
    return {}


def _drain_summary(results: Mapping[str, Any]) -> Mapping[str, Any]:
    summary = results.get("drain", {}).get("summary", {})
    return summary if isinstance(summary, Mapping) else {}


def _cell(summary: Mapping[str, Any], case: str, system: str) -> Mapping[str, Any]:
    entry = summary.get(f"{PROTOCOL}/{case}/{system}/{CELL}")
    return entry if isinstance(entry, Mapping) else {}


def _systems_of(summary: Mapping[str, Any], case: str) -> list[str]:
    """The systems of ``case`` in the drain cell, in the order the run stored them."""
    prefix, suffix = f"{PROTOCOL}/{case}/", f"/{CELL}"
    return [
        key[len(prefix) : -len(suffix)]
        for key in summary
        if key.startswith(prefix) and key.endswith(suffix)
    ]


def _drain_label(system: str) -> str:
    return LABELS.get(system, system)


def _ours(system: str) -> bool:
    return system.startswith("sqla")


def drain_bars(report: Mapping[str, Any]) -> list[DrainBar]:
    """The plain drain of every system with a median, fastest first."""
    summary = _drain_summary(_results(report))
    bars = []
    for system in _systems_of(summary, "plain"):
        entry = _cell(summary, "plain", system)
        median = _number(entry.get("median"))
        if median is None or median <= 0:
            continue
        low = _number(entry.get("min"))
        high = _number(entry.get("max"))
        bars.append(
            DrainBar(
                system,
                _drain_label(system),
                median,
                median if low is None else low,
                median if high is None else high,
            )
        )
    return sorted(bars, key=lambda bar: (-bar.median, bar.label))


def cpu_bars(report: Mapping[str, Any]) -> list[CpuBar]:
    """The plain drain's worker + server CPU per job of every system with both, lowest first."""
    summary = _drain_summary(_results(report))
    bars = []
    for system in _systems_of(summary, "plain"):
        entry = _cell(summary, "plain", system)
        worker = _number(entry.get("cpu_us_per_job"))
        server = _number(entry.get("server_us_per_job"))
        if worker is None or server is None:
            continue
        bars.append(CpuBar(system, _drain_label(system), max(worker, 0.0), max(server, 0.0)))
    return sorted(bars, key=lambda bar: (bar.total_us, bar.label))


def _system_order(system: str) -> tuple[int, str]:
    known = list(SUSTAINED_SYSTEMS)
    return (known.index(system) if system in known else len(known), system)


def sustained_groups(report: Mapping[str, Any]) -> list[SustainedGroup]:
    """Each target rate of the sustained scenario, lowest first, its systems in a fixed order."""
    sustained = _results(report).get("sustained", {})
    summary = sustained.get("summary", {}) if isinstance(sustained, Mapping) else {}
    by_rate: dict[float, list[SustainedRow]] = {}
    for entry in summary.values() if isinstance(summary, Mapping) else ():
        if not isinstance(entry, Mapping):
            continue
        system, rate = str(entry.get("system", "")), _number(entry.get("rate"))
        if not system or rate is None:
            continue
        label = SUSTAINED_SYSTEMS[system][0] if system in SUSTAINED_SYSTEMS else system
        latency = entry.get("latency_ms", {})
        p50 = _number(latency.get("p50")) if isinstance(latency, Mapping) else None
        p99 = _number(latency.get("p99")) if isinstance(latency, Mapping) else None
        skipped = str(entry.get("skipped") or "")
        if not skipped and (p50 is None or p99 is None):
            continue
        by_rate.setdefault(rate, []).append(
            SustainedRow(
                system,
                label,
                _number(entry.get("achieved_rate")) or 0.0,
                p50 if p50 is not None else math.nan,
                p99 if p99 is not None else math.nan,
                skipped,
                bool(entry.get("problems")),
            )
        )
    return [
        SustainedGroup(rate, tuple(sorted(rows, key=lambda row: _system_order(row.system))))
        for rate, rows in sorted(by_rate.items())
    ]


def shape_rows(report: Mapping[str, Any]) -> list[ShapeRow]:
    """Every system with a burst or hot-key drain, in drain order, as fractions of plain."""
    summary = _drain_summary(_results(report))
    systems = _systems_of(summary, "burst")
    systems += [s for s in _systems_of(summary, "hot") if s not in systems]
    order = list(LABELS)
    systems.sort(key=lambda s: (order.index(s) if s in order else len(order), s))
    rows = []
    for system in systems:
        burst = _number(_cell(summary, "burst", system).get("vs_plain"))
        hot = _number(_cell(summary, "hot", system).get("vs_plain"))
        if burst is not None or hot is not None:
            rows.append(ShapeRow(system, _drain_label(system), burst, hot))
    return rows


# -- drawing ----------------------------------------------------------------------------------


def _nice_step(top: float, ticks: int = 5) -> float:
    """A 1, 2 or 5 times a power of ten that cuts ``[0, top]`` into about ``ticks`` parts."""
    raw = top / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _linear_axis(top: float) -> tuple[float, list[float]]:
    """The axis end (a whole step at or above ``top``) and its ticks from 0."""
    top = top if top > 0 else 1.0
    step = _nice_step(top)
    end = math.ceil(top / step - 1e-9) * step
    return end, [i * step for i in range(round(end / step) + 1)]


def _tick_text(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == 0 else f"{value:g}"


def _decade_text(exponent: int) -> str:
    """``0.1``, ``1``, ``100``, ``10k``: a log axis's ticks stay narrow at any decade."""
    for power, suffix in ((6, "M"), (3, "k")):
        if exponent >= power:
            return f"{10 ** (exponent - power)}{suffix}"
    return f"{10.0**exponent:g}"


def _open(title: str, height: float) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" role="img" aria-labelledby="title" '
        'font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f'<title id="title">{escape(title)}</title>',
        f'<rect width="{WIDTH}" height="{height:.0f}" rx="6" fill="#ffffff" stroke="#d0d0d0"/>',
        f'<text x="12" y="24" font-size="14" font-weight="bold" fill="{INK}">'
        f"{escape(title)}</text>",
    ]


def _close(parts: list[str]) -> str:
    return "\n".join([*parts, "</svg>"]) + "\n"


def _gridlines(
    parts: list[str], xs: Iterable[tuple[float, str]], top: float, bottom: float
) -> None:
    for x, text in xs:
        parts.append(
            f'<line x1="{x:.1f}" y1="{top - 6:.1f}" x2="{x:.1f}" y2="{bottom + 2:.1f}" '
            f'stroke="{GRID}" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{bottom + 16:.1f}" text-anchor="middle" fill="{MUTED}">'
            f"{escape(text)}</text>"
        )


def _label(
    parts: list[str], y: float, text: str, bold: bool = False, right: float = LABEL_RIGHT
) -> None:
    weight = ' font-weight="bold"' if bold else ""
    parts.append(
        f'<text x="{right:.0f}" y="{y:.1f}" text-anchor="end" fill="{INK}"{weight}>'
        f"{escape(text)}</text>"
    )


def _rect(x: float, y: float, width: float, height: float, fill: str, tip: str = "") -> str:
    inner = f"<title>{escape(tip)}</title>" if tip else ""
    close = f">{inner}</rect>" if inner else "/>"
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(width, 1.5):.1f}" height="{height:.1f}" '
        f'fill="{fill}"{close}'
    )


def _legend(parts: list[str], y: float, entries: Sequence[tuple[str, str]]) -> None:
    x = 120.0
    for colour, text in entries:
        parts.append(_rect(x, y - 9, 10, 10, colour))
        parts.append(f'<text x="{x + 14:.1f}" y="{y:.1f}" fill="{MUTED}">{escape(text)}</text>')
        x += 24 + 6.5 * len(text)


def _linear_frame(
    title: str, maximum: float, rows: int, tick: Callable[[float], str] = _tick_text
) -> tuple[list[str], float, float]:
    """A chart with a linear axis up to ``maximum`` over ``rows`` rows: its opening parts
    (title and gridlines), its scale (pixels per unit) and the plot's bottom."""
    end, ticks = _linear_axis(maximum)
    scale = (PLOT_RIGHT - PLOT_LEFT) / end
    bottom = TOP + ROW * rows
    parts = _open(title, bottom + 50)
    _gridlines(parts, ((PLOT_LEFT + t * scale, tick(t)) for t in ticks), TOP, bottom)
    return parts, scale, bottom


def render_drain(bars: Sequence[DrainBar]) -> str:
    """Jobs/s per system, a bar to the median and a whisker from min to max."""
    title = "Drain by contender: jobs/s, 2 workers, batch 10, cold start"
    parts, scale, bottom = _linear_frame(title, max(bar.high for bar in bars), len(bars))
    for row, bar in enumerate(bars):
        top = TOP + row * ROW
        middle = top + ROW / 2
        _label(parts, middle + 4, bar.label, bold=_ours(bar.system))
        colour = FASTER if _ours(bar.system) else PEER
        tip = f"median {bar.median:,.0f} jobs/s, min {bar.low:,.0f}, max {bar.high:,.0f}"
        parts.append(_rect(PLOT_LEFT, top + (ROW - BAR) / 2, bar.median * scale, BAR, colour, tip))
        low, high = PLOT_LEFT + bar.low * scale, PLOT_LEFT + bar.high * scale
        parts.append(
            f'<path d="M{low:.1f} {middle - 4:.1f}v8M{low:.1f} {middle:.1f}H{high:.1f}'
            f'M{high:.1f} {middle - 4:.1f}v8" stroke="{INK}" stroke-width="1" fill="none"/>'
        )
        parts.append(
            f'<text x="{VALUE_LEFT}" y="{middle + 4:.1f}" fill="{INK}">{bar.median:,.0f}/s</text>'
        )
    _legend(
        parts,
        bottom + 38,
        [(FASTER, "sqla_queue"), (PEER, "other systems"), (INK, "whisker: min to max of repeats")],
    )
    return _close(parts)


def render_cpu(bars: Sequence[CpuBar]) -> str:
    """Worker and server CPU microseconds per job, stacked, lowest total first."""
    title = "CPU per job in the drain: worker processes + PostgreSQL server, µs"
    parts, scale, bottom = _linear_frame(title, max(bar.total_us for bar in bars), len(bars))
    for row, bar in enumerate(bars):
        top = TOP + row * ROW
        middle = top + ROW / 2
        y = top + (ROW - BAR) / 2
        _label(parts, middle + 4, bar.label, bold=_ours(bar.system))
        worker = bar.worker_us * scale
        parts.append(
            _rect(PLOT_LEFT, y, worker, BAR, FASTER, f"worker {bar.worker_us:,.0f} µs/job")
        )
        parts.append(
            _rect(
                PLOT_LEFT + worker,
                y,
                bar.server_us * scale,
                BAR,
                SERVER,
                f"server {bar.server_us:,.0f} µs/job",
            )
        )
        parts.append(
            f'<text x="{VALUE_LEFT}" y="{middle + 4:.1f}" fill="{INK}">'
            f"{bar.worker_us:,.0f} + {bar.server_us:,.0f} µs</text>"
        )
    _legend(parts, bottom + 38, [(FASTER, "worker CPU"), (SERVER, "server CPU")])
    return _close(parts)


def _ms(value: float) -> str:
    if math.isnan(value):
        return "-"
    if value < 0.1:
        # A p50 below the clocks' agreement between processes reads as 0 or less.
        return "<0.1"
    return f"{value:.1f}" if value < 10 else f"{value:,.0f}"


def render_sustained(groups: Sequence[SustainedGroup]) -> str:
    """Per target rate, each system's p50 and p99 latency on a logarithmic axis."""
    title = "Latency under sustained load: commit to handler start, ms (log scale)"
    shown = [v for g in groups for r in g.rows for v in (r.p50, r.p99) if v > 0]
    low = min(-1, math.floor(math.log10(min(shown)))) if shown else -1
    high = max(2, math.ceil(math.log10(max(shown)))) if shown else 2
    scale = (PLOT_RIGHT - PLOT_LEFT) / (high - low)

    def width_of(value: float) -> float:
        if math.isnan(value) or value <= 10.0**low:
            return 0.0
        return (math.log10(value) - low) * scale

    rows = sum(len(g.rows) + 1 for g in groups)
    bottom = TOP + ROW * rows
    parts = _open(title, bottom + 50)
    _gridlines(
        parts,
        ((PLOT_LEFT + (e - low) * scale, _decade_text(e)) for e in range(low, high + 1)),
        TOP,
        bottom,
    )
    top = float(TOP)
    problems = False
    for group in groups:
        parts.append(
            f'<text x="12" y="{top + ROW / 2 + 4:.1f}" font-weight="bold" fill="{INK}">'
            f"target {group.rate:,.0f} jobs/s</text>"
        )
        parts.append(
            f'<text x="{LABEL_RIGHT}" y="{top + ROW / 2 + 4:.1f}" text-anchor="end" '
            f'fill="{MUTED}">offered</text>'
        )
        parts.append(
            f'<text x="{VALUE_LEFT}" y="{top + ROW / 2 + 4:.1f}" fill="{MUTED}">p50 / p99 ms</text>'
        )
        top += ROW
        for row in group.rows:
            middle = top + ROW / 2
            _label(parts, middle + 4, row.label, _ours(row.system), right=SYSTEM_RIGHT)
            parts.append(
                f'<text x="{LABEL_RIGHT}" y="{middle + 4:.1f}" text-anchor="end" fill="{MUTED}">'
                f"{'-' if row.skipped else f'{row.offered:,.0f}/s'}</text>"
            )
            if row.skipped:
                parts.append(
                    f'<text x="{PLOT_LEFT}" y="{middle + 4:.1f}" fill="{MUTED}">'
                    f"skipped: {escape(row.skipped[:60])}</text>"
                )
                top += ROW
                continue
            colour = FASTER if _ours(row.system) else PEER
            parts.append(
                _rect(PLOT_LEFT, top + 3, width_of(row.p99), 8, P99, f"p99 {_ms(row.p99)} ms")
            )
            parts.append(
                _rect(PLOT_LEFT, top + 11, width_of(row.p50), 8, colour, f"p50 {_ms(row.p50)} ms")
            )
            mark = " *" if row.problems else ""
            problems = problems or row.problems
            parts.append(
                f'<text x="{VALUE_LEFT}" y="{middle + 4:.1f}" fill="{INK}">'
                f"{escape(_ms(row.p50))} / {escape(_ms(row.p99))}{mark}</text>"
            )
            top += ROW
    legend = [(FASTER, "p50 sqla_queue"), (PEER, "p50 others"), (P99, "p99")]
    if problems:
        legend.append((SLOWER, "* jobs lost or never started"))
    _legend(parts, bottom + 38, legend)
    return _close(parts)


def render_shapes(rows: Sequence[ShapeRow]) -> str:
    """Burst and hot-key drains as a fraction of the plain drain, with the aim drawn."""
    title = "Backlog shapes: drain rate as a fraction of the plain drain (aim 0.85 or more)"
    values = [v for row in rows for v in (row.burst, row.hot) if v is not None]
    parts, scale, bottom = _linear_frame(
        title, max([1.2, *values]), 2 * len(rows), lambda t: f"{t:g}x"
    )
    for index, row in enumerate(rows):
        top = TOP + index * 2 * ROW
        _label(parts, top + ROW + 4, row.label, bold=_ours(row.system))
        for offset, (value, colour, case) in enumerate(
            ((row.burst, FASTER, "first 10% of a 10x burst"), (row.hot, HOT, "behind a hot key"))
        ):
            y = top + offset * ROW + (ROW - BAR) / 2
            text = f"{value:.2f}x" if value is not None else "not run"
            if value is not None:
                parts.append(_rect(PLOT_LEFT, y, value * scale, BAR, colour, f"{case}: {text}"))
            fill = SLOWER if value is not None and value < SHAPE_AIM else INK
            parts.append(
                f'<text x="{VALUE_LEFT}" y="{y + BAR - 3:.1f}" fill="{fill}">{text}</text>'
            )
    aim = PLOT_LEFT + SHAPE_AIM * scale
    parts.append(
        f'<line x1="{aim:.1f}" y1="{TOP - 6}" x2="{aim:.1f}" y2="{bottom + 2}" '
        f'stroke="{SLOWER}" stroke-width="1.5" stroke-dasharray="4 3"/>'
    )
    _legend(
        parts,
        bottom + 38,
        [(FASTER, "first 10% of a 10x burst"), (HOT, "behind a hot key"), (SLOWER, "aim 0.85x")],
    )
    return _close(parts)


def contender_charts(report: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The SVGs the report has figures for, by file name, and a note for each left out."""
    charts: dict[str, str] = {}
    notes: list[str] = []
    cell = f"{PROTOCOL}/<case>/<system>/{CELL}"
    drain = drain_bars(report)
    if drain:
        charts["perf-drain.svg"] = render_drain(drain)
    else:
        notes.append(f"perf-drain.svg left out: no plain drain in results.drain ({cell})")
    cpu = cpu_bars(report)
    if cpu:
        charts["perf-cpu.svg"] = render_cpu(cpu)
    else:
        notes.append(f"perf-cpu.svg left out: no CPU per job in the plain drain ({cell})")
    sustained = sustained_groups(report)
    if sustained:
        charts["perf-sustained.svg"] = render_sustained(sustained)
    else:
        notes.append("perf-sustained.svg left out: no sustained scenario in the report")
    shapes = shape_rows(report)
    if shapes:
        charts["perf-shapes.svg"] = render_shapes(shapes)
    else:
        notes.append(f"perf-shapes.svg left out: no burst or hot drain with vs_plain ({cell})")
    return charts, notes


def write_contender_charts(report_path: Path, out_dir: Path, log: Any = print) -> list[Path]:
    """Read a report, write the charts it has figures for into ``out_dir``, log the others."""
    return write_drawn(
        report_path, out_dir, contender_charts, what="drain or sustained figures", log=log
    )


def main(argv: list[str] | None = None) -> int:
    """The command line: the report to read and the directory to write the SVGs into."""
    return chart_command(
        argv,
        module="bench.contender_charts",
        description="Draw the drain, CPU, sustained-load and backlog-shape charts as SVG.",
        report_help="JSON of bench.run --json or bench.sustained",
        write=write_contender_charts,
    )


if __name__ == "__main__":
    sys.exit(main())
