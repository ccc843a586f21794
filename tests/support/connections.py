"""The test suite's own connections to the server: tagged, sampled, and kept within a budget.

A full run on two cores once failed a test at set-up with "sorry, too many clients already":
the server's ``max_connections`` (100 here) is shared by every test process, the worker
processes their tests start and the PgBouncer in front of some of them. So:

* Every connection of a test process is recognisable on the server. Its ``PGAPPNAME``
  (which libpq uses for every connection that sets no ``application_name`` of its own, and
  which the processes it starts inherit) is ``sqlaq-test-<id>``, and its test databases'
  names start with ``sqlaq_t_<id>_``, which also counts the connections that set a name of
  their own or come through PgBouncer. A process's id extends its parent test process's
  (:func:`process_id`), so an xdist worker's count includes the pytest one of its tests
  runs, and the controller's includes every worker's.
* Each test process samples its count in ``pg_stat_activity`` every 100 ms
  (:class:`ConnectionSampler`) against a budget (:func:`budget`; tests/conftest.py says
  how it is enforced).
* ``--measure-connections`` (or ``$SQLA_QUEUE_TEST_MEASURE_CONNECTIONS=1``) samples the
  whole run's count, and the server's, and prints both peaks in the terminal summary.

A burst shorter than 100 ms can go unseen: the budgets leave room for it.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import psycopg

__all__ = [
    "BUDGET_ENV",
    "DEFAULT_BUDGET",
    "MEASURE_ENV",
    "PROCESS_ENV",
    "ConnectionSampler",
    "OverBudgetError",
    "Scope",
    "budget",
    "database_prefix",
    "process_id",
    "process_scope",
    "process_tag",
]

#: The id of the test process that started this one (see :func:`process_id`).
PROCESS_ENV = "SQLA_QUEUE_TEST_PROCESS"
#: Set to 1 to print the run's peak number of connections at the end.
MEASURE_ENV = "SQLA_QUEUE_TEST_MEASURE_CONNECTIONS"
#: Connections one test process (with the processes and PgBouncer its test starts) may hold.
BUDGET_ENV = "SQLA_QUEUE_TEST_CONNECTION_BUDGET"
#: The default budget: two xdist processes at their budget, with the samplers, stay well
#: below the 100 connections a stock PostgreSQL accepts.
DEFAULT_BUDGET = 25
#: Seconds between two samples.
SAMPLE_INTERVAL = 0.1
#: The sampler's own connections carry this name, and are never counted.
SAMPLER_NAME = "sqlaq-test-sampler"

_COUNT = """
select count(*) filter (
           where application_name = %(app)s or application_name like %(app_below)s
              or datname like %(db)s
       ),
       count(*),
       current_setting('max_connections')::int
           - current_setting('superuser_reserved_connections')::int
from pg_stat_activity
where backend_type = 'client backend' and pid <> pg_backend_pid()
  and application_name <> %(sampler)s
"""


class OverBudgetError(RuntimeError):
    """A test process asked for a connection while over its connection budget."""


@functools.cache
def process_id() -> str:
    """This test process's id: its parent test process's id (if any), then its pid.

    The first call also hands it down (``$SQLA_QUEUE_TEST_PROCESS``) to the processes it
    starts later: the xdist workers of a controller, the pytest a test runs. So a
    process's connections include those of every test process below it.
    """
    parent = os.environ.get(PROCESS_ENV, "").strip()
    ident = f"{parent}_{os.getpid()}" if parent else str(os.getpid())
    os.environ[PROCESS_ENV] = ident
    return ident


def process_tag() -> str:
    """The ``application_name`` of this test process's connections (see module doc)."""
    return f"sqlaq-test-{process_id()}"


def database_prefix() -> str:
    """The prefix of this test process's databases' names."""
    return f"sqlaq_t_{process_id()}"


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%")


@dataclass(frozen=True)
class Scope:
    """The connections of one test process and of the test processes below it."""

    ident: str

    def params(self) -> dict[str, str]:
        """The parameters of the counting query."""
        tag = f"sqlaq-test-{self.ident}"
        return {
            "app": tag,
            "app_below": _escaped(tag + "_") + "%",
            "db": _escaped(f"sqlaq_t_{self.ident}_") + "%",
            "sampler": SAMPLER_NAME,
        }


def process_scope() -> Scope:
    """This test process's connections, with those of the processes its tests start."""
    return Scope(process_id())


