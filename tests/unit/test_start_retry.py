"""A worker's start-up check tries again when the server ends its connection as it is made.

The chaos test caught a worker started just as an operator terminated every backend: its
schema check failed with SQLSTATE 57P01 before any Connection existed to be invalidated,
and the worker exited instead of connecting again.
"""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from sqla_queue.worker.base import VERIFY_ATTEMPTS, WorkerBase

pytestmark = pytest.mark.unit


class _DriverError(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        super().__init__("terminating connection due to administrator command")
        self.sqlstate = sqlstate


def _error(sqlstate: str | None) -> OperationalError:
    return OperationalError("SELECT 1", {}, _DriverError(sqlstate))


@pytest.mark.parametrize("sqlstate", ["57P01", "57P03", "08006"])
def test_a_connection_ended_by_the_server_is_tried_again(sqlstate: str) -> None:
    assert WorkerBase._verify_retry_delay(_error(sqlstate), 1) is not None
    assert WorkerBase._verify_retry_delay(_error(sqlstate), VERIFY_ATTEMPTS) is None


@pytest.mark.parametrize("sqlstate", [None, "42P01", "28000"])
def test_other_errors_at_start_are_not(sqlstate: str | None) -> None:
    assert WorkerBase._verify_retry_delay(_error(sqlstate), 1) is None


def test_a_connection_closed_while_it_was_set_up_is_tried_again() -> None:
    # libpq's words when a backend is terminated as the connection is made: no SQLSTATE.
    closed = OperationalError(
        None,
        None,
        Exception("consuming input failed: server closed the connection unexpectedly"),
    )
    assert WorkerBase._verify_retry_delay(closed, 1) is not None
    refused = OperationalError(None, None, Exception("connection refused"))
    assert WorkerBase._verify_retry_delay(refused, 1) is None
