"""What the docs pages say and show, checked without a database.

- The README lists every how-to guide of the site's navigation.
- No page speaks of the project's internal issue numbers.
- Every Markdown table has a header in each column, and few enough columns to fit the
  content width of the site's theme.
- The performance page opens with its charts, and the charts are the ones
  ``python -m bench.charts`` draws from the committed benchmark figures.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PERFORMANCE = DOCS / "performance.md"
MKDOCS = ROOT / "mkdocs.yml"
IMAGES = DOCS / "images"

#: Six columns of the performance page's figures fit mkdocs-material's content width at a
#: 1024 px window; its seven- to nine-column tables scrolled sideways.
MAX_COLUMNS = 6

_FENCE = re.compile(r"^\s*(```|~~~)")
_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_ISSUE_NUMBER = re.compile(r"\bissues?\s+(#\s*)?\d{1,2}(?!\d)", re.IGNORECASE)
_NAV_GUIDE = re.compile(r"^\s+-\s.*:\s*\"?(?P<path>guides/[\w./-]+\.md)\"?\s*$")
_README_GUIDE = re.compile(r"\]\(docs/(?P<path>guides/[\w./-]+\.md)\)")
_CHART_COMMAND = re.compile(r"python -m bench\.charts (?P<report>bench/results/[\w.-]+\.json)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Numbered lines of ``path`` outside fenced code blocks."""
    fence: str | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        opening = _FENCE.match(line)
        if opening and (fence is None or opening.group(1) == fence):
            fence = opening.group(1) if fence is None else None
            continue
        if fence is None:
            yield number, line


def split_row(line: str) -> list[str]:
    """The cells of one Markdown table row; a ``|`` escaped or inside backticks is text."""
    cells: list[str] = []
    cell: list[str] = []
    in_code, previous = False, ""
    for char in line.strip():
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code and previous != "\\":
            cells.append("".join(cell).strip())
            cell = []
        else:
            cell.append(char)
        previous = char
    cells.append("".join(cell).strip())
    if line.strip().startswith("|"):
        cells = cells[1:]
    if line.strip().endswith("|"):
        cells = cells[:-1]
    return cells


@dataclass(frozen=True)
class Table:
    """A Markdown table: where its header is and the header's cells."""

    path: Path
    line: int
    header: list[str]

    @property
    def location(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def tables(path: Path) -> list[Table]:
    """Every table of ``path`` outside code blocks: a row followed by a separator row."""
    lines = list(_prose_lines(path))
    found = []
    for (number, line), (_, following) in itertools.pairwise(lines):
        if "|" in line and _SEPARATOR.match(following):
            found.append(Table(path, number, split_row(line)))
    return found


def test_the_table_parser_sees_empty_and_wide_headers() -> None:
    """The checks below can fail: an empty header cell and a code span's pipe are seen."""
    assert split_row("| | Supported | Tested |") == ["", "Supported", "Tested"]
    assert split_row("| a | `x | y` | b \\| c |") == ["a", "`x | y`", "b \\| c"]
    assert _SEPARATOR.match("|---|:---:|---:|")
    assert _ISSUE_NUMBER.search("Issue 11's targets") and _ISSUE_NUMBER.search("issues 6 and 11")
    assert not _ISSUE_NUMBER.search("issue 123 of PostgreSQL") and not _ISSUE_NUMBER.search(
        "tissue 5"
    )


def test_readme_lists_every_guide_of_the_navigation() -> None:
    """Each page under the site's how-to guides is linked from the README's guide list."""
    nav = [
        m.group("path") for line in MKDOCS.read_text().splitlines() if (m := _NAV_GUIDE.match(line))
    ]
    assert len(nav) >= 20, f"mkdocs.yml's guides were not found: {nav}"
    documentation = README.read_text(encoding="utf-8").split("## Documentation", 1)[1]
    listed = {m.group("path") for m in _README_GUIDE.finditer(documentation)}
    missing = [path for path in nav if path not in listed]
    assert not missing, f"guides in mkdocs.yml's nav but not in the README's list: {missing}"
    unknown = sorted(listed - set(nav))
    assert not unknown, f"guides in the README's list but not in mkdocs.yml's nav: {unknown}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_an_internal_issue(page: Path) -> None:
    """Readers do not have the project's issue tracker: no "issue 11" on a page."""
    hits = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for number, line in _prose_lines(page)
        if _ISSUE_NUMBER.search(line)
    ]
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_has_a_header_in_each_column_and_fits(page: Path) -> None:
    """No empty header cell, and at most MAX_COLUMNS columns per table."""
    for table in tables(page):
        assert all(table.header), f"{table.location}: empty header cell in {table.header}"
        assert len(table.header) <= MAX_COLUMNS, (
            f"{table.location}: {len(table.header)} columns, more than fit the page "
            f"({MAX_COLUMNS}); split the table: {table.header}"
        )


