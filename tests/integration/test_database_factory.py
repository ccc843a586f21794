"""DatabaseFactory against a real PostgreSQL server."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from sqla_queue.testing.databases import (
    DatabaseFactory,
    resolve_test_admin_url,
    url_for_database,
)

pytestmark = pytest.mark.integration


def _setup_widgets(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE widgets (id integer PRIMARY KEY, name text NOT NULL)"))
        conn.execute(text("INSERT INTO widgets VALUES (1, 'template row')"))


def _scalar(url: str, sql: str) -> object:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql)).scalar()
    finally:
        engine.dispose()


def _exists(admin_url: str, name: str) -> bool:
    engine = create_engine(admin_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
            ).scalar()
    finally:
        engine.dispose()
    return found is not None


@pytest.fixture(scope="module")
def admin_url() -> str:
    return resolve_test_admin_url()


@pytest.fixture(scope="module")
def factory(admin_url: str) -> DatabaseFactory:
    return DatabaseFactory(admin_url)


@pytest.fixture(scope="module")
def template(factory: DatabaseFactory) -> Iterator[str]:
    name = factory.create_template(f"sqlaq_tpl_factory_{os.getpid()}", _setup_widgets)
    yield name
    factory.drop_template(name)


@pytest.fixture
def clone_url(factory: DatabaseFactory, template: str) -> Iterator[str]:
    url = factory.clone(template)
    yield url
    factory.drop(url)


def test_template_is_marked_and_closed_to_connections(
    admin_url: str, factory: DatabaseFactory, template: str
) -> None:
    engine = create_engine(admin_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text("SELECT datistemplate, datallowconn FROM pg_database WHERE datname = :n"),
                {"n": template},
            ).one()
    finally:
        engine.dispose()
    assert row.datistemplate is True
    assert row.datallowconn is False


def test_clone_sees_template_table(clone_url: str) -> None:
    assert _scalar(clone_url, "SELECT name FROM widgets WHERE id = 1") == "template row"


def test_clone_url_points_at_new_database(admin_url: str, clone_url: str) -> None:
    name = make_url(clone_url).database
    assert name is not None
    assert name.startswith(f"sqlaq_t_{os.getpid()}_")
    assert _scalar(clone_url, "SELECT current_database()") == name
    assert clone_url == url_for_database(admin_url, name)


def test_clones_are_independent(factory: DatabaseFactory, template: str) -> None:
    first = factory.clone(template)
    second = factory.clone(template)
    try:
        assert first != second
        engine = create_engine(first, poolclass=NullPool)
        try:
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO widgets VALUES (2, 'only in first')"))
        finally:
            engine.dispose()
        assert _scalar(first, "SELECT count(*) FROM widgets") == 2
        assert _scalar(second, "SELECT count(*) FROM widgets") == 1
    finally:
        factory.drop(first)
        factory.drop(second)


def test_clone_with_explicit_name(factory: DatabaseFactory, template: str) -> None:
    name = f"sqlaq_named_{os.getpid()}"
    url = factory.clone(template, name)
    try:
        assert make_url(url).database == name
        assert _scalar(url, "SELECT count(*) FROM widgets") == 1
    finally:
        factory.drop(name)


def test_drop_removes_database(admin_url: str, factory: DatabaseFactory, template: str) -> None:
    url = factory.clone(template)
    name = make_url(url).database
    assert name is not None
    assert _exists(admin_url, name)
    factory.drop(url)
    assert not _exists(admin_url, name)


def test_drop_by_name_terminates_open_sessions(
    admin_url: str, factory: DatabaseFactory, template: str
) -> None:
    url = factory.clone(template)
    name = make_url(url).database
    assert name is not None
    engine = create_engine(url, poolclass=NullPool)
    conn = engine.connect()
    try:
        conn.execute(text("SELECT 1"))
        factory.drop(name)
        assert not _exists(admin_url, name)
    finally:
        # The session was killed by the drop; closing it must not hide a test failure.
        with contextlib.suppress(DBAPIError):
            conn.close()
        engine.dispose()


def test_drop_of_missing_database_is_a_no_op(factory: DatabaseFactory) -> None:
    factory.drop(f"sqlaq_never_created_{os.getpid()}")
    factory.drop_template(f"sqlaq_never_created_{os.getpid()}")


def test_create_template_replaces_a_stale_one(admin_url: str, factory: DatabaseFactory) -> None:
    name = f"sqlaq_tpl_stale_{os.getpid()}"

    def first_setup(engine: Engine) -> None:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE old_table (id integer)"))

    def second_setup(engine: Engine) -> None:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE new_table (id integer)"))

    factory.create_template(name, first_setup)
    try:
        factory.create_template(name, second_setup)
        url = factory.clone(name)
        try:
            assert _scalar(url, "SELECT to_regclass('old_table') IS NULL") is True
            assert _scalar(url, "SELECT to_regclass('new_table') IS NOT NULL") is True
        finally:
            factory.drop(url)
    finally:
        factory.drop_template(name)
    assert not _exists(admin_url, name)


def test_failed_setup_leaves_no_database(admin_url: str, factory: DatabaseFactory) -> None:
    name = f"sqlaq_tpl_broken_{os.getpid()}"

    def broken_setup(engine: Engine) -> None:
        raise RuntimeError("setup failed")

    with pytest.raises(RuntimeError, match="setup failed"):
        factory.create_template(name, broken_setup)
    assert not _exists(admin_url, name)


def test_sessions_leaked_by_setup_do_not_block_cloning(factory: DatabaseFactory) -> None:
    name = f"sqlaq_tpl_leaky_{os.getpid()}"
    leaked: list[Connection] = []

    def leaky_setup(engine: Engine) -> None:
        _setup_widgets(engine)
        conn = engine.connect()
        conn.execute(text("SELECT 1"))
        leaked.append(conn)

    factory.create_template(name, leaky_setup)
    try:
        url = factory.clone(name)
        try:
            assert _scalar(url, "SELECT count(*) FROM widgets") == 1
        finally:
            factory.drop(url)
    finally:
        factory.drop_template(name)
        for conn in leaked:
            with contextlib.suppress(DBAPIError):
                conn.close()


def test_clone_of_a_database_in_use_retries(factory: DatabaseFactory, template: str) -> None:
    source_name = f"sqlaq_busy_{os.getpid()}"
    source_url = factory.clone(template, source_name)
    engine = create_engine(source_url, poolclass=NullPool)
    conn = engine.connect()
    try:
        conn.execute(text("SELECT 1"))
        copy_url = factory.clone(source_name)
        try:
            assert _scalar(copy_url, "SELECT count(*) FROM widgets") == 1
        finally:
            factory.drop(copy_url)
    finally:
        with contextlib.suppress(DBAPIError):
            conn.close()
        engine.dispose()
        factory.drop(source_name)


def test_names_with_special_characters_are_quoted(admin_url: str, factory: DatabaseFactory) -> None:
    name = f'sqlaq Odd "Name"; {os.getpid()}'
    factory.create_template(name, _setup_widgets)
    try:
        url = factory.clone(name)
        try:
            assert _scalar(url, "SELECT count(*) FROM widgets") == 1
        finally:
            factory.drop(url)
        assert _exists(admin_url, name)
    finally:
        factory.drop_template(name)
    assert not _exists(admin_url, name)


@pytest.mark.parametrize("name", ["postgres", "template0", "template1"])
def test_refuses_to_drop_system_databases(factory: DatabaseFactory, name: str) -> None:
    with pytest.raises(ValueError, match="Refusing"):
        factory.drop(name)


def test_rejects_names_postgres_would_truncate(factory: DatabaseFactory, template: str) -> None:
    with pytest.raises(ValueError, match="longer than"):
        factory.clone(template, "x" * 64)
