"""A PgBouncer in transaction pooling mode, started for the tests that run through it.

:func:`start_pgbouncer` runs Debian's ``pgbouncer`` (``.ci/install_pgbouncer.sh`` installs
it) as a child process with a configuration of its own, in a temporary directory: a free
loopback port, ``pool_mode = transaction``, ``auth_type = trust`` and every database of the
test server (``* = host=... port=...``), so each test's fresh database is reachable through
it. :meth:`PgBouncer.url` rewrites a database URL of that server to go through it.

Through PgBouncer before 1.21 (Debian 12 has 1.18), a driver's prepared statements do not
survive: the next transaction may run on another server connection. Engines made for it
turn psycopg's off (:data:`ENGINE_OPTIONS`).

``$SQLA_QUEUE_TEST_THROUGH=pgbouncer`` makes the ``engine`` and ``async_engine`` fixtures
of tests/conftest.py go through one such PgBouncer (see :func:`through_pgbouncer`);
creating, cloning and dropping the test databases stays direct.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

__all__ = [
    "ENGINE_OPTIONS",
    "THROUGH_ENV",
    "PgBouncer",
    "direct_only",
    "find_pgbouncer",
    "pgbouncer_or_skip",
    "start_pgbouncer",
    "through_pgbouncer",
]

#: Set to ``pgbouncer`` to run the tests' engines through a PgBouncer in transaction mode.
THROUGH_ENV = "SQLA_QUEUE_TEST_THROUGH"
#: ``create_engine`` options of an engine through PgBouncer 1.18: psycopg prepares a
#: statement on the server after 5 runs of it, which the next transaction, on another
#: server connection, does not find. ``None`` turns that off.
ENGINE_OPTIONS: dict[str, Any] = {"connect_args": {"prepare_threshold": None}}
#: Longest wait for a started pgbouncer to accept connections, and for it to exit.
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0
#: Where Debian puts the binary, which is not on PATH of a user outside sbin.
_DEBIAN_BINARY = "/usr/sbin/pgbouncer"
#: The unprivileged user a pgbouncer started by root runs as (it refuses to run as root).
_UNPRIVILEGED = "postgres"


def find_pgbouncer() -> str | None:
    """The path of the ``pgbouncer`` binary, or None when it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return _DEBIAN_BINARY if os.access(_DEBIAN_BINARY, os.X_OK) else None


