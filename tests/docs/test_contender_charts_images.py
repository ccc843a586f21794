"""The performance page's charts are the ones their committed figures draw.

``python -m bench.contender_charts bench/results/2026-12-04.json --out docs/images`` writes
``perf-drain.svg``, ``perf-cpu.svg``, ``perf-sustained.svg`` and ``perf-shapes.svg``;
``python -m bench.workflow_charts bench/results/2026-12-04-workflows.json --out docs/images``
writes ``workflows-latency.svg``, ``workflows-drain.svg`` and ``workflows-fanout.svg``. The
committed images must be exactly what the committed JSON draws, so a new run's figures and
its charts are committed together.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"
#: Each chart module, the run its charts are drawn from, and the images it draws.
DRAWINGS = [
    pytest.param(
        "bench.contender_charts",
        ROOT / "bench" / "results" / "2026-12-04.json",
        ("perf-drain.svg", "perf-cpu.svg", "perf-sustained.svg", "perf-shapes.svg"),
        id="contenders",
    ),
    pytest.param(
        "bench.workflow_charts",
        ROOT / "bench" / "results" / "2026-12-04-workflows.json",
        ("workflows-latency.svg", "workflows-drain.svg", "workflows-fanout.svg"),
        id="workflows",
    ),
]


@pytest.mark.parametrize(("module", "report", "charts"), DRAWINGS)
def test_charts_are_drawn_from_the_committed_figures(
    tmp_path: Path, module: str, report: Path, charts: tuple[str, ...]
) -> None:
    """Each image in docs/images is byte for byte what its module draws from the JSON."""
    if not report.is_file():
        pytest.skip(f"{report.relative_to(ROOT)} is not committed yet: no figures to check")
    command = f"python -m {module}"
    redraw = f"{command} {report.relative_to(ROOT)} --out docs/images"
    result = subprocess.run(
        [sys.executable, "-m", module, str(report), "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    drawn = sorted(p.name for p in tmp_path.glob("*.svg"))
    assert drawn == sorted(charts), (
        f"{report.name} lacks the figures of some charts: {result.stdout.strip()}"
    )
    for name in charts:
        committed = IMAGES / name
        assert committed.is_file(), f"docs/images/{name} is missing; run: {redraw}"
        assert (tmp_path / name).read_text(encoding="utf-8") == committed.read_text(
            encoding="utf-8"
        ), f"docs/images/{name} is not what {command} draws from {report.name}; run: {redraw}"
