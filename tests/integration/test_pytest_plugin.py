"""The pytest plugin (sqla_queue.testing.pytest_plugin) as a user's suite sees it.

Each test writes a small application and test suite and runs pytest on it in a subprocess
(the plugin is loaded from its ``pytest11`` entry point, as after ``pip install``), then
checks the outcome of each of the suite's tests, including the ones that must fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.markdown import parse_page

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "testing.md"

APP = """\
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqla_queue import JobContext, Queue


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))
    welcomed: Mapped[bool] = mapped_column(default=False)


queue = Queue(Base)


@queue.task(name="welcome", pass_context=True)
def welcome(ctx: JobContext[Session], user_id: int) -> str:
    user = ctx.session.get(User, user_id)
    user.welcomed = True
    ctx.session.commit()
    return user.email


@queue.task(name="chain")
def chain(n: int) -> int:
    return n


@queue.task(name="explode")
def explode() -> None:
    raise RuntimeError("kaput")


def signup(session: Session, email: str) -> User:
    user = User(email=email)
    session.add(user)
    session.flush()
    welcome.enqueue(session, user.id)
    return user
"""

INI = """\
[pytest]
sqla_queue_app = shopapp:queue
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", *args)


def test_fixtures_give_a_fresh_database_with_app_and_queue_tables(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(shopapp=APP)
    pytester.makeini(INI)
    pytester.makepyfile(
        test_db="""
        import pytest
        from sqlalchemy import inspect, select, func
        from shopapp import User, queue, signup

        @pytest.mark.parametrize("round", [1, 2])
        def test_fresh(sqla_queue_engine, sqla_queue_session_factory, round):
            names = set(inspect(sqla_queue_engine).get_table_names())
            assert {"users", "sqla_queue_jobs", "sqla_queue_job_executions"} <= names
            with sqla_queue_session_factory() as session:
                # Each test starts empty, whatever the other one committed.
                assert session.scalar(select(func.count()).select_from(User)) == 0
                assert session.scalar(select(func.count()).select_from(queue.Job)) == 0
            with sqla_queue_session_factory.begin() as session:
                signup(session, f"u{round}@example.com")
        """
    )
    result = _run(pytester)
    result.assert_outcomes(passed=2)


def test_drain_runs_due_jobs_and_reports_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(shopapp=APP)
    pytester.makeini(INI)
    pytester.makepyfile(
        test_drain="""
        from sqlalchemy import select
        from shopapp import User, chain, explode, signup

        def test_drain(sqla_queue_session_factory, sqla_queue_drain):
            with sqla_queue_session_factory.begin() as session:
                user = signup(session, "ada@example.com")
                chain.enqueue(session, 7)
                chain.options(delay=3600).enqueue(session, 8)  # not due: must not run
            result = sqla_queue_drain()
            assert result.tasks == ["welcome", "chain"]
            assert [job.status for job in result.jobs] == ["succeeded", "succeeded"]
            assert [job.result for job in result.jobs] == ["ada@example.com", 7]
            assert result.stats.succeeded == 2
            with sqla_queue_session_factory() as session:
                assert session.scalar(select(User.welcomed)) is True
            assert sqla_queue_drain().jobs == ()  # nothing left that is due

        def test_failure_is_reported(sqla_queue_session_factory, sqla_queue_drain):
            with sqla_queue_session_factory.begin() as session:
                explode.enqueue(session)
            result = sqla_queue_drain()
            [job] = result.failed
            assert job.status == "failed"
            assert job.error["message"] == "kaput"
            result.raise_failures()  # must fail the test, naming the job and its error
        """
    )
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*1 job(s) failed:*", "*(explode, now failed): *RuntimeError: kaput*"]
    )


def test_assert_enqueued_passes_and_fails_clearly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(shopapp=APP)
    pytester.makeini(INI)
    pytester.makepyfile(
        test_enqueued="""
        from sqla_queue.testing.helpers import assert_enqueued
        from shopapp import chain, queue, signup

        def test_matches(sqla_queue_session_factory, sqla_queue_assert_enqueued):
            with sqla_queue_session_factory.begin() as session:
                chain.enqueue(session, 1)  # before the block: not counted
                with sqla_queue_assert_enqueued(
                    session, task="welcome", count=1, args=[1]
                ) as found:
                    signup(session, "ada@example.com")
                    chain.enqueue(session, 3)
                assert [job.task for job in found.all] == ["welcome", "chain"]
                assert len(found) == 1

        def test_rolled_back_jobs_do_not_count(sqla_queue_session_factory):
            with sqla_queue_session_factory() as session:
                with assert_enqueued(queue, session, count=0):
                    signup(session, "bob@example.com")
                    session.rollback()

        def test_nothing_enqueued(sqla_queue_session_factory, sqla_queue_assert_enqueued):
            with sqla_queue_session_factory() as session:
                with sqla_queue_assert_enqueued(session, task="welcome"):
                    chain.enqueue(session, 5)

        def test_wrong_kwargs(sqla_queue_session_factory):
            with sqla_queue_session_factory() as session:
                with assert_enqueued(queue, session, task="chain", kwargs={"n": 6}):
                    chain.enqueue(session, 5)
        """
    )
    result = _run(pytester)
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    # Each failure says what was expected and lists what the block enqueued instead.
    assert (
        "AssertionError: expected at least 1 job(s) of task 'welcome' enqueued in the block, "
        "found 0. Jobs enqueued in the block:"
    ) in out
    assert "#1 chain(args=[5], kwargs={})" in out
    assert "of task 'chain' with kwargs {'n': 6} enqueued in the block, found 0." in out


