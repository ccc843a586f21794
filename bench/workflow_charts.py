"""The performance page's workflow charts, drawn from the workflow benchmark's JSON.

    python -m bench.workflow_charts bench/results/2026-12-04-workflows.json --out docs/images

It writes three SVGs, sqla_queue and each peer the run measured (pg-boss's ``flow()``,
Chancy's workflows) side by side:

* ``workflows-latency.svg``: the fan-in latency (the last child's commit to the callback's
  start) and a chain's latency per hop, p50 and p99, on a logarithmic axis: the systems
  are three orders of magnitude apart;
* ``workflows-drain.svg``: the drain of a chord (children and callback) against the drain of
  as many plain jobs, jobs/s, with the chord's fraction of the plain rate against the aim
  of 0.8;
* ``workflows-fanout.svg``: the write of a whole chord in one transaction against the write
  of as many plain jobs, seconds.

The report is what ``python -m bench.workflows --json`` writes: sqla_queue's figures at the
top level, each peer's under ``peers`` (``{"skipped": reason}`` for one that did not run, left
out). The drawing is :mod:`bench.contender_charts`'s, and the output depends on nothing but
the JSON, so the committed images can be checked against their data
(``tests/docs/test_contender_charts_images.py``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from bench.charts import FASTER, SLOWER, chart_command, write_drawn
from bench.contender_charts import (
    INK,
    MUTED,
    P99,
    PEER,
    PLOT_LEFT,
    PLOT_RIGHT,
    ROW,
    TOP,
    VALUE_LEFT,
    _close,
    _decade_text,
    _gridlines,
    _label,
    _legend,
    _linear_frame,
    _ms,
    _number,
    _open,
    _ours,
    _rect,
)
from bench.workflows import PEER_LABELS

__all__ = [
    "DRAIN_AIM",
    "DrainPair",
    "LatencyRow",
    "WorkflowSystem",
    "WriteRow",
    "drain_pairs",
    "latency_groups",
    "main",
    "workflow_charts",
    "workflow_systems",
    "write_rows",
    "write_workflow_charts",
]

#: A chord should drain at this fraction of the same jobs' plain drain (issue 29's target).
DRAIN_AIM = 0.8
OURS = "sqla_queue"
#: The second bar of a pair: the chord's drain, the plain write.
SECOND = "#2a9d8f"


@dataclass(frozen=True)
class WorkflowSystem:
    """One system's figures in the report; None where it lacks one."""

    system: str
    label: str
    figures: Mapping[str, Any]

    def get(self, key: str) -> float | None:
        """A finite figure of this system, else None."""
        return _number(self.figures.get(key))


@dataclass(frozen=True)
class LatencyRow:
    """One system's latency of one shape, ms (p99 NaN: not recorded)."""

    system: str
    label: str
    p50: float
    p99: float


@dataclass(frozen=True)
class DrainPair:
    """One system's plain and chord drains, jobs/s."""

    system: str
    label: str
    plain: float
    chord: float

    @property
    def ratio(self) -> float:
        """The chord's rate as a fraction of the plain drain's."""
        return self.chord / self.plain


@dataclass(frozen=True)
class WriteRow:
    """One system's fan-out write and its plain write of as many jobs, seconds."""

    system: str
    label: str
    chord: float
    plain: float | None


#: The latency chart's shapes: a heading and the figures' key prefix. Fan-in runs from the
#: last child's commit to the callback's start, a hop from one step's commit to the next's.
SHAPES = (
    ("fan-in: callback start", "fan_in"),
    ("chain: per hop", "chain_hop"),
)


def workflow_systems(report: Mapping[str, Any]) -> list[WorkflowSystem]:
    """sqla_queue, then every peer that ran, in the order the run stored them."""
    systems = [WorkflowSystem(OURS, OURS, report)]
    peers = report.get("peers", {})
    for peer, figures in peers.items() if isinstance(peers, Mapping) else ():
        if isinstance(figures, Mapping) and not figures.get("skipped"):
            systems.append(WorkflowSystem(str(peer), PEER_LABELS.get(peer, str(peer)), figures))
    return systems


