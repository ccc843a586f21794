"""The enqueue, worker and liveness tests again, as a role with DML rights only.

A worker and an enqueuing app need SELECT/INSERT/UPDATE/DELETE on the queue tables and
USAGE on the schema and sequences; nothing at runtime may need DDL. The conftest's
``SQLA_QUEUE_TEST_DML_ROLE`` switch connects every test engine as such a role.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SUITES = ["test_enqueue.py", "test_worker.py", "test_liveness.py", "test_claim.py"]


@pytest.mark.skipif(
    os.environ.get("SQLA_QUEUE_TEST_DML_ROLE") == "1", reason="already the restricted run"
)
def test_suites_pass_as_a_dml_only_role() -> None:
    env = {**os.environ, "SQLA_QUEUE_TEST_DML_ROLE": "1"}
    paths = [str(Path(__file__).parent / name) for name in SUITES]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
