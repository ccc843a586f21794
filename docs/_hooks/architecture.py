"""MkDocs hook: draw the package's layers, from the ``layers`` block of a page, as an SVG.

``docs/concepts.md`` holds the layers as a fenced block, one line per layer, top to bottom:
``name: module, module, ...``. The same block is what ``tests/unit/test_architecture.py``
holds every import to, so the picture cannot drift from the rule. This hook replaces the
block with the picture at build time: a stack of boxes, one per layer, each naming its
files, with the arrow of the allowed imports (downwards) beside them.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Layer", "layers_in", "on_page_markdown", "render_svg"]

_BLOCK = re.compile(r"^```layers\n(?P<body>.*?)^```\n", re.MULTILINE | re.DOTALL)
ROOT = Path(__file__).resolve().parents[2]

WIDTH = 760
NAME_WIDTH = 150
LINE_HEIGHT = 17
PADDING = 10
GAP = 14
CHARS_PER_LINE = 78


@dataclass(frozen=True)
class Layer:
    """One layer: its name and the dotted module prefixes that belong to it."""

    name: str
    modules: tuple[str, ...]


def layers_in(markdown: str) -> list[Layer]:
    """The layers of the first ``layers`` block in ``markdown``, top layer first."""
    match = _BLOCK.search(markdown)
    if match is None:
        raise ValueError("no ```layers block in the page")
    layers = []
    for line in match.group("body").splitlines():
        if not line.strip():
            continue
        name, _, modules = line.partition(":")
        layers.append(
            Layer(name.strip(), tuple(m.strip() for m in modules.split(",") if m.strip()))
        )
    return layers


def _path_of(module: str) -> str:
    """``sqla_queue.worker`` -> ``worker/``; ``sqla_queue.queue`` -> ``queue.py``."""
    relative = Path(*module.split("."))
    shown = module.split(".", 1)[1] if module.startswith("sqla_queue.") else module
    shown = shown.replace(".", "/")
    if (ROOT / relative).is_dir():
        return f"{shown}/"
    return f"{shown}.py"


def _wrapped(words: list[str]) -> list[str]:
    lines: list[str] = []
    current = ""
    for word in words:
        candidate = f"{current}  {word}" if current else word
        if len(candidate) > CHARS_PER_LINE and current:
            lines.append(current)
            current = word
        else:
            current = candidate
    if current:
        lines.append(current)
    return lines


def render_svg(layers: list[Layer]) -> str:
    """The layers as an inline SVG: one box per layer, top to bottom, imports pointing down."""
    parts: list[str] = []
    y = PADDING
    for layer in layers:
        lines = _wrapped([_path_of(module) for module in layer.modules])
        height = max(len(lines), 1) * LINE_HEIGHT + 2 * PADDING
        parts.append(
            f'<rect x="40" y="{y}" width="{WIDTH - 42}" height="{height}" rx="6" '
            'fill="var(--md-code-bg-color, #f5f5f5)" stroke="currentColor" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{40 + PADDING}" y="{y + PADDING + 12}" font-weight="bold">'
            f"{html.escape(layer.name)}</text>"
        )
        for index, text in enumerate(lines):
            parts.append(
                f'<text x="{40 + NAME_WIDTH}" y="{y + PADDING + 12 + index * LINE_HEIGHT}" '
                f'font-family="monospace">{html.escape(text)}</text>'
            )
        y += height + GAP
    total = y - GAP + PADDING
    arrow = (
        f'<line x1="18" y1="{PADDING}" x2="18" y2="{total - PADDING - 8}" '
        'stroke="currentColor" stroke-width="2"/>'
        f'<polygon points="10,{total - PADDING - 10} 26,{total - PADDING - 10} '
        f'18,{total - PADDING}" fill="currentColor"/>'
    )
    label = (
        f'<text x="14" y="{total / 2}" transform="rotate(-90 14 {total / 2})" '
        'text-anchor="middle" font-size="11">imports point down</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 {WIDTH} {total}" '
        f'width="100%" font-size="13" fill="currentColor" '
        'aria-label="The layers of sqla_queue, top to bottom; each imports only layers below">'
        + arrow
        + label
        + "".join(parts)
        + "</svg>"
    )


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace a page's ``layers`` block with its picture."""
    if "```layers" not in markdown:
        return markdown
    picture = render_svg(layers_in(markdown))
    return _BLOCK.sub(lambda _match: f'<div class="layers">{picture}</div>\n', markdown, count=1)
