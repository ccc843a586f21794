"""The ``sqla_queue_copy`` execution option says on or off without doubt (issue 36, §5).

``0``, ``"false"`` and ``"off"`` turn COPY off as ``False`` does; ``None``, ``2``, a float
or a word that is neither raise an error naming the option before anything is written,
on a connection, an engine and a session, for a batch of any size. The road a batch took
shows in the statements sent, as in test_enqueue_copy.py.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session

from sqla_queue.copying import COPY_MIN_ROWS, COPY_OPTION, copy_option
from tests.support.app import noop, queue

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get("SQLA_QUEUE_TEST_DML_ROLE") is not None, reason="a restricted run"
    ),
]

N = COPY_MIN_ROWS + 10
OFF = (False, 0, "false", "FALSE", " off ", "no", "0")
ON = (True, 1, "true", "On", "yes", "1")
NONSENSE = (None, 2, -1, 0.0, 1.0, "", "disabled", "nein", b"false", [False])


def _roads(engine: Engine) -> list[str]:
    seen: list[str] = []

    def sent(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "string_agg(nextval" in statement:
            seen.append("copy")
        elif "jsonb_to_recordset" in statement:
            seen.append("statement")

    event.listen(engine, "before_cursor_execute", sent)
    return seen


def _jobs(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(select(func.count()).select_from(queue.tables.jobs)) or 0)


def test_the_option_s_values_parse_without_doubt() -> None:
    assert copy_option({}) is True
    for value in ON:
        assert copy_option({COPY_OPTION: value}) is True, value
    for value in OFF:
        assert copy_option({COPY_OPTION: value}) is False, value
    for value in NONSENSE:
        with pytest.raises((TypeError, ValueError), match=COPY_OPTION) as caught:
            copy_option({COPY_OPTION: value})
        assert "True (COPY on, the default) or False (COPY off)" in str(caught.value)
    with pytest.raises(TypeError, match="leave the option out for the default"):
        copy_option({COPY_OPTION: None})


@pytest.mark.parametrize("value", OFF)
def test_every_off_value_takes_the_statement(engine: Engine, value: object) -> None:
    roads = _roads(engine)
    with engine.begin() as connection:
        queue.enqueue_many(
            connection.execution_options(**{COPY_OPTION: value}), [noop.call() for _ in range(N)]
        )
    assert roads == ["statement"]
    assert _jobs(engine) == N


@pytest.mark.parametrize("value", ON)
def test_every_on_value_copies(engine: Engine, value: object) -> None:
    roads = _roads(engine)
    with engine.begin() as connection:
        queue.enqueue_many(
            connection.execution_options(**{COPY_OPTION: value}), [noop.call() for _ in range(N)]
        )
    assert roads == ["copy"]


@pytest.mark.parametrize("value", [None, 2, "disabled"])
@pytest.mark.parametrize("size", [1, N])
def test_nonsense_raises_before_anything_is_written(
    engine: Engine, value: object, size: int
) -> None:
    # On a connection, and on an engine behind a session.
    with engine.begin() as connection:
        with pytest.raises((TypeError, ValueError), match=COPY_OPTION):
            queue.enqueue_many(
                connection.execution_options(**{COPY_OPTION: value}),
                [noop.call() for _ in range(size)],
            )
        # The transaction is intact: the error came before any statement.
        queue.enqueue_many(connection.execution_options(**{COPY_OPTION: True}), [noop.call()])
    with Session(engine.execution_options(**{COPY_OPTION: value})) as session:
        with pytest.raises((TypeError, ValueError), match=COPY_OPTION):
            queue.enqueue_many(session, [noop.call() for _ in range(size)])
        session.rollback()
    assert _jobs(engine) == 1
