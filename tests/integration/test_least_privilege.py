"""The worker suites again, as the deployment guide's least-privilege roles.

The conftest's ``SQLA_QUEUE_TEST_DML_ROLE`` switch connects every test engine as a role
that has exactly the grants of ``docs/guides/deployment.md`` (read from the page, see
``tests/support/grants.py``): ``app`` for the application role that producers and workers
use, ``admin`` for the operator role, which may also change stored limits. Nothing at
runtime may need DDL, and a worker must do everything, limits included, with those grants.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The whole worker suite, as the application role.
APP_ROLE_SUITES = ["test_enqueue.py", "test_worker.py", "test_liveness.py", "test_claim.py"]
#: The limit tests store limits (set_limit): the operator role.
ADMIN_ROLE_SUITES = ["test_limits.py"]


@pytest.mark.skipif(
    os.environ.get("SQLA_QUEUE_TEST_DML_ROLE") is not None, reason="already a restricted run"
)
@pytest.mark.parametrize(
    ("role", "suites"), [("app", APP_ROLE_SUITES), ("admin", ADMIN_ROLE_SUITES)]
)
def test_suites_pass_as_a_dml_only_role(role: str, suites: list[str]) -> None:
    env = {**os.environ, "SQLA_QUEUE_TEST_DML_ROLE": role}
    paths = [str(Path(__file__).parent / name) for name in suites]
    run = subprocess.run(
        # One process: this test's group runs beside the rest of the suite already.
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *paths],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
