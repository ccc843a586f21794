"""I/O-free logic: backoff bounds, payload validation, outcomes, identifiers."""

from __future__ import annotations

import datetime as dt
import math
import random
import uuid

import pytest

from sqla_queue import (
    InvalidIdentifierError,
    PayloadNotSerializableError,
    Reschedule,
    Retry,
    RetryPolicy,
)
from sqla_queue._identifiers import validate_prefix, validate_schema, validate_task_name
from sqla_queue.core.outcomes import (
    ClaimedJob,
    OutcomeKind,
    outcome_for_error,
    outcome_for_return,
    outcome_lost_too_often,
)
from sqla_queue.core.payload import decode_arguments, encode_arguments

pytestmark = pytest.mark.unit

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
WORKER = uuid.UUID(int=7)


def job(attempt: int = 1, max_attempts: int = 3, reclaims: int = 0) -> ClaimedJob:
    return ClaimedJob(1, "t", attempt, max_attempts, reclaims, None, {"args": [], "kwargs": {}})


class TestRetryPolicy:
    def test_delays_stay_within_bounds(self) -> None:
        policy = RetryPolicy(min_delay=1, max_delay=30, factor=2, jitter=0.5)
        rng = random.Random(42)
        for attempt in range(1, 12):
            for _ in range(50):
                d = policy.delay(attempt, rng)
                assert policy.floor(attempt) <= d <= policy.ceiling(attempt)
                assert 1 <= d <= 30

    def test_grows_exponentially_then_caps(self) -> None:
        policy = RetryPolicy(min_delay=1, max_delay=10, factor=2, jitter=0)
        assert [policy.ceiling(a) for a in range(1, 7)] == [1, 2, 4, 8, 10, 10]
        assert policy.delay(3) == 4

    def test_huge_attempt_does_not_overflow(self) -> None:
        assert RetryPolicy(max_delay=60).ceiling(10_000) == 60

    @pytest.mark.parametrize(
        "kwargs", [{"min_delay": -1}, {"min_delay": 5, "max_delay": 1}, {"jitter": 2}]
    )
    def test_rejects_nonsense(self, kwargs: dict[str, float]) -> None:
        with pytest.raises(ValueError):
            RetryPolicy(**kwargs)


class TestPayload:
    def test_round_trip(self) -> None:
        import json

        text = encode_arguments("t", [1, "a"], {"x": [1, 2], "y": None})
        assert decode_arguments(json.loads(text)) == ([1, "a"], {"x": [1, 2], "y": None})

    def test_names_task_and_offending_value(self) -> None:
        with pytest.raises(PayloadNotSerializableError) as info:
            encode_arguments("send_email", [], {"to": "a", "when": {"at": object()}})
        message = str(info.value)
        assert "send_email" in message
        assert "['when']['at']" in message
        assert isinstance(info.value, TypeError)

    def test_refuses_nan(self) -> None:
        with pytest.raises(PayloadNotSerializableError, match="nan"):
            encode_arguments("t", [math.nan], {})

    @pytest.mark.parametrize("payload", [None, [], {"args": {}}, {"kwargs": []}])
    def test_malformed_rows_are_reported(self, payload: object) -> None:
        with pytest.raises(ValueError, match="malformed payload"):
            decode_arguments(payload)


class TestOutcomes:
    def test_success_keeps_result(self) -> None:
        outcome = outcome_for_return(job(), {"ok": True})
        assert outcome.kind is OutcomeKind.SUCCEEDED
        assert outcome.result == {"ok": True}

    def test_error_with_attempts_left_retries_with_backoff(self) -> None:
        policy = RetryPolicy(min_delay=2, max_delay=2, jitter=0)
        outcome = outcome_for_error(
            job(attempt=1), ValueError("x"), policy=policy, worker_id=WORKER, now=NOW
        )
        assert outcome.kind is OutcomeKind.RETRY
        assert outcome.delay == 2
        assert outcome.error is not None
        assert outcome.error["type"] == "builtins.ValueError"
        assert outcome.error["message"] == "x"
        assert outcome.error["worker"] == str(WORKER)

    def test_last_attempt_fails(self) -> None:
        outcome = outcome_for_error(
            job(attempt=3), ValueError("x"), policy=RetryPolicy(), worker_id=WORKER, now=NOW
        )
        assert outcome.kind is OutcomeKind.FAILED

    def test_retry_request_sets_its_own_delay(self) -> None:
        outcome = outcome_for_error(
            job(),
            Retry(after=dt.timedelta(seconds=90)),
            policy=RetryPolicy(),
            worker_id=WORKER,
            now=NOW,
        )
        assert (outcome.kind, outcome.delay) == (OutcomeKind.RETRY, 90)

    def test_reschedule_does_not_burn_an_attempt(self) -> None:
        at = NOW + dt.timedelta(hours=1)
        raised = outcome_for_error(
            job(attempt=3), Reschedule(at=at), policy=RetryPolicy(), worker_id=WORKER, now=NOW
        )
        returned = outcome_for_return(job(attempt=3), Reschedule(in_=5))
        assert raised.kind is returned.kind is OutcomeKind.RESCHEDULE
        assert raised.execute_at == at
        assert returned.delay == 5

    def test_reschedule_needs_one_time(self) -> None:
        with pytest.raises(ValueError):
            Reschedule()
        with pytest.raises(ValueError):
            Reschedule(at=dt.datetime(2030, 1, 1))

    def test_lost_too_often(self) -> None:
        assert (
            outcome_lost_too_often(job(reclaims=2), max_reclaims=2, worker_id=WORKER, now=NOW)
            is None
        )
        lost = outcome_lost_too_often(job(reclaims=3), max_reclaims=2, worker_id=WORKER, now=NOW)
        assert lost is not None
        assert lost.kind is OutcomeKind.FAILED
        assert "lost 3 times" in lost.error["message"]  # type: ignore[index]


class TestIdentifiers:
    @pytest.mark.parametrize("bad", ["Public", "1abc", "a-b", 'x"; drop', "x" * 64])
    def test_bad_schema(self, bad: str) -> None:
        with pytest.raises(InvalidIdentifierError):
            validate_schema(bad)

    def test_prefix_length_leaves_room_for_index_names(self) -> None:
        with pytest.raises(InvalidIdentifierError, match="too long"):
            validate_prefix("p" * 45)
        assert validate_prefix("myapp_") == "myapp_"

    @pytest.mark.parametrize("bad", ["", "has space", "semi;colon", "x" * 201, "9lives"])
    def test_bad_task_names(self, bad: str) -> None:
        with pytest.raises(InvalidIdentifierError):
            validate_task_name(bad)

    def test_good_task_names(self) -> None:
        for name in ["send_email", "myapp.jobs.send_email", "billing:charge", "a-b"]:
            assert validate_task_name(name) == name
