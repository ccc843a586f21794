"""The performance page's contender charts are the ones their committed figures draw.

``python -m bench.contender_charts bench/results/2026-12-04.json --out docs/images`` writes
``perf-drain.svg``, ``perf-cpu.svg``, ``perf-sustained.svg`` and ``perf-shapes.svg``; the
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
#: The full run the charts are drawn from.
REPORT = ROOT / "bench" / "results" / "2026-12-04.json"
CHARTS = ("perf-drain.svg", "perf-cpu.svg", "perf-sustained.svg", "perf-shapes.svg")


def test_contender_charts_are_drawn_from_the_committed_figures(tmp_path: Path) -> None:
    """Each of the four images in docs/images is byte for byte what the JSON draws."""
    if not REPORT.is_file():
        pytest.skip(f"{REPORT.relative_to(ROOT)} is not committed yet: no figures to check")
    command = "python -m bench.contender_charts"
    redraw = f"{command} {REPORT.relative_to(ROOT)} --out docs/images"
    result = subprocess.run(
        [sys.executable, "-m", "bench.contender_charts", str(REPORT), "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    drawn = sorted(p.name for p in tmp_path.glob("*.svg"))
    assert drawn == sorted(CHARTS), (
        f"{REPORT.name} lacks the figures of some charts: {result.stdout.strip()}"
    )
    for name in CHARTS:
        committed = IMAGES / name
        assert committed.is_file(), f"docs/images/{name} is missing; run: {redraw}"
        assert (tmp_path / name).read_text(encoding="utf-8") == committed.read_text(
            encoding="utf-8"
        ), f"docs/images/{name} is not what {command} draws from {REPORT.name}; run: {redraw}"
