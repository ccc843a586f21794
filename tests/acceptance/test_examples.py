"""The scripts in examples/ run as a user would run them, against a fresh database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script: str, url: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_sync_example(empty_db_url: str) -> None:
    out = run("enqueue_and_work.py", empty_db_url)
    assert "worker: 3 succeeded, 0 failed" in out
    assert "ada@example.com: confirmed=True; jobs: send_confirmation succeeded\n" in out
    assert "cy@example.com: confirmed=True; jobs: send_confirmation succeeded\n" in out
    assert "bob@example.com" not in out  # rolled back with its job
    assert "stats rebuilt (new orders)" in out
    # The unique key kept a double submit to one job; the result came back.
    assert "ada@example.com submitted twice: one job: True" in out
    assert "cy@example.com's confirmation: confirmed cy@example.com" in out

    # The jobs of one order, from the command line, through their link to the order.
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "sqla_queue",
            "jobs",
            "myapp.jobs:queue",
            "--url",
            empty_db_url,
            "--about",
            "example_orders:1",
            "--json",
        ],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    rows = json.loads(cli.stdout)
    assert [(row["task"], row["state"], row["unique_key"]) for row in rows] == [
        ("send_confirmation", "succeeded", "order-1")
    ]


def test_async_example_and_cli(empty_db_url: str) -> None:
    out = run("async_worker.py", empty_db_url)
    assert "async worker: 3 succeeded" in out
    assert "succeeded jobs in the database: 3" in out
    cli = subprocess.run(
        [sys.executable, "-m", "sqla_queue", "verify", "myapp.jobs:queue", "--url", empty_db_url],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert "schema OK" in cli.stdout