def budget() -> int:
    """A test process's connection budget: ``$SQLA_QUEUE_TEST_CONNECTION_BUDGET``, else
    :data:`DEFAULT_BUDGET`; 0 turns the budget off (to measure what tests would use)."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return DEFAULT_BUDGET
    if not raw.isascii() or not raw.isdigit():
        raise ValueError(
            f"${BUDGET_ENV} must be a whole number of connections (0: no budget), got {raw!r}"
        )
    return int(raw)


@dataclass
class _Peaks:
    own: int = 0
    total: int = 0
    test: int = 0
    test_id: str | None = None
    worst_test: tuple[int, str | None] = (0, None)
    samples: int = 0
    last_own: int = 0
    limit: int = 0
    errors: list[str] = field(default_factory=list)


class ConnectionSampler(threading.Thread):
    """Counts ``scope``'s connections (and the server's) every 100 ms, keeping the peaks.

    It runs on one connection of its own (named :data:`SAMPLER_NAME`, never counted). Start
    it, mark each test with :meth:`begin_test`, read :meth:`end_test`, and :meth:`stop` it.
    """

    def __init__(self, admin_url: str, scope: Scope, interval: float = SAMPLE_INTERVAL) -> None:
        super().__init__(name="sqlaq-test-connection-sampler", daemon=True)
        self.dsn = _libpq(admin_url)
        self.scope = scope
        self.interval = interval
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._peaks = _Peaks()
        self.ready = threading.Event()

    def run(self) -> None:
        """Sample until stopped; a lost connection is opened again."""
        while not self._halt.is_set():
            try:
                with psycopg.connect(
                    self.dsn, autocommit=True, application_name=SAMPLER_NAME, connect_timeout=5
                ) as connection:
                    self._sample_on(connection)
            except psycopg.Error as exc:
                with self._lock:
                    self._peaks.errors.append(str(exc).strip())
                self.ready.set()
                self._halt.wait(1.0)

    def _sample_on(self, connection: psycopg.Connection[Any]) -> None:
        params = self.scope.params()
        while not self._halt.is_set():
            row = connection.execute(_COUNT, params).fetchone()
            assert row is not None
            self._record(int(row[0]), int(row[1]), int(row[2]))
            self.ready.set()
            self._halt.wait(self.interval)

    def _record(self, own: int, total: int, limit: int) -> None:
        with self._lock:
            peaks = self._peaks
            peaks.samples += 1
            peaks.last_own, peaks.limit = own, limit
            peaks.own = max(peaks.own, own)
            peaks.total = max(peaks.total, total)
            peaks.test = max(peaks.test, own)
            if own > peaks.worst_test[0]:
                peaks.worst_test = (own, peaks.test_id)

    def begin_test(self, test_id: str) -> None:
        """Count from here on for ``test_id``."""
        with self._lock:
            self._peaks.test, self._peaks.test_id = 0, test_id

    def end_test(self) -> int:
        """The most connections seen since :meth:`begin_test` (one more sample taken)."""
        self.sample_now()
        with self._lock:
            peak, self._peaks.test_id = self._peaks.test, None
            return peak

    def sample_now(self) -> None:
        """Take one sample at once, on a connection of its own (from any thread)."""
        try:
            with psycopg.connect(
                self.dsn, autocommit=True, application_name=SAMPLER_NAME, connect_timeout=5
            ) as connection:
                row = connection.execute(_COUNT, self.scope.params()).fetchone()
        except psycopg.Error:
            return
        if row is not None:
            self._record(int(row[0]), int(row[1]), int(row[2]))

    def last_count(self) -> int:
        """This scope's connections at the latest sample."""
        with self._lock:
            return self._peaks.last_own

    def peaks(self) -> _Peaks:
        """A copy of the peaks so far."""
        with self._lock:
            peaks = self._peaks
            return _Peaks(**{name: getattr(peaks, name) for name in peaks.__dataclass_fields__})

    def stop(self) -> None:
        """Stop sampling and wait for the thread."""
        self._halt.set()
        if self.is_alive():
            self.join(5)

    @classmethod
    def started(cls, admin_url: str, scope: Scope) -> ConnectionSampler:
        """A sampler already running, its first sample taken (or its error recorded)."""
        sampler = cls(admin_url, scope)
        sampler.start()
        sampler.ready.wait(10)
        return sampler


def _libpq(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
