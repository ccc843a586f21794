"""The test suite's connection budget (tests/conftest.py): a test that goes over it fails by
name, and the run's peak can be measured. Each case runs a pytest of its own on a file of
tests written here, with the repository's conftest and a budget of 5."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import connections

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

TESTS = """
import time

import psycopg
from sqlalchemy import create_engine, text


def _hold(db_url, count, pause):
    engine = create_engine(db_url, pool_size=count, max_overflow=0)
    held = []
    try:
        for _ in range(count):
            held.append(engine.connect())
            held[-1].execute(text("select 1"))
            time.sleep(pause)
        time.sleep(0.4)  # long enough for a sample or two
    finally:
        for connection in held:
            connection.close()
        engine.dispose()


def test_direct(db_url):
    # Not through an engine, like a worker process's: never refused, but counted.
    dsn = db_url.replace("postgresql+psycopg://", "postgresql://")
    held = [psycopg.connect(dsn) for _ in range(8)]
    time.sleep(0.4)
    for connection in held:
        connection.close()


def test_one_at_a_time(db_url):
    _hold(db_url, 8, 0.25)


def test_within(db_url):
    _hold(db_url, 2, 0)
"""


def run_pytest(tmp_path: Path, *extra: str, budget: str = "5") -> str:
    path = tmp_path / "test_budgeted.py"
    path.write_text(TESTS)
    env = {**os.environ, connections.BUDGET_ENV: budget, "PYTHONPATH": str(ROOT)}
    env.pop(connections.MEASURE_ENV, None)
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-n", "0", "-q"]
    plugins = ["-p", "tests.conftest", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *config, *plugins, *extra, str(path)],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return done.stdout + done.stderr


def test_a_test_over_its_budget_fails_by_name_and_the_others_pass(tmp_path: Path) -> None:
    out = run_pytest(tmp_path)
    # Eight opened past the engines' gate: seen by the sampler, failed at teardown.
    direct = re.search(r"test_direct held (\d+) connections to the test server at once", out)
    assert direct is not None, out
    assert int(direct.group(1)) >= 8, out
    assert "over its budget of 5" in out
    # One at a time: refused at the connection that goes over, naming the test.
    assert re.search(r"OverBudgetError: \S*test_one_at_a_time holds [5-9] connections", out), out
    assert re.search(r"FAILED \S*test_one_at_a_time", out), out
    assert re.search(r"ERROR \S*test_direct", out), out
    # test_within passes, and test_direct's call too (its teardown is the error).
    assert re.search(r"\b1 failed, 2 passed, 1 error\b", out), out


def test_measuring_prints_the_peak_and_the_heaviest_tests(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "--measure-connections", budget="0")
    assert "connections to the test server" in out, out
    peak = re.search(r"this run's peak: (\d+) connections at once", out)
    assert peak is not None and 8 <= int(peak.group(1)) < 20, out
    heaviest = r"test process main: peak \d+; heaviest test \S*test_(direct|one_at_a_time)"
    assert re.search(heaviest, out), out
    assert re.search(r"the server's peak: \d+ of \d+ usable", out), out
    assert "budget: none" in out
    assert re.search(r"\b3 passed\b", out), out
