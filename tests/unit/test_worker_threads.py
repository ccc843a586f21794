"""The one base of the threads beside a worker's loop (``sqla_queue.worker.threads``), and
the heartbeater and listener built on it, with real threads and short waits."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from sqla_queue.worker.heartbeat import Heartbeater
from sqla_queue.worker.listener import Listener
from sqla_queue.worker.threads import WorkerThread, backoff

pytestmark = pytest.mark.unit

#: Generous bound on how long a thread takes to notice a stop: far below any pause used.
PROMPT = 1.0


class Looper(WorkerThread):
    """Calls ``step`` through :meth:`WorkerThread.repeat`, recording when it ran."""

    thread_name = "test-looper"

    def __init__(
        self,
        step: Callable[[], float | None],
        *,
        first_pause: float = 0.0,
        stop_flag: threading.Event | None = None,
        wanted: bool = True,
    ) -> None:
        super().__init__(stop_flag=stop_flag)
        self.step = step
        self.first_pause = first_pause
        self.wanted = wanted
        self.ran_on: list[str] = []
        self.ended = threading.Event()

    def _wanted(self) -> bool:
        return self.wanted

    def _run(self) -> None:
        self.ran_on.append(threading.current_thread().name)
        try:
            self.repeat(self.step, first_pause=self.first_pause)
        finally:
            self.ended.set()


class Counter:
    """A step that counts its calls and asks for a fixed pause."""

    def __init__(self, pause: float | None) -> None:
        self.pause = pause
        self.calls = 0
        self.called = threading.Event()

    def __call__(self) -> float | None:
        self.calls += 1
        self.called.set()
        return self.pause


def wait_until(condition: Callable[[], bool], timeout: float = PROMPT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_start_runs_the_body_once_on_a_named_daemon_thread() -> None:
    looper = Looper(Counter(None))
    assert not looper.is_alive()
    looper.start()
    looper.start()  # a second start starts nothing
    assert looper.ended.wait(PROMPT)
    looper.join(PROMPT)
    assert looper.ran_on == ["test-looper"]
    assert not looper.is_alive()
    assert looper._thread is not None and looper._thread.daemon


def test_a_thread_with_nothing_to_do_never_starts_and_joins_at_once() -> None:
    looper = Looper(Counter(0.01), wanted=False)
    looper.start()
    began = time.monotonic()
    looper.request_stop()
    looper.join(PROMPT)
    assert time.monotonic() - began < 0.1
    assert looper.ran_on == []
    assert looper._thread is None


def test_join_returns_after_its_timeout_when_the_thread_goes_on() -> None:
    looper = Looper(Counter(5.0))
    looper.start()
    try:
        began = time.monotonic()
        looper.join(0.05)
        assert 0.04 <= time.monotonic() - began < 0.5
        assert looper.is_alive()
    finally:
        looper.request_stop()
        looper.join(PROMPT)
    assert not looper.is_alive()


def test_repeat_steps_at_the_interval_each_step_returns() -> None:
    step = Counter(0.02)
    looper = Looper(step)
    began = time.monotonic()
    looper.start()
    wait_until(lambda: step.calls >= 4)
    looper.request_stop()
    looper.join(PROMPT)
    # The first step at once, then one every 20 ms: four need at least 60 ms.
    assert time.monotonic() - began >= 0.06
    assert not looper.is_alive()


def test_first_pause_delays_the_first_step() -> None:
    step = Counter(0.01)
    looper = Looper(step, first_pause=0.1)
    began = time.monotonic()
    looper.start()
    try:
        assert step.called.wait(PROMPT)
        assert time.monotonic() - began >= 0.1
    finally:
        looper.request_stop()
        looper.join(PROMPT)


def test_a_stop_request_ends_a_long_pause_at_once_and_no_step_follows() -> None:
    step = Counter(30.0)
    looper = Looper(step)
    looper.start()
    assert step.called.wait(PROMPT)
    began = time.monotonic()
    looper.request_stop()
    looper.join(PROMPT)
    assert time.monotonic() - began < 0.2
    assert not looper.is_alive()
    assert step.calls == 1


def test_a_stop_requested_before_the_start_runs_no_step() -> None:
    step = Counter(0.01)
    looper = Looper(step)
    looper.request_stop()
    looper.start()
    assert looper.ended.wait(PROMPT)
    assert step.calls == 0


def test_a_step_that_returns_none_ends_the_loop() -> None:
    step = Counter(None)
    looper = Looper(step)
    looper.start()
    assert looper.ended.wait(PROMPT)
    assert step.calls == 1
    assert not looper.stopping()


def test_a_wake_up_ends_the_pause_early_and_the_loop_goes_on() -> None:
    step = Counter(30.0)
    looper = Looper(step)
    looper.start()
    try:
        wait_until(lambda: step.calls == 1)
        looper.wake()
        wait_until(lambda: step.calls == 2)
        time.sleep(0.05)
        assert step.calls == 2  # the wake-up was taken: the next pause waits again
        assert looper.is_alive()
    finally:
        looper.request_stop()
        looper.join(PROMPT)


def test_the_worker_stop_flag_ends_a_thread_given_it_within_its_poll() -> None:
    class Polling(Looper):
        flag_poll = 0.02

    flag = threading.Event()
    step = Counter(30.0)
    looper = Polling(step, stop_flag=flag)
    looper.start()
    assert step.called.wait(PROMPT)
    began = time.monotonic()
    flag.set()
    assert looper.ended.wait(PROMPT)
    assert time.monotonic() - began < 0.2
    assert looper.stopping()
    looper.join(PROMPT)


def test_without_a_poll_the_stop_flag_is_seen_between_steps_only() -> None:
    flag = threading.Event()
    looper = Looper(Counter(0.01), stop_flag=flag)
    flag.set()
    began = time.monotonic()
    assert looper.pause(0.1)  # waited it out: nothing wakes it but a stop request
    assert time.monotonic() - began >= 0.1
    assert looper.stopping()


def test_a_thread_not_given_the_stop_flag_runs_until_asked_to_stop() -> None:
    step = Counter(0.01)
    looper = Looper(step)  # as the heartbeater and the registry
    looper.start()
    try:
        wait_until(lambda: step.calls >= 2)
        assert not looper.stopping()
    finally:
        looper.request_stop()
        looper.join(PROMPT)
    assert looper.stopping()


def test_pause_reports_a_stop_and_a_zero_pause_only_looks() -> None:
    looper = Looper(Counter(None))
    began = time.monotonic()
    assert looper.pause(0.0) is False
    assert looper.pause(0.02) is False
    assert time.monotonic() - began >= 0.02
    looper.request_stop()
    assert looper.pause(30.0) is True


def test_wait_for_wake_waits_even_while_stopping_once_the_stop_was_taken() -> None:
    looper = Looper(Counter(None))
    looper.request_stop()
    assert looper.wait_for_wake(30.0)  # the stop request is a wake-up, taken here
    began = time.monotonic()
    assert not looper.wait_for_wake(0.05)
    assert time.monotonic() - began >= 0.05
    threading.Timer(0.02, looper.wake).start()
    assert looper.wait_for_wake(PROMPT)


def test_backoff_doubles_per_failure_up_to_six_times_and_its_cap() -> None:
    assert [backoff(0.1, n, cap=5.0) for n in range(8)] == [
        0.1,
        0.2,
        0.4,
        0.8,
        1.6,
        3.2,
        5.0,
        5.0,
    ]
    assert backoff(1.0, 10, cap=100.0) == 64.0
    assert backoff(0.02, 1, cap=60.0) == 0.04


# -- the heartbeater ------------------------------------------------------------------------


class FakeConnection:
    def __init__(self, fail: BaseException | None) -> None:
        self.fail = fail
        self.executed: list[Any] = []

    def execute(self, statement: Any, params: Any = None) -> FakeConnection:
        if self.fail is not None:
            raise self.fail
        self.executed.append(statement)
        return self

    def all(self) -> list[tuple[int, bool]]:
        return [(1, False)]


class FakeEngine:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.connection = FakeConnection(fail)

    @contextmanager
    def begin(self) -> Iterator[FakeConnection]:
        yield self.connection


class FakeSource:
    guard = "guard"
    heartbeat_statement = "heartbeat"

    def __init__(self, held: bool = True) -> None:
        self.held = held
        self.done: list[tuple[list[int], list[Any]]] = []
        self.failed: list[BaseException] = []
        self.beats = threading.Event()

    def heartbeat_params(self) -> Any:
        self.beats.set()
        return {"ids": [1], "attempts": [1], "worker": "w"} if self.held else None

    def heartbeat_done(self, sent: Any, rows: Any) -> None:
        self.done.append((list(sent), list(rows)))

    def heartbeat_failed(self, exc: BaseException, now: float) -> None:
        self.failed.append(exc)


def test_the_heartbeater_beats_after_each_interval_until_stopped() -> None:
    source, engine = FakeSource(), FakeEngine()
    heartbeater = Heartbeater(source, engine, 0.02)  # type: ignore[arg-type]
    began = time.monotonic()
    heartbeater.start()
    try:
        wait_until(lambda: len(source.done) >= 2)
        assert time.monotonic() - began >= 0.04  # it waits an interval before the first
    finally:
        heartbeater.request_stop()
        heartbeater.join(PROMPT)
    assert not heartbeater.is_alive()
    assert source.done[0] == ([1], [(1, False)])
    assert engine.connection.executed[:2] == ["guard", "heartbeat"]
    assert heartbeater._thread is not None
    assert heartbeater._thread.name == "sqla-queue-heartbeat"


def test_a_failed_heartbeat_is_reported_to_the_worker_and_the_next_one_tried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = FakeSource()
    heartbeater = Heartbeater(source, FakeEngine(RuntimeError("gone")), 0.01)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="sqla_queue.worker"):
        heartbeater.start()
        try:
            wait_until(lambda: len(source.failed) >= 2)
        finally:
            heartbeater.request_stop()
            heartbeater.join(PROMPT)
    assert source.done == []
    assert "heartbeat failed, retrying in 0.0s: gone" in caplog.text


def test_nothing_held_sends_no_heartbeat() -> None:
    source, engine = FakeSource(held=False), FakeEngine()
    heartbeater = Heartbeater(source, engine, 0.01)  # type: ignore[arg-type]
    heartbeater.beat()
    assert engine.connection.executed == [] and source.done == []


# -- the listener ---------------------------------------------------------------------------


class FakeListenConnection:
    def __init__(self) -> None:
        self.executed: list[Any] = []
        self.first = True

    def execute(self, statement: Any) -> None:
        self.executed.append(statement)

    def notifies(self, *, timeout: float, stop_after: int) -> Iterator[object]:
        if self.first:  # one notification, then quiet
            self.first = False
            yield object()
            return
        time.sleep(min(timeout, 0.01))


def test_the_listener_wakes_the_worker_on_connect_and_on_each_notification() -> None:
    connection = FakeListenConnection()
    notified: list[float] = []

    @contextmanager
    def connect() -> Iterator[FakeListenConnection]:
        yield connection

    listener = Listener(connect, "chan", lambda: notified.append(time.monotonic()))  # type: ignore[arg-type]
    listener.start()
    try:
        wait_until(lambda: len(notified) >= 2)
        assert listener.connected.is_set()
    finally:
        listener.request_stop()
        listener.join(PROMPT)
    assert not listener.is_alive()
    assert len(connection.executed) == 1  # the LISTEN


def test_the_listener_reconnects_with_backoff_and_stops_while_waiting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: list[float] = []

    def connect() -> Any:
        attempts.append(time.monotonic())
        raise OSError("refused")

    listener = Listener(connect, "chan", lambda: None)
    with caplog.at_level(logging.WARNING, logger="sqla_queue.worker"):
        listener.start()
        try:
            wait_until(lambda: len(attempts) >= 3)  # after 0.1 s, then 0.2 s more
        finally:
            began = time.monotonic()
            listener.request_stop()
            listener.join(PROMPT)
    assert time.monotonic() - began < 0.2  # the 0.4 s wait under way ended at once
    assert attempts[1] - attempts[0] >= 0.1
    assert attempts[2] - attempts[1] >= 0.2
    assert "reconnecting in 0.1s: refused" in caplog.text
    assert "reconnecting in 0.2s: refused" in caplog.text
    assert not listener.connected.is_set()
