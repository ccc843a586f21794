"""The plan checker of the robustness tests refuses what reads a backlog, and only that.

A bitmap scan is refused unless it reads ``queue_active_ix`` alone (one key's pending and
running rows, never its waiting backlog) within the row bound.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.robustness import ROW_BOUND, violations

pytestmark = pytest.mark.unit

EX = "sqla_queue_job_executions"


def _bitmap(index: str, rows: int) -> dict[str, Any]:
    return {
        "Plan": {
            "Node Type": "Bitmap Heap Scan",
            "Relation Name": EX,
            "Alias": "started",
            "Actual Rows": 1,
            "Actual Loops": 1,
            "Plans": [
                {
                    "Node Type": "Bitmap Index Scan",
                    "Index Name": index,
                    "Actual Rows": rows,
                    "Actual Loops": 1,
                }
            ],
        }
    }


def test_a_bitmap_of_one_keys_active_rows_within_the_bound_passes() -> None:
    assert violations(_bitmap(f"{EX}_queue_active_ix", 3), EX) == []


@pytest.mark.parametrize(
    ("index", "rows"),
    [
        (f"{EX}_queue_ix", 3),  # every keyed row, the waiting backlog included
        (f"{EX}_task_claim_ix", 3),
        (f"{EX}_queue_active_ix", ROW_BOUND + 1),  # a key with more active rows than allowed
    ],
)
def test_any_other_bitmap_scan_is_refused(index: str, rows: int) -> None:
    assert any("a scan that reads the backlog" in v for v in violations(_bitmap(index, rows), EX))


def test_a_sequential_scan_is_refused() -> None:
    plan = {"Plan": {"Node Type": "Seq Scan", "Relation Name": EX, "Actual Rows": 1}}
    assert violations(plan, EX) == [f"Seq Scan on {EX} (None, None): a scan that reads the backlog"]