def test_eager_runs_jobs_at_commit_and_only_in_its_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(shopapp=APP)
    pytester.makeini(INI)
    pytester.makepyfile(
        test_eager="""
        from sqlalchemy import select
        from shopapp import User, explode, queue, signup

        def test_runs_at_commit(sqla_queue_session_factory, sqla_queue_eager):
            with sqla_queue_session_factory.begin() as session:
                signup(session, "ada@example.com")
            # The job ran before commit() returned.
            with sqla_queue_session_factory() as session:
                assert session.scalar(select(User.welcomed)) is True
            assert [job.task for job in sqla_queue_eager.jobs] == ["welcome"]

        def test_rollback_runs_nothing(sqla_queue_session_factory, sqla_queue_eager):
            with sqla_queue_session_factory() as session:
                signup(session, "bob@example.com")
                session.rollback()
            assert sqla_queue_eager.jobs == []

        def test_not_eager_without_the_fixture(sqla_queue_session_factory):
            with sqla_queue_session_factory.begin() as session:
                signup(session, "cy@example.com")
            with sqla_queue_session_factory() as session:
                job = session.scalars(select(queue.Job)).one()
                assert job.status == "queued"

        def test_failed_job_fails_the_test(sqla_queue_session_factory, sqla_queue_eager):
            with sqla_queue_session_factory.begin() as session:
                explode.enqueue(session)
        """
    )
    result = _run(pytester)
    # The failing test's body passed; its teardown (where the hook ends) reports the job.
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_failed_job_fails_the_test*"])
    result.stdout.fnmatch_lines(["*(explode, now failed): *RuntimeError: kaput*"])


def test_plugin_is_inert_until_configured(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(shopapp=APP)
    pytester.makepyfile(
        test_plain="""
        def test_plain():
            assert 1 + 1 == 2

        def test_needs_the_queue(sqla_queue_drain):
            pass
        """
    )
    # No sqla_queue_app anywhere: a plain test runs as usual; the fixture names the fix.
    result = _run(pytester)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*the sqla_queue_* fixtures need the application's queue*"])
    # The queue on the command line, or from the user's own fixture, enables them.
    assert _run(pytester, "--sqla-queue-app", "shopapp:queue").ret == 0
    pytester.makeconftest(
        """
        import pytest
        from shopapp import queue

        @pytest.fixture(scope="session")
        def sqla_queue_app():
            return queue
        """
    )
    _run(pytester).assert_outcomes(passed=2)
    # Turned off, the fixtures do not exist.
    off = _run(pytester, "-p", "no:sqla_queue")
    off.assert_outcomes(passed=1, errors=1)
    off.stdout.fnmatch_lines(["*fixture 'sqla_queue_drain' not found*"])


def test_the_testing_guide_runs_as_written(pytester: pytest.Pytester) -> None:
    """docs/guides/testing.md: its files, then each pytest command, with the outcome shown
    after it (the shop's tests, then the workflows')."""
    page = parse_page(GUIDE)
    files = page.marked("file")
    shells = page.marked("shell")
    assert files, "the guide lost its example files"
    assert len(shells) == 2, "the guide lost the command of its tests or its workflows' tests"
    for block in files:
        target = pytester.path / str(block.argument)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.source, encoding="utf-8")
    for shell, expected in zip(shells, page.outputs, strict=True):
        [command] = [line for line in shell.source.splitlines() if line.startswith("pytest")]
        result = _run(pytester, *command.split()[1:])
        summary = expected.source.strip().splitlines()[-1]
        # Exactly the outcomes shown: "3 passed" is not met by "3 passed, 1 error".
        assert result.parseoutcomes() == pytest.RunResult.parse_summary_nouns([summary]), (
            result.stdout.str()
        )
