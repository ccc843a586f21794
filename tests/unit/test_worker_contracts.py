"""Each Python-SQL contract of the worker is written once and held to its SQL here.

A statement builder's parameter record (a ``TypedDict`` next to it) must name exactly the
parameters its statement binds; the outcome row the worker encodes must carry exactly the
columns the completion reads. Compiled with the PostgreSQL dialect, no database.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any, get_type_hints

import pytest
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql

from sqla_queue.logic.outcomes import Outcome, OutcomeKind, OutcomeRow
from sqla_queue.models import QueueTables, build_tables
from sqla_queue.statements import (
    claim_statement,
    cleanup_statement,
    clear_done_statement,
    complete_statement,
    heartbeat_statement,
    orphan_sweep_statement,
    promote_statement,
    reclaim_statement,
)
from sqla_queue.statements.claim import (
    ClaimParams,
    LimitedClaimParams,
    LimitedRatedClaimParams,
    RatedClaimParams,
)
from sqla_queue.statements.complete import OUTCOME_COLUMNS, CompleteParams
from sqla_queue.statements.controls import (
    ControlledTasksParams,
    RateBacklogParams,
    RateLockParams,
    SetPausedParams,
    SetRateParams,
    controlled_tasks_statement,
    rate_backlog_statement,
    rate_lock_statement,
    set_paused_statement,
    set_rate_statement,
)
from sqla_queue.statements.keys import CleanupParams, KeysParams, SweepParams
from sqla_queue.statements.liveness import HeartbeatParams, ReclaimParams

pytestmark = pytest.mark.unit

CONTRACTS: list[tuple[str, Callable[[QueueTables], Any], type]] = [
    ("claim", claim_statement, ClaimParams),
    ("limited claim", lambda t: claim_statement(t, limited=True), LimitedClaimParams),
    ("rated claim", lambda t: claim_statement(t, rated=True), RatedClaimParams),
    (
        "limited rated claim",
        lambda t: claim_statement(t, limited=True, rated=True),
        LimitedRatedClaimParams,
    ),
    ("rate lock", rate_lock_statement, RateLockParams),
    ("rate backlog", rate_backlog_statement, RateBacklogParams),
    ("controlled tasks", controlled_tasks_statement, ControlledTasksParams),
    ("set paused", set_paused_statement, SetPausedParams),
    ("set rate", set_rate_statement, SetRateParams),
    ("complete", complete_statement, CompleteParams),
    ("heartbeat", heartbeat_statement, HeartbeatParams),
    ("reclaim", reclaim_statement, ReclaimParams),
    ("clear done", clear_done_statement, KeysParams),
    ("promote", promote_statement, KeysParams),
    ("cleanup", cleanup_statement, CleanupParams),
    ("orphan sweep", orphan_sweep_statement, SweepParams),
]


def required_binds(statement: Any) -> set[str]:
    """The parameters a caller must supply: binds SQLAlchemy has no value for."""
    compiled = statement.compile(dialect=postgresql.psycopg.dialect())
    return {name for name, bind in compiled.binds.items() if bind.required}


@pytest.mark.parametrize(("name", "build", "record"), CONTRACTS, ids=[c[0] for c in CONTRACTS])
def test_parameter_record_names_exactly_the_statement_binds(
    name: str, build: Callable[[QueueTables], Any], record: type
) -> None:
    tables = build_tables(MetaData(), schema="app")
    # A key the record marks NotRequired is a bind with a default (None), not a required one.
    assert required_binds(build(tables)) == set(record.__required_keys__), name
    assert set(get_type_hints(record)) >= set(record.__required_keys__), name


def test_the_contract_check_can_fail() -> None:
    tables = build_tables(MetaData())
    # The plain claim binds fewer parameters than the limited record names.
    assert required_binds(claim_statement(tables)) != set(get_type_hints(LimitedClaimParams))


def test_outcome_row_keys_are_the_completion_columns_in_order() -> None:
    assert list(get_type_hints(OutcomeRow)) == [c.name for c in OUTCOME_COLUMNS]
    row = Outcome(1, 2, OutcomeKind.RETRY, delay=3.0).as_row()
    assert list(row) == [c.name for c in OUTCOME_COLUMNS]


def test_outcome_kind_groups_cover_every_kind_once() -> None:
    final, requeue = set(OutcomeKind.final()), set(OutcomeKind.back_to_pending())
    in_handler = set(OutcomeKind.settled_by_handler())
    assert final | requeue | in_handler == set(OutcomeKind)
    assert not final & requeue and not (final | requeue) & in_handler
    assert set(OutcomeKind.recorded()) == final | {OutcomeKind.RETRY}


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(7, 1, OutcomeKind.SUCCEEDED),
        Outcome(7, 1, OutcomeKind.SUCCEEDED, result={"n": [1, "x"]}),
        Outcome(7, 2, OutcomeKind.RETRY, error={"message": "boom"}, delay=1.5),
        Outcome(7, 2, OutcomeKind.RESCHEDULE, execute_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC)),
        Outcome(7, 3, OutcomeKind.RELEASE),
    ],
    ids=["bare", "result", "retry", "reschedule", "release"],
)
def test_an_encoded_outcome_is_its_row(outcome: Outcome) -> None:
    assert json.loads(outcome.encoded) == outcome.as_row()
    assert outcome.encoded is outcome.encoded  # encoded once, then kept
