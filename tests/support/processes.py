"""Starting worker processes the way users do: through the ``sqla-queue`` CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def worker_command(db_url: str, *extra: str, target: str = "tests.support.app:queue") -> list[str]:
    """The argv of ``python -m sqla_queue worker`` on the test app."""
    return [
        sys.executable,
        "-m",
        "sqla_queue",
        "--log-level",
        "WARNING",
        "worker",
        target,
        "--url",
        db_url,
        *extra,
    ]


def start_worker(
    db_url: str,
    *extra: str,
    log_path: Path | None = None,
    target: str = "tests.support.app:queue",
) -> subprocess.Popen[bytes]:
    """Start one worker process; its output goes to ``log_path`` (or is discarded)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        worker_command(db_url, *extra, target=target),
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
