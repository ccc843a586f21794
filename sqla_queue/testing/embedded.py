"""An embedded PostgreSQL server for demos and tests, built on the ``pgserver`` wheel.

``pgserver`` ships PostgreSQL binaries inside a Python wheel, so a server can be started
without any system installation.  It is an optional dependency::

    pip install 'sqla-queue[embedded]'

The server listens only on a unix socket inside its data directory (TCP is disabled), so it
never competes with a system PostgreSQL for port 5432.  On Windows, where pgserver cannot use
unix sockets, it listens on a free TCP port on 127.0.0.1 instead.

Running as root
---------------
PostgreSQL refuses to run as root.  pgserver deals with that itself: when the effective uid
is 0 it runs ``initdb``/``pg_ctl`` as a system user named ``pgserver`` (creating it with
``useradd`` if needed), chowns the data directory to that user and makes the parent
directories of the data directory and of its bundled binaries world-traversable
(``o+rx``).  This module adds to that:

* it creates the ``pgserver`` user itself, as a locked system account without a home
  directory or login shell (pgserver would create a regular user with ``/bin/bash``), and
  falls back to BusyBox ``adduser`` where ``useradd`` is missing;
* the default data directory for root is under ``/var/cache`` rather than ``~/.cache``, so
  pgserver does not have to open up ``/root`` to other users.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from sqlalchemy.engine import URL

if TYPE_CHECKING:
    from pgserver.postgres_server import PostgresServer

__all__ = ["EmbeddedPostgres", "default_data_dir", "start_embedded_postgres"]

_INSTALL_HINT = (
    "The embedded PostgreSQL fallback needs the optional 'pgserver' package. "
    "Install it with: pip install 'sqla-queue[embedded]' "
    "(or point the application at an existing server with a database URL)."
)

#: Environment variable that overrides the default data directory.
DATA_DIR_ENV = "SQLA_QUEUE_PGDATA"

# pgserver hardcodes this account name for running the server when started as root.
_SERVER_USER = "pgserver"

# pgserver keeps exactly one PostgresServer object per data directory per process, and its
# cleanup() stops the server for the whole process. Count our own handles so that closing one
# EmbeddedPostgres does not pull the server out from under another one in the same process.
_refcounts: dict[Path, int] = {}
_refcount_lock = threading.Lock()


def _import_pgserver() -> None:
    try:
        with warnings.catch_warnings():
            # platformdirs warns at pgserver import time when XDG_RUNTIME_DIR is unset (common
            # in containers and CI); the /tmp fallback it picks is fine for a lock file.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import pgserver.postgres_server  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(_INSTALL_HINT) from exc


def _is_root() -> bool:
    return sys.platform != "win32" and os.geteuid() == 0


def _user_cache_root() -> Path:
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        return Path(local) if local else Path.home() / "AppData" / "Local"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches"
    if _is_root():
        # The server runs as an unprivileged user that must be able to traverse every parent of
        # the data directory; under /root pgserver would chmod root's home to o+rx.
        return Path("/var/cache")
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) if xdg else Path.home() / ".cache"


@functools.cache
def _server_major_version() -> str:
    """Major version of the PostgreSQL binaries bundled with pgserver, e.g. ``"16"``."""
    commands = _import_pgserver_commands()
    out = subprocess.run(
        [str(commands / "postgres"), "--version"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    match = re.search(r"(\d+)(?:\.\d+)?", out)
    if match is None:
        raise RuntimeError(f"Cannot parse the PostgreSQL version from {out!r}")
    return match.group(1)


def _import_pgserver_commands() -> Path:
    _import_pgserver()
    from pgserver._commands import POSTGRES_BIN_PATH

    return POSTGRES_BIN_PATH


def default_data_dir() -> Path:
    """Return the data directory used when none is given to :func:`start_embedded_postgres`.

    In order of preference:

    1. ``$SQLA_QUEUE_PGDATA`` if set;
    2. ``<cache>/sqla_queue/pg<major>`` where ``<cache>`` is ``$XDG_CACHE_HOME`` or
       ``~/.cache`` on Linux, ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows and
       ``/var/cache`` when running as root, and ``<major>`` is the PostgreSQL major version
       bundled with pgserver (a data directory only works with one major version);
    3. ``./.sqla_queue_pg/pg<major>`` if the cache directory cannot be created.

    Raises:
        RuntimeError: if pgserver is not installed (needed to learn the PostgreSQL version).
    """
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser()
    leaf = f"pg{_server_major_version()}"
    cache = _user_cache_root() / "sqla_queue"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return Path.cwd() / ".sqla_queue_pg" / leaf
    return cache / leaf


def _ensure_server_user() -> None:
    import pwd

    try:
        pwd.getpwnam(_SERVER_USER)
    except KeyError:
        pass
    else:
        return
    candidates = [
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            _SERVER_USER,
        ],
        # BusyBox (Alpine): system user, no password, no home directory.
        ["adduser", "-S", "-D", "-H", _SERVER_USER],
    ]
    errors: list[str] = []
    for command in candidates:
        if shutil.which(command[0]) is None:
            errors.append(f"{command[0]}: not found")
            continue
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        # Exit code 9 from useradd means another process created the user concurrently.
        if result.returncode in (0, 9):
            return
        errors.append(f"{' '.join(command)}: {result.stderr.strip()}")
    raise RuntimeError(
        "PostgreSQL refuses to run as root, and the unprivileged system user "
        f"{_SERVER_USER!r} used by the embedded server could not be created "
        f"({'; '.join(errors)}). Create it manually (useradd --system {_SERVER_USER}), run "
        "as a non-root user, or use an existing server via a database URL."
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _prune_dead_handles(pgdata: Path) -> None:
    # pgserver records every process using the server in this file and only stops the server
    # when the last recorded process exits. A process killed with SIGKILL never removes its
    # entry, which would keep the server from ever being stopped again.
    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(pids, list) or not all(isinstance(p, int) for p in pids):
        return
    alive = [p for p in pids if _pid_alive(p)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _remove_stale_pidfile(pgdata: Path) -> None:
    # After a container or machine restart postmaster.pid may survive while its pid has been
    # reused by an unrelated process (pids are small and deterministic in containers, and the
    # system PostgreSQL often gets the same one). pgserver would then assume the server is
    # running and hand out a dead socket, and postgres itself would refuse to start. Only
    # remove the file when we are sure the pid is not a postmaster for this data directory:
    # deleting the lock file of a live postmaster would allow a second one on the same data.
    pidfile = pgdata / "postmaster.pid"
    try:
        first_line = pidfile.read_text().splitlines()[0]
        pid = int(first_line.strip())
    except (OSError, IndexError, ValueError):
        if pidfile.exists():
            with contextlib.suppress(OSError):
                if pidfile.stat().st_size == 0:
                    pidfile.unlink()
        return
    try:
        import psutil  # type: ignore[import-untyped]

        process = psutil.Process(pid)
        name: str = process.name()
        cmdline: list[str] = process.cmdline()
    except ImportError:
        return
    except Exception:  # psutil.NoSuchProcess, AccessDenied, ZombieProcess
        if not _pid_alive(pid):
            pidfile.unlink(missing_ok=True)
        return
    ours = name.startswith("postgres") and (not cmdline or str(pgdata) in " ".join(cmdline))
    if not ours:
        pidfile.unlink(missing_ok=True)


def _check_version(pgdata: Path) -> None:
    version_file = pgdata / "PG_VERSION"
    if not version_file.exists():
        return
    existing = version_file.read_text().strip()
    bundled = _server_major_version()
    if existing != bundled:
        raise RuntimeError(
            f"The data directory {pgdata} was created by PostgreSQL {existing}, but pgserver "
            f"bundles PostgreSQL {bundled}. Delete the directory or choose another data_dir."
        )


class EmbeddedPostgres:
    """A running embedded PostgreSQL server.

    Create it with :func:`start_embedded_postgres`.  Use it as a context manager or call
    :meth:`stop` when done; servers still open at interpreter exit are stopped then.

    The server is shared: several processes (or several handles in one process) that start the
    same data directory use one server, and it is only shut down when the last of them stops.
    """

    def __init__(self, server: PostgresServer, data_dir: Path) -> None:
        """Wrap an already running pgserver server; use :func:`start_embedded_postgres`."""
        self._server = server
        self._data_dir = data_dir
        self._stopped = False
        info = server.get_postmaster_info()
        if info.socket_dir is not None:
            query = {"host": str(info.socket_dir)}
            if info.port is not None:
                # The socket file name contains the port (.s.PGSQL.<port>), and PGPORT in the
                # environment would otherwise override it.
                query["port"] = str(info.port)
            url = URL.create(
                "postgresql+psycopg", username="postgres", database="postgres", query=query
            )
        else:
            url = URL.create(
                "postgresql+psycopg",
                username="postgres",
                host=info.hostname or "127.0.0.1",
                port=info.port,
                database="postgres",
            )
        self._url = url.render_as_string(hide_password=False)

    @property
    def url(self) -> str:
        """SQLAlchemy URL (``postgresql+psycopg://``) of the ``postgres`` database."""
        return self._url

    @property
    def data_dir(self) -> Path:
        """The server's data directory."""
        return self._data_dir

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` has been called on this handle."""
        return self._stopped

    def stop(self) -> None:
        """Release this handle, stopping the server if nothing else uses it.

        Calling it more than once is harmless.
        """
        with _refcount_lock:
            if self._stopped:
                return
            self._stopped = True
            remaining = _refcounts.get(self._data_dir, 1) - 1
            if remaining > 0:
                _refcounts[self._data_dir] = remaining
                return
            _refcounts.pop(self._data_dir, None)
            self._server.cleanup()

    def __enter__(self) -> Self:
        """Return the running server."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server (see :meth:`stop`)."""
        self.stop()

    def __repr__(self) -> str:
        """Show the data directory and URL."""
        state = "stopped" if self._stopped else "running"
        return f"<EmbeddedPostgres {state} data_dir={str(self._data_dir)!r} url={self._url!r}>"


def start_embedded_postgres(data_dir: Path | None = None) -> EmbeddedPostgres:
    """Start (or attach to) an embedded PostgreSQL server and return a handle to it.

    Args:
        data_dir: The server's data directory. It is initialised on first use and reused
            afterwards, so data survives between runs; if a server from an earlier run is still
            running on it, that server is reused. Defaults to :func:`default_data_dir` (a
            per-user cache directory such as ``~/.cache/sqla_queue/pg16``, overridable with
            ``$SQLA_QUEUE_PGDATA``).

    Returns:
        A handle whose :attr:`~EmbeddedPostgres.url` connects as the ``postgres`` superuser
        (trust authentication, unix socket only) to the ``postgres`` database.

    Raises:
        RuntimeError: if pgserver is not installed, if running as root and the unprivileged
            server account cannot be created, or if the data directory belongs to another
            PostgreSQL major version.
    """
    _import_pgserver()
    from pgserver.postgres_server import PostgresServer, get_server

    pgdata = (data_dir if data_dir is not None else default_data_dir()).expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if _is_root():
        _ensure_server_user()
    if pgdata.exists():
        _check_version(pgdata)
    # The threading lock comes first because pgserver's file lock only excludes other
    # processes: two threads of one process would both hold it.
    with _refcount_lock:
        if pgdata.exists():
            # The inter-process lock pgserver takes while starting and stopping servers, so
            # its bookkeeping files are not edited under a concurrent start elsewhere.
            with PostgresServer._lock:
                _prune_dead_handles(pgdata)
                _remove_stale_pidfile(pgdata)
        server = get_server(pgdata, cleanup_mode="stop")
        _refcounts[pgdata] = _refcounts.get(pgdata, 0) + 1
    return EmbeddedPostgres(server, pgdata)
