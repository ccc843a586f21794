"""Throughput charts as inline SVG, drawn on the server: no script, no external asset."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from markupsafe import Markup, escape

__all__ = ["bar_chart", "sparkline"]


def _nice_max(value: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (at least 1)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


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
    peak = _nice_max(max(counts, default=0))
    slot = plot_w / max(len(counts), 1)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(label)}</title>",
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = top + plot_h * (1 - fraction)
        parts.append(
            f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{width - 8}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{int(peak * fraction):,}</text>"
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


def sparkline(counts: Sequence[int], *, label: str, width: int = 120, height: int = 24) -> Markup:
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