def latency_groups(report: Mapping[str, Any]) -> list[tuple[str, list[LatencyRow]]]:
    """Per shape (fan-in, chain hop), the systems with a p50 latency; shapes with none left out."""
    groups = []
    for heading, key in SHAPES:
        rows = []
        for system in workflow_systems(report):
            p50, p99 = system.get(f"{key}_p50_ms"), system.get(f"{key}_p99_ms")
            if p50 is not None:
                rows.append(
                    LatencyRow(system.system, system.label, p50, math.nan if p99 is None else p99)
                )
        if rows:
            groups.append((heading, rows))
    return groups


def drain_pairs(report: Mapping[str, Any]) -> list[DrainPair]:
    """The systems with both a plain and a chord drain rate above zero."""
    pairs = []
    for system in workflow_systems(report):
        plain, chord = system.get("plain_rate"), system.get("chord_rate")
        if plain is not None and chord is not None and plain > 0 and chord >= 0:
            pairs.append(DrainPair(system.system, system.label, plain, chord))
    return pairs


def write_rows(report: Mapping[str, Any]) -> list[WriteRow]:
    """The systems with a fan-out write time, with their plain write where measured."""
    rows = []
    for system in workflow_systems(report):
        chord = system.get("fanout_write_s")
        # sqla_queue's plain write is stored under another key than the peers'.
        plain = system.get("fanout_plain_s" if system.system == OURS else "plain_write_s")
        if chord is not None:
            rows.append(WriteRow(system.system, system.label, chord, plain))
    return rows


# -- drawing ----------------------------------------------------------------------------------


def render_latency(groups: Sequence[tuple[str, Sequence[LatencyRow]]]) -> str:
    """Per shape, each system's p50 and p99 latency on a logarithmic axis."""
    title = "Workflow latency: a release to the next job's start, ms (log scale)"
    shown = [v for _, rows in groups for r in rows for v in (r.p50, r.p99) if v > 0]
    low = min(0, math.floor(math.log10(min(shown)))) if shown else 0
    high = max(2, math.ceil(math.log10(max(shown)))) if shown else 2
    scale = (PLOT_RIGHT - PLOT_LEFT) / (high - low)

    def width_of(value: float) -> float:
        if math.isnan(value) or value <= 10.0**low:
            return 0.0
        return (math.log10(value) - low) * scale

    bottom = TOP + ROW * sum(len(rows) + 1 for _, rows in groups)
    parts = _open(title, bottom + 50)
    _gridlines(
        parts,
        ((PLOT_LEFT + (e - low) * scale, _decade_text(e)) for e in range(low, high + 1)),
        TOP,
        bottom,
    )
    top = float(TOP)
    for heading, rows in groups:
        parts.append(
            f'<text x="12" y="{top + ROW / 2 + 4:.1f}" font-weight="bold" fill="{INK}">'
            f"{escape(heading)}</text>"
        )
        parts.append(
            f'<text x="{VALUE_LEFT}" y="{top + ROW / 2 + 4:.1f}" fill="{MUTED}">p50 / p99 ms</text>'
        )
        top += ROW
        for row in rows:
            middle = top + ROW / 2
            _label(parts, middle + 4, row.label, bold=_ours(row.system))
            colour = FASTER if _ours(row.system) else PEER
            parts.append(
                _rect(PLOT_LEFT, top + 3, width_of(row.p99), 8, P99, f"p99 {_ms(row.p99)} ms")
            )
            parts.append(
                _rect(PLOT_LEFT, top + 11, width_of(row.p50), 8, colour, f"p50 {_ms(row.p50)} ms")
            )
            parts.append(
                f'<text x="{VALUE_LEFT}" y="{middle + 4:.1f}" fill="{INK}">'
                f"{escape(_ms(row.p50))} / {escape(_ms(row.p99))}</text>"
            )
            top += ROW
    _legend(parts, bottom + 38, [(FASTER, "p50 sqla_queue"), (PEER, "p50 peers"), (P99, "p99")])
    return _close(parts)


