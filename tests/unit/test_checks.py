"""The generic checks of :mod:`sqla_queue.checks` that callers parametrize by name.

Each caller keeps its own wording by passing its subject; these tests pin the shared rule
(which values pass, what they become) and the message shape the callers' tests match.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from sqla_queue.checks import (
    INT8_MAX,
    check_in_range,
    check_row_limit,
    is_number,
    is_whole_number,
)


@pytest.mark.parametrize(
    ("value", "whole", "number"),
    [
        (3, True, True),
        (-(2**70), True, True),
        (True, False, False),
        (2.0, False, True),
        (Fraction(1, 2), False, True),
        (Decimal(2), False, False),  # Decimal is not registered as a numbers.Real
        ("2", False, False),
        (None, False, False),
        (float("nan"), False, True),
    ],
)
def test_the_predicates_take_numbers_but_not_bools(
    value: object, whole: bool, number: bool
) -> None:
    assert is_whole_number(value) is whole
    assert is_number(value) is number


@pytest.mark.parametrize("value", [0, 1001, -1, 1.0, True, "5", None, Decimal(5)])
def test_check_in_range_refuses_any_bad_value_with_one_value_error(value: object) -> None:
    with pytest.raises(ValueError) as raised:
        check_in_range("ahead", value, 1, 1000)
    assert str(raised.value) == f"ahead must be a whole number from 1 to 1000, got {value!r}"


def test_check_in_range_returns_an_int_within_the_bounds() -> None:
    assert check_in_range("x", 1, 1, 1000) == 1
    assert check_in_range("x", 1000, 1, 1000) == 1000
    assert type(check_in_range("x", 7, 0, 10)) is int


@pytest.mark.parametrize("value", [0, -5, 2.5, True, "10", None])
def test_check_row_limit_refuses_any_bad_value_with_one_value_error(value: object) -> None:
    with pytest.raises(ValueError) as raised:
        check_row_limit("the number of jobs to list", value)
    assert str(raised.value) == f"the number of jobs to list must be at least 1, got {value!r}"


def test_check_row_limit_lowers_a_limit_beyond_a_bigint() -> None:
    assert check_row_limit("n", 1) == 1
    assert check_row_limit("n", INT8_MAX) == INT8_MAX
    assert check_row_limit("n", 2**70) == INT8_MAX