def test_performance_page_opens_with_its_charts() -> None:
    """The summary's charts come before the method, and every chart is on the page."""
    text = PERFORMANCE.read_text(encoding="utf-8")
    first_image = text.find("](images/perf-")
    assert 0 < first_image < text.find("## Reproduce") < text.find("## Method")
    assert text.count("\n", 0, first_image) < 20, "the first chart is not on the first screen"
    committed = sorted(p.name for p in IMAGES.glob("perf-*.svg"))
    assert committed, "no chart in docs/images"
    shown = sorted(set(re.findall(r"\]\(images/(perf-[\w-]+\.svg)\)", text)))
    assert shown == committed


def test_performance_charts_are_drawn_from_the_committed_figures(tmp_path: Path) -> None:
    """``python -m bench.charts`` on the JSON the page names redraws the committed images."""
    commands = set(_CHART_COMMAND.findall(PERFORMANCE.read_text(encoding="utf-8")))
    assert len(commands) == 1, f"the page should name one figures file: {commands}"
    report = ROOT / commands.pop()
    assert report.is_file(), report
    result = subprocess.run(
        [sys.executable, "-m", "bench.charts", str(report), "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    drawn = sorted(p.name for p in tmp_path.glob("*.svg"))
    assert drawn == sorted(p.name for p in IMAGES.glob("perf-vs-*.svg"))
    for name in drawn:
        assert (tmp_path / name).read_text() == (IMAGES / name).read_text(), (
            f"docs/images/{name} is not what bench.charts draws from {report.name}; "
            f"run: python -m bench.charts {report.relative_to(ROOT)} --out docs/images"
        )


def _quick_report() -> dict[str, object]:
    """A report as ``bench.run --quick --scenarios drain,latency --protocol cold`` writes it."""
    from bench.common import summarize

    plain = summarize([9000.0]).as_json()
    no_bare = {"vs_pgqueuer": 1.5, "vs_bare": math.nan}
    return {
        "results": {
            "drain": {
                "protocols": ["cold"],
                "summary": {
                    # json.dumps writes a missing ratio as NaN, and json.loads reads it back.
                    "cold/plain/sqla-sync/W2/b10": plain | no_bare,
                    "cold/burst/sqla-sync/W2/b10": plain | {"vs_pgqueuer": 20.0, "vs_bare": 3.0},
                },
            },
            "latency": {"summary": {"sqla-notify": {"p50": 2.0}, "pgqueuer": {"p50": 1.0}}},
        }
    }


def test_charts_leave_out_what_a_partial_run_did_not_measure() -> None:
    """A quick run's report charts what it has; a missing or NaN figure is no bar."""
    from bench.charts import headline_charts

    report = json.loads(json.dumps(_quick_report()))
    charts = {chart.peer: chart.bars for chart in headline_charts(report)}
    assert [(b.label, b.speedup) for b in charts["PgQueuer"]] == [
        ("Drain, sync worker", 1.5),
        ("Drain after a burst, sync worker", 20.0),
        ("Latency p50, sync worker", 0.5),
    ]
    assert [(b.label, b.speedup) for b in charts["bare SQL"]] == [
        ("Drain after a burst, sync worker", 3.0)
    ]


def test_charts_refuse_a_report_without_figures(tmp_path: Path) -> None:
    """A report with nothing to chart is an error that names the file, and writes nothing."""
    from bench.charts import write_charts

    report = tmp_path / "empty.json"
    report.write_text(json.dumps({"results": {"enqueue": {"summary": {}}}}))
    with pytest.raises(ValueError, match=r"empty\.json: no drain"):
        write_charts(report, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("speedup", "shown"),
    [(1.329, "1.33x faster"), (0.97, "1.03x slower"), (0.4, "2.5x slower"), (648.2, "648x faster")],
)
def test_chart_ratios_read_as_times_faster_or_slower(speedup: float, shown: str) -> None:
    """Below 1x a bar reads as times slower, with fewer digits as the ratio grows."""
    from bench.charts import format_ratio

    assert format_ratio(speedup) == shown
