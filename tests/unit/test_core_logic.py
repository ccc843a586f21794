"""I/O-free logic: backoff bounds, payload validation, outcomes, identifiers."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import uuid
from typing import Any

import pytest

from sqla_queue import (
    InvalidIdentifierError,
    PayloadNotSerializableError,
    Reschedule,
    Retry,
    RetryPolicy,
)
from sqla_queue._identifiers import validate_prefix, validate_schema, validate_task_name
from sqla_queue.logic.outcomes import (
    ClaimedJob,
    InvalidOutcomeError,
    OutcomeKind,
    check_outcome,
    error_entry,
    find_unstorable,
    outcome_for_error,
    outcome_for_return,
    outcome_lost_too_often,
    outcome_unwritable,
    sanitize_text,
)
from sqla_queue.logic.payload import decode_arguments, encode_arguments
from sqla_queue.logic.times import EARLIEST_DUE, LATEST_DUE, check_due, check_due_time

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


class TestDueTimes:
    """Issue 12, item 1 (handler side) and item 7: due times and delays a job may have."""

    @pytest.mark.parametrize(
        ("make", "error", "words"),
        [
            (lambda: Retry(after=math.nan), ValueError, "Retry(after=...) must be a finite"),
            (lambda: Retry(after=math.inf), ValueError, "finite"),
            (lambda: Retry(after=-1), ValueError, "cannot be negative"),
            (
                lambda: Retry(after=True),
                TypeError,
                "number of seconds (int or float) or a timedelta",
            ),
            (lambda: Retry(after="60"), TypeError, "got '60' (str)"),  # type: ignore[arg-type]
            (lambda: Retry(at=dt.datetime(2030, 1, 1)), ValueError, "must be timezone-aware"),
            (lambda: Retry(at="2030-01-01"), TypeError, "must be a timezone-aware datetime"),  # type: ignore[arg-type]
            (lambda: Retry(after=1, at=NOW), ValueError, "at most one of after= and at="),
            (lambda: Reschedule(in_=math.nan), ValueError, "Reschedule(in_=...) must be a finite"),
            (lambda: Reschedule(at=dt.datetime(2030, 1, 1)), ValueError, "timezone-aware"),
            (
                lambda: Reschedule(at=dt.datetime.max.replace(tzinfo=dt.UTC)),
                ValueError,
                "outside the due times a job may have",
            ),
            (
                lambda: Retry(at=dt.datetime.min.replace(tzinfo=dt.UTC)),
                ValueError,
                "outside the due times",
            ),
        ],
    )
    def test_retry_and_reschedule_refuse_bad_times_at_once(
        self, make: Any, error: type[Exception], words: str
    ) -> None:
        with pytest.raises(error) as info:
            make()
        assert words in str(info.value)

    def test_naive_datetimes_are_refused_by_both(self) -> None:
        naive = dt.datetime(2030, 1, 1)
        for make in (lambda: Retry(at=naive), lambda: Reschedule(at=naive)):
            with pytest.raises(ValueError, match="timezone-aware"):
                make()

    def test_bounds_hold_in_every_time_zone(self) -> None:
        for hours in (-23, -12, 0, 14, 23):
            zone = dt.timezone(dt.timedelta(hours=hours))
            # The extremes of Python's range are refused in any zone, without overflow...
            with pytest.raises(ValueError):
                check_due_time("at", dt.datetime.max.replace(tzinfo=zone))
            with pytest.raises(ValueError):
                check_due_time("at", dt.datetime.min.replace(tzinfo=zone))
            # ...and the bounds themselves stay inside it, read in that zone.
            assert LATEST_DUE.astimezone(zone).year in (9998, 9999)
            assert EARLIEST_DUE.astimezone(zone).year in (1, 2)

    def test_a_delay_past_the_latest_due_time_is_refused_naming_it(self) -> None:
        check_due(at=None, delay=3600, now=NOW, what="retry")
        with pytest.raises(ValueError) as info:
            check_due(at=None, delay=1e12, now=NOW, what="this attempt's retry")
        assert "1e+12 s" in str(info.value)
        assert LATEST_DUE.isoformat() in str(info.value)

    def test_retry_policy_refuses_non_finite_and_wrong_types(self) -> None:
        with pytest.raises(ValueError, match="max_delay must be finite"):
            RetryPolicy(max_delay=math.inf)
        with pytest.raises(ValueError, match="min_delay must be finite"):
            RetryPolicy(min_delay=math.nan)
        with pytest.raises(TypeError, match="factor must be a number"):
            RetryPolicy(factor=True)

    def test_a_huge_factor_caps_instead_of_overflowing(self) -> None:
        assert RetryPolicy(max_delay=60, factor=1e300).ceiling(5) == 60


class TestUnstorableOutcomes:
    """Issue 12, items 3 and 5: what PostgreSQL cannot store, and exceptions that resist."""

    def test_error_text_is_sanitized_and_says_so(self) -> None:
        try:
            raise ValueError("card \x00 declined \ud800")
        except ValueError as exc:
            entry = error_entry(job(), exc, WORKER, NOW)
        assert entry["message"].startswith("card \ufffd declined \ufffd [sqla_queue: ")
        assert "replaced with U+FFFD" in entry["message"]
        assert "\x00" not in entry["traceback"]
        assert "\ufffd" in entry["traceback"]
        json.dumps(entry).encode()  # plain, storable text

    def test_clean_error_text_is_left_alone(self) -> None:
        entry = error_entry(job(), ValueError("card declined"), WORKER, NOW)
        assert entry["message"] == "card declined"

    def test_an_exception_whose_str_raises_is_still_recorded(self) -> None:
        class Hostile(Exception):
            def __str__(self) -> str:
                raise RuntimeError("no")

        entry = error_entry(job(), Hostile(), WORKER, NOW)
        assert entry["message"] == "<str() of this Hostile raised RuntimeError>"
        assert entry["type"].endswith("Hostile")

    @pytest.mark.parametrize(
        ("value", "where"),
        [
            ({"a": ["ok", "x\x00y"]}, "result['a'][1] contains a NUL character"),
            (["\udc00"], "result[0] contains a lone surrogate code point U+DC00"),
            ({"k\x00": 1}, "a key of result contains a NUL character"),
            ("\ud83d", "result contains a lone surrogate code point U+D83D"),
        ],
    )
    def test_unstorable_strings_are_found_with_their_path(self, value: Any, where: str) -> None:
        found = find_unstorable(value)
        assert found is not None and found.startswith(where)

    @pytest.mark.parametrize("value", ["plain", "emoji \U0001f600", "\ud83d\ude00", {"a": [1]}])
    def test_storable_values_pass(self, value: Any) -> None:
        assert find_unstorable(value) is None

    def test_check_outcome_refuses_nul_depth_and_far_future(self) -> None:
        with pytest.raises(InvalidOutcomeError, match="NUL character"):
            check_outcome(outcome_for_return(job(), {"t": "\x00"}), NOW)
        # Deeper than the JSON encoder goes on any Python: 3.13's C encoder is bounded by
        # the interpreter's C recursion limit, not sys.getrecursionlimit(), and encodes
        # 5,000 levels.
        deep: Any = []
        for _ in range(100_000):
            deep = [deep]
        with pytest.raises(InvalidOutcomeError, match="nested too deep"):
            check_outcome(outcome_for_return(job(), deep), NOW)
        far = outcome_for_error(
            job(), Retry(after=1e12), policy=RetryPolicy(), worker_id=WORKER, now=NOW
        )
        with pytest.raises(InvalidOutcomeError, match="latest due time"):
            check_outcome(far, NOW)
        # A result with a backslash that only looks like an escape is fine.
        check_outcome(outcome_for_return(job(), "C:\\u0000"), NOW)

    def test_an_unwritable_outcome_has_a_plain_stand_in(self) -> None:
        original = outcome_for_return(job(), {"t": "x"})
        stand_in = outcome_unwritable(
            original, "bad \x00 (SQLSTATE 22P05)", worker_id=WORKER, now=NOW
        )
        assert stand_in.kind is OutcomeKind.FAILED
        assert stand_in.extra == {"stand_in": True}
        assert stand_in.error is not None
        assert stand_in.error["type"] == "sqla_queue.OutcomeNotWritten"
        assert "bad \ufffd (SQLSTATE 22P05)" in stand_in.error["message"]
        assert (stand_in.job_id, stand_in.attempt) == (original.job_id, original.attempt)

    def test_sanitize_text_counts_replacements(self) -> None:
        assert sanitize_text("a\x00b\udfffc") == ("a\ufffdb\ufffdc", 2)
        assert sanitize_text("clean") == ("clean", 0)
