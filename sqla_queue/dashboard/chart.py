"""Throughput charts as inline SVG, drawn on the server: no script, no external asset."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from markupsafe import Markup, escape

__all__ = ["axis_ticks", "bar_chart", "sparkline"]


def axis_ticks(peak: int, *, most: int = 5) -> list[int]:
    """The y axis' labels for counts up to ``peak``: 0, then the multiples of one step (1, 2
    or 5 times a power of ten, the smallest giving at most ``most`` intervals) up to the
    first at or above ``peak``. Whole numbers only: a count of 3 reads 0, 1, 2, 3."""
    peak = max(peak, 1)
    scale = 1
    while True:
        for factor in (1, 2, 5):
            step = scale * factor
            intervals = -(-peak // step)
            if intervals <= most:
                return [step * i for i in range(intervals + 1)]
        scale *= 10


def bar_chart(
    counts: Sequence[int],
    start: dt.datetime,
    *,
    label: str,
    width: int = 720,
    height: int = 160,
) -> Markup:
    """One bar per minute of ``counts`` (oldest first, from ``start``), with a y scale and
    the first and last minute on the x axis; each bar has a tooltip."""
    left, bottom, top = 48, 22, 8
    plot_w, plot_h = width - left - 8, height - bottom - top
    ticks = axis_ticks(max(counts, default=0))
    peak = ticks[-1]
    slot = plot_w / max(len(counts), 1)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(label)}</title>",
    ]
    for tick in ticks:
        y = top + plot_h * (1 - tick / peak)
        parts.append(
            f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{width - 8}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{tick:,}</text>"
        )
    for i, n in enumerate(counts):
        if n <= 0:
            continue
        h = max(plot_h * n / peak, 1.0)
        x = left + i * slot
        minute = (start + dt.timedelta(minutes=i)).astimezone().strftime("%H:%M")
        parts.append(
            f'<rect class="bar" x="{x + 0.5:.1f}" y="{top + plot_h - h:.1f}" '
            f'width="{max(slot - 1, 1):.1f}" height="{h:.1f}">'
            f"<title>{minute}: {n:,} finished</title></rect>"
        )
    last = start + dt.timedelta(minutes=max(len(counts) - 1, 0))
    for x, anchor, when in ((left, "start", start), (width - 8, "end", last)):
        parts.append(
            f'<text class="axis" x="{x}" y="{height - 6}" text-anchor="{anchor}">'
            f"{when.astimezone().strftime('%H:%M')}</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def sparkline(counts: Sequence[int], *, label: str, width: int = 90, height: int = 24) -> Markup:
    """A small bar sparkline of ``counts`` scaled to its own peak (none drawn when all are 0)."""
    peak = max(counts, default=0)
    slot = width / max(len(counts), 1)
    parts = [
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(label)}</title>"
    ]
    for i, n in enumerate(counts):
        if n > 0 and peak > 0:
            h = max(height * n / peak, 1.0)
            parts.append(
                f'<rect class="bar" x="{i * slot:.2f}" y="{height - h:.2f}" '
                f'width="{max(slot - 0.4, 0.6):.2f}" height="{h:.2f}"/>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))
