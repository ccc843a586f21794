"""How a table gives way at 80 columns (issue 36, §7): a column of dashes goes before a
column with values, and a ``whole`` column is not cut while another can go instead."""

from __future__ import annotations

from sqla_queue.cli.render import Cell, Column, table_lines

COLUMNS = (
    Column("id", right=True),
    Column("state"),
    Column("waits for", least=8, cut="end", drop=6, whole=True),
    Column("version", right=True, drop=3),
    Column("finished", drop=5),
    Column("zeros", right=True, drop=4, blank=("0",)),
)
ROWS: list[list[Cell]] = [
    ["1", "suspended", "signal:payment_received", "1", "-", "0"],
    ["2", "suspended", "signal:payment_received", "1", "-", "0"],
]


def shown(width: int | None, rows: list[list[Cell]] = ROWS) -> list[str]:
    return [line.plain for line in table_lines(COLUMNS, rows, width)]


def test_columns_without_a_value_go_first_whatever_their_drop_order() -> None:
    # Everything shows without a width; at 50, the dashes and the zeros go, not version.
    assert shown(None)[0].split()[-2:] == ["finished", "zeros"]
    lines = shown(50)
    assert lines[0].split() == ["id", "state", "waits", "for", "version"]
    assert " ".join(lines[3:]) == "(hidden, too narrow: finished, zeros; --json shows all)"
    assert all(len(line) <= 50 for line in lines)


def test_a_column_with_a_value_is_not_blank() -> None:
    rows = [list(ROWS[0]), [*ROWS[1][:4], "2026-12-07 10:00:00Z", "0"]]
    lines = shown(50, rows)
    assert "finished" not in lines[0] and "version" not in lines[0]


def test_a_whole_column_is_cut_only_when_nothing_else_can_go() -> None:
    # At 45 the version goes (it would fit cut), so the wait shows whole.
    lines = shown(45)
    assert "version" not in lines[0]
    assert all("signal:payment_received" in line for line in lines[1:3])
    # At 30 nothing else can go: the wait is cut, every line still fits.
    narrow = shown(30)
    assert all(len(line) <= 30 for line in narrow)
    assert "signal:pay" in narrow[1] and "…" in narrow[1]
