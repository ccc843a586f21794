"""How a log line quotes a database error (sqla_queue.logic.quoting)."""

from __future__ import annotations

import pytest

from sqla_queue.logic.quoting import MAX_QUOTED, short_error


def test_a_short_error_is_quoted_whole() -> None:
    assert short_error(RuntimeError("deadlock detected")) == "deadlock detected"


def test_a_long_error_keeps_its_message_and_says_how_much_was_cut() -> None:
    message = "deadlock detected"
    statement = "\n[SQL: UPDATE q SET x = 1 WHERE id IN (" + ", ".join(map(str, range(9000))) + ")]"
    text = short_error(RuntimeError(message + statement))
    assert text.startswith(message)
    assert len(text) < MAX_QUOTED + 40
    cut = len(message + statement) - MAX_QUOTED
    assert text.endswith(f"… ({cut} more characters)")


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        short_error(RuntimeError("x"), limit=0)