def render_drain(pairs: Sequence[DrainPair]) -> str:
    """Per system, the plain and the chord drain in jobs/s, the chord's fraction beside it."""
    title = "Workflow drain: a chord against as many plain jobs, jobs/s"
    parts, scale, bottom = _linear_frame(
        title, max(max(p.plain, p.chord) for p in pairs), 2 * len(pairs)
    )
    for index, pair in enumerate(pairs):
        top = TOP + index * 2 * ROW
        _label(parts, top + ROW + 4, pair.label, bold=_ours(pair.system))
        plain_colour = FASTER if _ours(pair.system) else PEER
        for offset, (value, colour, case) in enumerate(
            ((pair.plain, plain_colour, "plain jobs"), (pair.chord, SECOND, "chord"))
        ):
            y = top + offset * ROW + (ROW - 14) / 2
            parts.append(_rect(PLOT_LEFT, y, value * scale, 14, colour, f"{case}: {value:,.0f}/s"))
            text = f"{value:,.0f}/s"
            fill = INK
            if offset:
                text += f", {pair.ratio:.2f}x"
                fill = SLOWER if pair.ratio < DRAIN_AIM else INK
            parts.append(
                f'<text x="{VALUE_LEFT}" y="{y + 11:.1f}" fill="{fill}">{escape(text)}</text>'
            )
    _legend(
        parts,
        bottom + 38,
        [
            (FASTER, "plain, sqla_queue"),
            (PEER, "plain, peers"),
            (SECOND, "chord + callback"),
            (SLOWER, f"chord / plain below {DRAIN_AIM}x"),
        ],
    )
    return _close(parts)


def render_fanout(rows: Sequence[WriteRow]) -> str:
    """Per system, the chord's write and the plain jobs' write in one transaction, seconds."""
    title = "Fan-out write in one transaction: a chord against as many plain jobs, s"
    values = [v for row in rows for v in (row.chord, row.plain) if v is not None]
    parts, scale, bottom = _linear_frame(title, max(values), 2 * len(rows), lambda t: f"{t:g}")
    for index, row in enumerate(rows):
        top = TOP + index * 2 * ROW
        _label(parts, top + ROW + 4, row.label, bold=_ours(row.system))
        chord_colour = FASTER if _ours(row.system) else PEER
        for offset, (value, colour, case) in enumerate(
            ((row.chord, chord_colour, "chord + callback"), (row.plain, SECOND, "plain jobs"))
        ):
            y = top + offset * ROW + (ROW - 14) / 2
            text = f"{value:.3f} s" if value is not None else "not run"
            if value is not None:
                parts.append(_rect(PLOT_LEFT, y, value * scale, 14, colour, f"{case}: {text}"))
            parts.append(f'<text x="{VALUE_LEFT}" y="{y + 11:.1f}" fill="{INK}">{text}</text>')
    _legend(
        parts,
        bottom + 38,
        [(FASTER, "chord, sqla_queue"), (PEER, "chord, peers"), (SECOND, "as many plain jobs")],
    )
    return _close(parts)


def workflow_charts(report: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The SVGs the report has figures for, by file name, and a note for each left out."""
    charts: dict[str, str] = {}
    notes: list[str] = []
    latency = latency_groups(report)
    if latency:
        charts["workflows-latency.svg"] = render_latency(latency)
    else:
        notes.append("workflows-latency.svg left out: no fan_in_p50_ms or chain_hop_p50_ms")
    drain = drain_pairs(report)
    if drain:
        charts["workflows-drain.svg"] = render_drain(drain)
    else:
        notes.append("workflows-drain.svg left out: no plain_rate and chord_rate")
    fanout = write_rows(report)
    if fanout:
        charts["workflows-fanout.svg"] = render_fanout(fanout)
    else:
        notes.append("workflows-fanout.svg left out: no fanout_write_s")
    return charts, notes


def write_workflow_charts(report_path: Path, out_dir: Path, log: Any = print) -> list[Path]:
    """Read a report, write the charts it has figures for into ``out_dir``, log the others."""
    return write_drawn(report_path, out_dir, workflow_charts, what="workflow figures", log=log)


def main(argv: list[str] | None = None) -> int:
    """The command line: the report to read and the directory to write the SVGs into."""
    return chart_command(
        argv,
        module="bench.workflow_charts",
        description="Draw the workflow benchmark's latency, drain and fan-out charts as SVG.",
        report_help="JSON of bench.workflows --json",
        write=write_workflow_charts,
    )


if __name__ == "__main__":
    sys.exit(main())