@dataclass
class PgBouncer:
    """A running pgbouncer child process; :meth:`stop` ends it and removes its directory."""

    host: str
    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    config: Path
    _stopped: bool = field(default=False, repr=False)

    def url(self, url: str) -> str:
        """``url``, a database URL of the bouncer's server, through the bouncer instead.

        Database, user, password and driver are kept; host and port become the bouncer's.
        """
        parsed = make_url(url)
        query = {k: v for k, v in parsed.query.items() if k not in ("host", "port")}
        rewritten = parsed.set(host=self.host, port=self.port, query=query)
        return rewritten.render_as_string(hide_password=False)

    def log(self) -> str:
        """What pgbouncer wrote to its log file so far (for a failing test's message)."""
        try:
            return (self.directory / "pgbouncer.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after a bounded wait); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT)
        shutil.rmtree(self.directory, ignore_errors=True)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _server_address(server_url: str) -> tuple[str, int]:
    """Host (or unix socket directory) and port pgbouncer reaches the server on."""
    parsed = make_url(server_url)
    host = parsed.host or parsed.query.get("host") or "127.0.0.1"
    if isinstance(host, tuple):  # a multi-host URL: the first one
        host = host[0]
    port = parsed.port or int(str(parsed.query.get("port") or 5432))
    return str(host), port


def _quoted(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


def _config(
    directory: Path,
    *,
    host: str,
    port: int,
    server: tuple[str, int],
    pool_size: int,
    reserve_pool_size: int,
    run_as: str | None,
) -> str:
    server_host, server_port = server
    lines = [
        "[databases]",
        f"* = host={server_host} port={server_port}",
        "",
        "[pgbouncer]",
        f"listen_addr = {host}",
        f"listen_port = {port}",
        f"unix_socket_dir = {directory}",
        f"logfile = {directory / 'pgbouncer.log'}",
        f"pidfile = {directory / 'pgbouncer.pid'}",
        "auth_type = trust",
        f"auth_file = {directory / 'userlist.txt'}",
        "pool_mode = transaction",
        f"default_pool_size = {pool_size}",
        "min_pool_size = 0",
        f"reserve_pool_size = {reserve_pool_size}",
        "reserve_pool_timeout = 1",
        "max_client_conn = 1000",
        # Server connections to a test database dropped meanwhile are closed by the drop;
        # do not keep idle ones for long either, the server is shared.
        "server_idle_timeout = 30",
        "server_lifetime = 300",
        "server_connect_timeout = 5",
        "query_wait_timeout = 30",
        # The reset query only runs in session mode unless server_reset_query_always: in
        # transaction mode nothing cleans a server connection between two clients, which
        # is what the worker's SET LOCAL is for.
        "server_reset_query = DISCARD ALL",
        "ignore_startup_parameters = extra_float_digits",
        "log_connections = 0",
        "log_disconnections = 0",
        "admin_users = postgres",
    ]
    if run_as:
        lines.append(f"user = {run_as}")
    return "\n".join(lines) + "\n"


def start_pgbouncer(
    server_url: str,
    *,
    pool_size: int = 10,
    reserve_pool_size: int = 5,
    users: tuple[str, ...] = (),
) -> PgBouncer:
    """Start a pgbouncer in transaction mode in front of ``server_url``'s server.

    Each database and user pair gets ``pool_size`` server connections, and
    ``reserve_pool_size`` more when clients have waited a second.

    It listens on a free port of 127.0.0.1 and lets in, without a password, the user of
    ``server_url``, ``postgres``, ``root`` and ``users``; it logs in to the server with
    ``server_url``'s password, if any. Started by root, it runs as ``postgres``.

    Raises:
        FileNotFoundError: if pgbouncer is not installed.
        RuntimeError: if it does not accept connections within :data:`START_TIMEOUT`.
    """
    binary = find_pgbouncer()
    if binary is None:
        raise FileNotFoundError("pgbouncer is not installed (bash .ci/install_pgbouncer.sh)")
    parsed = make_url(server_url)
    run_as = _UNPRIVILEGED if os.geteuid() == 0 else None
    host = "127.0.0.1"
    last_error = ""
    for _ in range(3):  # another process may take the free port before pgbouncer binds it
        directory = Path(tempfile.mkdtemp(prefix="sqlaq_pgbouncer_"))
        port = _free_port(host)
        config = directory / "pgbouncer.ini"
        config.write_text(
            _config(
                directory,
                host=host,
                port=port,
                server=_server_address(server_url),
                pool_size=pool_size,
                reserve_pool_size=reserve_pool_size,
                run_as=run_as,
            )
        )
        names = dict.fromkeys((parsed.username or "postgres", "postgres", "root", *users))
        entries = [
            f"{_quoted(name)} {_quoted(parsed.password or '' if name == parsed.username else '')}"
            for name in names
        ]
        (directory / "userlist.txt").write_text("\n".join(entries) + "\n")
        if run_as:
            entry = pwd.getpwnam(run_as)
            for path in (directory, *directory.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        process = subprocess.Popen(
            [binary, "-q", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        bouncer = PgBouncer(host, port, directory, process, config)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5):
                # Stopped by its fixture; at exit too, should the session be interrupted.
                atexit.register(bouncer.stop)
                return bouncer
            time.sleep(0.05)
        last_error = bouncer.log() or f"exit code {process.poll()}"
        bouncer.stop()
    raise RuntimeError(f"pgbouncer did not start: {last_error.strip()[-2000:]}")


def pgbouncer_or_skip(server_url: str, **options: Any) -> Iterator[PgBouncer]:
    """A generator fixture's body: a started :class:`PgBouncer`, stopped afterwards.

    Skips the test, saying why, when pgbouncer is not installed.
    """
    if find_pgbouncer() is None:
        pytest.skip(
            "pgbouncer is not installed: `bash .ci/install_pgbouncer.sh` (as root, or with "
            "sudo) installs Debian's; .ci/run does"
        )
    bouncer = start_pgbouncer(server_url, **options)
    try:
        yield bouncer
    finally:
        bouncer.stop()


def through_pgbouncer() -> bool:
    """Whether this run's engines go through PgBouncer (``$SQLA_QUEUE_TEST_THROUGH``).

    Raises:
        ValueError: for a value other than ``pgbouncer`` (or unset/empty).
    """
    value = os.environ.get(THROUGH_ENV, "").strip().lower()
    if value not in ("", "pgbouncer"):
        raise ValueError(f"{THROUGH_ENV} must be 'pgbouncer' or unset, got {value!r}")
    return value == "pgbouncer"


def direct_only(reason: str) -> pytest.MarkDecorator:
    """A ``skipif`` marker: skip with ``reason`` when the engines go through PgBouncer."""
    return pytest.mark.skipif(
        through_pgbouncer(), reason=f"needs a direct connection, not PgBouncer: {reason}"
    )
