"""The first SIGTERM's stop request never runs inside the signal handler.

A handler runs on the main thread between two bytecodes, maybe while that thread holds a
lock the stop request needs (the run loop's wake-up event, the core's lock). The multi-host
test once caught a worker stuck that way for good, killed after its shutdown timeout.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent(
    """
    import os, signal, threading, time
    from sqla_queue.worker.signals import graceful_signals

    lock = threading.Lock()
    stopped = threading.Event()

    def request_stop():
        with lock:  # a lock the main thread holds when the signal arrives
            stopped.set()

    with graceful_signals(request_stop):
        with lock:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)  # the handler runs here, on this thread, lock held
        print("stopped" if stopped.wait(5) else "not stopped", flush=True)
    print("handlers restored:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    """
)


def test_a_signal_arriving_while_the_main_thread_holds_a_lock_still_stops() -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT], check=False, capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the stop request deadlocked inside the signal handler")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["stopped", "handlers restored: True"]
    assert "SIGTERM received: finishing running jobs" in done.stderr
