"""Finding the code blocks of Markdown pages that the documentation tests execute.

The markers are HTML comments, invisible in the rendered site. Each one applies to the next
fenced block and must sit on the last non-blank line before the fence:

``<!-- docs-test: page -->`` (anywhere in a page)
    Every ``python`` block of the page runs, except the ones marked ``skip``.
``<!-- docs-test: run -->``
    This ``python`` block runs (the only way to run a block on a page without ``page``).
``<!-- docs-test: skip -->``
    This block never runs.
``<!-- docs-test: output -->``
    Before a ``text`` block: what the page's examples print. Every non-empty line must
    appear in their standard output, as often as it appears in the block. Order is not
    checked, because handlers print from worker threads.
``<!-- docs-test: file PATH -->``
    This block is written to ``PATH`` (relative to the working directory) before anything
    runs, instead of being run.
``<!-- docs-test: shell -->``
    This ``bash`` block holds commands that the test runs itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "Page", "parse_page"]

_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>[a-z]+)(?:\s+(?P<arg>\S+))?\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^`\s]*)")
_PYTHON = frozenset({"python", "py", "python3"})
_KINDS = frozenset({"page", "run", "skip", "output", "file", "shell"})


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts, its language, its text and its marker."""

    path: Path
    #: 1-based line number of the first line of the block's content.
    line: int
    language: str
    source: str
    marker: str | None
    argument: str | None

    @property
    def location(self) -> str:
        """``file:line`` of the block, for assertion messages."""
        return f"{self.path.name}:{self.line}"


@dataclass(frozen=True)
class Page:
    """The blocks of one Markdown file, and whether the whole page runs."""

    path: Path
    blocks: tuple[Block, ...]
    runs_whole_page: bool

    @property
    def runnable(self) -> list[Block]:
        """The Python blocks to execute, in page order."""
        return [
            b
            for b in self.blocks
            if b.language in _PYTHON
            and b.marker not in ("skip", "file")
            and (self.runs_whole_page or b.marker == "run")
        ]

    @property
    def outputs(self) -> list[Block]:
        """The blocks that show what the examples print."""
        return [b for b in self.blocks if b.marker == "output"]

    def marked(self, kind: str) -> list[Block]:
        """The blocks carrying the marker ``kind``."""
        return [b for b in self.blocks if b.marker == kind]


def parse_page(path: Path) -> Page:
    """Split ``path`` into its fenced blocks, each with the marker that precedes it.

    Raises ``ValueError`` for an unknown marker or an unclosed fence, so a typo in a marker
    fails the tests instead of silently skipping an example.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    whole_page = False
    pending: tuple[str, str | None] | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        marker = _MARKER.match(line)
        if marker:
            kind = marker.group("kind")
            if kind not in _KINDS:
                raise ValueError(f"{path}:{index + 1}: unknown docs-test marker {kind!r}")
            if kind == "page":
                whole_page = True
            else:
                pending = (kind, marker.group("arg"))
            index += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if line.strip():
                pending = None  # a marker only applies to the block right after it
            index += 1
            continue
        indent = len(fence.group("indent"))
        closing = fence.group("fence")
        body: list[str] = []
        index += 1
        start = index + 1
        while index < len(lines) and not lines[index].strip().startswith(closing):
            body.append(lines[index][indent:] if lines[index].strip() else "")
            index += 1
        if index >= len(lines):
            raise ValueError(f"{path}:{start - 1}: unclosed code fence")
        index += 1
        kind, argument = pending if pending else (None, None)
        pending = None
        blocks.append(
            Block(
                path=path,
                line=start,
                language=fence.group("info").lower(),
                source="\n".join(body) + "\n",
                marker=kind,
                argument=argument,
            )
        )
    return Page(path=path, blocks=tuple(blocks), runs_whole_page=whole_page)
