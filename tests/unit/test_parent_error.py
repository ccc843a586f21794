"""A failed parent as its dependent sees it: short in a log line (issue 36, section 3)."""

from __future__ import annotations

import pytest

from sqla_queue.workflows import ParentError

pytestmark = pytest.mark.unit


def test_a_parent_errors_repr_names_the_error_without_its_traceback() -> None:
    trace = "Traceback (most recent call last):\n" + "  File 'x.py', line 1\n" * 500
    error = {"type": "builtins.RuntimeError", "message": "card declined", "traceback": trace}
    shown = repr(ParentError("failed", error))
    assert shown == "ParentError('failed', builtins.RuntimeError: card declined)"
    assert "Traceback" not in shown


def test_a_cancelled_parent_and_a_long_message_stay_short() -> None:
    assert repr(ParentError("cancelled", None)) == "ParentError('cancelled')"
    long = repr(ParentError("failed", {"type": "E", "message": "x" * 5000}))
    assert len(long) < 260 and long.endswith("…)")
    # The error is still there in full for the handler that reads it.
    assert ParentError("failed", {"message": "x" * 5000}).error == {"message": "x" * 5000}
